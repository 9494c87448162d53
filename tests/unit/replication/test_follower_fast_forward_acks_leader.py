"""Spec 3.5, receive procedure, follower, an offer from the leader: "accept and fast-forward-add the segment
to the current partition; add the leader to the acked_servers for the new segment entry". The follower's
own procedure then never pushes the segment back to the leader that sent it."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.bus.contract import Send, TimerFired
from sparkbus.roles.replication.messages import SegmentOffered
from sparkbus.roles.replication.role import TICK
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig, segment_file

from .harness import flushed
from .offers import P, started, transfer


def test_a_follower_lists_the_leader_as_acked_on_a_segment_it_fast_forwards() -> None:
    src = MemoryStorage()
    _, entry = flushed(src, P, StoreConfig(), pa.table({"key": [1], "v": ["one"]}))
    assert entry.major

    b = started("b")
    rep = b.local[P]
    assert not rep.leads and rep.leader is not None and rep.leader.placement == 1
    ack = transfer(b, entry, src.read(segment_file(entry.segment_id)))
    assert ack.ok, ack
    assert b.counters.get("fast_forwards", 0) == 1, dict(b.counters)
    listed = rep.store.entry(entry.segment_id)
    assert listed is not None and rep.store.root == entry.segment_id
    assert 1 in listed.acked, listed.acked
    # ... so the follower's procedure does not offer the leader its own segment back.
    later = [*b.handle(TimerFired(key=TICK), 5.0), *b.handle(TimerFired(key=TICK), 60.0)]
    offers = [x.message for x in later if isinstance(x, Send) and isinstance(x.message, SegmentOffered)]
    assert offers == [], offers
