"""The query role driven event by event: races of spec 3.5 at the level of single events."""

from __future__ import annotations

import pytest

from sparkbus.bus import contract as c
from sparkbus.codecs import DecodeError, EnvelopeCodec
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.roles.query.messages import (
    QueriesInactive,
    QueriesSuspected,
    QueryCancelled,
    QueryId,
    QueryStarted,
    parse_stream_key,
    stream_key,
)
from sparkbus.roles.query.plan import AggCall, Aggregate, Scan, fragment_to_plain
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.role import QueryRole
from sparkbus.roles.query.state import Phase, Step, next_phase

QID = QueryId(member="i", local="x.1")


def up(role: QueryRole, *peers: str) -> None:
    for p in peers:
        role.handle(c.PeerUp(peer=p), 0.0)


def start_msg() -> QueryStarted:
    """A repartitioned aggregate: edge 1 runs between the participants, edge 2 to the initiator."""
    plan = Aggregate(input=Scan(table="t"), keys=("k",), aggs=(AggCall(name="n", func="count", column=None),))
    frags = plan_fragments(plan, initiator="i", participants=["p1", "p2"], repartition=True)
    return QueryStarted(
        query_id=QID,
        fragments=tuple(fragment_to_plain(f) for f in frags),
        parameters=(),
        participants=("i", "p1", "p2"),
        edge_credits={1: 1 << 20, 2: 1 << 20},
        timeout=0.0,
    )


def batch(peer: str, qid: QueryId = QID, last: bool = False) -> c.BatchReceived:
    return c.BatchReceived(
        peer=peer, stream=stream_key(qid, 1), ordinal=0, last=last, data=b"", size=0, remaining=100
    )


def test_batch_for_a_finished_query_at_the_initiator_is_discarded() -> None:
    role = QueryRole("i", incarnation="x")
    actions = role.handle(batch("p1"), 1.0)
    assert actions == [c.CloseStream(peer="p1", stream=stream_key(QID, 1))]
    assert role.queries == {} and role.counters["batches_discarded"] == 1


def test_batch_before_start_is_retained_then_reaped_by_the_check_loop() -> None:
    role = QueryRole("p1", config=QueryConfig(check_period=0.5), incarnation="x")
    up(role, "i", "p2")
    acts = role.handle(batch("p2"), 10.0)
    assert acts == [c.SetTimer(key="check", at=10.5)]
    assert role.queries[QID].phase is Phase.PENDING and len(role.queries[QID].pending) == 1
    acts = role.handle(c.TimerFired(key="check"), 10.5)
    assert c.Send(peer="i", message=QueriesSuspected(query_ids=(QID,))) in acts
    assert c.SetTimer(key="check", at=11.0) in acts  # checks go on while the state waits
    # The answer from someone other than the initiator is ignored.
    role.handle(c.MessageReceived(peer="p2", message=QueriesInactive(query_ids=(QID,))), 10.6)
    assert QID in role.queries
    acts = role.handle(c.MessageReceived(peer="i", message=QueriesInactive(query_ids=(QID,))), 10.6)
    assert role.queries == {} and c.CloseStream(peer="p2", stream=stream_key(QID, 1)) in acts
    # Released without a word: no cancel, no error (docs/QUERY.md, races), only counted.
    assert not any(isinstance(a, c.Send) for a in acts) and role.counters["reaped"] == 1
    assert role.handle(c.TimerFired(key="check"), 11.0) == []


def test_initiator_answers_check_with_the_inactive_subset() -> None:
    role = QueryRole("i", incarnation="x")
    up(role, "p1")
    other = QueryId(member="i", local="x.2")
    role.handle(
        c.LocalCall(call_id=7, name="load", args={"table": "t", "batches": []}), 0.0
    )  # refused: no batches
    acts = role.handle(
        c.LocalCall(call_id=8, name="execute", args={"sql": "SELECT * FROM t", "participants": ["p1"]}), 0.0
    )
    active = next(iter(role.queries))
    assert any(isinstance(a, c.Send) and isinstance(a.message, QueryStarted) for a in acts)
    acts = role.handle(c.MessageReceived(peer="p1", message=QueriesSuspected(query_ids=(active, other))), 1.0)
    assert acts == [c.Send(peer="p1", message=QueriesInactive(query_ids=(other,)))]


def test_start_replays_the_retained_batch() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(batch("p2", last=True), 0.0)
    acts = role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.1)
    assert role.queries[QID].phase is Phase.RUNNING
    # The retained batch is consumed only now; no table here, so "no data" goes to both members.
    assert c.Consumed(peer="p2", stream=stream_key(QID, 1), size=0) in acts
    assert c.SendBatch(peer="p2", stream=stream_key(QID, 1), data=b"", last=True) in acts
    assert c.SendBatch(peer="p1", stream=stream_key(QID, 1), data=b"", last=True) in acts
    # The loopback batch completes edge 1; the merged (empty) result goes to the initiator.
    acts = role.handle(batch("p1", last=True), 0.2)
    assert c.SendBatch(peer="i", stream=stream_key(QID, 2), data=b"", last=True) in acts
    assert role.queries == {}


def test_remote_cancel_is_not_propagated() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(batch("p2"), 0.0)
    cancel = QueryCancelled(query_id=QID, code=ErrorCode.MEMBER_LEAVE, message="gone", origin="p2")
    acts = role.handle(c.MessageReceived(peer="i", message=cancel), 0.1)
    assert not any(isinstance(a, c.Send) for a in acts) and role.queries == {}
    assert role.handle(c.MessageReceived(peer="i", message=cancel), 0.2) == []  # unknown now: ignored
    with pytest.raises(c.RemoteProtocolError, match="not its initiator"):
        role.handle(c.MessageReceived(peer="p2", message=start_msg()), 0.3)


