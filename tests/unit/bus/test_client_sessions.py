"""A thin client's session (HELLO ``kind="client"``) reaches only the roles that serve thin clients: any other
role's message from it is refused with ERROR ``OUT_OF_STATE`` (the session goes on), and its stream batches
are dropped. The node's core is driven by hand, as a client's DEALER would."""

from __future__ import annotations

import random
from typing import Any

from sparkbus.bus import BusConfig, ErrorCode
from sparkbus.bus import contract as c
from sparkbus.bus.core import NodeCore
from sparkbus.bus.messages import MAGIC, Error, Hello, StreamBatch, Welcome, features_to_bits
from sparkbus.bus.state import Transmit
from sparkbus.codecs import REGISTRY, EnvelopeCodec, Limits, MiB
from sparkbus.roles.client import Gateway, Op, Request, Response
from sparkbus.roles.exchange.buffers import BufferState
from sparkbus.roles.exchange.messages import BinRequest, RequestType
from sparkbus.roles.exchange.server import BinxServer
from tests.sim.bus.roles import Note, Recorder

codec = EnvelopeCodec(REGISTRY)
NOW = 1000.0


class ThinClient:
    """A thin client's session on ``core``'s ROUTER under routing id ``rid``."""

    def __init__(self, core: NodeCore, rid: bytes) -> None:
        self.core, self.rid, self.seq = core, rid, 0
        self.got: list[Any] = []
        hello = Hello(
            magic=MAGIC,
            version=core.config.versions[0],
            features=features_to_bits(()),
            cluster_tag=core.config.cluster_tag,
            node_id="c",
            kind="client",
            attempt=1,
        )
        core.on_control(rid, codec.encode(hello), NOW)
        (welcome,) = self.collect()
        assert isinstance(welcome, Welcome)
        self.session = welcome.session
        self.peer = f"client:{rid.hex()}"

    def send(self, msg: Any) -> list[Any]:
        self.seq += 1
        self.core.on_control(self.rid, codec.encode(msg, session=self.session, seq=self.seq), NOW)
        return self.collect()

    def collect(self) -> list[Any]:
        new = [
            codec.decode(out.frames).message
            for out in self.core.take()
            if isinstance(out, Transmit) and out.channel == "reply" and out.to == self.rid
        ]
        self.got += new
        return new


def assert_served(client: ThinClient, request_id: int) -> None:
    """The client's REQUEST still reaches the gateway, and is answered."""
    (answer,) = client.send(Request(request_id=request_id, op=Op.PING, args={}, ack=(), window=8))
    assert isinstance(answer, Response) and answer.request_id == request_id and answer.code == 0


def node(*roles: Any, limits: Limits | None = None) -> NodeCore:
    config = BusConfig(cluster_tag="t", limits=limits or Limits())
    return NodeCore("n1", config, list(roles), random.Random(7).getrandbits)


def test_a_message_of_a_role_that_serves_no_clients_is_refused_and_the_session_serves_on() -> None:
    rec = Recorder()  # a node-to-node role
    core = node(Gateway("n1"), rec)
    client = ThinClient(core, b"\x00c1")
    (refused,) = client.send(Note(text="secret"))
    assert isinstance(refused, Error) and refused.code == ErrorCode.OUT_OF_STATE
    assert "Note is not a thin-client message" in refused.message
    assert refused.ref_type == REGISTRY.code_of(Note)
    assert not rec.of(c.MessageReceived) and not rec.of(c.BatchReceived)
    assert core.refusals["OUT_OF_STATE"] == 1
    # Not the session's end: the client's next message reaches the role that serves it.
    assert_served(client, 1)
    assert core.is_up(client.peer)


def test_a_stream_batch_from_a_thin_client_is_dropped() -> None:
    rec = Recorder()  # a node-to-node role
    core = node(Gateway("n1"), rec)
    client = ThinClient(core, b"\x00c2")
    batch = StreamBatch(ordinal=0, last=True, remaining=0, data=b"rows")
    core.on_data(codec.encode(batch, session=client.session, seq=1, stream="rec/s"), NOW)
    assert not rec.of(c.MessageReceived) and not rec.of(c.BatchReceived)
    assert core.refusals["OUT_OF_STATE"] == 1
    assert_served(client, 1)


def _delete(task: str) -> BinRequest:
    return BinRequest(
        sequence=1,
        requestType=RequestType.DELETE,
        getDataSize=False,
        maxSizeOctets=0,
        maxWaitMicroSeconds=0,
        taskId=task,
        bufferId=0,
        pageToken=0,
    )


def test_a_thin_client_cannot_delete_a_querys_binx_buffer_and_its_requests_still_run() -> None:
    server = BinxServer()
    core = node(server, Gateway("n1"))
    server.publish("q1.0.1", 0, [b"page-0", b"page-1"], last=True, now=NOW)
    client = ThinClient(core, b"\x00c3")
    (refused,) = client.send(_delete("q1.0.1"))
    assert isinstance(refused, Error) and refused.code == ErrorCode.OUT_OF_STATE
    buf = server.buffers.get("q1.0.1", 0)
    assert buf is not None and buf.state is not BufferState.DESTROYED
    assert_served(client, 1)


def test_a_request_that_does_not_decode_on_the_node_fails_with_malformed_and_the_session_goes_on() -> None:
    core = node(Gateway("n1"))
    client = ThinClient(core, b"\x00c4")
    # A top-level argument name that is not a str: msgpack carries it, the node's decoder refuses it.
    error, answer = client.send(Request(request_id=1, op=Op.SQL, args={1: "x"}, ack=(), window=8))  # type: ignore[dict-item]
    assert isinstance(error, Error) and error.code == ErrorCode.MALFORMED
    assert isinstance(answer, Response) and (answer.request_id, answer.last) == (1, True)
    assert answer.code == ErrorCode.MALFORMED and "Request.args" in answer.error
    assert_served(client, 2)


def test_a_request_over_the_nodes_limits_fails_with_limit_exceeded_and_the_session_goes_on() -> None:
    core = node(Gateway("n1"), limits=Limits(max_frame_bytes=1 * MiB))
    client = ThinClient(core, b"\x00c5")
    big = Request(request_id=1, op=Op.WRITE, args={"rows": b"x" * (2 * MiB)}, ack=(), window=8)
    error, answer = client.send(big)
    assert isinstance(error, Error) and error.code == ErrorCode.LIMIT_EXCEEDED
    assert isinstance(answer, Response) and answer.request_id == 1
    assert answer.code == ErrorCode.LIMIT_EXCEEDED
    assert "Request.<frame 1>: 2097198 bytes, limit is 1048576" in answer.error
    assert_served(client, 2)  # the refused message took its sequence number: no gap
    assert core.is_up(client.peer)
