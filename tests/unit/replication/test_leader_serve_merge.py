"""Spec 3.5, receive procedure, leader: an offer not based on the root is fast-forwarded when "the partition
state is LOADING and the root segment id is NULL"; otherwise, not referenced, it is merged. So a SERVE leader
with an empty partition merges it, and a LOAD leader (a split target) with an empty partition lists it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkbus.roles.replication.layout import Lifecycle
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig, segment_file

from .offers import SPEC, P, started, transfer, two_segments


@pytest.mark.parametrize("lifecycle", [Lifecycle.SERVE, Lifecycle.LOAD])
def test_a_leader_with_no_root_merges_a_minor_it_never_had_unless_loading(lifecycle: Lifecycle) -> None:
    src = MemoryStorage()
    _, _, entry = two_segments(src, 2, StoreConfig())  # a minor segment of b's
    a = started("a", replace(SPEC, lifecycle=lifecycle))
    rep = a.local[P]
    assert rep.leads and rep.lifecycle is lifecycle and rep.store.root is None
    ack = transfer(a, entry, src.read(segment_file(entry.segment_id)))
    assert ack.ok, ack
    counters = a.counters
    if lifecycle is Lifecycle.SERVE:
        assert counters.get("merges", 0) == 1 and counters.get("fast_forwards", 0) == 0, dict(counters)
        assert rep.store.root != entry.segment_id  # merged into a segment of the leader's own
    else:
        assert counters.get("fast_forwards", 0) == 1 and counters.get("merges", 0) == 0, dict(counters)
        assert rep.store.root == entry.segment_id  # listed as offered, id and base kept
