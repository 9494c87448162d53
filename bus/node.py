"""The ZeroMQ node: sockets and the loop thread around a ``NodeCore``.

Sockets, one set per node (DESIGN.md section 4): one ROUTER bound for control, one PULL bound for data; per
peer one DEALER (identity = our node id) to its ROUTER and one PUSH to its PULL, made and
given their options by ``sparkbus.bus.sockets`` (LINGER=0, explicit HWMs, MAXMSGSIZE, ZMTP heartbeats; ROUTER_MANDATORY
and ROUTER_HANDOVER on the ROUTER; IMMEDIATE on DEALER and PUSH). MAXMSGSIZE bounds each frame; of a
message with more than ``limits.max_frames`` frames the loop keeps only the first ones, drops the rest as
it reads them, and the core refuses the message (``NodeCore.on_too_many_frames``).
Sends never block the loop (NOBLOCK): a message ZeroMQ will not take is counted, and the sequence gap it
leaves makes the peer reset the link, so nothing is lost silently. One loop thread owns every socket;
other threads talk to it through an inproc pipe.

With ``BusConfig.curve`` every socket speaks CURVE (``sparkbus.bus.security``): a peer whose key or
address is not allowed never gets past the ZeroMQ handshake, so it cannot even send a HELLO; each such
refusal is logged with its address and counted (``refusals["curve_denied"]`` in ``status()``). A peer
whose handshake fails before ZAP is asked (a plain client, another mechanism, a broken handshake) is seen
by the server sockets' monitors and counted as ``refusals["curve_handshake_failed"]``, and logged once
per address where the address can still be read; a peer that refused our key is dialled again, backing
off, until it admits it (``sparkbus.bus.refusals``).

The HTTP exchange (docs/EXCHANGE.md section 5): a node that runs ``binx.server`` also serves that role's
output buffers over HTTP (``HttpExchangeServer`` bound on the node's host, an ephemeral port, advertised
as ``Endpoints.http``); every access is forwarded to the loop as a ``LocalCall`` of the role (``read``,
``acknowledge``, ``delete``), and a long-poll parks in the role. A node that runs ``http.client`` makes
that role's ``HttpFetch`` requests on worker threads (``HttpFetcher``), to the address each peer
advertised in the endpoints given to ``start``, and hands the answers back to the role on the loop. Both
stop with the node; every thread they started is joined. A node with ``BusConfig.curve`` serves no HTTP
exchange (``Endpoints.http`` is ""): Presto's HTTP exchange is plain HTTP, neither encrypted nor
authenticated, and would hand the buffers to anyone who reaches its port, around the bus's keys and
address list; the pulled exchange under CURVE is BinX, over the encrypted bus.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import secrets
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.backend import Socket as _BackendSocket
from zmq.backend import zmq_poll as _zmq_poll
from zmq.utils.monitor import parse_monitor_message

from sparkbus.bus import allocator, security, sockets
from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.core import NodeCore
from sparkbus.bus.http_exchange import HttpExchangeServer, LoopBuffers
from sparkbus.bus.http_fetch import HttpFetcher
from sparkbus.bus.refusals import CurveRefusals
from sparkbus.bus.sockets import context
from sparkbus.bus.state import Completed, Transmit

log = logging.getLogger("sparkbus.bus")

#: The prefix of the ipc directory a node makes for itself under /tmp when ``bus.ipc_dir`` is not set; it
#: removes it when it stops, which a node killed with SIGKILL never does (``sparkbus up`` removes those).
OWN_IPC_DIR_PREFIX = "sparkbus-ipc-"


@dataclass(frozen=True)
class Endpoints:
    """Where a node listens: ``http`` is its HTTP exchange server's ``host:port``, "" when it has none."""

    control: str
    data: str
    http: str = ""

    def to_json(self) -> dict[str, str]:
        raw = {"control": self.control, "data": self.data}
        if self.http:
            raw["http"] = self.http
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> Endpoints:
        return cls(control=raw["control"], data=raw["data"], http=raw.get("http", ""))


