"""Spec 3.5, receive procedure, leader: an offer not based on the root "check if is_referenced(P, S):
if yes, decline with EXISTS; if no, accept and merge". A segment the leader folded into a compacted
major (it is in the major's included ids, its own file gone) is referenced: offered again by a
follower, it is declined SEGMENT_EXISTS, not taken and merged a second time."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.bus.contract import MessageReceived, PeerUp, Send
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.messages import (
    DeclineReason,
    SegmentAccepted,
    SegmentDeclined,
    SegmentOffered,
)
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import PartitionStore

P = "t/0"
SPEC = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2)))


def test_a_leader_declines_exists_for_a_segment_its_compacted_major_includes() -> None:
    config = ReplicationConfig()
    storage = MemoryStorage()
    store = PartitionStore.open(storage, P, 1, config.store)
    store.write(pa.table({"key": [1], "v": ["one"]}), 0.0)
    first = store.flush()
    store.write(pa.table({"key": [2], "v": ["two"]}), 0.0)
    minor = store.flush()
    major = store.compact()
    assert first is not None and minor is not None and major is not None
    assert minor.segment_id in major.included
    for old in (first, minor):  # folded into the major: deleted, as the leader's procedure does
        store.delete_segment(old.segment_id)
    assert [e.segment_id for e in store.entries] == [major.segment_id]

    a = ReplicationRole("a", Layout.of([SPEC]), lambda p: storage, config)
    list(a.handle(PeerUp(peer="b"), 0.0))
    rep = a.local[P]
    assert rep.leads and rep.store.root == major.segment_id
    offer = SegmentOffered(
        partition=P,
        segment_id=minor.segment_id,
        base_id=minor.base_id,
        included=minor.included,
        major=minor.major,
        rows=minor.rows,
        max_lsn=minor.max_lsn,
        size=minor.size,
        checksum=minor.checksum,
        sender=2,
        target=1,
    )
    sent = [x.message for x in a.handle(MessageReceived(peer="b", message=offer), 1.0) if isinstance(x, Send)]
    answers = [m for m in sent if isinstance(m, SegmentAccepted | SegmentDeclined)]
    assert len(answers) == 1, sent
    assert isinstance(answers[0], SegmentDeclined), answers
    assert answers[0].reason is DeclineReason.SEGMENT_EXISTS
