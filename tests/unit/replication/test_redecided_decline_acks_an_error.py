"""Spec 3.5: the leader adds a replica to a segment's acked list once the replica took the segment, and a
follower deletes what its leader acked. The receiver decides again when the bytes are whole (the partition
may have moved on while they travelled): a segment that no longer applies and is not there (here a minor
whose base is no longer the follower's root: OUT_OF_ORDER) is dropped, and its ack must then say so
(``ok`` false). An ok ack would have its sender count the segment as replicated while no replica holds it."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig, segment_file

from .harness import flushed
from .offers import P, accept, finish, started, transfer, two_segments


def test_a_segment_that_no_longer_applies_when_its_bytes_are_whole_is_acked_with_an_error() -> None:
    # The leader's history: a major and a minor on it; and another major, of a history the leader
    # moved to (written on a store of its own, so it includes neither).
    src, other = MemoryStorage(), MemoryStorage()
    _, first, minor = two_segments(src, 1, StoreConfig())
    _, major = flushed(other, P, StoreConfig(), pa.table({"key": [3], "v": ["three"]}))
    assert major.major and minor.segment_id not in major.included

    b = started("b")
    rep = b.local[P]
    assert not rep.leads

    assert transfer(b, first, src.read(segment_file(first.segment_id))).ok
    assert rep.store.root == first.segment_id
    minor_stream = accept(b, minor)  # based on the root when offered
    assert transfer(b, major, other.read(segment_file(major.segment_id))).ok
    assert rep.store.root == major.segment_id  # the root moved while the minor travelled

    ack = finish(b, minor_stream, minor, src.read(segment_file(minor.segment_id)))
    assert rep.store.entry(minor.segment_id) is None  # not taken ...
    assert not ack.ok, ack  # ... so not acknowledged
    assert "OUT_OF_ORDER" in ack.error
