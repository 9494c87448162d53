"""Transfers of a replica that is unassigned or re-placed (spec 3.6), driven through one role's API.

The protocol has no cancel message: a sender whose replica went away ends an open stream short (an
empty last batch and a summary of what it sent), which the receiver answers with an error ack; a
receiver whose placement went away answers its incoming transfers with an error ack at once. Either way
no slot waits for ever.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkbus.bus.contract import (
    BatchReceived,
    LocalCall,
    MessageReceived,
    PeerUp,
    SendBatch,
)
from sparkbus.bus.contract import Send as SendAction
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.messages import (
    SegmentAccepted,
    SegmentAcked,
    SegmentOffered,
    SegmentTransited,
    stream_key,
)
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig

P = "t/0"
SPEC = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2)))
CONFIG = ReplicationConfig(store=StoreConfig(flush_rows=2), chunk_bytes=64, credit_bytes=128)


def make(node: str, spec: PartitionSpec = SPEC) -> ReplicationRole:
    storages: dict[str, MemoryStorage] = {}
    role = ReplicationRole(node, Layout.of([spec]), lambda p: storages.setdefault(p, MemoryStorage()), CONFIG)
    list(role.handle(PeerUp(peer="b" if node == "a" else "a"), 0.0))
    return role


def sent(actions: Any) -> list[Any]:
    return [a.message for a in actions if isinstance(a, SendAction)]


def write(role: ReplicationRole, keys: list[int], now: float = 1.0) -> list[Any]:
    batch = pa.RecordBatch.from_pydict({"key": keys, "v": [f"v{k}" for k in keys]})
    call = LocalCall(call_id=1, name="write", args={"partition": P, "rows": bytes(encode_batch(batch))})
    return list(role.handle(call, now))


def assign(role: ReplicationRole, spec: PartitionSpec, now: float = 2.0) -> list[Any]:
    return list(role.handle(LocalCall(call_id=2, name="assign", args={"spec": spec}), now))


def leader_offer() -> tuple[ReplicationRole, SegmentOffered]:
    a = make("a")
    offers = [m for m in sent(write(a, [1, 2])) if isinstance(m, SegmentOffered)]
    assert len(offers) == 1, "a flushed a segment and offered it to b"
    return a, offers[0]


def test_a_sender_unassigned_mid_stream_ends_the_stream_short() -> None:
    a, offer = leader_offer()
    stream = stream_key(P, offer.segment_id, 1)
    accept = SegmentAccepted(partition=P, segment_id=offer.segment_id, stream=stream, credit=128)
    first = list(a.handle(MessageReceived(peer="b", message=accept), 1.5))
    batches = [x for x in first if isinstance(x, SendBatch)]
    assert batches and not batches[-1].last and sum(len(x.data) for x in batches) == 128
    actions = assign(a, PartitionSpec(partition=P, replicas=(Replica(node="b", placement=2),)))
    ends = [x for x in actions if isinstance(x, SendBatch)]
    assert [(x.stream, bytes(x.data), x.last) for x in ends] == [(stream, b"", True)]
    summary = [m for m in sent(actions) if isinstance(m, SegmentTransited)]
    assert summary == [
        SegmentTransited(partition=P, segment_id=offer.segment_id, size=128, chunks=len(batches) + 1)
    ]
    # The receiver finds the bytes short of the offer and acks with an error: that ends the offer.
    nack = SegmentAcked(partition=P, segment_id=offer.segment_id, placement=2, ok=False, error="short")
    list(a.handle(MessageReceived(peer="b", message=nack), 3.0))
    assert a.counters.get("abandoned_offers") == 1
    # The segment is still a's alone: the unassigned replica drains it to b, in a transfer of its own.
    assert P in a.draining and P not in a.local
    assert [(o.segment_id, o.abandoned) for o in a.outgoing.values()] == [(offer.segment_id, False)]


def test_an_offer_accepted_after_its_sender_was_re_placed_is_ended_at_once() -> None:
    a, offer = leader_offer()
    replaced = SPEC.with_replica(Replica(node="a", placement=11))
    assign(a, replaced)
    assert a.outgoing, "the open offer waits for its answer"
    stream = stream_key(P, offer.segment_id, 1)
    accept = SegmentAccepted(partition=P, segment_id=offer.segment_id, stream=stream, credit=128)
    actions = list(a.handle(MessageReceived(peer="b", message=accept), 3.0))
    ends = [x for x in actions if isinstance(x, SendBatch)]
    assert [(bytes(x.data), x.last) for x in ends] == [(b"", True)], "no byte of the old placement's file"
    assert SegmentTransited(partition=P, segment_id=offer.segment_id, size=0, chunks=1) in sent(actions)


def test_a_receiver_re_placed_mid_transfer_acks_it_with_an_error() -> None:
    _, offer = leader_offer()
    b = make("b")
    replies = sent(b.handle(MessageReceived(peer="a", message=offer), 1.0))
    accept = next(m for m in replies if isinstance(m, SegmentAccepted))
    chunk = BatchReceived(
        peer="a", stream=accept.stream, ordinal=0, last=False, data=b"x" * 64, size=64, remaining=64
    )
    list(b.handle(chunk, 1.5))
    assert b.incoming
    actions = assign(b, SPEC.with_replica(Replica(node="b", placement=12)))
    acks = [m for m in sent(actions) if isinstance(m, SegmentAcked)]
    assert len(acks) == 1 and not acks[0].ok and acks[0].segment_id == offer.segment_id
    assert not b.incoming, "the slot is free"
    assert b.local[P].me.placement == 12 and not b.local[P].store.entries
