"""Races around a replica that returns after its node restarted with the disk repaired: a ReplicaReturns
that crosses the leader's word that it caught up."""

from __future__ import annotations

from .test_unopened_replica import _leading, _loaded, _watch


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
