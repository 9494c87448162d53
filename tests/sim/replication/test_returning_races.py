"""Races around a replica that returns after its node restarted with the disk repaired: a write it takes
before its links are up, and a ReplicaReturns that crosses the leader's word that it caught up."""

from __future__ import annotations

import pytest

from .cluster import P
from .test_unopened_replica import _leading, _loaded, _watch


@pytest.mark.parametrize("nodes", [("a", "b"), ("a", "b", "c")])
def test_a_write_taken_right_after_the_restart_is_not_lost_to_older_rows(nodes: tuple[str, ...]) -> None:
    """a was away while b took key 8 ("old8"); a restarts with the disk repaired and, before its links are
    up, a client's write of key 8 reaches it: a leads in its own view (no peer is live yet), acknowledges
    "new8", and that acknowledged write is then lost to b's older row on every node."""
    c, disk, _ = _loaded(seed=3, nodes=nodes)
    assert c.write_keys("b", range(8, 20), tag="old") == list(range(8, 20))
    c.crash("a")
    disk.failing = False
    c.restart("a")
    _, error = c.write("a", P, {"key": [8], "v": ["new8"]})
    c.settle(20.0)
    for node in nodes:
        rows = c.read(node)
        got = dict(zip(rows["key"], rows["v"], strict=True))
        assert error is not None or got[8] == "new8", (
            f"{node}: the write of key 8 that a acknowledged was lost: {got[8]!r}"
        )


def test_a_late_replica_returns_does_not_send_a_caught_up_leader_back_to_returning() -> None:
    """Three replicas, nothing written while a was away: b says ReplicaCaughtUp at once, and c's
    ReplicaReturns (its answer to a's first hello) arrives after it. a, already leading, takes itself for
    returning again, steps down and must be caught up a second time (a leaderless gap, writes refused)."""
    nodes = ("a", "b", "c")
    c, disk, _ = _loaded(seed=7, nodes=nodes)
    c.crash("a")
    disk.failing = False
    c.restart("a")
    history: list[tuple[float, tuple[str, ...]]] = []

    def seen() -> None:
        leading = tuple(_leading(c, nodes))
        if not history or history[-1][1] != leading:
            history.append((c.sim.now, leading))

    _watch(c, 15.0, seen)
    assert c.counters("a")["returns"] == 1, f"a returned {c.counters('a')['returns']} times: {history}"
    led_by_a = [i for i, (_, leading) in enumerate(history) if leading == ("a",)]
    assert len(led_by_a) == 1, f"a led, stepped down and led again: {history}"
