"""A node that comes back with empty storage under its old placements (spec 3.6, second ABA case).

The layout comes from the topology, so a node whose disk was lost keeps its placement ids. Its peers'
acked lists still name them: without the store epochs (``roles/replication/epochs.py``) a follower was
never sent again what it had acked, and a leader served an empty partition while its followers kept
the rows.
"""

from __future__ import annotations

import pytest

from .cluster import NODES, Cluster, P, spec

SEEDS = [1, 2, 3]


def _loaded(seed: int) -> tuple[Cluster, list[int]]:
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(20))
    c.call("a", "flush", partition=P)
    c.settle(10)
    c.assert_identical(NODES, keys)
    return c, keys


def _partition(c: Cluster, node: str) -> dict[str, object]:
    part: dict[str, object] = c.status(node)["partitions"][P]
    return part


def _assert_rejoined(c: Cluster, node: str, placement: int) -> None:
    for n in NODES:
        assert _partition(c, n)["joining"] == [], n
        if n != node:
            epochs = _partition(c, n)["epochs"]
            assert isinstance(epochs, dict) and epochs[placement][1] == "joined", (n, epochs)
    assert c.counters(node).get("rejoins") == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_follower_that_lost_its_disk_rejoins_and_is_caught_up(seed: int) -> None:
    c, keys = _loaded(seed)
    c.lose_disk("b")
    c.settle(20)
    c.assert_identical(NODES, keys)
    assert c.counters("a").get("replica_resets") == 1 and c.counters("c").get("replica_resets") == 1
    _assert_rejoined(c, "b", 2)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_leader_that_lost_its_disk_never_empties_its_followers_and_leads_again_once_caught_up(
    seed: int,
) -> None:
    c, keys = _loaded(seed)
    c.lose_disk("a")
    # Spec 3.6: the followers must not take the empty partition for one the placement acked.
    for _ in range(80):
        c.settle(0.25)
        for n in ("b", "c"):
            assert set(keys) <= set(c.read(n).get("key", [])), n
    c.assert_identical(NODES, keys)
    _assert_rejoined(c, "a", 1)
    assert [c.leader(n) for n in NODES] == ["a", "a", "a"], "first in placement order, caught up"
    keys += c.write_keys("a", range(100, 105), "new")
    c.settle(10)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_writes_a_leader_took_before_it_learned_its_disk_was_lost_are_kept(seed: int) -> None:
    # Its peers are down: it leads alone and acknowledges writes, as two leaders would (spec 3.2). Its
    # new segments must not take the ids of the old store's, which its peers still hold.
    c, keys = _loaded(seed)
    c.crash("b")
    c.crash("c")
    c.lose_disk("a")
    new = c.write_keys("a", range(100, 110), "new")
    assert new == list(range(100, 110))
    c.call("a", "flush", partition=P)
    c.restart("b")
    c.restart("c")
    c.settle(40)
    c.assert_identical(NODES, keys + new)
    _assert_rejoined(c, "a", 1)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_down_during_the_rejoin_learns_of_it_when_it_comes_back(seed: int) -> None:
    c, keys = _loaded(seed)
    c.crash("c")
    c.lose_disk("a")
    c.settle(20)
    assert c.counters("b").get("joins_finalized") == 1, "b led while a rejoined, and finalized it"
    assert c.leader("a") == "a"
    c.restart("c")  # it knew a's old store: a's hello and the finalize reach it in either order
    c.settle(20)
    c.assert_identical(NODES, keys)
    _assert_rejoined(c, "a", 1)
    assert c.leader("c") == "a"
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restart_with_its_disk_is_not_a_rejoin(seed: int) -> None:
    c, keys = _loaded(seed)
    c.crash("b")
    c.restart("b")
    c.crash("a")
    c.restart("a")
    c.settle(20)
    c.assert_identical(NODES, keys)
    for n in NODES:
        counters = c.counters(n)
        assert "replica_resets" not in counters and "rejoins" not in counters, (n, counters)
        assert _partition(c, n)["joining"] == []
    c.assert_clean()
