"""Every decline reason of the receive procedure (spec 3.5), driven through one role's public API."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sparkbus.bus.contract import (
    MessageReceived,
    PeerLost,
    PeerUp,
    Send,
)
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.messages import (
    DeclineReason,
    SegmentAccepted,
    SegmentDeclined,
    SegmentOffered,
)
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage

P = "t/0"
SPEC = PartitionSpec(
    partition=P,
    replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2), Replica(node="c", placement=3)),
)


def make(node: str, **cfg: Any) -> ReplicationRole:
    storages: dict[str, MemoryStorage] = {}
    role = ReplicationRole(
        node, Layout.of([SPEC]), lambda p: storages.setdefault(p, MemoryStorage()), ReplicationConfig(**cfg)
    )
    for peer in "abc":
        if peer != node:
            list(role.handle(PeerUp(peer=peer), 0.0))
    return role


def offer(
    segment_id: str = "9.1",
    *,
    base: str | None = None,
    major: bool = True,
    sender: int = 1,
    target: int = 2,
    partition: str = P,
) -> SegmentOffered:
    return SegmentOffered(
        partition=partition,
        segment_id=segment_id,
        base_id=base,
        included=(),
        major=major,
        rows=1,
        max_lsn=1,
        size=100,
        checksum=b"x" * 16,
        sender=sender,
        target=target,
    )


def answer(role: ReplicationRole, peer: str, msg: SegmentOffered) -> Any:
    sent = [
        a.message for a in role.handle(MessageReceived(peer=peer, message=msg), 1.0) if isinstance(a, Send)
    ]
    replies = [m for m in sent if isinstance(m, SegmentAccepted | SegmentDeclined)]
    assert len(replies) == 1, sent
    return replies[0]


def reason(reply: Any) -> DeclineReason | None:
    return reply.reason if isinstance(reply, SegmentDeclined) else None


def test_follower_accepts_the_first_major_from_the_leader() -> None:
    assert isinstance(answer(make("b"), "a", offer()), SegmentAccepted)


def test_overloaded_when_max_incoming_transfers_run() -> None:
    role = make("b", max_incoming=1)
    assert isinstance(answer(role, "a", offer("9.1")), SegmentAccepted)
    assert reason(answer(role, "a", offer("9.2"))) is DeclineReason.OVERLOADED


def test_inflight_when_the_same_segment_is_already_incoming() -> None:
    role = make("b")
    assert isinstance(answer(role, "a", offer("9.1")), SegmentAccepted)
    assert reason(answer(role, "a", offer("9.1"))) is DeclineReason.INFLIGHT


def test_invalid_when_a_follower_is_offered_by_a_non_leader() -> None:
    assert reason(answer(make("b"), "c", offer(sender=3))) is DeclineReason.INVALID


def test_invalid_when_the_sender_uses_a_stale_placement_of_the_leader() -> None:
    assert reason(answer(make("b"), "a", offer(sender=99))) is DeclineReason.INVALID


def test_invalid_for_a_placement_we_no_longer_hold() -> None:
    # Spec 3.6: the acked list holds placements; an offer addressed to an old placement is refused.
    assert reason(answer(make("b"), "a", offer(target=7))) is DeclineReason.INVALID


def test_invalid_for_a_partition_not_hosted_here() -> None:
    assert reason(answer(make("b"), "a", offer(partition="t/9"))) is DeclineReason.INVALID


def test_out_of_order_for_a_minor_segment_not_based_on_our_root() -> None:
    assert reason(answer(make("b"), "a", offer(base="9.0", major=False))) is DeclineReason.OUT_OF_ORDER


def test_leader_accepts_a_follower_push_to_merge() -> None:
    # Not based on our root (None), not referenced: the leader merges.
    assert isinstance(
        answer(make("a"), "b", offer(base="8.1", major=False, sender=2, target=1)), SegmentAccepted
    )


def test_unknown_answers_are_remote_protocol_errors(caplog: pytest.LogCaptureFixture) -> None:
    role = make("a")
    stray = SegmentDeclined(partition=P, segment_id="1.1", reason=DeclineReason.INVALID)
    with caplog.at_level(logging.ERROR):
        actions = list(role.handle(MessageReceived(peer="b", message=stray), 0.0))
    assert actions == []  # logged and counted, not raised
    assert role.counters["handler_errors"] == 1
    (record,) = [r for r in caplog.records if "no offer of ours" in r.getMessage()]
    assert "RemoteProtocolError" in record.getMessage() and not record.exc_info  # no traceback


def test_a_retried_transfer_gets_a_new_stream_key() -> None:
    # The bus contract: a key is not reopened right after its stream's last batch (a grant for the old
    # stream may still be in flight). The first attempt dies with the link; the retry must use a new key.
    role = make("b")
    first = answer(role, "a", offer("9.1"))
    list(role.handle(PeerLost(peer="a", reason="cut"), 2.0))
    list(role.handle(PeerUp(peer="a"), 3.0))
    second = answer(role, "a", offer("9.1"))
    assert isinstance(first, SegmentAccepted) and isinstance(second, SegmentAccepted)
    assert first.stream != second.stream


def test_invalid_when_a_non_leader_node_claims_the_leaders_placement() -> None:
    # b follows a (placement 1); c (placement 3) offers with sender=1.
    assert reason(answer(make("b"), "c", offer(sender=1))) is DeclineReason.INVALID
