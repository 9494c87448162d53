"""A connectivity probe: a node that only checks every pair of nodes can reach each other over ZeroMQ.

Each probe binds a ROUTER (control) and a PULL (data) socket on ephemeral ports, then, once started,
sends ``hello`` to every peer's control socket from a DEALER and answers every ``hello`` it receives with
``welcome``. It is ready when every peer has both welcomed it and said hello to it. It runs the same
runtime sequence as a bus node, so it tests placement, rendezvous and firewalls without any role.

Frames are plain UTF-8 strings; nothing is pickled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from sparkbus.topologies.runtime import Endpoints, NodeHandle, NodeRequest

_POLL_MS = 50


@dataclass(frozen=True)
class ProbeFactory:
    """A ``NodeFactory`` making ``ProbeNode``s.

    Args:
        hello_interval: seconds between repeated ``hello``s to a peer that has not answered yet (a peer
            may bind after our first ``hello`` was queued).
    """

    hello_interval: float = 0.2

    def __call__(self, request: NodeRequest) -> NodeHandle:
        return ProbeNode(request, hello_interval=self.hello_interval)


class ProbeNode:
    """See the module docstring. Sockets are created in ``bind`` and used only by the serving thread after
    ``start`` (the thread start is the memory barrier ZeroMQ asks for when a socket changes threads)."""

    def __init__(self, request: NodeRequest, *, hello_interval: float = 0.2) -> None:
        self.node_id = request.node_id
        self._bind_host = request.topology.bus.host
        self._advertise = request.advertise_host
        self._rows = sum(int(getattr(b, "num_rows", 0)) for b in request.local_data)
        self._hello_interval = hello_interval
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._pull: zmq.Socket[bytes] | None = None
        self._peers: dict[str, Endpoints] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._welcomed: set[str] = set()
        self._greeted: set[str] = set()
        self._counts = {"hellos_sent": 0, "hellos_answered": 0, "welcomes_received": 0}

    def bind(self) -> Endpoints:
        self._ctx = zmq.Context()
        self._router = self._socket(zmq.ROUTER)
        self._pull = self._socket(zmq.PULL)
        control = self._bind(self._router)
        data = self._bind(self._pull)
        return Endpoints(control=control, data=data)

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def _bind(self, sock: zmq.Socket[bytes]) -> str:
        port = sock.bind_to_random_port(f"tcp://{self._bind_host}")
        return f"tcp://{self._advertise}:{port}"

    def set_peers(self, peers: Mapping[str, Endpoints]) -> None:
        self._peers = {k: v for k, v in peers.items() if k != self.node_id}
        if not self._peers:
            self._ready.set()

    def start(self) -> None:
        if self._router is None:
            raise RuntimeError(f"probe {self.node_id}: start() before bind()")
        self._thread = threading.Thread(target=self._serve, name=f"probe-{self.node_id}", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self._failure is not None:
                raise RuntimeError(f"probe {self.node_id} failed: {self._failure}")
            if time.monotonic() >= deadline:
                with self._lock:
                    silent = sorted(
                        p for p in self._peers if p not in self._welcomed or p not in self._greeted
                    )
                raise TimeoutError(
                    f"probe {self.node_id}: no handshake with {', '.join(silent)} within {timeout:g}s"
                )

    def feed(self, batches: Sequence[Any], *, last: bool) -> None:
        """Count the rows (a probe loads nothing)."""
        with self._lock:
            self._rows += sum(int(getattr(b, "num_rows", 0)) for b in batches)

    def failure(self) -> str | None:
        return self._failure

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._counts,
                "peers": len(self._peers),
                "peers_welcomed": len(self._welcomed),
                "peers_greeted": len(self._greeted),
                "ready": self._ready.is_set(),
                "rows": self._rows,
            }

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                raise RuntimeError(f"probe {self.node_id}: serving thread did not stop within 5s")
            self._thread = None
        for sock in (self._router, self._pull):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- the serving thread

    def _serve(self) -> None:
        assert self._ctx is not None and self._router is not None
        dealers: dict[str, zmq.Socket[bytes]] = {}
        try:
            poller = zmq.Poller()
            poller.register(self._router, zmq.POLLIN)
            for peer, ep in self._peers.items():
                sock = self._socket(zmq.DEALER)
                sock.connect(ep.control)
                dealers[peer] = sock
                poller.register(sock, zmq.POLLIN)
            by_socket = {sock: peer for peer, sock in dealers.items()}
            next_hello = 0.0
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= next_hello:
                    for peer, sock in dealers.items():
                        if peer not in self._welcomed:
                            sock.send_multipart([b"hello", self.node_id.encode()], zmq.NOBLOCK)
                            self._counts["hellos_sent"] += 1
                    next_hello = now + self._hello_interval
                for sock, _ in poller.poll(_POLL_MS):
                    if sock is self._router:
                        self._on_hello(self._router.recv_multipart(zmq.NOBLOCK))
                    else:
                        self._on_welcome(by_socket[sock], sock.recv_multipart(zmq.NOBLOCK))
        except Exception as exc:
            self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            for sock in dealers.values():
                sock.close(linger=0)
            for own in (self._router, self._pull):
                if own is not None:
                    own.close(linger=0)

    def _on_hello(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or frames[1] != b"hello":
            return  # a stray connection (a port scanner, a misconfigured peer) is not our failure
        who = frames[2].decode("utf-8", "replace")
        self._router_send([frames[0], b"welcome", self.node_id.encode()])
        with self._lock:
            self._counts["hellos_answered"] += 1
            if who in self._peers:
                self._greeted.add(who)
            self._check_ready()

    def _on_welcome(self, peer: str, frames: list[bytes]) -> None:
        if frames[:1] != [b"welcome"]:
            return
        with self._lock:
            self._counts["welcomes_received"] += 1
            self._welcomed.add(peer)
            self._check_ready()

    def _router_send(self, frames: list[bytes]) -> None:
        assert self._router is not None
        self._router.send_multipart(frames, zmq.NOBLOCK)

    def _check_ready(self) -> None:
        if self._welcomed >= set(self._peers) and self._greeted >= set(self._peers):
            self._ready.set()