class Node:
    """A bus node running ``roles`` on real sockets.

    Typical use::

        node = Node("n1", BusConfig(), [MyRole()])
        endpoints = node.bind()            # publish these to the peers
        node.start({"n2": endpoints_of_n2})
        node.wait_ready(timeout=10)
        result = node.call("myrole", "do", {...}, timeout=5)
        node.stop()

    Args:
        node_id: unique in the topology; also our DEALER routing id.
        config: bus settings.
        roles: the roles to run.
        host: interface to bind (tests and the local runtime use 127.0.0.1).
        transport: ``"tcp"`` or ``"ipc"`` (``ipc_dir`` then holds the socket files).
        http_workers: threads making the ``http.client`` role's requests (if the node runs it).
    """

    def __init__(
        self,
        node_id: str,
        config: BusConfig,
        roles: Sequence[c.Role],
        *,
        host: str = "127.0.0.1",
        transport: str = "tcp",
        ipc_dir: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        http_workers: int = 4,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.core = NodeCore(node_id, config, roles, secrets.randbits)
        self.host = host
        self.transport = transport
        self.ipc_dir = ipc_dir
        self.ports = ports
        self._own_ipc_dir: str | None = None  # made by bind (no ipc_dir given), removed by stop
        self.clock = clock
        self.endpoints: Endpoints | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._pull: zmq.Socket[bytes] | None = None
        self._dealers: dict[str, zmq.Socket[bytes]] = {}
        self._pushes: dict[str, zmq.Socket[bytes]] = {}
        self._monitors: dict[zmq.Socket[bytes], str] = {}
        self._peer_endpoints: dict[str, Endpoints] = {}
        self._hung_up: set[str] = set()  # peers refused for good: no longer dialled
        # CURVE only: monitors of our ROUTER and PULL (name "control" / "data").
        self._server_monitors: dict[zmq.Socket[bytes], str] = {}
        self._wake_rx: zmq.Socket[bytes] | None = None
        self._wake_tx: zmq.Socket[bytes] | None = None
        # Work for the loop from other threads, each with the future it answers (None: nobody waits on it).
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], Future[Any] | None]] = queue.SimpleQueue()
        self._calls_run = 0  # commands the loop ran for other threads (calls, status): input, for idle_spin
        self._calls: dict[int, Future[Any]] = {}
        self._thread: threading.Thread | None = None
        # Set by stop(), read by the loop once per turn (a plain flag: Event.is_set is a call of its own).
        self._stopping = False
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._graceful = False
        self.drops: dict[str, int] = {}
        # Peers whose DEALER refused a message since its last ZMTP handshake (IMMEDIATE: not connected yet).
        self._ctl_refused: set[str] = set()
        # Sockets the loop sent on this turn, whose ZMQ_EVENTS it reads before it sleeps (see ``_run``).
        self._touched: set[zmq.Socket[bytes]] = set()
        # Each socket's zmq_poll item, for asking it for ZMQ_EVENTS (set up by ``_run``).
        self._poll_items: dict[zmq.Socket[bytes], list[tuple[zmq.Socket[bytes], int]]] = {}
        self._keys: security.KeyPair | None = None
        # CURVE only: node ids (routing ids) with a public key of their own, which no other key speaks for.
        self._owned_ids: frozenset[bytes] = frozenset()
        self._zap_domain: str | None = None
        # What CURVE refused, both ways (written by the ZAP thread and the loop, read by status()).
        self._refusals = CurveRefusals(node_id)
        # The HTTP exchange (module docstring): server and its source, fetcher, the peers' addresses.
        self._http_workers = http_workers
        self._http_server: HttpExchangeServer | None = None
        self._http_source: LoopBuffers | None = None
        self._http_fetcher: HttpFetcher | None = None
        self._peer_http: dict[str, str] = {}
        self._jobs_call: int | None = None  # the open "jobs" call on the http.client role
        self._jobs_again = False

    # ------------------------------------------------------------------ setup (caller's thread)

    def bind(self) -> Endpoints:
        """Bind the ROUTER and the PULL on ephemeral ports (or ipc files) and return where they listen."""
        if self.config.tune_allocator:
            allocator.tune()  # before the first receive buffer is allocated
        ctx = context()
        router, pull = sockets.server_sockets(ctx, self.config)
        self._router, self._pull = router, pull
        if self.config.curve is not None:
            self._secure_servers(ctx, router, pull)
        if self.transport == "ipc":
            base = self.ipc_dir
            if base is None:
                # A directory of this node's own (under /tmp: ipc paths have a length limit), so two
                # clusters with the same node ids never bind one path; removed when the node stops.
                base = self._own_ipc_dir = tempfile.mkdtemp(prefix=OWN_IPC_DIR_PREFIX, dir="/tmp")
            control, data = f"ipc://{base}/{self.node_id}-ctl", f"ipc://{base}/{self.node_id}-data"
            router.bind(control)
            pull.bind(data)
        else:
            control = sockets.bind_tcp(router, self.host, self.ports, f"node {self.node_id} (control)")
            data = sockets.bind_tcp(pull, self.host, self.ports, f"node {self.node_id} (data)")
        http = ""
        # Under CURVE no HTTP exchange: it is plain HTTP with no authentication (module docstring).
        if c.HTTP_BUFFERS in self.core.roles and self._http_server is None and self.config.curve is None:
            self._http_source = LoopBuffers(self.node_id, self.call_async)
            self._http_server = self._http_exchange_server(self._http_source)
            http = f"{self.host}:{self._http_server.port}"
        self.endpoints = Endpoints(control=control, data=data, http=http)
        return self.endpoints

    def _http_exchange_server(self, source: LoopBuffers) -> HttpExchangeServer:
        if self.ports is None:
            return HttpExchangeServer(source, host=self.host, port=0)
        return sockets.first_free_port(
            self.ports,
            lambda port: HttpExchangeServer(source, host=self.host, port=port),
            f"node {self.node_id} (HTTP exchange)",
        )

    def _secure_servers(
        self, ctx: zmq.Context[zmq.Socket[bytes]], router: zmq.Socket[bytes], pull: zmq.Socket[bytes]
    ) -> None:
        curve = self.config.curve
        assert curve is not None
        self._keys = security.node_keys(curve.key_dir, self.node_id)
        # The ZAP handler must answer before the first client handshakes: libzmq admits any client that
        # knows the server key when no handler is bound.
        domain = f"sparkbus/{self.node_id}/{id(self):x}"
        names = security.register(ctx, domain, curve, self._refusals.denied)
        self._zap_domain = domain
        self._owned_ids = frozenset(n.encode() for n in names.values() if n != security.SHARED_NAME)
        for sock, name in ((router, "control"), (pull, "data")):
            security.apply_server(sock, self._keys, domain)
            self._server_monitors[sock.get_monitor_socket(_SERVER_EVENTS)] = name

    def start(self, peers: dict[str, Endpoints]) -> None:
        """Connect to ``peers`` and start the loop thread (which owns every socket from now on)."""
        if self.endpoints is None:
            self.bind()
        ctx = context()
        wake_addr = f"inproc://sparkbus-wake-{id(self)}"
        self._wake_rx = ctx.socket(zmq.PULL)
        self._wake_rx.bind(wake_addr)
        self._wake_tx = ctx.socket(zmq.PUSH)
        self._wake_tx.setsockopt(zmq.LINGER, 0)
        self._wake_tx.connect(wake_addr)
        for peer, ep in peers.items():
            if peer != self.node_id:
                self._connect_peer(peer, ep)
        # Known peers before the loop reads its first message: a peer's HELLO that arrived before
        # add_peer was refused as "not a peer" and its handshake waited a whole timeout to retry.
        now = self.clock()
        for peer in peers:
            if peer != self.node_id:
                self.core.add_peer(peer, now)
        self._peer_http = {p: ep.http for p, ep in peers.items() if ep.http}
        if self._http_server is not None:
            self._http_server.start()
        if c.HTTP_CLIENT in self.core.roles:
            self._http_fetcher = HttpFetcher(
                self._on_fetched,
                workers=self._http_workers,
                max_body_bytes=self.config.limits.max_message_bytes,  # an answer is no larger than a message
                name=f"sparkbus-http-{self.node_id}",
            )
        self._thread = threading.Thread(target=self._run, name=f"sparkbus-node-{self.node_id}", daemon=True)
        self._thread.start()

    def _connect_peer(self, peer: str, ep: Endpoints) -> None:
        dealer, push = sockets.peer_sockets(context(), self.config, self.node_id)
        events = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        if self.config.curve is not None:
            assert self._keys is not None
            server = security.server_key(self.config.curve.key_dir, peer)
            for sock in (dealer, push):
                security.apply_client(sock, self._keys, server)
            events |= zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        monitor = dealer.get_monitor_socket(events)
        dealer.connect(ep.control)
        push.connect(ep.data)
        self._dealers[peer] = dealer
        self._pushes[peer] = push
        self._peer_endpoints[peer] = ep
        self.core.peer_addresses[peer] = ep.control
        self._monitors[monitor] = peer

    # ------------------------------------------------------------------ API (any thread)

    def wait_ready(self, timeout: float) -> None:
        """Block until every peer is up; raise ``TimeoutError`` naming the ones that are not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError(f"node {self.node_id} loop failed: {self.error}") from self.error
            status = self.status(timeout=max(0.1, deadline - time.monotonic()))
            missing = [p for p, st in status["peers"].items() if not st["up"]]
            if not missing and len(status["peers"]) >= len(self._dealers):
                return
            if status["refused"]:
                raise ConnectionRefusedError(f"node {self.node_id}: links refused: {status['refused']}")
            time.sleep(0.01)
        wrong = f" ({'; '.join(status['misdirected'].values())})" if status["misdirected"] else ""
        raise TimeoutError(f"node {self.node_id}: peers not up after {timeout} s: {missing}{wrong}")

    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        """A local call into a role; returns its result or raises ``RuntimeError`` with its error."""
        return self.call_async(role, name, args).result(timeout=timeout)

    def call_async(self, role: str, name: str, args: dict[str, Any] | None = None) -> Future[Any]:
        fut: Future[Any] = Future()

        def run() -> None:
            cid = self.core.call(role, name, args or {}, self.clock())
            self._calls[cid] = fut
            self._flush()

        self._submit(run, fut)
        return fut

    def status(self, *, timeout: float = 5.0) -> dict[str, Any]:
        """Peers, sessions, streams and counters (read on the loop thread)."""
        fut: Future[dict[str, Any]] = Future()

        def run() -> None:
            st = self.core.status()
            st["drops"] = dict(self.drops)
            counts, refused = self._refusals.snapshot()
            for what, n in counts.items():
                st["refusals"][what] = st["refusals"].get(what, 0) + n
            st["refused"].update(refused)
            st["endpoints"] = self.endpoints.to_json() if self.endpoints else None
            st["hung_up"] = sorted(self._hung_up)
            st["allocator"] = allocator.state()
            fut.set_result(st)

        self._submit(run, fut)
        return fut.result(timeout=timeout)

    def stop(self, *, timeout: float = 5.0) -> None:
        """Say goodbye to the peers, stop the loop, close every socket; stop the HTTP exchange.

        Every call (``call``, ``call_async``, ``status``) the loop has not answered by then, in progress or
        still queued for it, fails with ``RuntimeError("node <id> stopped")``.
        """
        if self._http_source is not None:
            self._http_source.close()  # HTTP requests waiting for the loop are answered 503
        try:
            self._stop_loop(timeout)
            # Nothing calls the roles any more: each may let go of what it holds (Role, "close").
            for role in self.core.roles.values():
                close = getattr(role, "close", None)
                if callable(close):
                    close()
        finally:
            if self._http_server is not None:
                self._http_server.close()
                self._http_server = None
            if self._http_fetcher is not None:
                self._http_fetcher.close()
                self._http_fetcher = None

    def _stop_loop(self, timeout: float) -> None:
        if self._thread is None:
            self._close()
            return
        self._stopping = True
        # The loop may see the flag on its own and close its sockets first; then there is nobody to wake.
        with contextlib.suppress(RuntimeError):
            self._submit(lambda: None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"node {self.node_id}: loop did not stop within {timeout} s")
        self._thread = None

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _submit(self, fn: Callable[[], None], fut: Future[Any] | None = None) -> None:
        # The inproc PUSH is only written by callers, never by the loop; ZeroMQ sockets are not thread-safe,
        # so callers serialise on a lock, and the loop closes the socket under the same lock (a caller that
        # checked it open must not send on it closed).
        with _WAKE_LOCK:
            if self._thread is None or self._wake_tx is None:
                raise RuntimeError(f"node {self.node_id} is not running")
            self._commands.put((fn, fut))
            with contextlib.suppress(zmq.Again):  # the loop has wake-ups queued already
                self._wake_tx.send(b"", zmq.NOBLOCK)

    # ------------------------------------------------------------------ the loop (its own thread)

    def _run(self) -> None:
        assert self._router is not None and self._pull is not None and self._wake_rx is not None
        router, pull, core, clock = self._router, self._pull, self.core, self.clock
        # What to read when a socket may have input, in the order a turn serves them.
        handlers: dict[zmq.Socket[bytes], Callable[[], bool]] = {
            self._wake_rx: self._on_wake,
            router: self._drain_control,
            pull: lambda: self._drain(pull, self._on_data, ("data", ""), copy=False),
        }
        for peer, sock in self._dealers.items():
            handlers[sock] = functools.partial(
                self._drain, sock, functools.partial(self._on_reply, peer), ("reply", peer)
            )
        for mon, peer in self._monitors.items():
            handlers[mon] = functools.partial(self._on_monitor, mon, peer)
        for mon, name in self._server_monitors.items():
            handlers[mon] = functools.partial(self._on_server_monitor, mon, name)
        rank = {sock: i for i, sock in enumerate(handlers)}
        # The loop sleeps in poll(2) on the sockets' ZMQ_FDs rather than in zmq_poll, which asks every
        # socket for its ZMQ_EVENTS (a poll(2) of its own each) before and after sleeping: twelve system
        # calls per wake-up over five sockets. A ZMQ_FD is readable while the socket has commands to
        # process, such as "a pipe has messages again"; any operation on the socket may process them and
        # leave the FD quiet with messages waiting. So a socket the loop sent on, or stopped reading
        # before it was empty, is asked for ZMQ_EVENTS (or read again) before the loop sleeps.
        by_fd: dict[int, zmq.Socket[bytes]] = {}
        fds = select.poll()
        for sock in handlers:
            fd = int(sock.getsockopt(zmq.FD))
            by_fd[fd] = sock
            fds.register(fd, select.POLLIN)
        # Each socket's own poll item: zmq_poll of one socket asks it for ZMQ_EVENTS without the enum lookup
        # pyzmq's getsockopt makes in Python on every call (the poll(2) of its ZMQ_FD it adds costs less).
        items = {sock: [(sock, _POLLIN)] for sock in handlers}
        self._poll_items = items
        self._touched.clear()
        more: set[zmq.Socket[bytes]] = set(handlers)  # not known to be empty: read without waiting
        spinner = int(self.config.idle_spin > 0)
        with _LOOPS_LOCK:
            _LOOPS[0] += spinner
        try:
            if self._http_fetcher is not None:
                self._ask_jobs()
                self._flush()
            wait_ms, served = 0, False
            heartbeat, idle_spin = self.config.heartbeat_interval, self.config.idle_spin
            short_waits = _SHORT_WAITS
            while not self._stopping:
                touched = self._touched
                if touched:
                    for sock in touched:
                        if _zmq_poll(items[sock], 0):
                            more.add(sock)
                    touched.clear()
                ready = more
                more = set()
                if ready or not wait_ms:
                    events = fds.poll(0)
                    started = clock()
                elif served and idle_spin and _LOOPS[0] == 1:
                    # The last turn served input: its answer, or the next request, may be microseconds
                    # away, and reading it without sleeping spares the wake-up of a sleeping thread. Only
                    # while it pays: after _SHORT_WAITS waits in a row that ended within the spin, so an
                    # idle node's heartbeats and spaced traffic (pairs of messages included) do not spin.
                    # Never past the next deadline: a timer is not made late by a spin.
                    idle_from = clock()
                    events = (
                        short_waits >= _SHORT_WAITS
                        and _spin(fds.poll, idle_from + min(idle_spin, wait_ms / 1000), clock)
                    ) or fds.poll(max(0, wait_ms - int((clock() - idle_from) * 1000)))
                    started = clock()
                    short_waits = short_waits + 1 if events and started - idle_from <= idle_spin else 0
                else:
                    events = fds.poll(wait_ms)
                    started = clock()
                for fd, _ in events:
                    ready.add(by_fd[fd])
                handled = core.handled + self._calls_run
                # _serve, written out: a turn usually serves one socket (a message, its answer).
                for sock in sorted(ready, key=rank.__getitem__) if len(ready) > 1 else ready:
                    if handlers[sock]():
                        more.add(sock)
                # Input, not a wake-up alone: a socket's FD also signals after a send.
                served = core.handled + self._calls_run != handled
                now = clock()
                if now - started > heartbeat:
                    # We were busy long enough for peers' heartbeats to queue up unread: read them before
                    # judging anyone silent, or our own stall would be blamed on the peers.
                    self._serve(set(handlers), handlers, rank, more)
                    now = clock()
                deadline = core.next_deadline()
                if deadline is not None and deadline <= now:
                    core.tick(now)
                    deadline = core.next_deadline()
                for peer in self._refusals.due(now):
                    self._redial(peer)
                wait_ms = 100 if deadline is None else max(0, min(100, int((deadline - now) * 1000) + 1))
                # Everything this turn produced leaves together, and last: what follows a send up to the
                # next poll competes for the CPU with the peer that is answering it.
                self._flush()
            self.core.stop(self.clock())
            self._flush()
            self._graceful = True
        except BaseException as exc:  # the loop must never die silently
            self.error = exc
            log.exception("node %s: loop failed", self.node_id)
        finally:
            with _LOOPS_LOCK:
                _LOOPS[0] -= spinner
            try:
                self._close()  # from now on nothing can be queued for the loop (_submit raises)
            finally:
                self._fail_pending()

    def _fail_pending(self) -> None:
        """Fail the calls the loop ended without answering: those it started, and those still queued."""
        pending: list[Future[Any] | None] = list(self._calls.values())
        self._calls.clear()
        while not self._commands.empty():
            pending.append(self._commands.get_nowait()[1])
        for fut in pending:
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError(f"node {self.node_id} stopped"))

    @staticmethod
    def _serve(
        ready: set[zmq.Socket[bytes]],
        handlers: dict[zmq.Socket[bytes], Callable[[], bool]],
        rank: dict[zmq.Socket[bytes], int],
        more: set[zmq.Socket[bytes]],
    ) -> None:
        """Read the sockets in ``ready``; those that may still have input go into ``more``."""
        for sock in sorted(ready, key=rank.__getitem__) if len(ready) > 1 else ready:
            if handlers[sock]():
                more.add(sock)

    def _on_data(self, frames: list[Any]) -> None:
        core = self.core
        grants = core.grants_sent
        core.on_data(frames, self.clock())
        if core.grants_sent != grants:
            # A credit grant leaves at once rather than at the end of the turn: its sender may be waiting
            # for it with nothing left to send, while this turn goes on handling the batches in flight.
            self._flush()

    def _on_reply(self, peer: str, frames: list[Any]) -> None:
        self.core.on_reply(peer, frames, self.clock())
        if peer not in self._hung_up and self.core.is_refused(peer):
            self._hang_up(peer)

    def _too_many_frames(self, channel: str, source: str | bytes, over: sockets.TooManyFrames) -> None:
        """A message over ``limits.max_frames``, of which only the first frames were kept: the core
        refuses it as it refuses any message over a limit on ``channel``."""
        try:
            self.core.on_too_many_frames(channel, source, over.frames, over.count, over.size, self.clock())
        except Exception:
            self._handler_bug()
            return
        peer = source if channel == "reply" and isinstance(source, str) else None
        if peer is not None and peer not in self._hung_up and self.core.is_refused(peer):
            self._hang_up(peer)

    def _handler_bug(self) -> None:
        """The core refuses bad input itself; reaching here is a bug, logged and counted, never fatal."""
        self.drops["handler_bug"] = self.drops.get("handler_bug", 0) + 1
        log.exception("node %s: error handling a message", self.node_id)

    def _hang_up(self, peer: str) -> None:
        """Stop dialling a peer that refused our link for good (only its answers can refuse it).

        ZeroMQ dials a socket's endpoints again whenever a connection closes, for ever. For a process
        the peer refused as replaced (``DUPLICATE_NODE``) each new connection would also take its node
        id's routing id from the newer process at the peer (``ZMQ_ROUTER_HANDOVER``).
        """
        self._hung_up.add(peer)
        ep = self._peer_endpoints[peer]
        for sock, endpoint in ((self._dealers[peer], ep.control), (self._pushes[peer], ep.data)):
            with contextlib.suppress(zmq.ZMQError):  # already disconnected
                sock.disconnect(endpoint)
        log.info("node %s: stopped dialling %s", self.node_id, peer)

    def _on_wake(self) -> bool:
        assert self._wake_rx is not None
        while True:
            try:
                self._wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while not self._commands.empty():
            self._commands.get_nowait()[0]()
            self._calls_run += 1
        return False

    def _drain_control(self) -> bool:
        """``_drain`` of the ROUTER, written out: every control message a peer sends comes this way.

        A frame after the envelope's header and body (a blob: a BinX reply's pages, a peek's rows) at
        least ``zero_copy_threshold`` long is kept as a memoryview on ZeroMQ's buffer, as the PULL keeps
        stream batches, and reaches the role without a copy; smaller ones are copied out as bytes, which
        costs less than the view.
        """
        sock, on_control, clock = self._router, self.core.on_control, self.clock
        assert sock is not None
        item = self._poll_items[sock]
        large = self.config.zero_copy_threshold
        max_frames = self.config.limits.max_frames
        owned = self._owned_ids
        for i in range(_DRAIN_BUDGET):
            try:
                frame = sock.recv(_NOBLOCK, copy=False)  # the routing id
            except zmq.Again:
                return False
            rid = frame.bytes
            key = security.user_id(frame) if rid in owned else ""
            parts: list[Any] = []
            over: sockets.TooManyFrames | None = None
            while frame.more:
                if len(parts) == max_frames:  # the rest is read and dropped, never copied
                    count, size = sockets.drop_rest(sock)
                    over = sockets.TooManyFrames(parts, max_frames + count, sum(map(len, parts)) + size)
                    break
                frame = sock.recv(_NOBLOCK, copy=False)
                # One length check for a small frame; the position only for a large one.
                parts.append(frame.buffer if len(frame) >= large and len(parts) >= 2 else frame.bytes)
            try:
                if key and not security.key_owner(rid, key, owned):
                    self.core.on_wrong_key(rid, parts, key, clock())
                    continue
                if over is not None:
                    self._too_many_frames("ctl", rid, over)
                    continue
                on_control(rid, parts, clock())
            except Exception:
                self._handler_bug()
            if i == 0 and not _zmq_poll(item, 0):
                return False
        return True

    def _drain(
        self,
        sock: zmq.Socket[bytes],
        handle: Callable[[list[Any]], None],
        source: tuple[str, str],
        *,
        copy: bool = True,
    ) -> bool:
        """Read and handle what ``sock`` has; True if it may have more (the budget ran out). ``source``: the
        channel and the peer it comes from, for a message over ``max_frames`` (``_too_many_frames``)."""
        # Bounded per turn so one busy socket cannot starve the others or the timers. The answers leave
        # once per loop turn (``_flush``), not once per message.
        max_frames = self.config.limits.max_frames
        for i in range(_DRAIN_BUDGET):
            try:
                parts = sockets.recv_message(sock, zero_copy=not copy, max_frames=max_frames)
            except zmq.Again:
                return False
            except sockets.TooManyFrames as over:
                self._too_many_frames(*source, over)
                continue
            try:
                handle(parts)
            except Exception:
                self._handler_bug()
            if i == 0 and not _zmq_poll(self._poll_items[sock], 0):
                # A lone message (a request, an answer): asking is cheaper than the failing recv that
                # would say so. Under load, the failing recv ends the drain once.
                return False
        return True

    def _on_monitor(self, mon: zmq.Socket[bytes], peer: str) -> bool:
        while True:
            try:
                msg = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return False
            if msg["event"] == zmq.EVENT_DISCONNECTED:
                self.core.on_transport_down(peer, self.clock(), "socket disconnected")
            elif msg["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refusals.admitted(peer)
                if peer in self._ctl_refused:
                    # Connected now: a HELLO it refused before is sent again at once, not after a timeout.
                    self._ctl_refused.discard(peer)
                    self.core.on_transport_ready(peer, self.clock())
            elif msg["event"] in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self._refusals.refused_by(peer, msg["event"], int(msg["value"]), self.clock())

    def _redial(self, peer: str) -> None:
        """Dial a peer that refused our CURVE handshake again: libzmq itself never does."""
        ep = self._peer_endpoints.get(peer)
        if ep is None or peer in self._hung_up:
            return
        log.debug("node %s: dialling %s again after a CURVE refusal", self.node_id, peer)
        for sock, address in ((self._dealers[peer], ep.control), (self._pushes[peer], ep.data)):
            with contextlib.suppress(zmq.ZMQError):  # the failed connection may be gone already
                sock.disconnect(address)
            sock.connect(address)

    def _on_server_monitor(self, mon: zmq.Socket[bytes], name: str) -> bool:
        """Handshake failures on our CURVE server sockets, which never reach the ZAP handler."""
        while True:
            try:
                msg = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return False
            self._refusals.server_event(name, msg["event"], int(msg["value"]))

    def _flush(self) -> None:
        core = self.core
        outs = core.out  # core.take(), without the call
        if outs:
            core.out = []
            for out in outs:
                if type(out) is Transmit:
                    self._transmit(out)
                    continue
                assert isinstance(out, Completed)
                if out.call_id == self._jobs_call:
                    self._run_jobs(out.result)
                    continue
                fut = self._calls.pop(out.call_id, None)
                if fut is not None and not fut.done():
                    if out.error is None:
                        fut.set_result(out.result)
                    else:
                        fut.set_exception(RuntimeError(out.error))
        if self._jobs_again:  # the answers of the jobs just started, or the next "jobs" call's answer
            self._jobs_again = False
            self._flush()

    # ------------------------------------------------------------------ HTTP exchange client (loop thread)

    def _ask_jobs(self) -> None:
        self._jobs_call = self.core.call(c.HTTP_CLIENT, "jobs", {}, self.clock())
        self._jobs_again = True

    def _run_jobs(self, jobs: Any) -> None:
        """The http.client role's requests: each to a worker, or answered here if the peer has no address."""
        fetcher = self._http_fetcher
        for job in jobs or ():
            address = self._peer_http.get(job.peer)
            if fetcher is not None and address is not None:
                fetcher.submit(job, address)
                continue
            text = (
                f"the peer advertises no HTTP exchange (it runs no {c.HTTP_BUFFERS}, its bus uses CURVE, "
                "under which no node serves plain HTTP, or its endpoints reached this node without 'http')"
            )
            self.core.call(
                c.HTTP_CLIENT, "fetched", {"result": c.HttpFetched(job=job.job, error=text)}, self.clock()
            )
        self._ask_jobs()

    def _on_fetched(self, answer: c.HttpFetched) -> None:
        """An answer from a worker thread: hand it to the role on the loop (dropped once the node stopped)."""

        def run() -> None:
            self.core.call(c.HTTP_CLIENT, "fetched", {"result": answer}, self.clock())
            self._flush()

        with contextlib.suppress(RuntimeError):
            self._submit(run)

    def _transmit(self, out: Transmit) -> None:
        channel, to = out.channel, out.to
        frames: list[Any] = out.frames
        if channel == "reply":
            sock: zmq.Socket[bytes] | None = self._router
            frames = [to, *frames]
        else:
            table = self._dealers if channel == "ctl" else self._pushes
            sock = table.get(to if type(to) is str else to.decode())  # type: ignore[union-attr]
        if sock is None:
            self._drop(f"{channel}_no_socket")
            return
        if channel != "data":
            # A send may process the socket's commands, and so leave its ZMQ_FD quiet with input waiting.
            self._touched.add(sock)
        threshold = self.config.zero_copy_threshold
        last = len(frames) - 1
        try:
            # Frame by frame rather than send_multipart, which type-checks every frame first: these are
            # the core's own bytes; and through the socket's own send, under the one of pyzmq's Python
            # class, which only adds the routing_id and group arguments of draft sockets. Large frames go
            # without a copy (ZeroMQ holds a reference until sent). ZeroMQ queues a message's frames
            # atomically: with NOBLOCK the first frame is refused whole, never a part of a message.
            for i, frame in enumerate(frames):
                _send(sock, frame, _MORE if i < last else _NOBLOCK, len(frame) < threshold)
        except zmq.Again:
            self._drop(f"{out.channel}_would_block")
            if out.channel == "ctl":
                self._ctl_refused.add(out.to if isinstance(out.to, str) else out.to.decode())
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._drop("reply_unroutable")
            else:
                raise
        except (TypeError, ValueError):
            # A frame ZeroMQ cannot send (the codec and the core let none through): a bug, logged and
            # counted, never the end of the loop that serves every other role and peer. If frames before
            # it were queued, the message is cut short and the next one joins it: the peer refuses that
            # (wrong frame count, then a sequence gap) and the link starts over, as after any corruption.
            self._drop(f"{channel}_bad_frame")
            log.exception("node %s: could not send a %s message to %r", self.node_id, channel, to)

    def _drop(self, what: str) -> None:
        self.drops[what] = self.drops.get(what, 0) + 1

    def _close(self) -> None:
        with _WAKE_LOCK:
            if self._wake_tx is not None:
                self._wake_tx.close(linger=0)
            self._wake_tx = None
        socks: list[zmq.Socket[bytes] | None] = [self._router, self._pull, self._wake_rx]
        socks += list(self._dealers.values()) + list(self._pushes.values())
        for dealer in self._dealers.values():
            dealer.disable_monitor()
            # After a graceful stop, give the BYE we just queued a moment to leave.
            dealer.close(linger=200 if self._graceful else 0)
        for server in (self._router, self._pull):
            if server is not None and self._server_monitors:
                server.disable_monitor()
        socks += list(self._monitors) + list(self._server_monitors)
        for sock in socks:
            if sock is not None and not sock.closed:
                sock.close(linger=0)
        self._dealers.clear()
        self._pushes.clear()
        self._monitors.clear()
        self._server_monitors.clear()
        self._router = self._pull = self._wake_rx = self._wake_tx = None
        if self._zap_domain is not None:
            security.unregister(context(), self._zap_domain)
            self._zap_domain = None
        if self._own_ipc_dir is not None:
            shutil.rmtree(self._own_ipc_dir, ignore_errors=True)  # libzmq leaves the socket files
            self._own_ipc_dir = None


