"""The barrier task's side of the Spark runtime (``sparkbus.topologies.spark``): each task builds its
node, meets the others through the driver's runtime channel, hands its node its rows, serves, and reports.

Everything here runs in Spark's Python workers; the plan (``TaskPlan``) comes pickled in the stage's
closure, with no sockets and no SparkContext.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.ipc
import zmq
from pyspark import BarrierTaskContext, SparkFiles

from sparkbus.bus import security, sockets
from sparkbus.topologies.keys import curve_settings
from sparkbus.topologies.model import Topology
from sparkbus.topologies.runtime import Endpoints, NodeFactory, NodeHandle, NodeRequest, advertise_host
from sparkbus.topologies.spark_channel import task_socket

log = logging.getLogger(__name__)

POLL_MS = 100
#: rows a barrier task gathers before it hands them to its running node (one local call each)
FEED_ROWS = 65_536
#: seconds of each wait for the node's links, between which the task reads the driver's channel
READY_SLICE = 0.2
#: when this module was imported: in a Python worker, when the first barrier task unpickled its plan
_IMPORTED_AT = time.time()


class RowRouter(Protocol):
    """What a barrier task does to each input batch before its node gets it, in the task (NumPy, Arrow)
    rather than as Spark expressions, which the JVM compiles and warms up for every new plan.

    Picklable: it travels to the tasks in the stage's closure.
    """

    #: True: rows move to the task each call names (the tasks exchange them); False: every row stays
    exchange: bool

    def __call__(
        self, batch: pa.RecordBatch, tasks: int
    ) -> tuple[pa.RecordBatch, npt.NDArray[np.integer[Any]] | None]:
        """The rows as the node should get them, and (with ``exchange``) each row's task index in
        ``[0, tasks)``; None when rows stay."""
        ...


@dataclass(frozen=True, kw_only=True)
class TaskPlan:
    """Everything a barrier task needs, pickled into the closure (no sockets, no SparkContext)."""

    topology: Topology
    node_ids: tuple[str, ...]
    channel: str
    factory: NodeFactory
    ready_timeout: float
    with_data: bool
    #: the directory of this start under the SparkFiles root of each machine (``data_root``)
    data_dir: str
    #: what each task does to its input batches (and whether it hands rows to other tasks), or None
    router: RowRouter | None = None


def data_root(name: str) -> Path:
    """``name`` under Spark's SparkFiles root of this process: in local mode a temporary directory Spark
    deletes when it stops, on a cluster the executor's (or driver's) own directory."""
    return Path(SparkFiles.getRootDirectory()).resolve() / name


def _remove_data(node_dir: Path) -> None:
    """A node's data directory, and its start's directory once it is empty."""
    shutil.rmtree(node_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        node_dir.parent.rmdir()


def tagged(node_id: str, task: int, cause: str) -> str:
    return f"sparkbus node {node_id} (barrier task {task}) failed: {cause}"


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _process_started() -> float | None:
    """When this process started (wall clock), on Linux; None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class _Abort(RuntimeError):
    """The driver called the start off (another node failed, or it is stopping)."""


