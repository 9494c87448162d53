"""Spec 3.5, receive procedure, follower, an offer from the leader not based on the root: "check if
is_referenced(P, S): if yes, decline with EXISTS; if no, check if the segment is a major segment". A
segment the follower folded into a compacted major (in the major's included ids, its own file gone) is
referenced: offered again by the leader it is declined SEGMENT_EXISTS. Not a fast-forward of the old
major (which would put the partition's root back to it) and not OUT_OF_ORDER for the minor (which makes
the leader drop its acked list and compact again)."""

from __future__ import annotations

import pytest

from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.messages import DeclineReason, SegmentDeclined
from sparkbus.roles.replication.storage import MemoryStorage

from .offers import P, answer, compacted, started


@pytest.mark.parametrize("which", ["first major", "minor"])
def test_a_follower_declines_exists_for_a_segment_its_compacted_major_includes(which: str) -> None:
    config = ReplicationConfig()
    storage = MemoryStorage()
    first, minor, major = compacted(storage, 2, config.store)

    b = started("b", storage=storage, config=config)
    rep = b.local[P]
    assert not rep.leads and rep.leader is not None and rep.leader.node == "a"
    assert rep.store.root == major.segment_id
    declined = answer(b, first if which == "first major" else minor)
    assert isinstance(declined, SegmentDeclined), declined
    assert declined.reason is DeclineReason.SEGMENT_EXISTS
    assert rep.store.root == major.segment_id
