"""ZeroMQ peers for the tests of the Spark runtime's sockets: a context whose sockets all close at the end,
and the monitor event that ends a connection's first handshake."""

from __future__ import annotations

from collections.abc import Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

WAIT_MS = 10_000


class Sockets:
    """The test's ZeroMQ context and every socket made in it, all closed at the end (``with``)."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.opened: list[zmq.Socket[bytes]] = []

    def __enter__(self) -> Sockets:
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in self.opened:
            sock.close(linger=0)
        self.ctx.term()

    def add(self, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        sock.setsockopt(zmq.LINGER, 0)
        self.opened.append(sock)
        return sock

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        return self.add(self.ctx.socket(kind))

    def dealer(self, identity: bytes) -> zmq.Socket[bytes]:
        sock = self.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        return sock


def handshake(sock: zmq.Socket[bytes], endpoint: str, messages: Sequence[bytes] = ()) -> int:
    """Connect ``sock`` to ``endpoint`` and queue ``messages`` on it; the monitor event that ends its first
    handshake."""
    monitor = sock.get_monitor_socket()
    monitor.setsockopt(zmq.RCVTIMEO, WAIT_MS)
    ends = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    )
    try:
        sock.connect(endpoint)
        for message in messages:
            try:
                sock.send(message, zmq.NOBLOCK)
            except zmq.Again:
                # The handshake failed already and ZeroMQ dropped the connection's pipe (with no
                # IMMEDIATE, only that refuses a few messages): nothing more can be queued.
                break
        while True:
            event: int = recv_monitor_message(monitor)["event"]
            if event & ends:
                return event
    finally:
        sock.disable_monitor()
        monitor.close()
