"""The gateway names every SQL request to the query role as its connection's (``owner``), and turns a
QUERY_CANCEL into a cancel of this connection's request ``request_id`` only."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.roles.client import Op
from sparkbus.roles.client.gateway import Gateway
from sparkbus.roles.client.messages import Request, Response

PEER = "client:0a"


def request(gw: Gateway, rid: int, op: int, args: dict[str, object]) -> list[c.Action]:
    return list(
        gw.handle(c.MessageReceived(peer=PEER, message=Request(request_id=rid, op=op, args=args)), 0.0)
    )


def session() -> Gateway:
    gw = Gateway("n1", ["query", "client.gateway"])
    list(gw.handle(c.PeerUp(peer=PEER, connection_id="cid"), 0.0))
    return gw


def test_sql_is_owned_by_its_connection_and_request_whatever_the_client_says() -> None:
    gw = session()
    (call,) = request(gw, 3, Op.SQL, {"sql": "SELECT 1 FROM t", "owner": "someone-else/1"})
    assert call == c.Call(
        role="query", name="execute", args={"sql": "SELECT 1 FROM t", "owner": "cid/3"}, tag="cid/3"
    )


def test_query_cancel_names_a_request_of_this_connection_only() -> None:
    gw = session()
    (call,) = request(
        gw, 4, Op.QUERY_CANCEL, {"request_id": 3, "call_id": 1, "query_id": "n1@x.1", "owner": "o/1"}
    )
    assert call == c.Call(role="query", name="cancel", args={"owner": "cid/3"}, tag="cid/4")


def test_query_cancel_without_a_request_id_is_answered_with_an_error() -> None:
    gw = session()
    for rid, args in enumerate([{"call_id": 1}, {"query_id": "n1@x.1"}, {"request_id": "3"}, {}], start=5):
        (send,) = request(gw, rid, Op.QUERY_CANCEL, args)
        assert isinstance(send, c.Send) and isinstance(send.message, Response)
        assert send.message.error is not None and send.message.error.startswith(
            "QUERY_CANCEL: takes request_id (int)"
        )
