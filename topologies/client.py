"""``sparkbus.connect``: the thin client over ZeroMQ (IEP-90).

One loop thread owns every socket: per node connection one DEALER (random routing id; the client binds
nothing, so results come back on the same pipe as control messages carrying Arrow IPC bytes, chunked), with
a socket monitor for connect and disconnect events. All decisions (address order, handshakes, cluster
identity, keepalive, retries, logical connection restore) are made by the sans-IO
``sparkbus.roles.client.ClientCore``; this module only carries them out. ``AsyncClient`` runs over the
same core and thread: its coroutines await the thread's futures (``asyncio.wrap_future``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import pyarrow as pa
import zmq
from zmq.utils.monitor import parse_monitor_message

from sparkbus.bus.node import context
from sparkbus.codecs import encode_batch
from sparkbus.roles.client import (
    ClientConfig,
    ClientCore,
    ClientError,
    Close,
    ConnectTimeoutError,
    Done,
    Op,
    Open,
    Send,
)
from sparkbus.roles.client.policy import Resolver, RetryPolicy, RetryReadPolicy
from sparkbus.roles.query import Query, result_table, table_to_ipc
from sparkbus.roles.query.plan import PlanNode
from sparkbus.topologies.launcher import state_file
from sparkbus.topologies.schema import load


def system_resolver(host: str, port: int) -> list[str]:
    """The host's transport addresses (``socket.getaddrinfo``), de-duplicated, in the system's order."""
    out: list[str] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = str(sockaddr[0])
        addr = f"tcp://[{ip}]:{port}" if family == socket.AF_INET6 else f"tcp://{ip}:{port}"
        if addr not in out:
            out.append(addr)
    return out


#: ``(3 << 16) | 11``: Ignite's OPERATION_TIMEOUT
OPERATION_TIMEOUT = (3 << 16) | 11
GATEWAY = "client.gateway"


def topology_addresses(path: str | os.PathLike[str]) -> tuple[list[str], str]:
    """The control endpoints of the nodes running ``client.gateway`` in the cluster ``sparkbus up`` started
    from topology file ``path`` (read from its state file), and the topology's cluster tag."""
    topo = load(Path(path))
    gateways = {node_id for spec in topo.nodes if GATEWAY in spec.roles for node_id in spec.node_ids}
    state = state_file(path)
    if not state.exists():
        raise ConnectTimeoutError(
            f"no running cluster recorded for {path} (looked for {state}); is `sparkbus up` running?"
        )
    nodes: dict[str, dict[str, Any]] = json.loads(state.read_text())["nodes"]
    found = [
        info["control"] for node, info in sorted(nodes.items()) if node in gateways and info.get("control")
    ]
    if not found:
        raise ConnectTimeoutError(f"{path}: no running node has the {GATEWAY} role (nodes: {sorted(nodes)})")
    return found, topo.cluster.tag


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
        **settings: Any,
    ) -> None:
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
        self._futures: dict[int, Future[Any]] = {}
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
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
            attempts = self._on_loop(self.core.attempts)
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
            self._submit(lambda: self._forget(fut))
            raise ClientError(
                OPERATION_TIMEOUT, f"operation {Op(op).name} took more than {wait:g} s"
            ) from None

    def submit(self, op: int, args: dict[str, Any] | None = None) -> Future[Any]:
        """Start an operation; the future completes with its result or a ``ClientError``."""
        fut: Future[Any] = Future()

        def run() -> None:
            handle = self.core.submit(op, dict(args or {}), time.monotonic())
            self._futures[handle] = fut
            fut.handle = handle  # type: ignore[attr-defined]

        self._submit(run)
        return fut

    def sql(
        self, text: str, parameters: Sequence[Any] = (), *, timeout: float = 30.0, **query: Any
    ) -> pa.Table:
        """Run SQL on the cluster and return the result as an Arrow table."""
        q = Query(sql=text, parameters=tuple(parameters), timeout=timeout, **query)
        return result_table(self.call(Op.SQL, q.args(), timeout=timeout + 5.0))

    def sql_batches(self, text: str, parameters: Sequence[Any] = (), **kw: Any) -> Iterator[pa.RecordBatch]:
        """The result of ``sql`` as record batches (the whole result arrives before the first batch)."""
        yield from self.sql(text, parameters, **kw).to_batches()

    def query(self, plan: PlanNode, *, timeout: float = 30.0) -> pa.Table:
        """Run a logical plan (``sparkbus.roles.query`` operators)."""
        return result_table(
            self.call(Op.SQL, Query(plan=plan, timeout=timeout).args(), timeout=timeout + 5.0)
        )

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

    def load(self, table_name: str, data: pa.Table) -> int:
        """Load rows as the connected node's partition of ``table_name`` (the ``query`` role's ``load``)."""
        return int(self.call(Op.LOAD, {"table": table_name, "batches": [table_to_ipc(data)]}))

    def peek(self, view: str, **args: Any) -> pa.Table:
        """Read a view (or table) of the compute controller."""
        return result_table(self.call(Op.PEEK, {"view": view, **args}))

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
            }
        )
        return out

    def status_of_links(self) -> dict[str, int]:
        """Node address -> how many times its logical connection was restored."""
        result: dict[str, int] = self._on_loop(lambda: {k: x.restores for k, x in self.core.links.items()})
        return result

    def close(self) -> None:
        """Close every socket and stop the loop thread."""
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

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        fut: Future[Any] = Future()
        self._submit(lambda: fut.set_result(fn()))
        return fut.result(timeout=5.0)

    def _forget(self, fut: Future[Any]) -> None:
        handle = getattr(fut, "handle", None)
        if handle is not None:
            self.core.cancel(handle)
            self._futures.pop(handle, None)

    def _submit(self, fn: Callable[[], None]) -> None:
        if not self._thread.is_alive():
            raise ClientError(OPERATION_TIMEOUT, f"client is closed{f': {self.error}' if self.error else ''}")
        self._commands.put(fn)
        self._wake()

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
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(ClientError(OPERATION_TIMEOUT, "client closed"))
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
                event = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_CONNECTED:
                self.core.on_connected(key, time.monotonic())
            elif event == zmq.EVENT_DISCONNECTED:
                self.core.on_disconnected(key, time.monotonic(), "socket disconnected")
            self._flush()
            if mon not in self._monitors:
                return

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
            elif isinstance(out, Done):
                fut = self._futures.pop(out.handle, None)
                if fut is not None and not fut.done():
                    if out.error is None:
                        fut.set_result(out.result)
                    else:
                        fut.set_exception(out.error)
        if not self._started.done() and (self.core.connected or self.core.gave_up):
            if self.core.connected:
                self._started.set_result(None)
            else:
                self._started.set_exception(
                    ConnectTimeoutError(f"no node could be connected; tried:\n{self.core.attempts()}")
                )

    def _open(self, key: str, transport: str) -> None:
        self._close(key)
        limits = self.core.config.limits
        sock = context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
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
        fut = self.client.submit(op, args)
        wait = self.client.op_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), wait)
        except TimeoutError:
            self.client._submit(lambda: self.client._forget(fut))
            raise ClientError(
                OPERATION_TIMEOUT, f"operation {Op(op).name} took more than {wait:g} s"
            ) from None

    async def sql(self, text: str, parameters: Sequence[Any] = (), *, timeout: float = 30.0) -> pa.Table:
        q = Query(sql=text, parameters=tuple(parameters), timeout=timeout)
        return result_table(await self.call(Op.SQL, q.args(), timeout=timeout + 5.0))

    async def peek(self, view: str, **args: Any) -> pa.Table:
        return result_table(await self.call(Op.PEEK, {"view": view, **args}))

    async def status(self) -> dict[str, Any]:
        return dict(await self.call(Op.STATUS))

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(
    target: str | os.PathLike[str] | Sequence[str], *, cluster_tag: str | None = None, **kw: Any
) -> Client:
    """Connect to a cluster.

    Args:
        target: node addresses (``"tcp://127.0.0.1:5555"`` or ``"host:port"``, one string or a list), or a
            topology file a running ``sparkbus up`` was started from (its gateway nodes are found through
            the state file ``sparkbus status`` reads).
        cluster_tag: the cluster to join; taken from the topology file when one is given.
        **kw: ``Client`` options (``connect_timeout``, ``seed``, ``retry``, ``op_timeout``, ...).

    Raises:
        ConnectTimeoutError: no node connection within ``connect_timeout``; lists what was tried and why.
    """
    if isinstance(target, str | os.PathLike) and Path(target).suffix == ".toml":
        addresses, tag = topology_addresses(target)
        return Client(addresses, cluster_tag=cluster_tag or tag, **kw)
    if cluster_tag is None:
        raise ValueError("connect needs cluster_tag= with plain addresses (a topology file names its own)")
    addresses = [str(target)] if isinstance(target, str | os.PathLike) else list(target)
    return Client(addresses, cluster_tag=cluster_tag, **kw)


async def connect_async(
    target: str | os.PathLike[str] | Sequence[str], *, cluster_tag: str | None = None, **kw: Any
) -> AsyncClient:
    """``connect`` for asyncio (the handshake runs off the event loop)."""
    client = await asyncio.to_thread(connect, target, cluster_tag=cluster_tag, **kw)
    return AsyncClient(client)