def test_participant_cancel_from_a_non_initiator_is_refused() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(batch("p2"), 0.0)
    cancel = QueryCancelled(query_id=QID, code=ErrorCode.GENERIC, message="x", origin="p2")
    with pytest.raises(c.RemoteProtocolError):
        role.handle(c.MessageReceived(peer="p2", message=cancel), 0.1)


def test_initiator_cancel_from_a_member_outside_the_query_is_refused() -> None:
    role = QueryRole("i", incarnation="x")
    up(role, "p1", "p9")
    args = {"sql": "SELECT x FROM t", "participants": ["p1"]}
    role.handle(c.LocalCall(call_id=1, name="execute", args=args), 0.0)
    (qid,) = role.queries
    cancel = QueryCancelled(query_id=qid, code=ErrorCode.GENERIC, message="x", origin="p9")
    with pytest.raises(c.RemoteProtocolError, match="p9, which is not one of its participants"):
        role.handle(c.MessageReceived(peer="p9", message=cancel), 0.1)
    assert qid in role.queries and role.calls == {1: qid}  # still running, its caller still waiting
    acts = role.handle(c.MessageReceived(peer="p1", message=cancel), 0.2)  # a participant may end it
    assert any(isinstance(a, c.Reply) and a.call_id == 1 and a.error for a in acts) and role.queries == {}


def test_losing_the_initiator_releases_without_messages() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(batch("p2"), 0.0)
    acts = role.handle(c.PeerLost(peer="i", reason="heartbeat"), 0.1)
    assert role.queries == {} and not any(isinstance(a, c.Send) for a in acts)


def test_duplicate_start_is_a_remote_error() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(batch("p2"), 0.0)
    role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.1)
    with pytest.raises(c.RemoteProtocolError, match="start is not allowed in phase running"):
        role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.3)


def test_bad_stream_key_is_a_remote_error() -> None:
    role = QueryRole("p1", incarnation="x")
    with pytest.raises(c.RemoteProtocolError):
        role.handle(
            c.BatchReceived(
                peer="p2", stream="query/bogus", ordinal=0, last=True, data=b"", size=0, remaining=0
            ),
            0.0,
        )


def test_unknown_call_and_bad_arguments_reply_with_errors() -> None:
    role = QueryRole("i", incarnation="x")
    (reply,) = role.handle(c.LocalCall(call_id=1, name="frobnicate"), 0.0)
    assert isinstance(reply, c.Reply) and reply.error is not None
    (reply,) = role.handle(
        c.LocalCall(call_id=2, name="execute", args={"sql": "SELECT x FROM t", "timeout": -1}), 0.0
    )
    assert isinstance(reply, c.Reply) and reply.error is not None and "1005" in reply.error
    (reply,) = role.handle(c.LocalCall(call_id=3, name="execute", args={"plan": {"op": "nope"}}), 0.0)
    assert isinstance(reply, c.Reply) and reply.error is not None and "plan.op" in reply.error
    assert role.queries == {} and role.calls == {}


def test_transition_table_names_state_and_event() -> None:
    assert next_phase(Phase.PENDING, Step.START, "q") is Phase.RUNNING
    with pytest.raises(c.LocalProtocolError, match="complete is not allowed in phase pending"):
        next_phase(Phase.PENDING, Step.COMPLETE, "q")
    for phase in Phase:
        for step in Step:
            try:
                next_phase(phase, step, "q")
            except (c.LocalProtocolError, c.RemoteProtocolError) as exc:
                assert phase.value in str(exc) and step.value in str(exc)


# ---------------------------------------------------------------- messages


def test_messages_round_trip_and_decode_strictly() -> None:
    codec = EnvelopeCodec()
    for msg in (
        start_msg(),
        QueryCancelled(query_id=QID, code=ErrorCode.TIMEOUT, message="late", origin="i"),
        QueriesSuspected(query_ids=(QID,)),
        QueriesInactive(query_ids=()),
    ):
        assert codec.decode(codec.encode(msg)).message == msg
    import msgpack

    frames = codec.encode(start_msg())
    body = msgpack.unpackb(frames[1], strict_map_key=False)
    body["fragments"][0]["root"]["op"] = "explode"
    with pytest.raises(DecodeError, match="fragments"):
        codec.decode([frames[0], msgpack.packb(body)])
    body = msgpack.unpackb(frames[1], strict_map_key=False)
    body["edge_credits"] = {}
    with pytest.raises(DecodeError, match="edge_credits"):
        codec.decode([frames[0], msgpack.packb(body)])
    frames = codec.encode(QueryCancelled(query_id=QID, code=ErrorCode.TIMEOUT, message="", origin="i"))
    body = msgpack.unpackb(frames[1])
    body["code"] = 42
    with pytest.raises(DecodeError, match="code"):
        codec.decode([frames[0], msgpack.packb(body)])


def test_stream_keys() -> None:
    assert parse_stream_key(stream_key(QID, 3)) == (QID, 3)
    assert str(QueryId.parse("node@a@x.1")) == "node@a@x.1"
    for bad in ("exchange/i@x/1", "query/i@x/e", "query//1", "query/nomember/1"):
        with pytest.raises(ValueError):
            parse_stream_key(bad)


def test_package_surface() -> None:
    import sparkbus.roles.query as q

    for name in q.__all__:
        assert hasattr(q, name), name
