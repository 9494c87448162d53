"""The gateway holds at most ``MAX_HELD`` results per logical connection (held or running): past it, it drops
the oldest result it has sent whole, never one whose client is still reading it, and with none such it
refuses a new request with ``LIMIT_EXCEEDED`` without running it."""

from __future__ import annotations

import pytest

from sparkbus.bus import ErrorCode
from sparkbus.bus import contract as c
from sparkbus.roles.client import Op
from sparkbus.roles.client import gateway as gateway_module
from sparkbus.roles.client.gateway import Gateway
from sparkbus.roles.client.messages import Ack, Request, Response

PEER = "client:0a"
LONG = b"x" * 64  # a result of many 8-byte chunks


@pytest.fixture(autouse=True)
def two_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_module, "MAX_HELD", 2)


def session() -> Gateway:
    gw = Gateway("n1", ["query", "replication"], chunk_bytes=8)
    list(gw.handle(c.PeerUp(peer=PEER, connection_id="cid"), 0.0))
    return gw


def request(gw: Gateway, rid: int, op: int, args: dict[str, object] | None = None) -> list[c.Action]:
    msg = Request(request_id=rid, op=op, args=args or {}, ack=(), window=1)
    return list(gw.handle(c.MessageReceived(peer=PEER, message=msg), 0.0))


def ran(gw: Gateway, rid: int, result: object) -> list[Response]:
    """Request ``rid`` (SQL) runs, and its result comes back: what the gateway sends at once (window 1)."""
    assert request(gw, rid, Op.SQL, {"sql": "select 1"}) == [
        c.Call(
            role="query", name="execute", args={"sql": "select 1", "owner": f"cid/{rid}"}, tag=f"cid/{rid}"
        )
    ]
    return responses(list(gw.handle(c.CallResult(tag=f"cid/{rid}", result=result), 0.0)))


def being_read(gw: Gateway, rid: int) -> None:
    """Request ``rid``'s long result is being read: one chunk sent (the window), more to come."""
    (first,) = ran(gw, rid, LONG)
    assert not first.last


def responses(actions: list[c.Action]) -> list[Response]:
    """``actions``, each a RESPONSE sent to the client."""
    out = [a.message for a in actions if isinstance(a, c.Send) and isinstance(a.message, Response)]
    assert len(out) == len(actions), actions
    return out


def test_the_oldest_result_sent_whole_makes_room_and_one_being_read_is_kept() -> None:
    gw = session()
    being_read(gw, 1)
    (whole,) = ran(gw, 2, 7)  # sent whole; its acknowledgement not in yet
    assert whole.last and whole.code == 0
    (more,) = ran(gw, 3, 8)
    assert more.request_id == 3 and more.code == 0
    (ctx,) = gw.contexts.values()
    assert sorted(ctx.held) == [1, 3]
    # The result being read goes on where it was.
    ack = c.MessageReceived(peer=PEER, message=Ack(consumed={1: 1}, release=()))
    (chunk,) = responses(list(gw.handle(ack, 0.0)))
    assert (chunk.request_id, chunk.chunk) == (1, 1)


def test_with_every_result_being_read_a_new_request_is_refused_and_not_run() -> None:
    gw = session()
    being_read(gw, 1)
    being_read(gw, 2)
    (refused,) = responses(request(gw, 3, Op.WRITE, {"partition": "p/0", "rows": b"ipc"}))  # no Call
    assert refused.request_id == 3 and refused.last and refused.code == ErrorCode.LIMIT_EXCEEDED
    assert "more than 2 unacknowledged results on this logical connection" in refused.error
    (ctx,) = gw.contexts.values()
    assert sorted(ctx.held) == [1, 2] and not ctx.running
    # Once the client releases a result, requests run again.
    ack = c.MessageReceived(peer=PEER, message=Ack(consumed={}, release=(1,)))
    assert list(gw.handle(ack, 0.0)) == []
    (call,) = request(gw, 4, Op.WRITE, {"partition": "p/0", "rows": b"ipc"})
    assert isinstance(call, c.Call) and call.tag == "cid/4"


def test_a_running_request_counts_against_the_limit() -> None:
    gw = session()
    being_read(gw, 1)
    (call,) = request(gw, 2, Op.SQL, {"sql": "select 2"})
    assert isinstance(call, c.Call)
    (refused,) = responses(request(gw, 3, Op.STATUS))
    assert refused.code == ErrorCode.LIMIT_EXCEEDED
