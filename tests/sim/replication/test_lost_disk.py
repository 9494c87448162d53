"""A node that comes back with empty storage under its old placements (spec 3.6, second ABA case).

The layout comes from the topology, so a node whose disk was lost keeps its placement ids. Its peers'
acked lists still name them: without the store epochs (``roles/replication/epochs.py``) a follower was
never sent again what it had acked, and a leader served an empty partition while its followers kept
the rows.
"""

from __future__ import annotations

import pytest

from sparkbus.roles.replication.layout import PartitionSpec, Replica
from sparkbus.roles.replication.storage import MemoryStorage, write_whole
from sparkbus.roles.replication.store import MANIFEST

from .cluster import NODES, Cluster, P, spec

SEEDS = [1, 2, 3]


def _loaded(
    seed: int, replicas: tuple[str, ...] = NODES, nodes: tuple[str, ...] = NODES
) -> tuple[Cluster, list[int]]:
    """20 keys written on a, flushed and replicated to ``replicas``."""
    c = Cluster([spec(*replicas)], seed=seed, nodes=nodes)
    keys = c.write_keys("a", range(20))
    c.call("a", "flush", partition=P)
    c.settle(10)
    c.assert_identical(replicas, keys)
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


def _until_a_rejoins(c: Cluster) -> None:
    """Run until a takes itself for joining, before its leader finalizes it."""
    for _ in range(200):
        if _partition(c, "a")["joining"] == ["a"]:
            break
        c.settle(0.005)
    assert _partition(c, "a")["joining"] == ["a"] and _partition(c, "b")["joining"] == ["a"]