class _Task:
    """One barrier task's life: its rows, its node, the rendezvous through the driver, serve, report.

    The rendezvous goes through the driver's channel rather than ``BarrierTaskContext.allGather``: Spark's
    barrier RPC waits in steps of a whole second (``BarrierTaskContext.runBarrier`` sleeps 1 s between
    checks of its reply), so each ``allGather`` cost about a second of every start. The barrier stage
    still launches every task at once and fails them together.
    """

    def __init__(self, plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> None:
        # Wall-clock marks of this task's steps, sent to the driver with "ready" (SparkRuntime.timeline).
        self.marks: dict[str, float] = {"module_imported": _IMPORTED_AT, "task_started": time.time()}
        if (spawned := _process_started()) is not None:
            self.marks["worker_spawned"] = spawned
        self.plan = plan
        self.batches = batches
        self.ctx = BarrierTaskContext.get()
        self.task = self.ctx.partitionId()
        self.node_id = plan.node_ids[self.task]
        self.node: NodeHandle | None = None
        self.data_dir = data_root(plan.data_dir) / self.node_id
        #: the address this task's node and row exchange advertise (set by ``_build``)
        self.host = ""
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            self.channel = task_socket(self.zctx, plan.topology, self.node_id)
        except Exception as exc:  # a CURVE key missing on this machine: no way to tell the driver
            self.zctx.term()
            cause = f"the runtime channel: {describe(exc)}"
            raise RuntimeError(tagged(self.node_id, self.task, cause)) from exc
        self.channel.connect(plan.channel)
        self.deadline = time.monotonic() + plan.ready_timeout

    def run(self) -> dict[str, Any]:
        """The task's result row: status ``stopped`` with the node's counters, or ``aborted`` when the driver
        called the start or the stage off. Raises (failing the stage) when the node or the task failed."""
        status, counters = "stopped", {}
        try:
            try:
                self._start()
            except _Abort:
                raise
            except Exception as exc:
                # Told at once, the driver tells the other tasks to abort while Spark is still failing the
                # stage: a task Spark kills runs no cleanup.
                with contextlib.suppress(zmq.ZMQError):
                    self._tell("failed", {"error": describe(exc)})
                raise
            self._tell("ready", {"marks": self.marks, "pid": os.getpid()})
            self._serve()
            assert self.node is not None
            counters = self.node.counters()
        except _Abort:
            # Asked for by the driver (another node failed, or it is stopping), not a failure of this task:
            # raised, Spark would log it as a failed task with the worker's traceback and a Java stack.
            status = "aborted"
        except Exception as exc:
            raise RuntimeError(tagged(self.node_id, self.task, describe(exc))) from exc
        finally:
            try:
                if self.node is not None:
                    self.node.stop()
            finally:
                _remove_data(self.data_dir)
                with contextlib.suppress(zmq.ZMQError):
                    self._tell("ended", {})  # the driver waits for it before it cancels a stage
                self.channel.close()
                self.zctx.term()
        return {
            "node": self.node_id,
            "partition": self.task,
            "status": status,
            "counters": json.dumps(counters),
        }

    def _start(self) -> None:
        """Build, bind and start the node, hand it its rows, wait for its links: everything before
        ``ready``. Raises ``_Abort`` when the driver calls the start off meanwhile."""
        self._tell("bound", self._build().to_json())
        peers = self._expect("peers")
        assert self.node is not None
        self.node.set_peers({k: Endpoints.from_json(v) for k, v in peers.items() if k != self.node_id})
        self.node.start()
        self.marks["node_started"] = time.time()
        # The rows come after the start, so the node's handshakes (and, for a node that loads them, its
        # first writes) overlap Spark sending them.
        self._feed()
        self.marks["data_received"] = time.time()
        self._wait_links()
        self.marks["links_ready"] = time.time()

    def _wait_links(self) -> None:
        """The node's ``wait_ready`` in slices of ``READY_SLICE``, reading the driver's channel between
        them, until the task's deadline."""
        assert self.node is not None
        while True:
            self._check_driver()
            left = self.deadline - time.monotonic()
            try:
                self.node.wait_ready(max(0.01, min(READY_SLICE, left)))
                return
            except TimeoutError as exc:
                if time.monotonic() >= self.deadline:
                    raise TimeoutError(
                        f"links not up within {self.plan.ready_timeout:g}s (last check: {exc})"
                    ) from exc

    def _build(self) -> Endpoints:
        """The task's node, built (without rows: ``_feed`` hands them over once it runs) and bound."""
        machine = self.ctx.getTaskInfos()[self.task].address.rsplit(":", 1)[0]
        self.host = advertise_host(self.plan.topology.bus.host, machine)
        request = NodeRequest(
            node_id=self.node_id,
            topology=self.plan.topology,
            advertise_host=self.host,
            data_dir=str(self.data_dir),
        )
        self.node = self.plan.factory(request)
        self.marks["node_built"] = time.time()
        endpoints = self.node.bind()
        self.marks["node_bound"] = time.time()
        return endpoints

    def _feed(self) -> None:
        """This node's rows, handed to the running node in pieces of about ``FEED_ROWS``: Spark's Arrow
        batches as they are (maxRecordsPerBatch rows each, through the plan's router if it has one), or,
        when the router moves rows, those of every task's input that it sends to this task. Raises if the
        node refused rows."""
        assert self.node is not None
        if not self.plan.with_data:
            for _ in self.batches:
                pass
            self.node.feed((), last=True)
            return
        feeder = _Feeder(self.node)
        router = self.plan.router
        if router is None or not router.exchange:
            n = len(self.plan.node_ids)
            for batch in self.batches:
                self._check_driver()
                if batch.num_rows:
                    self.marks.setdefault("first_rows", time.time())
                    feeder.add(batch if router is None else router(batch, n)[0])
            self.marks["input_read"] = time.time()
        else:
            _RowExchange(self, self.host, router, feeder.add).run()
        feeder.close()

    def _tell(self, event: str, body: dict[str, Any]) -> None:
        self.channel.send_multipart([event.encode(), json.dumps(body).encode()])

    def _expect(self, event: str) -> dict[str, Any]:
        """The driver's next message, which must be ``event``; its body."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no '{event}' from the driver within {self.plan.ready_timeout:g}s")
            if (got := self._from_driver(min(POLL_MS, max(1, int(left * 1000))))) is not None:
                if got[0] == event.encode():
                    answer: dict[str, Any] = json.loads(got[1])
                    return answer
                raise RuntimeError(
                    f"expected '{event}' from the driver, got '{got[0].decode(errors='replace')}'"
                )

    def _check_driver(self) -> None:
        """Raise ``_Abort`` if the driver has called the start off; it sends nothing else unasked."""
        if (got := self._from_driver(0)) is not None:
            raise RuntimeError(f"unexpected '{got[0].decode(errors='replace')}' from the driver")

    def _from_driver(self, timeout_ms: int) -> tuple[bytes, bytes] | None:
        """The driver's next message (event, body) within ``timeout_ms``, or None; raises ``_Abort`` for
        ``abort``, and for ``stop`` (which before ``ready`` calls the start off too)."""
        if not self.channel.poll(timeout_ms):
            return None
        got, body = self.channel.recv_multipart()
        if got == b"abort":
            raise _Abort(json.loads(body)["cause"])
        if got == b"stop":
            raise _Abort("the driver is stopping")
        return got, body

    def _serve(self) -> None:
        assert self.node is not None
        while True:
            if self.channel.poll(POLL_MS):
                frames = self.channel.recv_multipart()
                if frames[:1] == [b"stop"]:
                    return
                if frames[:1] == [b"abort"]:
                    raise _Abort(json.loads(frames[1])["cause"])
            failure = self.node.failure()
            if failure is not None:
                raise RuntimeError(f"node died: {failure}")


class _RowExchange:
    """Every task's input rows to the task the router names, over ZeroMQ between the tasks.

    Each task binds a PULL socket (``_ExchangeInbox``), the driver hands every task the others' (the
    "rows" round of the rendezvous), and each task splits its input batches by the router's task index as
    they arrive: its own share it keeps, the others' it sends as Arrow IPC streams from a PUSH per task
    (``_exchange_push``), then an empty message that says it is done. This replaces Spark's shuffle (a
    stage of its own that writes every row to disk and reads it back). In a CURVE topology both ends speak
    CURVE with their nodes' key pairs, as the bus does.
    """

    def __init__(
        self, task: _Task, host: str, router: RowRouter, sink: Callable[[pa.RecordBatch], None]
    ) -> None:
        self.task = task
        self.router = router
        self.sink = sink
        self.inbox = _ExchangeInbox(task.plan.topology, task.plan.node_ids, task.node_id, host)
        self.endpoint = self.inbox.endpoint
        self.done = 0
        # The rows and the driver's channel: a start called off (``abort``) ends the wait at once.
        self.poller = zmq.Poller()
        self.poller.register(self.inbox.sock, zmq.POLLIN)
        self.poller.register(task.channel, zmq.POLLIN)

    def run(self) -> None:
        task = self.task
        plan = task.plan
        n = len(plan.node_ids)
        pushes: dict[int, zmq.Socket[bytes]] = {}
        sent = False
        try:
            task._tell("rows", {"endpoint": self.endpoint})
            endpoints = task._expect("rows")["endpoints"]
            for i, ep in enumerate(endpoints):
                if i != task.task:
                    pushes[i] = _exchange_push(
                        task.zctx, plan.topology, (task.node_id, plan.node_ids[i]), ep, plan.ready_timeout
                    )
            for batch in task.batches:
                if not batch.num_rows:
                    continue
                task.marks.setdefault("first_rows", time.time())
                rows, dest = self.router(batch, n)
                if dest is None or len(dest) != rows.num_rows:
                    raise ValueError(f"the row router gave {rows.num_rows} rows but no task index for each")
                lo, hi = (int(dest.min()), int(dest.max())) if rows.num_rows else (0, 0)
                if lo < 0 or hi >= n:  # such a row would go to no task: lost, not loaded
                    raise ValueError(
                        f"the row router named task {lo if lo < 0 else hi} for a row, but the tasks are 0 "
                        f"to {n - 1}"
                    )
                for i in range(n):
                    part = rows.filter(pa.array(dest == i))
                    if not part.num_rows:
                        continue
                    if i == task.task:
                        self.sink(part)
                    else:
                        pushes[i].send(_ipc(part), copy=False)
                self._drain(0)
            task.marks["input_read"] = time.time()
            for push in pushes.values():
                push.send(b"")
            while self.done < n - 1:
                left = task.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"rows from {n - 1 - self.done} other task(s) did not arrive "
                        f"within {plan.ready_timeout:g}s"
                    )
                self._drain(max(1, int(left * 1000)))
            sent = True
        finally:
            for push in pushes.values():
                # Rows still queued for a task go with it when the start failed: closing the context
                # would otherwise wait up to ready_timeout for them.
                push.close(linger=None if sent else 0)
            self.inbox.close()

    def _drain(self, timeout_ms: int) -> None:
        """Receive what has arrived, waiting up to ``timeout_ms`` for the first message or for the
        driver's; raises ``_Abort`` when the driver called the start off."""
        ready = dict(self.poller.poll(timeout_ms))
        if self.task.channel in ready:
            self.task._check_driver()
        if self.inbox.sock in ready:
            self.done += self.inbox.drain(self.sink)


