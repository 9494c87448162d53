"""Store epochs at role level: REPLICA_HELLO, REPLICA_REJOIN and the finalize of a rejoin, and what a peer
may not make a replica believe with them (``roles/replication/epochs.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.bus.contract import MessageReceived, PeerUp, Send, TimerFired
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.messages import JoinFinalized, ReplicaHello, ReplicaRejoin, SegmentOffered
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage

from .test_dropped_replica import CONFIG, P, write

SPEC = PartitionSpec(
    partition=P,
    replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2), Replica(node="c", placement=3)),
)
OLD, NEW, OTHER = b"\x01" * 8, b"\x02" * 8, b"\x03" * 8
MINE = b"\xee" * 8  # stands for the receiver's own (random) epoch in parameters


def role(node: str, storages: dict[str, MemoryStorage] | None = None) -> ReplicationRole:
    kept = {} if storages is None else storages
    r = ReplicationRole(node, Layout.of([SPEC]), lambda p: kept.setdefault(p, MemoryStorage()), CONFIG)
    list(r.handle(TimerFired(key="replication/tick"), 0.0))
    return r


def receive(r: ReplicationRole, peer: str, msg: Any, now: float = 1.0) -> list[Any]:
    return [x.message for x in r.handle(MessageReceived(peer=peer, message=msg), now) if isinstance(x, Send)]


def joining(r: ReplicationRole) -> list[str]:
    return [x.node for x in r.layout.partitions[P].replicas if x.joining]


def record(r: ReplicationRole, placement: int) -> list[str] | None:
    epochs: dict[int, list[str]] = r._call_status({})["partitions"][P]["epochs"]
    return epochs.get(placement)


def test_a_peer_up_names_our_store_before_anything_else_of_the_partition() -> None:
    a = role("a")
    write(a, [1, 2])
    sent = [x.message for x in a.handle(PeerUp(peer="b"), 2.0) if isinstance(x, Send)]
    assert sent[0] == ReplicaHello(partition=P, placement=1, epoch=a.local[P].store.epoch)
    assert any(isinstance(m, SegmentOffered) for m in sent[1:]), "and then the offer of the unacked segment"


def test_the_first_epoch_is_taken_and_another_one_makes_the_placement_rejoin() -> None:
    a = role("a")
    write(a, [1, 2])
    rep = a.local[P]
    segment = rep.store.entries[0].segment_id
    assert receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD)) == []
    assert record(a, 2) == [OLD.hex(), "member"]
    rep.store.set_acked(segment, frozenset({2, 3}))
    assert receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD)) == [], "the same store again"
    assert joining(a) == []

    sent = receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW), 2.0)
    assert ReplicaRejoin(partition=P, placement=2, epoch=NEW) in sent
    assert record(a, 2) == [NEW.hex(), "rejoining"] and joining(a) == ["b"]
    assert rep.store.entry(segment).acked == frozenset({3}), "what the old store acked is gone with it"
    assert a.counters["replica_resets"] == 1
    # A hello of the same new store (it restarted before it saved the rejoin) repeats the rejoin.
    assert receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW), 3.0)[0] == ReplicaRejoin(
        partition=P, placement=2, epoch=NEW
    )


@pytest.mark.parametrize(
    ("peer", "msg"),
    [
        ("z", ReplicaHello(partition=P, placement=2, epoch=NEW)),  # holds no replica
        ("c", ReplicaHello(partition=P, placement=2, epoch=NEW)),  # not its placement
        ("b", ReplicaHello(partition="t/9", placement=2, epoch=NEW)),  # a partition we do not hold
        ("z", ReplicaRejoin(partition=P, placement=1, epoch=MINE)),  # holds no replica
        ("b", ReplicaRejoin(partition=P, placement=3, epoch=MINE)),  # not our placement
        ("b", ReplicaRejoin(partition=P, placement=1, epoch=OTHER)),  # not our store
    ],
)
def test_a_hello_or_rejoin_that_does_not_fit_is_ignored(peer: str, msg: Any) -> None:
    a = role("a")
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    if isinstance(msg, ReplicaRejoin) and msg.epoch == MINE:
        msg = ReplicaRejoin(partition=P, placement=msg.placement, epoch=a.local[P].store.epoch)
    assert receive(a, peer, msg) == []
    assert a.counters["epoch_refused"] == 1
    assert joining(a) == [] and record(a, 2) == [OLD.hex(), "member"] and record(a, 1) is None
    assert "replica_resets" not in a.counters and "rejoins" not in a.counters


def test_a_rejoining_replica_stays_joining_across_a_restart_until_finalized() -> None:
    storages: dict[str, MemoryStorage] = {}
    b = role("b", storages)
    epoch = b.local[P].store.epoch
    receive(b, "a", ReplicaRejoin(partition=P, placement=2, epoch=epoch))
    assert joining(b) == ["b"] and b.counters["rejoins"] == 1
    again = role("b", {p: s.crashed() for p, s in storages.items()})
    assert again.local[P].store.epoch == epoch and joining(again) == ["b"]
    receive(again, "a", JoinFinalized(partition=P, placement=2, epoch=epoch))
    assert joining(again) == [] and record(again, 2) == [epoch.hex(), "joined"]
    assert receive(again, "a", ReplicaRejoin(partition=P, placement=2, epoch=epoch)) == []
    assert joining(again) == [], "a late rejoin does not undo the finalize"


def test_a_finalize_of_another_epoch_waits_for_that_stores_hello() -> None:
    a = role("a")
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    # c finalized b's rejoin under NEW before b's own hello reached us (another link).
    receive(a, "c", JoinFinalized(partition=P, placement=2, epoch=NEW))
    assert record(a, 2) == [OLD.hex(), "member"] and joining(a) == []
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW))
    assert record(a, 2) == [NEW.hex(), "joined"] and joining(a) == [], "a new store, already finalized"
    # A finalize of yet another store of b changes nothing until that store's hello.
    receive(a, "c", JoinFinalized(partition=P, placement=2, epoch=OTHER))
    assert record(a, 2) == [NEW.hex(), "joined"] and a.counters["replica_resets"] == 1
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OTHER))
    assert a.counters["replica_resets"] == 2 and record(a, 2) == [OTHER.hex(), "joined"]


def test_an_old_finalize_does_not_end_the_rejoin_of_a_newer_store() -> None:
    a = role("a")
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW))
    assert joining(a) == ["b"]
    receive(a, "c", JoinFinalized(partition=P, placement=2, epoch=OLD))
    assert joining(a) == ["b"] and record(a, 2) == [NEW.hex(), "rejoining"]


def test_a_leader_with_nothing_to_send_finalizes_a_rejoin_at_once() -> None:
    a = role("a")
    for peer in ("b", "c"):
        list(a.handle(PeerUp(peer=peer), 0.5))
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    sent = receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW), 2.0)
    final = JoinFinalized(partition=P, placement=2, epoch=NEW)
    assert sent.count(final) == 2, "to b and c, both up"
    assert joining(a) == [] and record(a, 2) == [NEW.hex(), "joined"]
    # A peer that comes back hears it again, after our hello.
    resent = [x.message for x in a.handle(PeerUp(peer="c"), 3.0) if isinstance(x, Send)]
    assert isinstance(resent[0], ReplicaHello) and final in resent


def test_a_hello_says_what_the_store_knows_of_itself() -> None:
    a = role("a")
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    # Another peer told b it rejoins (b's first hello to us said member): its next hello says so.
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD, state="rejoining"))
    assert record(a, 2) == [OLD.hex(), "rejoining"] and joining(a) == ["b"]
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD, state="joined"))
    assert record(a, 2) == [OLD.hex(), "joined"] and joining(a) == []
    # A lagging hello does not undo a finalize, and a new store already finalized is taken as one.
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD, state="rejoining"))
    assert joining(a) == []
    assert receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=NEW, state="joined")) == []
    assert record(a, 2) == [NEW.hex(), "joined"] and joining(a) == []


def test_a_layout_join_is_not_ended_by_a_members_hello() -> None:
    spec = PartitionSpec(
        partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2, joining=True))
    )
    a = ReplicationRole("a", Layout.of([spec]), lambda p: MemoryStorage(), CONFIG)
    list(a.handle(TimerFired(key="replication/tick"), 0.0))
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    assert joining(a) == ["b"], "only the leader's JOIN_FINALIZE ends a join the layout placed"


def test_when_every_replica_rejoins_the_first_in_placement_order_leads() -> None:
    a = role("a")
    for peer in ("b", "c"):
        list(a.handle(PeerUp(peer=peer), 0.5))
    epoch = a.local[P].store.epoch
    receive(a, "b", ReplicaRejoin(partition=P, placement=1, epoch=epoch))
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD, state="rejoining"))
    assert sorted(joining(a)) == ["a", "b"]
    assert a.local[P].leader is not None and a.local[P].leader.node == "c", "the only member leads"
    sent = receive(a, "c", ReplicaHello(partition=P, placement=3, epoch=OLD, state="rejoining"))
    # No member is left: a, first in placement order, leads; holding nothing, it finalizes b and c at
    # once, and b, the first member again, leads.
    assert JoinFinalized(partition=P, placement=2, epoch=OLD) in sent
    assert JoinFinalized(partition=P, placement=3, epoch=OLD) in sent
    assert joining(a) == ["a"] and a.local[P].leader is not None and a.local[P].leader.node == "b"
