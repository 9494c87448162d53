"""One replication role driven by hand through the receive procedure of spec 3.5: its peer offers it a
segment (``SegmentOffered``), and, accepted, hands the segment's bytes over as one batch and says they are
whole (``SegmentTransited``). The partition ``P`` has two replicas: ``a`` (placement 1) and ``b`` (2)."""

from __future__ import annotations

from dataclasses import fields

import pyarrow as pa

from sparkbus.bus.contract import AcceptStream, BatchReceived, MessageReceived, PeerUp, Send
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.messages import (
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
)
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.segments import SegmentEntry
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig

P = "t/0"
SPEC = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2)))
PLACEMENT = {r.node: r.placement for r in SPEC.replicas}


def peer_of(node: str) -> str:
    """The other replica of ``SPEC``."""
    (peer,) = [n for n in PLACEMENT if n != node]
    return peer


def started(
    node: str,
    spec: PartitionSpec = SPEC,
    storage: MemoryStorage | None = None,
    config: ReplicationConfig | None = None,
) -> ReplicationRole:
    """Node ``node``'s role for ``spec``, told its peer is up: its partition on ``storage`` (what it had
    stored before it started), or on a new, empty ``MemoryStorage``."""
    storages: dict[str, MemoryStorage] = {}

    def storage_for(partition: str) -> MemoryStorage:
        return storage if storage is not None else storages.setdefault(partition, MemoryStorage())

    role = ReplicationRole(node, Layout.of([spec]), storage_for, config or ReplicationConfig())
    list(role.handle(PeerUp(peer=peer_of(node)), 0.0))
    return role


def two_segments(
    storage: MemoryStorage, placement: int, config: StoreConfig
) -> tuple[PartitionStore, SegmentEntry, SegmentEntry]:
    """A store of ``placement`` on ``storage`` with a major segment and a minor one based on it."""
    store = PartitionStore.open(storage, P, placement, config)
    store.write(pa.table({"key": [1], "v": ["one"]}), 0.0)
    first = store.flush()
    store.write(pa.table({"key": [2], "v": ["two"]}), 0.0)
    minor = store.flush()
    assert first is not None and minor is not None
    assert first.major and not minor.major and minor.base_id == first.segment_id
    return store, first, minor


def compacted(
    storage: MemoryStorage, placement: int, config: StoreConfig
) -> tuple[SegmentEntry, SegmentEntry, SegmentEntry]:
    """``two_segments`` compacted into a major that includes both; the two are then deleted, as the
    replication procedure does, so only the major is left."""
    store, first, minor = two_segments(storage, placement, config)
    major = store.compact()
    assert major is not None
    assert {first.segment_id, minor.segment_id} <= set(major.included)
    for old in (first, minor):
        store.delete_segment(old.segment_id)
    assert [e.segment_id for e in store.entries] == [major.segment_id]
    return first, minor, major


def offer(entry: SegmentEntry, sender: str) -> SegmentOffered:
    """``entry`` of ``P`` offered by node ``sender`` to the other replica: each field the entry has too
    (id, base, included, size, checksum...) is the entry's."""
    described = {f.name: getattr(entry, f.name) for f in fields(SegmentOffered) if hasattr(entry, f.name)}
    return SegmentOffered(
        partition=P, sender=PLACEMENT[sender], target=PLACEMENT[peer_of(sender)], **described
    )


def answer(role: ReplicationRole, entry: SegmentEntry) -> SegmentAccepted | SegmentDeclined:
    """What ``role`` answers its peer's offer of ``entry``: one accept or one decline."""
    peer = peer_of(role.node)
    sent = [
        x.message
        for x in role.handle(MessageReceived(peer=peer, message=offer(entry, peer)), 1.0)
        if isinstance(x, Send)
    ]
    answers = [m for m in sent if isinstance(m, SegmentAccepted | SegmentDeclined)]
    assert len(answers) == 1, sent
    return answers[0]


def accept(role: ReplicationRole, entry: SegmentEntry) -> str:
    """The stream ``role`` opens to take its peer's offer of ``entry`` (it must take it)."""
    peer = peer_of(role.node)
    actions = list(role.handle(MessageReceived(peer=peer, message=offer(entry, peer)), 1.0))
    accepts = [x for x in actions if isinstance(x, AcceptStream)]
    assert len(accepts) == 1, actions
    return accepts[0].stream


def finish(role: ReplicationRole, stream: str, entry: SegmentEntry, data: bytes) -> SegmentAcked:
    """Hand ``data``, the whole of ``entry``, over ``stream`` as one batch, say it is whole, and return the
    one ack ``role`` sends."""
    peer = peer_of(role.node)
    batch = BatchReceived(
        peer=peer, stream=stream, ordinal=0, last=True, data=data, size=len(data), remaining=0
    )
    list(role.handle(batch, 1.0))
    transited = SegmentTransited(partition=P, segment_id=entry.segment_id, size=len(data), chunks=1)
    done = list(role.handle(MessageReceived(peer=peer, message=transited), 1.0))
    acks = [x.message for x in done if isinstance(x, Send) and isinstance(x.message, SegmentAcked)]
    assert len(acks) == 1, done
    return acks[0]


def transfer(role: ReplicationRole, entry: SegmentEntry, data: bytes) -> SegmentAcked:
    """Offer ``entry`` to ``role``, hand it over whole, and return ``role``'s ack."""
    return finish(role, accept(role, entry), entry, data)
