"""JOIN_FINALIZE and SPLIT_FINALIZE from a peer, and the split call, are checked before they are applied.

Applied unchecked, a finalize from a node that holds no replica of the partition, or one naming a target
that is not in the layout, moved the leader's partition to UNLOAD for good (writes refused, the unload
never finished); a split bound that is not a value of the key made every later event raise.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import LocalCall, MessageReceived, PeerUp, Reply, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.layout import Layout, Lifecycle, PartitionSpec, Replica, SplitTarget
from sparkbus.roles.replication.messages import JoinFinalized, ReplicaHello, SplitFinalized
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import EPOCH_BYTES, LSN, read_manifest

from .test_dropped_replica import CONFIG, SPEC, P, make, sent, write

TARGET = PartitionSpec(partition="t/1", replicas=(Replica(node="b", placement=21),), lifecycle=Lifecycle.LOAD)


def leader_with_rows() -> ReplicationRole:
    a = make("a")
    write(a, [1, 2])
    list(a.handle(LocalCall(call_id=5, name="assign", args={"spec": TARGET}), 1.2))
    return a


def reply(actions: list[Any]) -> Reply:
    (r,) = [x for x in actions if isinstance(x, Reply)]
    return r


def still_serving(a: ReplicationRole) -> None:
    list(a.handle(TimerFired(key="replication/tick"), 3.0))  # a later event does not raise
    assert a.local[P].lifecycle is Lifecycle.SERVE
    assert reply(write(a, [7], now=3.1)).error is None


@pytest.mark.parametrize(
    ("peer", "targets"),
    [
        ("b", (SplitTarget(partition="nope/9"),)),  # a replica of P, a target no layout has
        ("b", (SplitTarget(partition=P),)),  # into itself
        ("b", (SplitTarget(partition="t/1", low="zz"),)),  # a string bound on an int64 key
        ("b", (SplitTarget(partition="t/1", high=2**70),)),  # beyond int64
        ("z", (SplitTarget(partition="t/1", high=5),)),  # from a node that holds no replica of P
    ],
)
def test_a_split_finalize_that_cannot_apply_is_ignored(peer: str, targets: tuple[SplitTarget, ...]) -> None:
    a = leader_with_rows()
    list(a.handle(MessageReceived(peer=peer, message=SplitFinalized(partition=P, targets=targets)), 1.5))
    assert a.counters["finalize_refused"] == 1
    still_serving(a)


def test_a_split_finalize_from_a_replica_with_good_targets_applies() -> None:
    a = leader_with_rows()
    msg = SplitFinalized(partition=P, targets=(SplitTarget(partition="t/1", high=5),))
    list(a.handle(MessageReceived(peer="b", message=msg), 1.5))
    assert a.local[P].lifecycle is Lifecycle.UNLOAD and "finalize_refused" not in a.counters


def test_a_join_finalize_from_a_node_without_a_replica_is_ignored() -> None:
    spec = PartitionSpec(
        partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2, joining=True))
    )
    a = make("a", spec)
    list(a.handle(MessageReceived(peer="z", message=JoinFinalized(partition=P, placement=2)), 1.0))
    assert a.counters["finalize_refused"] == 1 and a.layout.partitions[P].replicas[1].joining
    list(a.handle(MessageReceived(peer="b", message=JoinFinalized(partition=P, placement=2)), 1.1))
    assert not a.layout.partitions[P].replicas[1].joining


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        (
            SplitTarget(partition="t/1", high="m"),
            "split bound 'm' of t/1 cannot be compared with a int64 key",
        ),
        (SplitTarget(partition="t/9"), "split target 't/9' is not another partition of the layout"),
    ],
)
def test_a_split_call_that_cannot_apply_is_refused_with_the_reason(target: SplitTarget, problem: str) -> None:
    a = leader_with_rows()
    call = LocalCall(call_id=6, name="split", args={"partition": P, "targets": (target,)})
    got = reply(list(a.handle(call, 1.5)))
    assert got.error is not None and problem in got.error
    assert not a.layout.partitions[P].split_targets
    still_serving(a)


def test_a_split_finalize_from_a_node_an_assign_removed_applies_and_a_join_finalize_does_not() -> None:
    """The removed node may be the split's leader, whose finalize the assign overtook; it is kept in
    the replica's manifest, so a restarted node takes it too."""
    a = leader_with_rows()
    alone = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1),))
    list(a.handle(LocalCall(call_id=6, name="assign", args={"spec": alone}), 1.3))
    assert a.local[P].store.meta["former"] == ["b"]
    list(a.handle(MessageReceived(peer="b", message=JoinFinalized(partition=P, placement=1)), 1.4))
    assert a.counters["finalize_refused"] == 1
    msg = SplitFinalized(partition=P, targets=(SplitTarget(partition="t/1", high=5),))
    list(a.handle(MessageReceived(peer="b", message=msg), 1.5))
    assert a.local[P].lifecycle is Lifecycle.UNLOAD and a.counters["finalize_refused"] == 1


