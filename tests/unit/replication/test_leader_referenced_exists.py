"""Spec 3.5, receive procedure, leader: an offer not based on the root "check if is_referenced(P, S):
if yes, decline with EXISTS; if no, accept and merge". A segment the leader folded into a compacted
major (it is in the major's included ids, its own file gone) is referenced: offered again by a
follower, it is declined SEGMENT_EXISTS, not taken and merged a second time."""

from __future__ import annotations

from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.messages import DeclineReason, SegmentDeclined
from sparkbus.roles.replication.storage import MemoryStorage

from .offers import P, answer, compacted, started


def test_a_leader_declines_exists_for_a_segment_its_compacted_major_includes() -> None:
    config = ReplicationConfig()
    storage = MemoryStorage()
    _, minor, major = compacted(storage, 1, config.store)

    a = started("a", storage=storage, config=config)
    rep = a.local[P]
    assert rep.leads and rep.store.root == major.segment_id
    declined = answer(a, minor)
    assert isinstance(declined, SegmentDeclined), declined
    assert declined.reason is DeclineReason.SEGMENT_EXISTS
