"""DROP_VIEW: the gateway routes it to the compute controller's ``drop_view`` as it routes CREATE_VIEW, and
the controller's answer, or its refusal, comes back to the client as the response; ``Client.drop_view``
sends it. Without it a view that failed on its data could not be dropped, so it could never be created
again (its peeks say "drop and create it again")."""

from __future__ import annotations

from typing import Any

import msgpack
import pyarrow as pa
import pytest

from sparkbus.bus import contract as c
from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ClientConnectionError, Op, OperationError, RetryReadPolicy
from sparkbus.roles.client.gateway import ARGS, ROUTES, Gateway
from sparkbus.roles.client.messages import READ_OPS, Request, Response
from sparkbus.roles.compute import Aggregate, ComputeController, ViewDef
from sparkbus.topologies.client import Client

PEER = "client:0a"
VIEW = ViewDef(source="t", aggregates=(Aggregate(func="sum", column="x", name="s"),))


def session() -> Gateway:
    gw = Gateway("coordinator", ["compute.controller", "client.gateway"])
    list(gw.handle(c.PeerUp(peer=PEER, connection_id="cid"), 0.0))
    return gw


def request(gw: Gateway, rid: int, op: int, args: dict[str, Any]) -> list[c.Action]:
    return list(
        gw.handle(c.MessageReceived(peer=PEER, message=Request(request_id=rid, op=op, args=args)), 0.0)
    )


def answer(gw: Gateway, tag: str, result: Any = None, error: str | None = None) -> Response:
    (send,) = gw.handle(c.CallResult(tag=tag, result=result, error=error), 0.0)
    assert isinstance(send, c.Send) and send.peer == PEER and isinstance(send.message, Response)
    assert send.message.last
    return send.message


def local(ctl: ComputeController, call_id: int, name: str, args: dict[str, Any]) -> c.Reply:
    """The controller's reply to one local call (the node's owner's, or a role's)."""
    (reply,) = [
        a
        for a in ctl.handle(c.LocalCall(call_id=call_id, name=name, args=args), 0.0)
        if isinstance(a, c.Reply)
    ]
    return reply


def controller() -> ComputeController:
    ctl = ComputeController(replicas=("r1",))  # none connected: commands wait in its history
    assert (
        local(ctl, 1, "create_table", {"name": "t", "schema": pa.schema([("x", pa.int64())])}).error is None
    )
    assert local(ctl, 2, "create_view", {"name": "v", "view": VIEW}).error is None
    return ctl


def through(gw: Gateway, ctl: ComputeController, rid: int, args: dict[str, Any]) -> Response:
    """One DROP_VIEW from the client to the controller and back, as the node carries a call and its reply."""
    (call,) = request(gw, rid, Op.DROP_VIEW, args)
    assert isinstance(call, c.Call)
    reply = local(ctl, 100 + rid, call.name, call.args)
    return answer(gw, call.tag, reply.result, reply.error)


def test_drop_view_is_routed_to_the_controller_as_create_view_is() -> None:
    assert Op.DROP_VIEW == 37 and Op.DROP_VIEW.name == "DROP_VIEW"
    assert ROUTES[Op.DROP_VIEW] == ("compute.controller", "drop_view")
    assert ROUTES[Op.DROP_VIEW][0] == ROUTES[Op.CREATE_VIEW][0]
    assert Op.DROP_VIEW not in ARGS  # its args go as they are: a name
    gw = session()
    assert request(gw, 4, Op.DROP_VIEW, {"name": "v"}) == [
        c.Call(role="compute.controller", name="drop_view", args={"name": "v"}, tag="cid/4")
    ]
    response = answer(gw, "cid/4", None)
    assert response.code == 0 and response.error == "" and msgpack.unpackb(response.payload) is None


def test_a_dropped_view_frees_its_name_and_a_second_drop_is_a_clear_error() -> None:
    gw, ctl = session(), controller()
    assert through(gw, ctl, 1, {"name": "v"}).code == 0
    assert ctl.views == {}
    again = through(gw, ctl, 2, {"name": "v"})
    assert again.code == ErrorCode.PROTOCOL and again.error == "drop_view: no view named 'v'"
    assert local(ctl, 3, "create_view", {"name": "v", "view": VIEW}).error is None  # created again


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"name": "nope"}, "drop_view: no view named 'nope'"),
        ({"name": "t"}, "drop_view: no view named 't' (a table: tables cannot be dropped)"),
        ({"name": ""}, "drop_view: a view name must be a non-empty str, got ''"),
        ({"name": ["v"]}, "drop_view: a view name must be a non-empty str, got ['v']"),
        ({}, "drop_view: a view name must be a non-empty str, got None"),
    ],
)
def test_an_unknown_or_bad_name_is_answered_with_an_error_and_drops_nothing(
    args: dict[str, Any], error: str
) -> None:
    gw, ctl = session(), controller()
    response = through(gw, ctl, 1, args)
    assert response.code == ErrorCode.PROTOCOL and response.error == error and response.payload == b""
    assert set(ctl.views) == {"v"} and set(ctl.tables) == {"t"}


def test_a_view_another_view_reads_is_not_dropped() -> None:
    gw, ctl = session(), controller()
    assert local(ctl, 9, "create_view", {"name": "w", "view": ViewDef(source="v")}).error is None
    response = through(gw, ctl, 1, {"name": "v"})
    assert response.error == "drop_view: view 'v' is read by ['w']; drop those first"
    assert set(ctl.views) == {"v", "w"}


def test_a_gateway_whose_node_runs_no_controller_answers_the_nodes_error() -> None:
    gw = session()
    (call,) = request(gw, 1, Op.DROP_VIEW, {"name": "v"})
    assert isinstance(call, c.Call)
    error = "node store-0 runs no role 'compute.controller' (it runs ['client.gateway', 'replication'])"
    response = answer(gw, call.tag, None, error)
    assert response.code == ErrorCode.PROTOCOL and response.error == error
    assert gw.status()["counters"]["requests"] == 1  # answered; the session serves on
    assert request(gw, 2, Op.PING, {})[0] == c.Send(
        peer=PEER, message=Response(request_id=2, chunk=0, last=True, payload=msgpack.packb(None))
    )


class Calls:
    """Stands for a connected client's ``call``: records the operation, answers or raises."""

    def __init__(self, outcome: Any = None) -> None:
        self.outcome = outcome
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def call(self, op: int, args: dict[str, Any] | None = None, **_: Any) -> Any:
        self.sent.append((op, dict(args or {})))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_client_drop_view_sends_drop_view_with_the_name() -> None:
    calls = Calls()
    assert Client.drop_view(calls, "by_kind") is None  # type: ignore[arg-type]
    assert calls.sent == [(Op.DROP_VIEW, {"name": "by_kind"})]


@pytest.mark.parametrize(
    "error",
    [
        OperationError(ErrorCode.PROTOCOL, "drop_view: no view named 'nope'"),
        ClientConnectionError("tcp://127.0.0.1:1: connection lost"),
    ],
    ids=["unknown view", "controller unreachable"],
)
def test_client_drop_view_raises_the_operations_error(error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        Client.drop_view(Calls(error), "nope")  # type: ignore[arg-type]
    assert raised.value is error


def test_drop_view_is_not_retried_by_default() -> None:
    # A drop sent again after the connection broke may have run already: the second would be refused.
    assert Op.DROP_VIEW not in READ_OPS
    assert not RetryReadPolicy().should_retry(Op.DROP_VIEW, 1, ClientConnectionError("lost"))