def test_a_split_finalize_naming_a_store_the_node_heard_applies_though_the_layout_dropped_its_sender() -> (
    None
):
    """A node restarted with a layout that no longer places the split's leader never saw the assign
    that removed it; its store heard that leader's hello, so a finalize naming that store is taken.
    One naming another epoch, or no store, is a stranger's: refused."""
    storages: dict[str, MemoryStorage] = {}

    def storage_for(partition: str) -> MemoryStorage:
        return storages.setdefault(partition, MemoryStorage())

    before = ReplicationRole("a", Layout.of([SPEC, TARGET]), storage_for, CONFIG)
    list(before.handle(PeerUp(peer="b"), 0.0))
    epoch = bytes(range(EPOCH_BYTES))
    hello = ReplicaHello(partition=P, placement=2, epoch=epoch, state="member")
    list(before.handle(MessageReceived(peer="b", message=hello), 0.1))
    alone = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1),))
    a = ReplicationRole("a", Layout.of([alone, TARGET]), storage_for, CONFIG)  # restarted: the new layout
    list(a.handle(PeerUp(peer="b"), 1.0))
    targets = (SplitTarget(partition="t/1", high=5),)
    for proof in ({}, {"placement": 2, "epoch": bytes(EPOCH_BYTES)}, {"placement": 1, "epoch": epoch}):
        msg = SplitFinalized(partition=P, targets=targets, **proof)  # type: ignore[arg-type]
        list(a.handle(MessageReceived(peer="b", message=msg), 1.1))
    assert a.counters["finalize_refused"] == 3 and a.local[P].lifecycle is Lifecycle.SERVE
    msg = SplitFinalized(partition=P, targets=targets, placement=2, epoch=epoch)
    answer = sent(a.handle(MessageReceived(peer="b", message=msg), 1.2))
    assert a.local[P].lifecycle is Lifecycle.UNLOAD_FINAL, "split, and a holds no row to unload"
    assert a.counters["finalize_refused"] == 3
    assert [m.partition for m in answer if isinstance(m, SplitFinalized)] == [P], "it tells b it knows"


@pytest.mark.parametrize(
    "fields", [{"placement": 2}, {"epoch": bytes(EPOCH_BYTES)}, {"placement": 2, "epoch": b"short"}]
)
def test_a_split_finalize_names_a_whole_store_or_none(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"placement and epoch|epoch must be"):
        SplitFinalized(partition=P, targets=(SplitTarget(partition="t/1"),), **fields)


def test_a_split_finalize_raises_the_clocks_and_the_finalize_told_again_carries_it() -> None:
    """A target serves from the finalize on, while the source's rows may still be on their way: its
    writes are versioned above the source leader's clock, which is saved before it serves. A source
    replica keeps that clock too, so the finalize it tells a node that comes back carries it."""
    storages: dict[str, MemoryStorage] = {}
    b = ReplicationRole(
        "b", Layout.of([SPEC, TARGET]), lambda p: storages.setdefault(p, MemoryStorage()), CONFIG
    )
    list(b.handle(PeerUp(peer="a"), 0.0))
    msg = SplitFinalized(partition=P, targets=(SplitTarget(partition="t/1"),), lamport=40)
    list(b.handle(MessageReceived(peer="a", message=msg), 1.0))
    assert b.local["t/1"].lifecycle is Lifecycle.SERVE
    assert read_manifest(storages["t/1"], "t/1")["lamport"] == 40
    assert read_manifest(storages[P], P)["lamport"] == 40
    told = sent(b.handle(PeerUp(peer="a"), 2.0))
    assert [m.lamport for m in told if isinstance(m, SplitFinalized)] == [40]
    batch = pa.RecordBatch.from_pydict({"key": [5], "v": ["new"]})
    call = LocalCall(call_id=7, name="write", args={"partition": "t/1", "rows": bytes(encode_batch(batch))})
    assert reply(list(b.handle(call, 2.1))).error is None
    assert b.local["t/1"].store.versioned_rows().column(LSN).to_pylist() == [41]
    older = SplitFinalized(partition=P, targets=(SplitTarget(partition="t/1"),), lamport=3)
    list(b.handle(MessageReceived(peer="a", message=older), 2.2))
    assert b.local["t/1"].store.lamport == 41, "a clock is never lowered"
