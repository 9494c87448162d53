"""A replica its peers hold for absent whose node restarts with the disk repaired opens at start.

Only a store that opened again on a tick said it returns: this one's hello said nothing of it, its peers
dropped their record of its absence and it led at once, without the rows the other replica took while it
was away, and a write it then took of such a key got a version below the older row. Now a peer that held
it for absent takes it for returning and tells it so (``ReplicaReturns``): both sides agree, it leads again
once caught up.
"""

from __future__ import annotations

import pytest

from .cluster import P
from .test_unopened_replica import _first_led, _later_write_wins, _leaders, _loaded


@pytest.mark.parametrize("nodes", [("a", "b"), ("a", "b", "c")])
def test_a_replica_absent_until_a_restart_returns_before_it_leads(nodes: tuple[str, ...]) -> None:
    c, disk, acked = _loaded(seed=3, nodes=nodes)
    meanwhile = c.write_keys("b", range(8, 20), tag="w")  # three flushes on b
    assert meanwhile == list(range(8, 20))
    assert "a" in c.status("b")["partitions"][P]["absent"]
    c.crash("a")
    disk.failing = False  # repaired while the node was down
    c.restart("a")
    first_led, both = _first_led(c, nodes, 15.0)
    assert both == [], f"two nodes led at {both[:5]}"
    assert first_led == [sorted(acked + meanwhile)], (
        "a led again before it held what b took while it was away"
    )
    assert _leaders(c, nodes) == dict.fromkeys(nodes, "a")
    assert c.counters("a")["returns"] == 1 and c.counters("b")["caught_up"] == 1
    assert all(c.status(n)["partitions"][P]["returning"] == [] for n in nodes)
    c.assert_identical(list(nodes), acked + meanwhile)


def test_a_write_taken_by_the_restarted_replica_is_not_overwritten_by_an_older_one() -> None:
    c, disk, _ = _loaded(seed=3)
    assert c.write_keys("b", range(8, 20), tag="old") == list(range(8, 20))
    c.crash("a")
    disk.failing = False
    c.restart("a")
    _later_write_wins(c)


@pytest.mark.parametrize("nodes", [("a", "b"), ("a", "b", "c")])
def test_a_returning_replica_restarted_before_caught_up_does_not_lead_without_the_rows(
    nodes: tuple[str, ...],
) -> None:
    """Returning lives in the node's memory: restarted before the leader caught it up, its first hello
    said nothing of it, and the peer that held it returning took that for caught up."""
    c, disk, acked = _loaded(seed=3, nodes=nodes)
    meanwhile = c.write_keys("b", range(8, 20), tag="w")  # flushed on b while a is away
    assert meanwhile == list(range(8, 20))
    disk.failing = False  # the next tick opens a's replica again: it returns
    c.sim.run_until(lambda: (P, 1) in c.role("b").returning, limit=5)
    c.crash("a")
    assert c.role("b").counters.get("caught_up", 0) == 0 and (P, 1) in c.role("b").returning
    c.restart("a")
    first_led, both = _first_led(c, nodes, 15.0)
    assert both == [], f"two nodes led at {both[:5]}"
    assert first_led == [sorted(acked + meanwhile)], "a led again before it held what b took meanwhile"
    c.assert_identical(list(nodes), acked + meanwhile)


def test_a_write_taken_by_a_returning_replica_restarted_before_caught_up_is_not_lost() -> None:
    c, disk, _ = _loaded(seed=3)
    assert c.write_keys("b", range(8, 20), tag="old") == list(range(8, 20))
    disk.failing = False
    c.sim.run_until(lambda: (P, 1) in c.role("b").returning, limit=5)
    c.crash("a")
    c.restart("a")
    _later_write_wins(c)