@pytest.mark.parametrize("seed", SEEDS)
def test_two_replicas_that_lost_their_disks_one_after_the_other_still_elect_a_leader(seed: int) -> None:
    # a rejoins; before b has finalized it, b loses its disk too. Each took the other for rejoining (or a
    # fresh b took a for a member): no replica was electable on a, and b named a, for good.
    c, _ = _loaded(seed, ("a", "b"), ("a", "b"))
    c.lose_disk("a")
    _until_a_rejoins(c)
    c.lose_disk("b")
    c.settle(30)
    assert c.leader("a") == c.leader("b") is not None
    leader = c.leader("a")
    assert leader is not None
    new = c.write_keys(leader, range(100, 105), "new")
    assert new == list(range(100, 105))
    c.settle(20)
    assert set(new) <= set(c.read("a")["key"]) and c.read("a") == c.read("b")
    assert _partition(c, "a")["joining"] == [] == _partition(c, "b")["joining"]
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_two_replicas_that_lost_their_disks_at_once_both_rejoin(seed: int) -> None:
    # b took both for rejoining; a's fresh store heard c's first hello as a member's and, leading, never
    # finalized it: c stayed joining in b's and its own view. A hello now says what the store knows.
    c, keys = _loaded(seed)
    c.crash("a")
    c.crash("c")
    for owner, part in list(c.storages):
        if owner in ("a", "c"):
            c.storages[owner, part] = MemoryStorage()
    c.restart("a")
    c.restart("c")
    c.settle(40)
    c.assert_identical(NODES, keys)
    for n in NODES:
        assert _partition(c, n)["joining"] == [], n
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_placed_while_its_links_are_up_is_known_by_its_epoch(seed: int) -> None:
    # Its hello went only with a PeerUp: placed by assign, its peers never recorded its epoch and took
    # the empty store it came back with after a lost disk for the first one they heard.
    c, keys = _loaded(seed, ("a", "b"))
    for n in NODES:
        c.call(n, "assign", spec=spec(*NODES))
    c.specs = [spec(*NODES)]  # the topology places c now
    c.settle(20)
    c.assert_identical(NODES, keys)
    c.lose_disk("c")
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_drained_and_placed_again_under_its_old_placement_is_caught_up(
    seed: int, restart: bool
) -> None:
    # The end of its drain emptied the store and kept the epoch: its peers' acked lists still named the
    # placement, so placed again it stayed empty. An emptied store draws a new epoch.
    c, keys = _loaded(seed)
    for n in NODES:
        c.call(n, "assign", spec=spec("a", "b"))
    c.settle(10)
    assert c.counters("c").get("drains_done") == 1
    for n in NODES:
        c.call(n, "assign", spec=spec(*NODES))
    if restart:
        c.crash("c")
        c.restart("c")
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("placement", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_an_assign_in_the_middle_of_a_rejoin_keeps_it(seed: int, placement: int) -> None:
    # The assign's spec (from the topology) cleared the joining flags: the empty store was elected, and
    # after a restart the nodes disagreed on who leads, both refusing writes.
    c, keys = _loaded(seed, ("a", "b"))
    c.lose_disk("a")
    _until_a_rejoins(c)
    # b's replica moves to c (2: the id the topology gives the second replica; 3: a new one).
    moved = PartitionSpec(
        partition=P, replicas=(Replica(node="a", placement=1), Replica(node="c", placement=placement))
    )
    for n in NODES:
        c.call(n, "assign", spec=moved)
    assert c.leader("a") != "a", "still rejoining: not elected"
    c.specs = [moved]
    c.settle(20)
    c.crash("a")
    c.restart("a")
    c.settle(30)
    assert c.leader("a") == c.leader("c") is not None
    leader = c.leader("c")
    assert leader is not None
    keys += c.write_keys(leader, range(100, 103), "new")
    c.settle(20)
    c.assert_identical(["a", "c"], keys)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_draining_replica_keeps_what_only_a_store_since_lost_held(seed: int) -> None:
    """A drainer hears no hello (hellos go to replicas), so it cannot tell that a holder's acks are of
    a store lost since. It used to drop the 20 keys b had acked, after b came back empty and c, the
    other replica, had never held them: it now counts only the acks of its own drain."""
    c = Cluster([spec(*NODES)], seed=seed)
    c.crash("c")
    keys = c.write_keys("a", range(20))
    c.call("a", "flush", partition=P)
    c.settle(10)  # a and b hold the 20 keys; c none
    keys += c.write_keys("a", range(100, 102), "log")  # in a's log only: a drains at least these
    c.crash("b")
    new = spec("b", "c", first_placement=2)  # b keeps its placement
    c.call("a", "assign", spec=new)
    c.specs = [new]
    c.settle(2)
    assert c.status("a")["draining"], "a drains: no replica of the new layout is up"
    for owner, part in list(c.storages):  # b's disk is lost while it is down
        if owner == "b":
            c.storages[owner, part] = MemoryStorage()
    c.restart("b")
    c.settle(20)
    c.restart("c")
    c.settle(30)
    assert c.status("a")["draining"] == {}
    c.assert_identical(("b", "c"), keys)
    c.assert_clean()


@pytest.mark.parametrize("how", ["restarted", "assigned behind a cut"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_re_placed_replica_keeps_what_only_a_store_since_lost_held(seed: int, how: str) -> None:
    """A re-placed replica cannot tell that a holder's acks are of a store lost since either: down, or
    cut off, it never heard that store's new hello. It used to carry over only the segments no other
    replica had acked and delete the rest, so the 20 keys b had acked were lost on both nodes. It now
    carries every live row, as a drainer does."""
    c, keys = _loaded(seed, ("a", "b"), ("a", "b"))
    moved = PartitionSpec(
        partition=P, replicas=(Replica(node="a", placement=11), Replica(node="b", placement=2))
    )
    if how == "restarted":  # b loses its disk while a is down; a restarts under a new placement
        c.crash("a")
        c.lose_disk("b")
        c.settle(5)
        c.specs = [moved]
        c.restart("a")
        c.call("b", "assign", spec=moved)
    else:  # b loses its disk behind a cut; an assign re-places a before the link heals
        c.cut("a", "b")
        c.lose_disk("b")
        c.settle(5)
        for n in ("a", "b"):
            c.call(n, "assign", spec=moved)
        c.heal("a", "b")
    c.settle(30)
    assert c.status("a")["partitions"][P]["placement"] == 11
    c.assert_identical(("a", "b"), keys)
    c.assert_clean()


def _damage(storage: MemoryStorage, what: str) -> None:
    """Flip a byte of the manifest, or of the first listed segment (bit rot the checksums catch)."""
    name = MANIFEST if what == "manifest" else next(n for n in storage.names() if n.startswith("seg-"))
    data = bytearray(storage.read(name))
    data[len(data) // 2] ^= 0xFF
    write_whole(storage, name, [bytes(data)])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("what", ["manifest", "segment"])
@pytest.mark.parametrize("node", ["a", "b"])
def test_a_store_that_fails_its_checksums_at_start_is_set_aside_and_rejoins(
    seed: int, what: str, node: str
) -> None:
    """The leader's or a follower's store damaged while the node was down: raised at start, the error
    stopped the role (no tick, no election) for every partition of the node. Its files are renamed
    aside and the replica rejoins like one that lost its disk; its peers keep and send every row."""
    c, keys = _loaded(seed)
    c.crash(node)
    _damage(c.storages[node, P], what)
    c.restart(node)
    c.settle(20)
    c.assert_identical(NODES, keys)
    _assert_rejoined(c, node, NODES.index(node) + 1)
    assert c.counters(node).get("stores_set_aside") == 1 and c.role_errors()[node] == 0
    assert "checksum" in c.status(node)["damaged"][P] or "magic" in c.status(node)["damaged"][P]
    names = c.storages[node, P].names()
    assert "damaged1-MANIFEST" in names and any(n.startswith("damaged1-seg-") for n in names)
    keys += c.write_keys(c.leader("c"), range(100, 104), "after")
    c.settle(10)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_damaged_store_keeps_its_log_so_writes_acknowledged_since_the_last_flush_are_served(
    seed: int,
) -> None:
    """The log's records are checked one by one and replay is idempotent: it is not set aside with the
    segments. Set aside with them, the writes only a's log held were served nowhere."""
    c, keys = _loaded(seed)
    keys += c.write_keys("a", range(200, 202), "logged")  # acknowledged, in a's log only
    c.crash("a")
    _damage(c.storages["a", P], "segment")
    c.restart("a")
    c.settle(20)
    c.assert_identical(NODES, keys)
    assert c.counters("a").get("stores_set_aside") == 1
    c.assert_clean()
