"""A replica unassigned while its partition splits (spec 3.6 meets 3.8).

An unassigned replica drains what no current replica holds to the partition's leader. Once the split is
finalized that leader is in UNLOAD and declines INVALID on every offer: the rows only the drained
replica held never reached the split targets and stayed on its disk, offered and declined for ever.
"""

from __future__ import annotations

import pytest

from sparkbus.roles.replication.layout import Lifecycle, SplitTarget

from .cluster import Cluster, P, spec

SEEDS = [1, 2, 3]
T = "t/1"
NODES = ("a", "b", "c")


def _cluster(seed: int) -> Cluster:
    """P on a, b (a leads); the split target T on c, in LOAD."""
    return Cluster(
        [spec("a", "b"), spec("c", partition=T, first_placement=21, lifecycle=Lifecycle.LOAD)], seed=seed
    )


def _assert_drained_into_the_target(c: Cluster, node: str, keys: list[int]) -> None:
    _assert_drained_into_the_target_on(c, node, "c", keys)


def _assert_drained_into_the_target_on(c: Cluster, node: str, target: str, keys: list[int]) -> None:
    status = c.status(node)
    assert status["draining"] == {}, status["draining"]
    assert status["counters"].get("drains_done") == 1
    assert sorted(c.read(target, T)["key"]) == sorted(keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_leader_unassigned_in_unload_pushes_its_log_rows_to_the_target(seed: int) -> None:
    c = _cluster(seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    keys += c.write_keys("a", range(50, 52))  # acknowledged, in a's log only
    c.crash("c")  # the target's only replica: nothing reaches it before a is unassigned
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(5)
    assert c.status("b")["partitions"][P]["lifecycle"] == "UNLOAD"
    for n in ("a", "b"):
        c.call(n, "assign", spec=spec("b", first_placement=2))
    c.restart("c")  # its layout comes from the topology; b re-sends the finalize
    c.settle(60)
    _assert_drained_into_the_target(c, "a", keys)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_follower_unassigned_before_the_finalize_reached_it_learns_the_split_from_the_leader(
    seed: int,
) -> None:
    c = _cluster(seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "b")
    keys += c.write_keys("b", range(60, 63), "b")  # b leads its side of the cut: rows only it holds
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(20)
    for n in NODES:
        c.call(n, "assign", spec=spec("a"))
    c.heal("a", "b")
    c.settle(60)
    assert c.counters("b").get("splits_finalized") == 1, "from a's answer to its drain offer"
    _assert_drained_into_the_target(c, "b", keys)


@pytest.mark.parametrize("strike", [1, 2])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_crash_between_a_draining_sources_unload_and_the_local_targets_serve_is_finished_at_start(
    seed: int, strike: int
) -> None:
    """b drains P (an assign removed it during a cut, with rows only it holds) and holds T, P's split
    target, alone. The finalize reaches b on the heal: its drainer saved UNLOAD, then b died at T's clock
    or T's SERVE. The start applied the split again only for sources placed here, so with a down nobody
    told b again: T stayed in LOAD, its clock not raised, and b, its leader, refused every write to it."""
    target = spec("b", partition=T, first_placement=21, lifecycle=Lifecycle.LOAD)
    c = Cluster([spec("a", "b"), target], seed=seed, nodes=("a", "b"))
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "b")
    keys += c.write_keys("b", range(60, 63), "b")  # b leads its side of the cut: rows only it holds
    for n in ("a", "b"):
        c.call(n, "assign", spec=spec("a"))
    c.specs = [spec("a"), target]  # the topology places P on a alone from now on
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(2)
    assert c.status("b")["draining"][P]["lifecycle"] == "SERVE", "b drains P to a, which it cannot reach"
    c.storages["b", T].arm_crash(strike)  # T's raise_clock, then its SERVE, in _apply_split
    c.heal("a", "b")  # a tells b the finalize
    c.run(5)
    assert not c.alive("b"), "the crash struck inside the finalize"
    c.crash("a")
    c.restart("b")
    status = c.status("b")  # the start: b has no peer up to hear from
    assert status["draining"][P]["lifecycle"] == "UNLOAD"
    assert status["partitions"][T]["lifecycle"] == "SERVE"
    drainer = c.role("b").draining[P]
    assert c.role("b").local[T].store.lamport >= drainer.store.lamport
    _, error = c.write("b", T, {"key": [100], "v": ["new"]})
    assert error is None, error
    c.restart("a")
    c.settle(60)
    _assert_drained_into_the_target_on(c, "b", "b", [*keys, 100])
