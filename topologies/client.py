"""``sparkbus.connect``: the thin client over ZeroMQ (IEP-90).

One loop thread owns every socket: per node connection one DEALER (random routing id; the client binds
nothing, so results come back on the same pipe as control messages carrying Arrow IPC bytes, chunked), with
a socket monitor for connect and disconnect events. All decisions (address order, handshakes, cluster
identity, keepalive, retries, logical connection restore) are made by the sans-IO
``sparkbus.roles.client.ClientCore``; this module only carries them out. The loop thread decodes no
result: a call's ``Reply`` is decoded by the thread that asks for it (``sparkbus.topologies.client_reply``).
``AsyncClient`` runs over the same core and thread: its coroutines await the thread's futures
(``asyncio.wrap_future``) and decode in a worker thread. Where to connect and with which keys (addresses,
topology files, ``ClientCurve``) is ``sparkbus.topologies.client_target``. This module re-exports both
modules' public names.

With ``ClientCurve`` settings every DEALER is a CURVE client (``sparkbus.bus.security``): the client's key
pair and the node's public key are set before it connects. A node whose ZAP handler refuses the key (or
whose CURVE handshake fails) is reported by the socket monitor and refused for good with an
``AuthenticationError`` naming its address; it is never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import zmq
from zmq.utils.monitor import parse_monitor_message

from sparkbus.bus import security
from sparkbus.bus.messages import ErrorCode
from sparkbus.bus.sockets import context
from sparkbus.codecs import encode_batch
from sparkbus.codecs.schema import to_plain
from sparkbus.roles.client import (
    ArrowParts,
    AuthenticationError,
    Chunk,
    ClientConfig,
    ClientConnectionError,
    ClientCore,
    ClientError,
    Close,
    ClusterMismatchError,
    ConnectTimeoutError,
    Done,
    Op,
    Open,
    Send,
)
from sparkbus.roles.client.errors import OPERATION_TIMEOUT
from sparkbus.roles.client.policy import Resolver, RetryPolicy, RetryReadPolicy
from sparkbus.roles.query import Query
from sparkbus.roles.query.api import load_batches
from sparkbus.roles.query.plan import PlanNode
from sparkbus.topologies.client_reply import Reply, as_table, chunk_record_batches
from sparkbus.topologies.client_target import (
    CLIENT_KEY_NAME,
    GATEWAY,
    ClientCurve,
    TopologyTarget,
    system_resolver,
    topology_addresses,
    topology_target,
)

if TYPE_CHECKING:
    from sparkbus.roles.compute import ViewDef

__all__ = [
    "CLIENT_KEY_NAME",
    "GATEWAY",
    "OPERATION_TIMEOUT",
    "AsyncClient",
    "Client",
    "ClientCurve",
    "Reply",
    "TopologyTarget",
    "as_table",
    "connect",
    "connect_async",
    "system_resolver",
    "topology_addresses",
    "topology_target",
]

_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


def unsent(op: int, exc: Exception) -> ClientError:
    """The error of an operation the client could not even start (``exc`` came from the core)."""
    if isinstance(exc, ClientError):
        return exc
    name = Op(op).name if op in Op._value2member_map_ else str(op)
    return ClientError(ErrorCode.MALFORMED, f"operation {name} cannot be sent: {exc!r}")


class Client:
    """A thin client connected to a sparkbus cluster; use ``connect`` to make one.

    Args:
        addresses: node control endpoints (``tcp://host:port``) or ``host:port``.
        cluster_tag: the cluster to join.
        connect_timeout: seconds to wait for the first node connection.
        seed: seeds the address order (tests); random otherwise.
        resolver: host, port -> transport addresses (``socket.getaddrinfo`` by default).
        retry: IEP-82 retry policy (default: reads only, up to 16 times).
        op_timeout: default seconds an operation may take.
        curve: CURVE keys (None: plain TCP, which a CURVE node refuses).
        **settings: further ``ClientConfig`` fields (``handshake_timeout``, ``heartbeat_interval``, ...).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        cluster_tag: str,
        connect_timeout: float = 5.0,
        seed: int | None = None,
        resolver: Resolver = system_resolver,
        retry: RetryPolicy | None = None,
        op_timeout: float = 60.0,
        curve: ClientCurve | None = None,
        **settings: Any,
    ) -> None:
        self.curve = curve
        config = ClientConfig(cluster_tag=cluster_tag, retry=retry or RetryReadPolicy(), **settings)
        self.core = ClientCore(
            addresses,
            config,
            rng=random.Random(seed) if seed is not None else random.Random(secrets.randbits(64)),
            resolver=resolver,
            name=f"client-{secrets.token_hex(4)}",
        )
        self.op_timeout = op_timeout
        self._socks: dict[str, zmq.Socket[bytes]] = {}
        self._monitors: dict[zmq.Socket[bytes], str] = {}
        self._futures: dict[int, Reply] = {}
        self._streams: dict[int, queue.Queue[Chunk | Done]] = {}
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._commands_lock = threading.Lock()
        self._accepting = True  # False once the loop ends: no command is queued after that
        self._wake_lock = threading.Lock()
        self._stopping = threading.Event()
        self._started: Future[None] = Future()
        ctx = context()
        addr = f"inproc://sparkbus-client-{id(self)}-{secrets.token_hex(4)}"
        self._wake_rx = ctx.socket(zmq.PULL)
        self._wake_rx.bind(addr)
        self._wake_tx = ctx.socket(zmq.PUSH)
        self._wake_tx.setsockopt(zmq.LINGER, 0)
        self._wake_tx.connect(addr)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sparkbus-client", daemon=True)
        self._thread.start()
        try:
            self._started.result(timeout=connect_timeout)
        except FutureTimeout:
            try:
                attempts = self._on_loop(self.core.attempts, "the addresses tried")
            except ClientError as exc:
                attempts = f"  (unknown: {exc.message})"
            self.close()
            raise ConnectTimeoutError(
                f"no node connection within {connect_timeout:g} s; tried:\n{attempts}"
            ) from None
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ operations

    def call(self, op: int, args: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Run one operation and return its result (raises ``ClientError`` with a code)."""
        fut = self.submit(op, args)
        wait = self.op_timeout if timeout is None else timeout
        try:
            return fut.result(timeout=wait)
        except FutureTimeout:
            self._abandon(fut)
            raise ClientError(
                OPERATION_TIMEOUT, f"operation {Op(op).name} took more than {wait:g} s"
            ) from None
        except BaseException:
            self._abandon(fut)  # interrupted (Ctrl-C): nobody waits for the answer any more
            raise

    def submit(self, op: int, args: dict[str, Any] | None = None) -> Reply:
        """Start an operation; the future completes with its result or a ``ClientError``. An Arrow result
        is decoded by the thread that asks for it (``Reply``), never by the client's loop thread."""
        fut = Reply()
        call_args = dict(args or {})

        def run() -> None:
            if not self._accepting:  # handed over as the loop ended (close)
                fut.set_exception(self._closed_error())
                return
            try:
                handle = self.core.submit(op, call_args, time.monotonic())
            except Exception as exc:  # a command never ends the loop: this call fails, the client lives on
                fut.set_exception(unsent(op, exc))
                return
            self._futures[handle] = fut
            fut.handle = handle

        self._submit(run)
        return fut

    def stream(
        self, op: int, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Iterator[Chunk]:
        """Run one operation and yield its result's chunks as they arrive, in order, each once.

        A chunk counts as consumed when the next one is asked for: at most ``window`` chunks (the
        ``ClientConfig.window``, 8 by default) are in flight or queued here at any time. ``timeout`` bounds
        the wait for each chunk. Leaving the loop early abandons the rest (the gateway is told to drop it).
        A stream that has yielded a chunk is not retried after a lost connection. ``timeout`` also bounds
        the wait for the client's loop thread to start the stream: past it the stream is never started.

        Raises:
            ClientError: the operation's own error; OPERATION_TIMEOUT when a wait passes ``timeout``.
        """
        wait = self.op_timeout if timeout is None else timeout
        # A Queue, not a SimpleQueue: on CPython 3.11 a SimpleQueue wait that a signal whose handler
        # returns cut short waits again, for ever once the time left is negative (the wait bounded no more).
        chunks: queue.Queue[Chunk | Done] = queue.Queue()
        started: Future[int] = Future()
        call_args = dict(args or {})

        def run() -> None:
            if not started.set_running_or_notify_cancel():  # its caller stopped waiting: never start it
                return
            if not self._accepting:
                started.set_exception(self._closed_error())
                return
            try:
                handle = self.core.submit(op, call_args, time.monotonic(), stream=True)
            except Exception as exc:  # as in ``submit``: the loop lives on
                started.set_exception(unsent(op, exc))
                return
            self._streams[handle] = chunks
            started.set_result(handle)

        self._submit(run)
        late = f"operation {Op(op).name}: the client's loop thread did not start it within {wait:g} s"
        try:
            handle = started.result(timeout=wait)
        except FutureTimeout:
            if started.cancel():
                raise ClientError(OPERATION_TIMEOUT, late) from None
            try:  # too late to cancel: the loop thread is starting it at this moment
                handle = started.result(timeout=wait)
            except FutureTimeout:
                raise ClientError(OPERATION_TIMEOUT, late) from None
        finished = False
        try:
            while True:
                try:
                    item = chunks.get(timeout=wait)
                except queue.Empty:
                    raise ClientError(
                        OPERATION_TIMEOUT, f"operation {Op(op).name}: no chunk within {wait:g} s"
                    ) from None
                if isinstance(item, Done):
                    finished = True
                    if item.error is not None:
                        raise item.error
                    return
                yield item
                n = item.index + 1
                self._submit(lambda n=n: self.core.consumed(handle, n, time.monotonic()))  # type: ignore[misc]
        finally:
            if not finished:
                with contextlib.suppress(ClientError):  # a closed client holds nothing any more
                    self._submit(lambda: self._forget_stream(handle))

    def sql(
        self, text: str, parameters: Sequence[Any] = (), *, timeout: float = 30.0, **query: Any
    ) -> pa.Table:
        """Run SQL on the cluster and return the result as an Arrow table."""
        q = Query(sql=text, parameters=tuple(parameters), timeout=timeout, **query)
        return as_table(self.call(Op.SQL, q.args(), timeout=timeout + 5.0))

    def sql_batches(
        self, text: str, parameters: Sequence[Any] = (), *, timeout: float = 30.0, **query: Any
    ) -> Iterator[pa.RecordBatch]:
        """The result of ``sql`` as record batches, handed out chunk by chunk as the gateway sends them
        (at most ``window`` chunks of about 1 MiB held here; ``timeout`` also bounds each chunk's wait)."""
        q = Query(sql=text, parameters=tuple(parameters), timeout=timeout, **query)
        yield from chunk_record_batches(self.stream(Op.SQL, q.args(), timeout=timeout + 5.0))

    def query(self, plan: PlanNode, *, timeout: float = 30.0) -> pa.Table:
        """Run a logical plan (``sparkbus.roles.query`` operators)."""
        return as_table(self.call(Op.SQL, Query(plan=plan, timeout=timeout).args(), timeout=timeout + 5.0))

    def write(self, table_name: str, data: pa.Table, *, partition: str | None = None) -> Any:
        """Write rows to a replicated partition through its leader (``replication`` role's ``write``).
        ``partition`` defaults to ``table_name``. Never retried by default (a write is not idempotent)."""
        batch = (
            data.combine_chunks().to_batches()[0]
            if data.num_rows
            else pa.RecordBatch.from_pylist([], schema=data.schema)
        )
        rows = bytes(encode_batch(batch))
        return self.call(Op.WRITE, {"partition": partition or table_name, "rows": rows})

    def flush(self, partition: str) -> str | None:
        """Flush the memtable of this node's replica of ``partition`` into a segment, so replication
        sends it to the followers now rather than at the flush thresholds (``replication`` role's
        ``flush``); returns the new segment's id, None when there was nothing to flush."""
        segment = self.call(Op.FLUSH, {"partition": partition})
        return None if segment is None else str(segment)

    def load(self, table_name: str, data: pa.Table, *, replace: bool = False) -> int:
        """Load rows as the connected node's partition of ``table_name`` (the ``query`` role's ``load``);
        returns the table's row count there. Added to the rows already there, or in their place with
        ``replace``. Sent as one Arrow IPC stream per record batch of at most 65,536 rows, as the role takes
        them (a table of several chunks included); a table of no rows as one empty batch of its columns."""
        args = {"table": table_name, "batches": load_batches(data), "replace": replace}
        return int(self.call(Op.LOAD, args))

    def peek(self, view: str, **args: Any) -> pa.Table:
        """Read a view (or table) of the compute controller."""
        return as_table(self.call(Op.PEEK, {"view": view, **args}))

    def create_table(self, name: str, schema: pa.Schema, key: Sequence[str] | None = None) -> dict[str, Any]:
        """Create an input table of the compute controller (what views read); returns ``{"upper"}``. With
        ``key``, an upsert table: a written row replaces the one with the same key, so views count each key
        once however often it is written."""
        args: dict[str, Any] = {"name": name, "schema": schema.serialize().to_pybytes()}
        if key is not None:
            args["key"] = list(key)
        return dict(self.call(Op.CREATE_TABLE, args))

    def write_table(self, name: str, data: pa.Table) -> int:
        """Write rows to a compute controller table (``create_table``): appended, or upserted by the key of
        an upsert table; returns the write's time. Never retried by default (an append is not idempotent)."""
        batch = (
            data.combine_chunks().to_batches()[0]
            if data.num_rows
            else pa.RecordBatch.from_pylist([], schema=data.schema)
        )
        reply = self.call(Op.TABLE_WRITE, {"table": name, "batch": bytes(encode_batch(batch))})
        return int(reply["time"])

    def create_view(self, name: str, view: ViewDef) -> dict[str, Any]:
        """Create a view the compute replicas keep fresh (a ``sparkbus.roles.compute.ViewDef``); returns
        ``{"as_of", "id"}``. Read it with ``peek``."""
        return dict(self.call(Op.CREATE_VIEW, {"name": name, "view": to_plain(view)}))

    def drop_view(self, name: str) -> None:
        """Drop a view, so that its name may take a new one (how a view that failed on its data is created
        again); refused while another view or a subscribe reads it. Never retried by default."""
        self.call(Op.DROP_VIEW, {"name": name})

    def subscribe(self, view: str) -> dict[str, Any]:
        """Subscribe to a view; returns ``{"id", "as_of"}``; read updates with ``fetch(id)``."""
        return dict(self.call(Op.SUBSCRIBE, {"view": view}))

    def fetch(self, subscription: str) -> Any:
        return self.call(Op.FETCH, {"id": subscription})

    def status(self) -> dict[str, Any]:
        """The serving node's gateway status, plus this client's node connections."""
        out = dict(self.call(Op.STATUS))
        out["client"] = self._on_loop(
            lambda: {
                k: {"state": x.state, "node": x.node_id, "restores": x.restores}
                for k, x in self.core.links.items()
            },
            "STATUS (this client's connections)",
        )
        return out

    def status_of_links(self) -> dict[str, int]:
        """Node address -> how many times its logical connection was restored."""
        result: dict[str, int] = self._on_loop(
            lambda: {k: x.restores for k, x in self.core.links.items()}, "status_of_links"
        )
        return result

    def close(self) -> None:
        """Close every socket and stop the loop thread. Every operation not finished fails with
        ``ClientConnectionError`` "client closed", as does any submitted afterwards."""
        self._stopping.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for sock in (self._wake_rx, self._wake_tx):
            if not sock.closed:
                sock.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop thread

    def _on_loop(self, fn: Callable[[], Any], what: str = "the client's state", timeout: float = 5.0) -> Any:
        """``fn()`` run on the loop thread; OPERATION_TIMEOUT naming ``what`` when the loop does not get to it
        within ``timeout`` (or ``op_timeout`` when shorter)."""
        fut: Future[Any] = Future()
        wait = min(timeout, self.op_timeout)

        def run() -> None:
            try:
                fut.set_result(fn())
            except Exception as exc:  # the caller's error, never the loop's end
                fut.set_exception(exc)

        self._submit(run)
        try:
            return fut.result(timeout=wait)
        except FutureTimeout:
            raise ClientError(
                OPERATION_TIMEOUT, f"{what}: the client's loop thread did not answer within {wait:g} s"
            ) from None

    def _forget_stream(self, handle: int) -> None:
        self.core.cancel(handle, time.monotonic())
        self._streams.pop(handle, None)

    def _forget(self, fut: Reply) -> None:
        if fut.handle is not None:
            self.core.cancel(fut.handle, time.monotonic())
            self._futures.pop(fut.handle, None)

    def _abandon(self, fut: Reply) -> None:
        """The caller stopped waiting for ``fut`` (timed out, interrupted): forget it, and stop its query."""
        with contextlib.suppress(ClientError):  # closed: it has failed already
            self._submit(lambda: self._forget(fut))

    def _submit(self, fn: Callable[[], None]) -> None:
        """Hand ``fn`` to the loop thread; every command handed over runs, the last ones as the loop ends."""
        with self._commands_lock:
            if not self._accepting or self._stopping.is_set():
                raise self._closed_error()
            self._commands.put(fn)
        self._wake()

    def _closed_error(self) -> ClientConnectionError:
        return ClientConnectionError(
            f"client closed{f': its loop failed: {self.error!r}' if self.error else ''}"
        )

    def _wake(self) -> None:
        with self._wake_lock, contextlib.suppress(zmq.ZMQError):
            self._wake_tx.send(b"", zmq.NOBLOCK)

    def _run(self) -> None:
        try:
            self.core.start(time.monotonic())
            self._flush()
            while not self._stopping.is_set():
                poller = zmq.Poller()
                poller.register(self._wake_rx, zmq.POLLIN)
                for sock in list(self._socks.values()) + list(self._monitors):
                    poller.register(sock, zmq.POLLIN)
                deadline = self.core.next_deadline()
                wait = (
                    100
                    if deadline is None
                    else max(0, min(100, int((deadline - time.monotonic()) * 1000) + 1))
                )
                events = dict(poller.poll(wait))
                if self._wake_rx in events:
                    with contextlib.suppress(zmq.Again):
                        while True:
                            self._wake_rx.recv(zmq.NOBLOCK)
                    while not self._commands.empty():
                        self._commands.get_nowait()()
                for key, sock in list(self._socks.items()):
                    if sock in events:
                        self._drain(key, sock)
                for mon, key in list(self._monitors.items()):
                    if mon in events:
                        self._on_monitor(mon, key)
                self.core.tick(time.monotonic())
                self._flush()
        except BaseException as exc:  # the loop must never die silently
            self.error = exc
            if not self._started.done():
                self._started.set_exception(exc)
        finally:
            with self._commands_lock:
                self._accepting = False
            while not self._commands.empty():  # handed over before: each completes what it was given
                with contextlib.suppress(Exception):
                    self._commands.get_nowait()()
            error = self._closed_error()
            if not self._started.done():
                self._started.set_exception(error)
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(error)
            for handle, chunks in self._streams.items():
                chunks.put(Done(handle, None, error))
            self._futures.clear()
            self._streams.clear()
            for key in list(self._socks):
                self._close(key)

    def _drain(self, key: str, sock: zmq.Socket[bytes]) -> None:
        for _ in range(256):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.core.on_frames(key, frames, time.monotonic())
            self._flush()
            if self._socks.get(key) is not sock:
                return

    def _on_monitor(self, mon: zmq.Socket[bytes], key: str) -> None:
        while True:
            try:
                msg = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            event, value = int(msg["event"]), int(msg["value"])
            if event == zmq.EVENT_CONNECTED:
                self.core.on_connected(key, time.monotonic())
            elif event == zmq.EVENT_DISCONNECTED:
                self.core.on_disconnected(key, time.monotonic(), "socket disconnected")
            elif event & _HANDSHAKE_FAILED:
                reason = self._handshake_failure(key, event, value)
                if reason is not None:
                    self.core.on_auth_failed(key, reason, time.monotonic())
            self._flush()
            if mon not in self._monitors:
                return

    def _handshake_failure(self, key: str, event: int, value: int) -> str | None:
        """Why a ZeroMQ security handshake failed, or None when it is no reason to refuse the node."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (
                f"the node refused this client's CURVE key (ZAP status {value}: key or address not allowed)"
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                side = "this client uses CURVE" if self.curve else "this client has no CURVE keys"
                return f"security mechanism mismatch ({side}; the node does not match)"
            return f"security handshake protocol error {value:#x}"
        # HANDSHAKE_FAILED_NO_DETAIL: with CURVE, a server that cannot open our HELLO (we hold the wrong
        # public key for it). A link that had a session is only cut: it reconnects and restores.
        link = self.core.links.get(key)
        if self.curve is not None and link is not None and not link.connection_id:
            return "CURVE handshake failed: the server public key used for this node is probably wrong"
        return None

    def _flush(self) -> None:
        for out in self.core.take():
            if isinstance(out, Open):
                self._open(out.key, out.transport)
            elif isinstance(out, Close):
                self._close(out.key)
            elif isinstance(out, Send):
                sock = self._socks.get(out.key)
                if sock is not None:
                    try:
                        sock.send_multipart(out.frames, zmq.NOBLOCK)
                    except zmq.Again:
                        self.core.on_disconnected(out.key, time.monotonic(), "send queue full")
            elif isinstance(out, Chunk):
                chunks = self._streams.get(out.handle)
                if chunks is not None:
                    chunks.put(out)
            elif isinstance(out, Done):
                stream = self._streams.pop(out.handle, None)
                if stream is not None:
                    stream.put(out)
                fut = self._futures.pop(out.handle, None)
                if fut is not None and not fut.done():
                    if out.error is not None:
                        fut.set_exception(out.error)
                    else:  # as it came: an Arrow result is decoded by its caller (``Reply``)
                        fut.set_result(out.result)
        if not self._started.done() and (self.core.connected or self.core.gave_up):
            if self.core.connected:
                self._started.set_result(None)
            else:
                self._started.set_exception(self._gave_up())

    def _gave_up(self) -> ClientError:
        """Why ``connect`` failed on every node: a final refusal's own error (another cluster, a refused
        key), else ``ConnectTimeoutError``; each lists every address tried."""
        attempts = self.core.attempts()
        refusal = self.core.refusal()
        if isinstance(refusal, AuthenticationError):
            return AuthenticationError(f"{refusal.message}; tried:\n{attempts}")
        if isinstance(refusal, ClusterMismatchError):
            return ClusterMismatchError(f"{refusal.message}; tried:\n{attempts}")
        return ConnectTimeoutError(f"no node could be connected; tried:\n{attempts}")

    def _open(self, key: str, transport: str) -> None:
        self._close(key)
        limits = self.core.config.limits
        sock = context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED
        if self.curve is not None:
            try:
                server = self.curve.server_key(key)
            except AuthenticationError as exc:
                sock.close(linger=0)
                self.core.on_auth_failed(key, exc.message, time.monotonic())
                return
            security.apply_client(
                sock, security.KeyPair(public=self.curve.public, secret=self.curve.secret), server
            )
        mon = sock.get_monitor_socket(events)
        sock.connect(transport)
        self._socks[key] = sock
        self._monitors[mon] = key

    def _close(self, key: str) -> None:
        sock = self._socks.pop(key, None)
        if sock is None:
            return
        for mon, k in list(self._monitors.items()):
            if k == key:
                del self._monitors[mon]
                sock.disable_monitor()
                mon.close(linger=0)
        sock.close(linger=0)


class AsyncClient:
    """The asyncio face of ``Client``: the same core and loop thread; coroutines await its futures."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, op: int, args: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """``Client.call``; an Arrow result is decoded in a worker thread (``asyncio.to_thread``), so
        neither the client's loop thread nor the event loop spends that time."""
        fut = self.client.submit(op, args)
        wait = self.client.op_timeout if timeout is None else timeout
        settled: Future[None] = Future()  # done with the call, carrying nothing to decode

        def settle(_: object) -> None:
            with contextlib.suppress(InvalidStateError):  # cancelled: the coroutine stopped waiting
                settled.set_result(None)

        fut.add_done_callback(settle)
        try:
            await asyncio.wait_for(asyncio.wrap_future(settled), wait)
        except TimeoutError:
            self.client._abandon(fut)
            raise ClientError(
                OPERATION_TIMEOUT, f"operation {Op(op).name} took more than {wait:g} s"
            ) from None
        except asyncio.CancelledError:
            self.client._abandon(fut)  # the awaiting task was cancelled
            raise
        if isinstance(fut.undecoded(), ArrowParts):  # undecoded() raises the call's error
            return await asyncio.to_thread(fut.result)
        return fut.result()

    async def sql(self, text: str, parameters: Sequence[Any] = (), *, timeout: float = 30.0) -> pa.Table:
        q = Query(sql=text, parameters=tuple(parameters), timeout=timeout)
        return as_table(await self.call(Op.SQL, q.args(), timeout=timeout + 5.0))

    async def peek(self, view: str, **args: Any) -> pa.Table:
        return as_table(await self.call(Op.PEEK, {"view": view, **args}))

    async def status(self) -> dict[str, Any]:
        return dict(await self.call(Op.STATUS))

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(
    target: str | os.PathLike[str] | Sequence[str] | Mapping[str, str],
    *,
    cluster_tag: str | None = None,
    curve: ClientCurve | None = None,
    key_dir: str | os.PathLike[str] | None = None,
    key_name: str = CLIENT_KEY_NAME,
    node: str | None = None,
    **kw: Any,
) -> Client:
    """Connect to a cluster.

    Args:
        target: node addresses (``"tcp://127.0.0.1:5555"`` or ``"host:port"``, one string or a list), or a
            topology file a running ``sparkbus up`` was started from (its gateway nodes are found through
            the state file ``sparkbus status`` reads): a name ending in ``.toml`` or any existing file. A
            mapping node id -> address names each address's node, for a ``key_dir`` with per-node keys.
        cluster_tag: the cluster to join; taken from the topology file when one is given.
        curve: CURVE keys; overrides ``key_dir``.
        key_dir: a key directory (``sparkbus keys generate``): the client's pair is ``key_name`` (or the
            shared ``cluster`` pair), each node's public key its own when its node id is known (a topology
            file, or a mapping target), else the shared ``public/cluster.key``. With a topology file
            whose ``[bus.security]`` is CURVE, its key directory is the default; a ``{run_dir}`` one made
            by ``sparkbus up`` for this user also lends a gateway node's pair when it has no client pair.
        key_name: the client's key pair in ``key_dir``.
        node: with a topology file, connect to this node's gateway only (any gateway node, e.g. a store
            node, to write to the partitions it leads); by default the entry gateways
            (``topology_target``).
        **kw: ``Client`` options (``connect_timeout``, ``seed``, ``retry``, ``op_timeout``, ...).

    Raises:
        ConnectTimeoutError: no node connection within ``connect_timeout``; lists what was tried and why.
        AuthenticationError: the nodes refused this client's key (or no key could be found: e.g. an address
            whose node id is unknown, with a ``key_dir`` that has no shared ``cluster`` public key).
        ClusterMismatchError: no node could be connected, and one is in another cluster than ``cluster_tag``.
    """
    if isinstance(target, str | os.PathLike) and (Path(target).suffix == ".toml" or Path(target).is_file()):
        found = topology_target(target)
        addresses = found.addresses
        if node is not None:
            if node not in found.gateways:
                running = ", ".join(sorted(found.gateways))
                raise ConnectTimeoutError(
                    f"{target}: node {node} runs no {GATEWAY} (running gateways: {running})"
                )
            addresses = [found.gateways[node]]
        if curve is None and (key_dir is not None or found.key_dir is not None):
            where = key_dir if key_dir is not None else found.key_dir
            assert where is not None
            lend = [found.nodes[a] for a in found.addresses] if key_dir is None and found.run_dir_keys else []
            curve = ClientCurve.from_key_dir(where, name=key_name, nodes=found.nodes, fallback_names=lend)
        return Client(addresses, cluster_tag=cluster_tag or found.cluster_tag, curve=curve, **kw)
    if node is not None:
        raise ValueError("connect(node=...) needs a topology file (it finds the node's gateway there)")
    if cluster_tag is None:
        raise ValueError("connect needs cluster_tag= with plain addresses (a topology file names its own)")
    named: dict[str, str] = {}  # address -> node id
    if isinstance(target, Mapping):
        named = {str(address): str(node_id) for node_id, address in target.items()}
        addresses = list(named)
    else:
        addresses = [str(target)] if isinstance(target, str | os.PathLike) else list(target)
    if curve is None and key_dir is not None:
        curve = ClientCurve.from_key_dir(key_dir, name=key_name, nodes=named, addresses=addresses)
    return Client(addresses, cluster_tag=cluster_tag, curve=curve, **kw)


async def connect_async(
    target: str | os.PathLike[str] | Sequence[str] | Mapping[str, str],
    *,
    cluster_tag: str | None = None,
    **kw: Any,
) -> AsyncClient:
    """``connect`` for asyncio (the handshake runs off the event loop)."""
    client = await asyncio.to_thread(connect, target, cluster_tag=cluster_tag, **kw)
    return AsyncClient(client)