class _ExchangeInbox:
    """A task's end of the row exchange: a PULL bound on the bus host, in ``bus.ports`` when it is a range,
    in the process's ZeroMQ context (whose ZAP handler serves the task's node too).

    In a CURVE topology it is a CURVE server with its node's key pair under a ZAP domain of its own with
    the bus's key directory and ``bus.security.allow``: a connection without CURVE, with a key that is not
    in the directory or from an address outside the list is refused in its handshake, and a message on a
    connection whose key is not another task's node's (or the shared ``cluster`` pair) is dropped. A
    message that is not one frame holding an Arrow IPC stream, or the empty one that says a task is done,
    is dropped and logged too, never raised.
    """

    def __init__(self, topology: Topology, node_ids: tuple[str, ...], node_id: str, host: str) -> None:
        self.node_id = node_id
        self._ctx = sockets.context()
        self._domain: str | None = None
        #: the key names whose messages are taken (None: any, in a plain topology)
        self._senders: frozenset[str] | None = None
        self.sock: zmq.Socket[bytes] = self._ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        bus = topology.bus
        try:
            curve = curve_settings(topology)
            if curve is not None:
                keys = security.node_keys(curve.key_dir, node_id)
                domain = f"sparkbus/row-exchange/{node_id}/{id(self):x}"
                security.register(self._ctx, domain, curve, self._refused)
                self._domain = domain
                self._senders = frozenset({*node_ids, security.SHARED_NAME} - {node_id})
                security.apply_server(self.sock, keys, domain)
            bound = sockets.bind_tcp(
                self.sock,
                "0.0.0.0" if bus.host in ("*", "") else bus.host,
                None if bus.ports is None else (bus.ports.first, bus.ports.last),
                f"node {node_id} (row exchange)",
            )
        except BaseException:
            self.close()
            raise
        self.endpoint = f"tcp://{host}:{bound.rsplit(':', 1)[1]}"

    def drain(self, sink: Callable[[pa.RecordBatch], None]) -> int:
        """Hand ``sink`` the rows of every message that has arrived; returns how many said a task is done."""
        done = 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return done
            if len(frames) != 1:
                self._drop(f"{len(frames)} frames, not 1")
                continue
            frame = frames[0]
            if self._senders is not None and (name := security.user_id(frame)) not in self._senders:
                self._drop(f"on a connection with the key of {name!r}, which is no other task's node's")
                continue
            if not len(frame.buffer):
                done += 1
                continue
            try:  # read whole before any row is taken: a stream cut short gives none
                with pa.ipc.open_stream(pa.py_buffer(frame.buffer)) as reader:
                    table = reader.read_all()
            except (pa.ArrowException, ValueError, OSError) as exc:
                self._drop(f"not an Arrow IPC stream ({describe(exc)})")
                continue
            for batch in table.to_batches():
                if batch.num_rows:
                    sink(batch)

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._domain is not None:
            security.unregister(self._ctx, self._domain)
            self._domain = None

    def _drop(self, why: str) -> None:
        log.warning("the row exchange of node %s dropped a message: %s", self.node_id, why)

    def _refused(self, address: str, reason: str) -> None:
        log.warning(
            "the row exchange of node %s refused a connection from %s: %s", self.node_id, address, reason
        )


