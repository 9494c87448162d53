"""Failures nobody foresaw still end the query: the user gets an answer, the members get a cancel."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus import contract as c
from sparkbus.codecs import encode_batch
from sparkbus.roles.query import aggregate, engine
from sparkbus.roles.query.errors import ErrorCode, ExecutionError
from sparkbus.roles.query.messages import QueryCancelled, QueryId, QueryStarted, stream_key
from sparkbus.roles.query.plan import AggCall
from sparkbus.roles.query.role import QueryRole

from .test_role import QID, start_msg, up


def loaded(member: str) -> QueryRole:
    role = QueryRole(member, incarnation="x")
    role.store.load("t", pa.table({"k": ["a", "b", "a"], "x": [1, 2, 3]}))
    return role


def execute(role: QueryRole, call_id: int, sql: str, **args: Any) -> list[c.Action]:
    return role.handle(c.LocalCall(call_id=call_id, name="execute", args={"sql": sql, **args}), 0.0)


def replies(actions: list[c.Action]) -> list[c.Reply]:
    return [a for a in actions if isinstance(a, c.Reply)]


def cancels(actions: list[c.Action]) -> list[tuple[str, QueryCancelled]]:
    return [
        (a.peer, a.message)
        for a in actions
        if isinstance(a, c.Send) and isinstance(a.message, QueryCancelled)
    ]


def boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError("boom")


def test_an_operator_raising_anything_fails_the_query_with_data_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    role = loaded("i")
    monkeypatch.setattr(engine, "run", boom)
    (reply,) = replies(execute(role, 1, "SELECT x FROM t", participants=["i"]))
    assert reply.call_id == 1 and reply.error is not None
    assert reply.error.startswith("[2000 DATA_EXCEPTION]") and "RuntimeError: boom" in reply.error
    assert role.queries == {} and role.calls == {} and role.counters["unexpected_errors"] == 1


def test_a_participant_whose_hash_partition_raises_cancels_through_the_initiator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    role = loaded("p1")
    up(role, "i", "p2")
    monkeypatch.setattr(engine, "hash_partition", boom)
    acts = role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.0)
    ((peer, cancel),) = cancels(acts)
    assert peer == "i" and cancel.query_id == QID and cancel.code is ErrorCode.DATA_EXCEPTION
    assert "hash partition: RuntimeError: boom" in cancel.message and cancel.origin == "p1"
    assert role.queries == {}


def test_a_batch_the_inbox_cannot_fold_fails_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.0)
    monkeypatch.setattr(engine.Inbox, "add", boom)
    data = bytes(encode_batch(pa.record_batch({"k": ["a"], "n": [1]})))
    acts = role.handle(
        c.BatchReceived(
            peer="p2",
            stream=stream_key(QID, 1),
            ordinal=0,
            last=False,
            data=data,
            size=len(data),
            remaining=0,
        ),
        0.1,
    )
    ((peer, cancel),) = cancels(acts)
    assert peer == "i" and "batch from p2: RuntimeError: boom" in cancel.message
    assert role.queries == {}


def test_a_local_call_raising_anything_is_still_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    role = loaded("i")
    up(role, "p1")
    monkeypatch.setattr(QueryRole, "_start", boom)
    acts = execute(role, 4, "SELECT x FROM t", participants=["i", "p1"])
    (reply,) = replies(acts)
    assert reply.error is not None and reply.error.startswith("[2000 DATA_EXCEPTION] execute: RuntimeError")
    # start went out before the failure, so p1 is told to drop the query.
    assert [p for p, _ in cancels(acts)] == ["p1"]
    assert role.queries == {} and role.calls == {}
    monkeypatch.setattr(QueryRole, "_load", boom)
    (reply,) = replies(role.handle(c.LocalCall(call_id=5, name="load", args={}), 0.0))
    assert reply.error is not None and reply.error.startswith("[-1 GENERIC] load: RuntimeError: boom")


def test_handler_failed_ends_the_query_the_event_belonged_to() -> None:
    role = loaded("i")
    up(role, "p1", "p2")
    acts = execute(role, 9, "SELECT x FROM t")
    assert len(role.queries) == 1
    start = next(a for a in acts if isinstance(a, c.Send) and isinstance(a.message, QueryStarted))
    # The bus could not carry out one of our actions (say, encoding start): its actions were dropped.
    acts = role.handle(c.HandlerFailed(event=start, error="OverflowError: out of range"), 0.1)
    (reply,) = replies(acts)
    assert reply.call_id == 9 and reply.error is not None
    assert reply.error.startswith("[-1 GENERIC] internal error on i at Send: OverflowError")
    assert sorted(p for p, _ in cancels(acts)) == ["p1", "p2"]
    assert role.queries == {} and role.calls == {} and role.counters["handler_failed"] == 1
    # Nothing left to end: only counted.
    assert role.handle(c.HandlerFailed(event=start, error="again"), 0.2) == []


@pytest.mark.parametrize(
    "event",
    [
        c.BatchReceived(
            peer="p2", stream=stream_key(QID, 1), ordinal=0, last=False, data=b"", size=0, remaining=0
        ),
        c.CreditChanged(peer="p2", stream=stream_key(QID, 1), credit=10),
        c.MessageReceived(peer="i", message=start_msg()),
        c.SendBatch(peer="p2", stream=stream_key(QID, 1), data=b"", last=True),
    ],
)
def test_handler_failed_on_a_participant_cancels_through_the_initiator(event: Any) -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.0)
    acts = role.handle(c.HandlerFailed(event=event, error="KeyError: 'x'"), 0.1)
    ((peer, cancel),) = cancels(acts)
    assert peer == "i" and cancel.code is ErrorCode.GENERIC and "KeyError" in cancel.message
    assert role.queries == {}


def test_handler_failed_for_a_message_or_batch_from_outside_the_query_leaves_it_alone() -> None:
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2", "p9")
    role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.0)
    bogus = QueryCancelled(query_id=QID, code=ErrorCode.GENERIC, message="x", origin="p9")
    event = c.MessageReceived(peer="p9", message=bogus)
    assert (
        role.handle(c.HandlerFailed(event=event, error="RemoteProtocolError: not its initiator"), 0.1) == []
    )
    assert QID in role.queries
    batch = c.BatchReceived(
        peer="p9", stream=stream_key(QID, 1), ordinal=0, last=True, data=b"", size=0, remaining=0
    )
    assert role.handle(c.HandlerFailed(event=batch, error="ValueError: bad batch"), 0.1) == []
    assert QID in role.queries
    other = QueryId(member="i", local="x.99")
    timer = c.TimerFired(key=f"timeout/{other}")
    assert role.handle(c.HandlerFailed(event=timer, error="x"), 0.1) == []


def test_handler_failed_for_a_participant_message_to_another_participant_leaves_it_alone() -> None:
    # p2 takes part in the query, but only the initiator may send a participant its messages.
    role = QueryRole("p1", incarnation="x")
    up(role, "i", "p2")
    role.handle(c.MessageReceived(peer="i", message=start_msg()), 0.0)
    cancel = c.MessageReceived(
        peer="p2", message=QueryCancelled(query_id=QID, code=ErrorCode.GENERIC, message="x", origin="p2")
    )
    with pytest.raises(c.RemoteProtocolError, match="p2, which is not its initiator"):
        role.handle(cancel, 0.1)
    assert (
        role.handle(c.HandlerFailed(event=cancel, error="RemoteProtocolError: not its initiator"), 0.1) == []
    )
    assert QID in role.queries


def test_finalize_reports_arrow_errors_as_data_exceptions() -> None:
    states = pa.table({"a$sum": ["not a number"], "a$count": [1]})
    with pytest.raises(ExecutionError, match="aggregate: "):
        aggregate.finalize(states, [], [AggCall(name="a", func="avg", column="v")])
