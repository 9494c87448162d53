"""The gateway sends ``WRITE`` and ``FLUSH`` to the node's own replication role (``sparkbus load`` writes
each partition through its leader's gateway, then flushes it), and a refusal comes back as the error
naming the leader."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.roles.client import Op
from sparkbus.roles.client.gateway import Gateway
from sparkbus.roles.client.messages import Request, Response

PEER = "client:0a"


def session() -> Gateway:
    gw = Gateway("store-0", ["replication", "client.gateway"])
    assert list(gw.handle(c.PeerUp(peer=PEER, connection_id="cid"), 0.0)) == []
    return gw


def test_write_and_flush_run_on_the_replication_role() -> None:
    gw = session()
    write = Request(request_id=1, op=Op.WRITE, args={"partition": "orders/1", "rows": b"ipc"})
    flush = Request(request_id=2, op=Op.FLUSH, args={"partition": "orders/1"})
    assert list(gw.handle(c.MessageReceived(peer=PEER, message=write), 0.0)) == [
        c.Call(role="replication", name="write", args={"partition": "orders/1", "rows": b"ipc"}, tag="cid/1")
    ]
    assert list(gw.handle(c.MessageReceived(peer=PEER, message=flush), 0.0)) == [
        c.Call(role="replication", name="flush", args={"partition": "orders/1"}, tag="cid/2")
    ]


def test_a_follower_refusal_reaches_the_client_with_the_leader() -> None:
    gw = session()
    write = Request(request_id=1, op=Op.WRITE, args={"partition": "orders/1", "rows": b"ipc"})
    list(gw.handle(c.MessageReceived(peer=PEER, message=write), 0.0))
    error = "store-0 is not the leader of orders/1; leader: store-1"
    out = list(gw.handle(c.CallResult(tag="cid/1", result={"leader": "store-1"}, error=error), 0.0))
    assert len(out) == 1 and isinstance(out[0], c.Send)
    response = out[0].message
    assert isinstance(response, Response) and response.last and response.code != 0
    assert response.error == error