def _exchange_push(
    ctx: zmq.Context[zmq.Socket[bytes]],
    topology: Topology,
    pair: tuple[str, str],
    endpoint: str,
    linger: float,
) -> zmq.Socket[bytes]:
    """The PUSH from node ``pair[0]``'s task to node ``pair[1]``'s at ``endpoint``, connected: in a CURVE
    topology a CURVE client with ``pair[0]``'s key pair and ``pair[1]``'s public key."""
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.setsockopt(zmq.LINGER, int(linger * 1000))
    try:
        curve = curve_settings(topology)
        if curve is not None:
            keys = security.node_keys(curve.key_dir, pair[0])
            security.apply_client(push, keys, security.server_key(curve.key_dir, pair[1]))
        push.connect(endpoint)
    except BaseException:
        push.close(linger=0)
        raise
    return push


class _Feeder:
    """Batches gathered into pieces of at least ``FEED_ROWS`` rows, each handed to the node at once."""

    def __init__(self, node: NodeHandle) -> None:
        self.node = node
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.rows += batch.num_rows
        if self.rows >= FEED_ROWS:
            self.node.feed(self.batches, last=False)
            self.batches, self.rows = [], 0

    def close(self) -> None:
        self.node.feed(self.batches, last=True)
        self.batches, self.rows = [], 0


def _ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


#: the one row each barrier task yields, as Spark and as Arrow see it
RESULT_SCHEMA = "node string, partition long, status string, counters string"
_RESULT_ARROW = pa.schema(
    [("node", pa.string()), ("partition", pa.int64()), ("status", pa.string()), ("counters", pa.string())]
)


WARM_SCHEMA = "pid long, seconds double"


def warm_task(modules: tuple[str, ...]) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.perf_counter()
        for name in modules:
            with contextlib.suppress(ImportError):  # ``start`` reports a node that cannot be built
                importlib.import_module(name)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "seconds": [time.perf_counter() - started]})

    return run


def barrier_task(plan: TaskPlan) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([_Task(plan, batches).run()], schema=_RESULT_ARROW)

    return run
