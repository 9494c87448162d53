"""What a peer can make a node hold: ZeroMQ's MAXMSGSIZE bounds each frame, not a message: the data and
reply sockets have it at ``max_frame_bytes``, the ROUTER at ``max_message_bytes`` (a longer frame within it
is answered by the core); a message of more than ``max_frames`` frames is read to its end keeping only
the first ones, and refused naming them all. Real sockets on 127.0.0.1, every receive timed out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from sparkbus.bus import BusConfig, sockets
from sparkbus.bus.messages import ErrorCode, Reject
from sparkbus.bus.node import Node, context
from sparkbus.codecs import REGISTRY, EnvelopeCodec, KiB, Limits, MiB
from tests.sim.bus.roles import Note, pair

LIMITS = Limits(max_frame_bytes=64 * KiB, max_message_bytes=1 * MiB, max_frames=4)
CONFIG = BusConfig(cluster_tag="t", limits=LIMITS)
TIMEOUT_MS = 10_000


@pytest.fixture
def node() -> Iterator[Node]:
    made = Node("a", CONFIG, [])
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def dealer() -> Iterator[zmq.Socket[bytes]]:
    sock = context().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"stranger")
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    try:
        yield sock
    finally:
        sock.close(linger=0)


def test_every_bus_socket_bounds_each_frame_and_the_router_at_the_message_limit() -> None:
    made = [*sockets.server_sockets(context(), CONFIG), *sockets.peer_sockets(context(), CONFIG, "a")]
    try:
        # ROUTER, PULL, DEALER, PUSH: the ROUTER's requests over the frame limit are answered by the core.
        assert [s.getsockopt(zmq.MAXMSGSIZE) for s in made] == [
            LIMITS.max_message_bytes,
            *[LIMITS.max_frame_bytes] * 3,
        ]
    finally:
        for sock in made:
            sock.close(linger=0)


def _closed_unread(node: Node, sock: zmq.Socket[bytes], endpoint: str, frames: list[bytes]) -> None:
    """``frames`` sent to ``endpoint``: ZeroMQ closes the connection and the node reads nothing of them."""
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    monitor.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        # ZeroMQ refuses the first frame as its length arrives and closes the connection (no answer).
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
    status = node.status()
    assert status["counters"].get("bytes_in", 0) == 0, status["counters"]
    assert "LIMIT_EXCEEDED" not in status["refusals"], status["refusals"]


def test_a_data_frame_over_max_frame_bytes_closes_the_connection_before_the_node_reads_it(
    node: Node,
) -> None:
    ep = node.bind()
    node.start({})
    push = context().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
    try:
        # Each frame within max_message_bytes, each over max_frame_bytes.
        _closed_unread(node, push, ep.data, [b"\x00" * (900 * KiB)] * 40)
    finally:
        push.close(linger=0)


def test_a_control_frame_over_max_message_bytes_closes_the_connection_before_the_node_reads_it(
    node: Node, dealer: zmq.Socket[bytes]
) -> None:
    ep = node.bind()
    node.start({})
    _closed_unread(node, dealer, ep.control, [b"\x00" * (LIMITS.max_message_bytes + 1)] * 3)


def test_a_control_frame_over_max_frame_bytes_within_the_message_limit_is_answered_limit_exceeded(
    node: Node, dealer: zmq.Socket[bytes]
) -> None:
    ep = node.bind()
    node.start({})
    dealer.connect(ep.control)
    header = msgpack.packb([1, REGISTRY.code_of(Note), 0, 0, None, 0])
    dealer.send_multipart([header, b"\x00" * (LIMITS.max_frame_bytes + 1)])
    answer = EnvelopeCodec(REGISTRY).decode(dealer.recv_multipart()).message
    assert isinstance(answer, Reject) and answer.code == ErrorCode.LIMIT_EXCEEDED
    assert f"limit is {LIMITS.max_frame_bytes}" in answer.message
    assert node.status()["refusals"]["LIMIT_EXCEEDED"] == 1


def test_recv_message_keeps_max_frames_and_drops_the_rest_of_the_message() -> None:
    pull, push = context().socket(zmq.PULL), context().socket(zmq.PUSH)
    try:
        pull.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        push.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send_multipart([bytes([i]) * (i + 1) for i in range(10)])
        push.send_multipart([b"next", b"one"])
        assert pull.poll(TIMEOUT_MS)
        with pytest.raises(sockets.TooManyFrames) as over:
            sockets.recv_message(pull, zero_copy=False, max_frames=4)
        assert [bytes(f) for f in over.value.frames] == [b"\x00", b"\x01" * 2, b"\x02" * 3, b"\x03" * 4]
        assert (over.value.count, over.value.size) == (10, sum(range(1, 11)))
        assert pull.poll(TIMEOUT_MS)
        assert sockets.recv_message(pull, zero_copy=False, max_frames=4) == [b"next", b"one"]
    finally:
        pull.close(linger=0)
        push.close(linger=0)


def test_a_control_message_over_max_frames_is_refused_naming_every_frame_and_only_the_first_are_kept(
    node: Node, dealer: zmq.Socket[bytes]
) -> None:
    ep = node.bind()
    seen: list[tuple[int, int]] = []
    core = node.core
    refuse = core.on_too_many_frames

    def spy(channel: str, source: Any, frames: Any, count: int, size: int, now: float) -> None:
        seen.append((len(frames), count))
        refuse(channel, source, frames, count, size, now)

    core.on_too_many_frames = spy  # type: ignore[method-assign]
    node.start({})
    dealer.connect(ep.control)
    header = msgpack.packb([1, REGISTRY.code_of(Note), 0, 0, None, 0])
    dealer.send_multipart([header, *[b"\x00" * KiB] * 11])
    answer = EnvelopeCodec(REGISTRY).decode(dealer.recv_multipart()).message
    assert isinstance(answer, Reject) and answer.code == ErrorCode.LIMIT_EXCEEDED
    assert answer.message == "?.<frames>: 12 frames, limit is 4"
    assert seen == [(LIMITS.max_frames, 12)]
    assert node.status()["refusals"]["LIMIT_EXCEEDED"] == 1


def test_the_core_refuses_a_data_message_or_an_answer_over_max_frames_as_any_over_a_limit() -> None:
    sim, _, _ = pair(1)
    a = sim.node("a").core
    a.on_too_many_frames("data", "", [b"x"] * 64, 70, 70, sim.now)
    assert a.refusals["LIMIT_EXCEEDED"] == 1
    a.on_too_many_frames("reply", "b", [b"x"] * 64, 70, 70, sim.now)
    assert a.is_refused("b") and "70 frames, limit is 64" in a.refused()["b"]
