"""A node process's status endpoint (plain ZeroMQ on 127.0.0.1, answering REQ as REP does, no key: anyone on the machine reaches it)
under requests that are not ``status``: each gets an error answer or is dropped, and the node keeps serving.
A real node process (``python -m sparkbus.topologies.nodeproc``), loopback only, every receive bounded."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from sparkbus.topologies.nodeproc import STATUS_MAX_FRAME
from sparkbus.topologies.schema import load

pytestmark = pytest.mark.integration

ONE = """
[cluster]
name = "one"

[[nodes]]
name = "a"
placement = "host"
host = "127.0.0.1"
services = ["echo"]
"""

WAIT_MS = 10_000


class Node:
    """One node process, started and linked (to no peer), and its status address."""

    def __init__(self, path: Path) -> None:
        node_id = load(str(path)).node_ids()[0]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparkbus.topologies.nodeproc", str(path), node_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.events: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.status = str(self.expect("bound")["status"])
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "peers", "peers": {}}) + "\n")
        self.expect("ready")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def expect(self, event: str) -> dict[str, Any]:
        msg = self.events.get(timeout=WAIT_MS / 1000)
        assert msg is not None and msg.get("event") == event, msg
        return msg

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # end of file: the node stops
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    path = tmp_path_factory.mktemp("one") / "one.toml"
    path.write_text(ONE)
    running = Node(path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    made: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield made
    made.destroy(linger=0)


def socket_to(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, address: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, WAIT_MS)
    sock.connect(address)
    return sock


def good_status(ctx: zmq.Context[zmq.Socket[bytes]], node: Node) -> dict[str, Any]:
    req = socket_to(ctx, zmq.REQ, node.status)
    req.send(b"status")
    body: dict[str, Any] = json.loads(req.recv())
    req.close()
    return body


def error_answer(ctx: zmq.Context[zmq.Socket[bytes]], node: Node, frames: list[bytes]) -> str:
    """Send ``frames`` as the body of one request (a DEALER, with REQ's empty delimiter); the error answered."""
    dealer = socket_to(ctx, zmq.DEALER, node.status)
    dealer.send_multipart([b"", *frames])
    reply = dealer.recv_multipart()
    dealer.close()
    assert len(reply) == 2 and reply[0] == b"", reply
    body = json.loads(reply[1])
    assert body["ok"] is False and body["node"] == "a", body
    return str(body["error"])


def send_and_go(ctx: zmq.Context[zmq.Socket[bytes]], node: Node, frames: list[bytes]) -> None:
    """Send ``frames`` as they are (no delimiter added) and hang up without waiting for anything."""
    dealer = socket_to(ctx, zmq.DEALER, node.status)
    dealer.send_multipart(frames)
    dealer.close()


def raw_bytes(node: Node, data: bytes) -> None:
    """``data`` on a TCP connection to the status port, which is not ZeroMQ at all."""
    host, port = node.status.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_MS / 1000) as conn:
        conn.sendall(data)
        conn.settimeout(2)
        try:
            while conn.recv(4096):  # the greeting, then the end when libzmq drops us
                pass
        except (TimeoutError, ConnectionResetError):
            pass


Ctx = zmq.Context[zmq.Socket[bytes]]

ANSWERED: dict[str, tuple[list[bytes], str]] = {
    "two frames": ([b"status", b"extra"], "one frame b'status', not 2"),
    "many frames": ([b"x"] * 1000, "one frame b'status', not 1000"),
    "many frames of the largest size": ([b"y" * STATUS_MAX_FRAME] * 50, "not 50"),
    "a long envelope": ([b"e"] * 20 + [b"", b"status"], "not 22"),
    "garbage bytes": ([b"\xff\x00\x17garbage"], "not b'\\xff\\x00\\x17garbage'"),
    "a JSON body": ([b'{"status": true}'], "b'status', not b'{\"status\": true}'"),
    "an empty body": ([b""], "not b''"),
    "a long body": ([b"s" * STATUS_MAX_FRAME], "not b'" + "s" * 32 + "'..."),
    "no body": ([], "one frame b'status', not 0"),
}


@pytest.mark.parametrize("name", sorted(ANSWERED))
def test_a_request_that_is_not_status_gets_an_error_and_the_node_serves_on(
    node: Node, ctx: Ctx, name: str
) -> None:
    frames, why = ANSWERED[name]
    assert why in error_answer(ctx, node, frames)
    assert good_status(ctx, node)["ok"] is True
    assert node.proc.poll() is None


DROPPED: dict[str, Callable[[Ctx, Node], None]] = {
    "a frame over the size limit": lambda ctx, node: send_and_go(ctx, node, [b"", b"z" * (1 << 20)]),
    "no delimiter": lambda ctx, node: send_and_go(ctx, node, [b"status"]),
    "no delimiter among many frames": lambda ctx, node: send_and_go(
        ctx, node, [b"e"] * 100 + [b"", b"status"]
    ),
    "a request whose sender hangs up": lambda ctx, node: send_and_go(ctx, node, [b"", b"status", b"x"]),
    "not ZeroMQ": lambda ctx, node: raw_bytes(node, b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 64),
    "a ZeroMQ greeting then garbage": lambda ctx, node: raw_bytes(
        node, b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 48 + b"\x04\xff" + b"\xee" * 64
    ),
}


@pytest.mark.parametrize("name", sorted(DROPPED))
def test_a_request_that_is_dropped_leaves_the_node_serving(node: Node, ctx: Ctx, name: str) -> None:
    DROPPED[name](ctx, node)
    body = good_status(ctx, node)
    assert body["ok"] is True and body["node"] == "a" and "peers" in body["status"], body
    assert node.proc.poll() is None
