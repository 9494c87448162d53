"""A write a split target takes once it serves outversions every row the split still brings it.

The target serves from the finalize on, while the source's rows may still be on their way: all of them
in an async split (it finalizes at once), and in a sync one the rows the source's leader held in its
memtable when it finalized (it waits only for its flushed segments; UNLOAD flushes and pushes the rest).
The target versioned its writes from its own clock, below the source's, so such a row, older than the
target's write, won the merge and reverted it. The finalize now carries the source leader's clock, and
the target raises its own to it before it serves (``SplitFinalized.lamport``).
"""

from __future__ import annotations

import pytest

from sparkbus.roles.replication.layout import Lifecycle, SplitTarget

from .cluster import Cluster, P, config, spec

SEEDS = [1, 2, 3]
T = "t/9"


def _cluster(seed: int, **store: object) -> Cluster:
    """P on a, b (a leads); the split target T on c and b (c leads), in LOAD."""
    specs = [spec("a", "b"), spec("c", "b", partition=T, first_placement=21, lifecycle=Lifecycle.LOAD)]
    return Cluster(specs, config(**store), seed=seed)


def _write_on_the_target_once_it_serves(c: Cluster, held: str, restart: bool = False) -> None:
    """Run until the target serves (then restart its leader if asked: the raised clock is in its
    manifest), check it does not hold ``held`` yet, and write key 5 there."""

    def serves() -> bool:
        return c.role("c").local[T].lifecycle is Lifecycle.SERVE

    c.sim.run_until(serves, limit=10)
    if restart:
        c.crash("c")
        c.restart("c")
        c.sim.run_until(lambda: c.leader("c", T) == "c", limit=10)
    assert held not in c.read("c", T).get("v", []), "the source's row is still on its way"
    assert c.write("c", T, {"key": [5], "v": ["new"]})[1] is None
    assert c.read("c", T) == {"key": [5], "v": ["new"]}


def _assert_the_write_stays(c: Cluster) -> None:
    c.settle(40)
    assert c.status("a")["partitions"][P]["lifecycle"] == "UNLOAD_FINAL"
    for n in ("c", "b"):
        assert c.read(n, T) == {"key": [5], "v": ["new"]}, n
    c.assert_clean()


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_to_the_target_of_an_async_split_is_not_reverted_by_the_rows_it_brings(
    seed: int, restart: bool
) -> None:
    c = _cluster(seed, flush_rows=2)
    for i in range(6):  # six versions of one key: the source's clock reaches 6
        assert c.write("a", P, {"key": [5], "v": [f"old{i}"]})[1] is None
    c.settle(10)
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    _write_on_the_target_once_it_serves(c, "old5", restart)
    _assert_the_write_stays(c)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_to_the_target_of_a_sync_split_is_not_reverted_by_the_source_memtable(seed: int) -> None:
    c = _cluster(seed, flush_rows=100, flush_age=30.0)  # no flush before the finalize
    for i in range(3):
        assert c.write("a", P, {"key": [5], "v": [f"old{i}"]})[1] is None
    c.call("a", "flush", partition=P)  # the segment the split waits for: versions up to 3
    for i in range(3, 6):  # versions 4 to 6, in the leader's memtable when it finalizes
        assert c.write("a", P, {"key": [5], "v": [f"old{i}"]})[1] is None
    c.settle(10)
    assert c.role("a").local[P].store.memtable_rows == 3
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),))
    _write_on_the_target_once_it_serves(c, "old5")
    _assert_the_write_stays(c)