_WAKE_LOCK = threading.Lock()
#: The node loops running in this process that may spin (``BusConfig.idle_spin``). Loops of one process
#: share its GIL: one that spins takes the GIL from the others between its polls, so a loop spins only
#: while it is the only one of its process that may.
_LOOPS = [0]
_LOOPS_LOCK = threading.Lock()
#: Waits after served input that ended within ``idle_spin``, in a row, before the loop spins again.
_SHORT_WAITS = 2


def _forget_loops() -> None:
    """In a forked child: the parent's loops are not running here (and its lock may have been held)."""
    global _LOOPS_LOCK
    _LOOPS[0] = 0
    _LOOPS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_loops)
_DRAIN_BUDGET = 256
_send = _BackendSocket.send
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)


def _spin(
    poll: Callable[[int], list[tuple[int, int]]], until: float, clock: Callable[[], float]
) -> list[tuple[int, int]]:
    """``poll(0)`` until it finds input or ``until`` passes (empty then), yielding the CPU between polls.

    The yield lets any other thread runnable on this core (ZeroMQ's I/O threads, the peer's loop on a
    small machine) go first, so the spin uses only time the core would otherwise idle.
    """
    while True:
        events = poll(0)
        if events or clock() >= until:
            return events
        os.sched_yield()


_SERVER_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
