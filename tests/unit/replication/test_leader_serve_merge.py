"""Spec 3.5, receive procedure, leader: an offer not based on the root is fast-forwarded when "the partition
state is LOADING and the root segment id is NULL"; otherwise, not referenced, it is merged. So a SERVE leader
with an empty partition merges it, and a LOAD leader (a split target) with an empty partition lists it."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from sparkbus.bus.contract import AcceptStream, BatchReceived, MessageReceived, PeerUp, Send
from sparkbus.roles.replication.layout import Layout, Lifecycle, PartitionSpec, Replica
from sparkbus.roles.replication.messages import SegmentAcked, SegmentOffered, SegmentTransited
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, segment_file

P = "t/0"
SPEC = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2)))


def _minor_segment_of_b() -> tuple[MemoryStorage, object]:
    st = MemoryStorage()
    store = PartitionStore.open(st, P, 2, StoreConfig())
    store.write(pa.table({"key": [1], "v": ["one"]}), 0.0)
    first = store.flush()
    store.write(pa.table({"key": [2], "v": ["two"]}), 0.0)
    second = store.flush()
    assert first is not None and second is not None
    assert first.major and not second.major and second.base_id == first.segment_id
    return st, second


@pytest.mark.parametrize("lifecycle", [Lifecycle.SERVE, Lifecycle.LOAD])
def test_a_leader_with_no_root_merges_a_minor_it_never_had_unless_loading(lifecycle: Lifecycle) -> None:
    src, entry = _minor_segment_of_b()
    storages: dict[str, MemoryStorage] = {}
    a = ReplicationRole(
        "a",
        Layout.of([replace(SPEC, lifecycle=lifecycle)]),
        lambda p: storages.setdefault(p, MemoryStorage()),
        ReplicationConfig(),
    )
    list(a.handle(PeerUp(peer="b"), 0.0))
    rep = a.local[P]
    assert rep.leads and rep.lifecycle is lifecycle and rep.store.root is None
    data = src.read(segment_file(entry.segment_id))
    offer = SegmentOffered(
        partition=P,
        segment_id=entry.segment_id,
        base_id=entry.base_id,
        included=entry.included,
        major=entry.major,
        rows=entry.rows,
        max_lsn=entry.max_lsn,
        size=entry.size,
        checksum=entry.checksum,
        sender=2,
        target=1,
    )
    actions = list(a.handle(MessageReceived(peer="b", message=offer), 1.0))
    (accept,) = [x for x in actions if isinstance(x, AcceptStream)]
    list(
        a.handle(
            BatchReceived(
                peer="b", stream=accept.stream, ordinal=0, last=True, data=data, size=len(data), remaining=0
            ),
            1.0,
        )
    )
    done = list(
        a.handle(
            MessageReceived(
                peer="b",
                message=SegmentTransited(partition=P, segment_id=entry.segment_id, size=len(data), chunks=1),
            ),
            1.0,
        )
    )
    acks = [x.message for x in done if isinstance(x, Send) and isinstance(x.message, SegmentAcked)]
    assert len(acks) == 1 and acks[0].ok, acks
    counters = a.counters
    if lifecycle is Lifecycle.SERVE:
        assert counters.get("merges", 0) == 1 and counters.get("fast_forwards", 0) == 0, dict(counters)
        assert rep.store.root != entry.segment_id  # merged into a segment of the leader's own
    else:
        assert counters.get("fast_forwards", 0) == 1 and counters.get("merges", 0) == 0, dict(counters)
        assert rep.store.root == entry.segment_id  # listed as offered, id and base kept
