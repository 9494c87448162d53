"""Local disk errors (ENOSPC) on one node: the role answers, keeps its tick and tries again.

Each fault strikes once, at a chosen storage operation of one replica (``_Once``), and the rows
acknowledged before and after it must end on every replica with no further event but the tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sparkbus.roles.replication.store import MANIFEST, WAL
from tests.sim.replication.cluster import NODES, Cluster, P, spec


class _Once:
    """Make ``method`` of ``storage`` raise ENOSPC the first time ``hit(name)`` is true."""

    def __init__(self, storage: Any, method: str, hit: Callable[[str], bool]) -> None:
        self.orig = getattr(storage, method)
        self.hit, self.fired = hit, False
        setattr(storage, method, self)

    def __call__(self, name: str, *args: Any, **kw: Any) -> Any:
        if not self.fired and self.hit(name):
            self.fired = True
            raise OSError(28, "No space left on device")
        return self.orig(name, *args, **kw)


@pytest.mark.parametrize("seed", [1, 2])
def test_one_failed_age_flush_does_not_stop_the_tick(seed: int) -> None:
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))  # two flushes of 4 rows
    c.settle(10)
    c.assert_identical(NODES, keys)
    fault = _Once(c.role("a").local[P].store.storage, "create", lambda n: n.startswith("seg-"))
    keys += c.write_keys("a", range(100, 102))  # below flush_rows: flushed by age (5 s) on a tick
    c.settle(60)
    assert fault.fired, "the age flush hit the error"
    keys += c.write_keys("a", range(200, 202))  # after it: again below flush_rows, only the tick flushes
    c.settle(60)
    c.assert_identical(NODES, keys)
    assert c.role("a").local[P].store.memtable_rows == 0
    # Logged and counted once, not raised; it clears once the procedures run again.
    assert c.counters("a").get("procedure_errors") == 1 and c.status("a")["failing"] == {}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_manifest_write_error_on_fast_forward_is_acked_and_retried(seed: int) -> None:
    """Raised, the error left the transfer unanswered: the leader, one offer at a time per follower,
    waited for its ack while the link stayed up and replicated nothing to b again."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.assert_identical(NODES, keys)
    fault = _Once(c.role("b").local[P].store.storage, "create", lambda n: n == MANIFEST)
    keys += c.write_keys("a", range(100, 108))  # flushed: offered to b and c
    c.settle(30)
    assert fault.fired
    assert c.counters("b").get("incoming_write_errors") == 1
    keys += c.write_keys("a", range(200, 208))
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_log_write_error_while_merging_is_acked_and_retried(seed: int) -> None:
    """b leads its side of a cut and takes writes; on the heal a merges b's fork, and its log append
    fails once. Unanswered, a never got b's acknowledged rows: reads on the leader missed them for good."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "b")
    c.cut("b", "c")
    keys += c.write_keys("b", range(50, 58))  # b leads alone
    c.call("b", "flush", partition=P)
    fault = _Once(c.role("a").local[P].store.storage, "append_durable", lambda n: n == WAL)
    c.heal("a", "b")
    c.heal("b", "c")
    c.settle(30)
    assert fault.fired
    assert c.counters("a").get("incoming_write_errors") == 1
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()
