"""The Spark runtime: executor-placed nodes as one barrier stage, driver-placed nodes in the driver.

Sequence (the xgboost.spark / TorchDistributor pattern, see docs/TOPOLOGIES.md):

1. The driver binds a small runtime channel (a ZeroMQ ROUTER on an ephemeral port) and the driver-placed
   nodes, then launches one barrier stage with one task per executor-placed node
   (``DataFrame.mapInArrow(..., barrier=True)``) from a background thread, in its own job group.
2. Each task, after the fork, builds its node through the ``NodeFactory`` (without rows), binds ephemeral
   ports, and tells the driver ``bound`` with its endpoints (or ``failed`` with the cause: the driver
   raises it naming the node). Once every task is bound, the driver sends each the peer table
   (``peers``).
3. The task starts its node, then reads its input partition (Arrow record batches) and hands it to the
   running node in pieces (``NodeHandle.feed``, ``FEED_ROWS`` rows each), so the node's handshakes and
   first writes overlap Spark sending the rows; with a ``RowRouter`` that moves rows the tasks first hand
   each other the rows that belong to another task (``_RowExchange``). It then waits for its links, tells the driver it
   is ready, and serves until the driver says stop or the node dies. It yields one result row.
4. The driver builds and binds its own nodes while Spark starts the stage, starts them as it sends the
   peer table and returns from ``start`` when every node
   is ready. ``stop`` tells each task to stop and collects the result rows.

A task that raises, or whose Python worker dies, fails the barrier stage; Spark then kills the other
tasks. The driver turns the job failure into a ``SparkRuntimeError`` naming the node, its barrier task and
the cause. A task waits for the driver at most ``ready_timeout``. A task that fails before it is ready also
tells the driver ``failed``, and the driver tells every task ``abort``: until it is ready a task reads the
channel between every step and wait (its links' in slices, the row exchange's along with its rows), so it
stops its node before Spark kills it without its cleanup.

Every node keeps its data in ``<SparkFiles root>/<job group>/<node>`` (``NodeRequest.data_dir``), which its
task removes when the node stops, and the driver on its machine at the end (``_abort``), in local mode
with each task node's own ipc directory (a killed task never stops its node).

This module is the driver's side; what runs in the barrier tasks is ``sparkbus.topologies.spark_task``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from sparkbus.bus.node import OWN_IPC_DIR_PREFIX
from sparkbus.topologies.model import Topology
from sparkbus.topologies.runtime import Endpoints, NodeFactory, NodeHandle, NodeRequest, advertise_host
from sparkbus.topologies.spark_channel import DriverChannel
from sparkbus.topologies.spark_task import (
    FEED_ROWS,
    POLL_MS,
    RESULT_SCHEMA,
    WARM_SCHEMA,
    RowRouter,
    TaskPlan,
    barrier_task,
    data_root,
    describe,
    tagged,
    warm_task,
)

log = logging.getLogger(__name__)

__all__ = [
    "ABORT_WAIT",
    "FEED_ROWS",
    "RESULT_SCHEMA",
    "NodeResult",
    "RowRouter",
    "SparkRuntime",
    "SparkRuntimeError",
    "embedded_session",
]

_TASK_TAG = re.compile(r"sparkbus node (?P<node>\S+) \(barrier task (?P<task>\d+)\)")
_BARRIER_TASK = re.compile(r"barrier task ResultTask\(\d+, (?P<task>\d+)\)")
_CRASHED = re.compile(r"Python worker exited unexpectedly \(crashed\)")
_SPARK_TASK = re.compile(r"Task (?P<task>\d+) in stage \S+ failed")
#: seconds the driver waits for the tasks to stop their nodes after ``abort``, before it cancels the stage
ABORT_WAIT = 5.0
#: seconds between the driver's cancels of the stage's job group while it waits for the stage to end
CANCEL_EVERY = 0.5


class SparkRuntimeError(RuntimeError):
    """The barrier stage or a node failed.

    Attributes:
        node: the node that failed, when known.
        task: its barrier task (partition) index, when known.
        cause: what went wrong, as reported by the task or by Spark.
    """

    def __init__(
        self, message: str, *, node: str | None = None, task: int | None = None, cause: str = ""
    ) -> None:
        super().__init__(message)
        self.node = node
        self.task = task
        self.cause = cause


@dataclass(frozen=True, kw_only=True)
class NodeResult:
    """One node's report at stop."""

    node: str
    partition: int | None
    status: str
    counters: dict[str, Any]


# ---------------------------------------------------------------- the SparkSession


def embedded_session(topology: Topology, **extra_conf: str) -> Any:
    """Build the SparkSession a topology asks for, with the settings barrier stages need, or return the
    one already running when it has them.

    Sets ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` to this interpreter (the one with sparkbus
    installed), ``spark.barrier.sync.timeout`` from ``spark.barrier_timeout``,
    ``spark.stage.maxConsecutiveAttempts`` 1 (a failed barrier stage is reported, not retried) and
    ``spark.ui.enabled`` false, then the topology's ``[spark.conf]`` and ``extra_conf``.

    Raises:
        SparkRuntimeError: a SparkContext already runs in this process with another master, Python, or
            value of one of these settings other than ``spark.sql.*`` (which Spark applies to the running
            session): Spark would ignore them, and hand back the running session as it is.
    """
    spark = topology.spark
    if spark is None:
        raise SparkRuntimeError(f"{topology.source}: no [spark] section; run it with `sparkbus up` instead")
    conf = {
        "spark.barrier.sync.timeout": f"{max(1, round(spark.barrier_timeout))}s",
        "spark.stage.maxConsecutiveAttempts": "1",
        "spark.ui.enabled": "false",
        **dict(spark.conf),
        **extra_conf,
    }
    running = SparkContext._active_spark_context
    if running is not None:
        _check_running(running, spark.master, conf)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(spark.master).appName(spark.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _check_running(sc: Any, master: str, conf: dict[str, str]) -> None:
    """Refuse a running SparkContext that differs from what ``embedded_session`` would build."""
    got = sc.getConf()
    differ = [] if sc.master == master else [f"master {sc.master} (the topology asks {master})"]
    if sc.pythonExec != sys.executable:
        differ.append(f"Python workers running {sc.pythonExec} (not {sys.executable})")
    differ += [
        f"{key} {got.get(key) or 'unset'} (asked: {value})"
        for key, value in conf.items()
        if not key.startswith("spark.sql.") and got.get(key) != value
    ]
    if differ:
        raise SparkRuntimeError(
            f"a SparkSession already runs in this process with {'; '.join(differ)}: stop it first, or build "
            "the SparkRuntime on it with a topology it matches"
        )


def _check_session(session: Any) -> None:
    timeout = session.sparkContext.getConf().get("spark.barrier.sync.timeout")
    if timeout is None:
        raise SparkRuntimeError(
            "the SparkSession leaves spark.barrier.sync.timeout at Spark's default of 365 days, so a barrier "
            "call waiting for a task that never arrives would hang the job for a year; build the session with "
            "sparkbus.topologies.spark.embedded_session, or set spark.barrier.sync.timeout (e.g. 30s)"
        )
    # Spark reads a boolean setting trimmed and in any case ("TRUE" enables it).
    if (
        session.sparkContext.getConf().get("spark.dynamicAllocation.enabled", "false").strip().lower()
        == "true"
    ):
        raise SparkRuntimeError(
            "barrier stages refuse dynamic allocation; set spark.dynamicAllocation.enabled=false"
        )


# ---------------------------------------------------------------- the driver side


def _explain(exc: BaseException, node_ids: tuple[str, ...]) -> SparkRuntimeError:
    """Name the node and the cause in a Spark job failure."""
    text = str(exc)
    # Tracebacks quote source lines too (f"node {...} could not bind"): only matches that name a node count.
    tagged = next((m for m in _TASK_TAG.finditer(text) if m["node"] in node_ids), None)
    node: str | None
    if tagged is not None:
        node = tagged["node"]
        task = int(tagged["task"])
        cause = text[tagged.end() :].removeprefix(" failed: ").splitlines()[0].strip()
    else:
        spark_task = _SPARK_TASK.search(text) or _BARRIER_TASK.search(text)
        task = int(spark_task["task"]) if spark_task else -1
        node = node_ids[task] if 0 <= task < len(node_ids) else None
        crashed = _CRASHED.search(text)
        if crashed is not None:
            cause = f"{crashed[0]}: its process died (killed, out of memory, or exited)"
        else:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            cause = lines[0] if lines else type(exc).__name__
    if node is None:
        return SparkRuntimeError(f"the sparkbus barrier stage failed: {cause}", cause=cause)
    return SparkRuntimeError(
        f"sparkbus node {node} (barrier task {task}) failed: {cause}", node=node, task=task, cause=cause
    )


def _driver_failure(node_id: str, cause: str) -> SparkRuntimeError:
    return SparkRuntimeError(f"sparkbus node {node_id} (driver) failed: {cause}", node=node_id, cause=cause)


@contextlib.contextmanager
def _driver_step(node_id: str) -> Iterator[None]:
    """A driver node's step (build, bind, start, wait for its links): what it raises, as the
    ``SparkRuntimeError`` naming the node, which a caller such as ``sparkbus run`` reports in one line."""
    try:
        yield
    except Exception as exc:
        raise _driver_failure(node_id, describe(exc)) from exc


@dataclass
class _Progress:
    rows: dict[str, str] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    #: the tasks that have spoken to the driver, and those that have said their node stopped
    seen: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)


class SparkRuntime:
    """Runs a topology's nodes on Spark: executor-placed ones in a barrier stage, driver-placed ones here.

    Args:
        topology: a validated topology with a ``[spark]`` section.
        session: the SparkSession (``embedded_session(topology)`` builds the right one).
        node_factory: builds each node (the bus node, or ``ProbeFactory`` for a connectivity probe).
        data: what the executor nodes load: ``data.repartition(n)`` gives the DataFrame with one partition
            per node, whose task's node loads it. When ``data`` has a ``router`` attribute (a
            ``RowRouter``, not None), each task passes its input batches through it; a router with
            ``exchange`` names the task each row goes to instead, and the tasks hand each other the rows
            (``mainjob.RoutedFrame``; ZeroMQ between the tasks, CURVE with the nodes' key pairs in a CURVE
            topology).
            None gives each node no data.
        ready_timeout: seconds for every node to complete its handshakes once the stage runs.

    Use as a context manager, or call ``start`` and then ``stop``.
    """

    def __init__(
        self,
        topology: Topology,
        session: Any,
        node_factory: NodeFactory,
        *,
        data: Any = None,
        ready_timeout: float = 30.0,
    ) -> None:
        if topology.spark is None:
            raise SparkRuntimeError(
                f"{topology.source}: no [spark] section; run it with `sparkbus up` instead"
            )
        _check_session(session)
        self.topology = topology
        self.session = session
        self.factory = node_factory
        self.data = data
        self.ready_timeout = ready_timeout
        self.executor_ids = tuple(nid for nid, _ in topology.placed("executor"))
        self.driver_ids = tuple(nid for nid, _ in topology.placed("driver"))
        self.endpoints: dict[str, Endpoints] = {}
        self.rendezvous_seconds: float | None = None
        #: seconds from ``start()`` to each step, driver's ("driver:...") and each task's ("<node>:...",
        #: from the task's wall clock: on a cluster, off by the machines' clock skew)
        self.timeline: dict[str, float] = {}
        #: the process id of each executor node's Python worker (as its task reported it)
        self.worker_pids: dict[str, int] = {}
        self._t0 = 0.0
        self._group = f"sparkbus-{topology.cluster.name}-{uuid.uuid4().hex[:8]}"
        self._channel: DriverChannel | None = None
        self._driver_nodes: dict[str, NodeHandle] = {}
        self._thread: threading.Thread | None = None
        #: set by ``_abort``: the stage's thread submits no job after it
        self._called_off = threading.Event()
        self._rows: list[dict[str, Any]] | None = None
        self._error: BaseException | None = None
        self._progress = _Progress()
        #: this start's data directory on the driver's machine (``data_root``), set by ``start``
        self._data_dir: Path | None = None

    def __enter__(self) -> SparkRuntime:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start

    def warm_workers(self) -> dict[str, Any]:
        """Start the executors' Python workers before ``start``, with the modules the nodes import.

        Spark forks a Python worker for each task of a Python stage and, with ``spark.python.worker.reuse``
        (Spark's default), keeps it for the next Python task. The barrier stage of ``start`` then begins
        with workers that have imported PyArrow and the node's roles, instead of spending its first second
        or two spawning them. Runs one ordinary (non-barrier) task per executor node, at once.

        Returns the seconds the warm-up took (``seconds``), the worker processes (``pids``) and, per task,
        the seconds spent importing (``import_seconds``).
        """
        from sparkbus.topologies.registry import ROLES  # noqa: PLC0415

        n = len(self.executor_ids)
        if n == 0:
            return {"seconds": 0.0, "pids": [], "import_seconds": []}
        modules = [__name__, type(self.factory).__module__]
        for nid in self.executor_ids:
            spec = self.topology.spec_of(nid)
            modules += [
                ROLES.entry(r).target.partition(":")[0] for r in (*spec.roles, *spec.services) if r in ROLES
            ]
        started = time.monotonic()
        rows = (
            self.session.range(0, n, 1, n)
            .mapInArrow(warm_task(tuple(dict.fromkeys(modules))), WARM_SCHEMA)
            .collect()
        )
        return {
            "seconds": round(time.monotonic() - started, 3),
            "pids": sorted(int(r["pid"]) for r in rows),
            "import_seconds": [round(float(r["seconds"]), 3) for r in rows],
        }

    def start(self) -> None:
        """Launch the stage and the driver nodes; return when every node is ready.

        Raises:
            SparkRuntimeError: a node failed (named), or not every node was ready in time. Everything
                started so far has been stopped.
        """
        started = time.monotonic()
        self._t0 = time.time()
        try:
            self._data_dir = data_root(self._group)
            self._open_channel()
            self._launch()
            self._mark("driver:stage_launched")
            # Built while Spark starts the stage: their endpoints reach the tasks with the peer table.
            self._build_driver_nodes()
            self._mark("driver:driver_nodes_bound")
            self._await(lambda p: p.bound >= set(self.executor_ids), "bind")
            self._mark("driver:all_tasks_bound")
            self._send_all("peers", {k: v.to_json() for k, v in self.endpoints.items()})
            self._start_driver_nodes()
            self._await(lambda p: p.ready >= set(self.executor_ids), "complete their handshakes")
            self._mark("driver:all_tasks_ready")
            for nid, node in self._driver_nodes.items():
                with _driver_step(nid):
                    node.wait_ready(max(0.1, self.ready_timeout - (time.monotonic() - started)))
            self._mark("driver:driver_nodes_ready")
        except BaseException:
            self._abort()  # the failure that brought us here is the one to report
            raise
        self.rendezvous_seconds = time.monotonic() - started

    def _mark(self, name: str, at: float | None = None) -> None:
        self.timeline[name] = round((time.time() if at is None else at) - self._t0, 3)

    def _open_channel(self) -> None:
        spark = self.topology.spark
        # Local tasks reach the driver on loopback; cluster executors reach it on spark.driver.host.
        bind = "127.0.0.1" if spark is not None and spark.is_local else "*"
        try:
            self._channel = DriverChannel(self.topology, self.executor_ids, bind, self._driver_host())
        except Exception as exc:
            raise SparkRuntimeError(
                f"the sparkbus runtime channel: {describe(exc)}", cause=describe(exc)
            ) from exc

    def _build_driver_nodes(self) -> None:
        host = self._driver_host()
        for nid in self.driver_ids:
            request = NodeRequest(
                node_id=nid,
                topology=self.topology,
                advertise_host=advertise_host(self.topology.bus.host, host),
                data_dir=str(self._data_dir / nid) if self._data_dir is not None else None,
            )
            with _driver_step(nid):
                node = self.factory(request)
                self._driver_nodes[nid] = node
                self.endpoints[nid] = node.bind()

    def _driver_host(self) -> str:
        spark = self.topology.spark
        if spark is not None and spark.is_local:
            return "127.0.0.1"  # spark.driver.host is the machine's name, which may not resolve to loopback
        host: str = self.session.sparkContext.getConf().get("spark.driver.host") or "127.0.0.1"
        return host

    def _launch(self) -> None:
        assert self._channel is not None
        n = len(self.executor_ids)
        plan = TaskPlan(
            topology=self.topology,
            node_ids=self.executor_ids,
            channel=self._channel.endpoint,
            factory=self.factory,
            ready_timeout=self.ready_timeout,
            with_data=self.data is not None,
            data_dir=self._group,
            router=getattr(self.data, "router", None),
        )
        sc = self.session.sparkContext
        # One partition per task; without data, a range with one row per partition.
        source = self.data.repartition(n) if self.data is not None else self.session.range(0, n, 1, n)
        job = source.mapInArrow(barrier_task(plan), RESULT_SCHEMA, barrier=True)

        def run() -> None:
            sc.setJobGroup(self._group, f"sparkbus {self.topology.cluster.name}: {n} nodes", True)
            if self._called_off.is_set():  # a driver node failed before the job was submitted
                return
            try:
                self._rows = job.collect()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"sparkbus-stage-{self._group}", daemon=True)
        self._thread.start()

    def _await(self, done: Any, what: str) -> None:
        assert self._channel is not None and self._thread is not None
        deadline = time.monotonic() + self.ready_timeout
        while not done(self._progress):
            self._raise_if_failed()
            if not self._thread.is_alive():
                raise SparkRuntimeError("the sparkbus barrier stage ended before every node was ready")
            for nid, node in self._driver_nodes.items():
                if (failure := node.failure()) is not None:
                    raise _driver_failure(nid, failure)
            if time.monotonic() >= deadline:
                late = sorted(set(self.executor_ids) - (self._progress.ready | self._progress.bound))
                raise SparkRuntimeError(
                    f"nodes {', '.join(late) or '(all bound)'} did not {what} within {self.ready_timeout:g}s "
                    f"(are there {len(self.executor_ids)} free task slots?)"
                )
            if self._channel.poll(POLL_MS) and (got := self._channel.receive()) is not None:
                self._on_task_event(*got)

    def _on_task_event(self, node_id: str, event: str, body: dict[str, Any]) -> None:
        progress = self._progress
        progress.seen.add(node_id)
        try:  # the body's fields, checked before anything is taken from them
            if event == "rows":
                endpoint = body["endpoint"]
                if not isinstance(endpoint, str):
                    raise TypeError(f"endpoint {endpoint!r} is not a string")
            elif event == "failed":
                cause = f"could not start: {body['error']}"
            elif event == "bound":
                endpoints = Endpoints.from_json(body)
            elif event == "ready":
                pid = int(body.get("pid", 0))
                marks = {f"{node_id}:{k}": float(at) for k, at in dict(body.get("marks", {})).items()}
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("the runtime channel dropped '%s' from %s: %s", event, node_id, describe(exc))
            return
        if event == "ended":
            progress.ended.add(node_id)
        elif event == "rows":
            progress.rows[node_id] = endpoint
            if len(progress.rows) == len(self.executor_ids):
                self._mark("driver:rows_rendezvous")
                self._send_all("rows", {"endpoints": [progress.rows[n] for n in self.executor_ids]})
        elif event == "failed":
            task = self.executor_ids.index(node_id)
            self._send_all("abort", {"cause": f"node {node_id} failed: {cause}"})
            raise SparkRuntimeError(tagged(node_id, task, cause), node=node_id, task=task, cause=cause)
        elif event == "bound":
            self.endpoints[node_id] = endpoints
            progress.bound.add(node_id)
        elif event == "ready":
            progress.ready.add(node_id)
            self.worker_pids[node_id] = pid
            for mark, at in marks.items():
                self._mark(mark, at)

    def _send_all(self, event: str, body: dict[str, Any]) -> None:
        assert self._channel is not None
        for nid in self.executor_ids:
            self._channel.send(nid, event, body)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise _explain(self._error, self.executor_ids) from self._error

    def _start_driver_nodes(self) -> None:
        # By now self.endpoints holds the driver nodes' and, from the tasks' "bound" reports, the executors'.
        for nid, node in self._driver_nodes.items():
            with _driver_step(nid):
                node.set_peers({k: v for k, v in self.endpoints.items() if k != nid})
                node.start()

    # -- running and stopping

    def check(self) -> None:
        """Raise ``SparkRuntimeError`` if the stage or a driver node has failed since ``start``."""
        self._raise_if_failed()
        if self._thread is not None and not self._thread.is_alive() and self._rows is None:
            raise SparkRuntimeError("the sparkbus barrier stage ended unexpectedly")
        for nid, node in self._driver_nodes.items():
            if (failure := node.failure()) is not None:
                raise _driver_failure(nid, failure)

    def stop(self, timeout: float = 30.0) -> list[NodeResult]:
        """Tell every task to stop, collect their results, stop the driver nodes.

        Raises:
            SparkRuntimeError: a node had failed, or the stage did not end within ``timeout`` (it is
                then cancelled).
        """
        results: list[NodeResult] = []
        try:
            if self._channel is not None:
                self._send_all("stop", {})
            if self._thread is not None:
                self._thread.join(timeout)
                if self._thread.is_alive():
                    raise SparkRuntimeError(
                        f"the sparkbus barrier stage did not stop within {timeout:g}s; cancelled"
                    )
            self._raise_if_failed()
            for row in self._rows or []:
                counters = json.loads(row["counters"])
                results.append(
                    NodeResult(
                        node=row["node"], partition=row["partition"], status=row["status"], counters=counters
                    )
                )
            for nid, node in self._driver_nodes.items():
                results.append(
                    NodeResult(node=nid, partition=None, status="stopped", counters=node.counters())
                )
        finally:
            errors = self._abort()
        if errors:
            raise SparkRuntimeError(f"driver nodes did not stop cleanly: {'; '.join(errors)}")
        return results

    def _cancel_stage(self, timeout: float = 30.0) -> None:
        """Cancel the stage's job and wait up to ``timeout`` for its thread. ``cancelJobGroup`` cancels
        only jobs that exist, and the thread may be past its ``_called_off`` check without having
        submitted the job yet: so cancel again every ``CANCEL_EVERY`` seconds while the thread runs."""
        assert self._thread is not None
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            self.session.sparkContext.cancelJobGroup(self._group)
            self._thread.join(min(CANCEL_EVERY, max(0.0, deadline - time.monotonic())))

    def _abort(self) -> list[str]:
        """Cancel the stage if it still runs, stop the driver nodes, close the channel, remove the data
        directory on this machine; returns the driver nodes' stop errors. Idempotent.

        A stage that did not return its rows (it failed, or is still running) may have tasks left: Spark
        kills a failed stage's other tasks, and ``cancelJobGroup`` all of them, without their ``finally``
        (which stops the node and removes its data). So they are told to abort first (a task first heard
        from meanwhile, again), and given up to ``ABORT_WAIT`` seconds to say they have ended."""
        self._called_off.set()
        if self._rows is None and self._channel is not None:
            self._send_all("abort", {"cause": "the driver is stopping"})
            deadline = time.monotonic() + ABORT_WAIT
            while self._progress.seen - self._progress.ended and time.monotonic() < deadline:
                if self._channel.poll(POLL_MS) and (got := self._channel.receive()) is not None:
                    nid, event, _ = got
                    if nid not in self._progress.seen:
                        # Its first message: the abort above went to an identity the channel did not know.
                        self._progress.seen.add(nid)
                        self._channel.send(nid, "abort", {"cause": "the driver is stopping"})
                    if event == "ended":
                        self._progress.ended.add(nid)
        if self._thread is not None and self._progress.ended >= set(self.executor_ids):
            # Every task has returned its row (``aborted``): the stage ends by itself, and succeeds, where a
            # cancel would race it and kill the tasks still handing their rows over.
            self._thread.join(ABORT_WAIT)
        if self._thread is not None and self._thread.is_alive():
            self._cancel_stage()
        errors: list[str] = []
        for nid, node in self._driver_nodes.items():
            try:
                node.stop()
            except Exception as exc:
                errors.append(f"{nid}: {describe(exc)}")
        self._driver_nodes.clear()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)  # in local mode, the tasks' too
        self._remove_task_ipc_dirs()
        return errors

    def _remove_task_ipc_dirs(self) -> None:
        """In local mode, remove each executor node's own ipc directory (``/tmp/sparkbus-ipc-*``, made when
        ``bus.ipc_dir`` is unset), which its ``bound`` endpoints name: only the node's stop removes it, and
        a task whose Python worker died (killed, out of memory) or that Spark killed never stopped its node.
        After a clean stop the nodes have removed theirs already."""
        spark = self.topology.spark
        if spark is None or not spark.is_local:
            return
        for nid in self.executor_ids:
            endpoints = self.endpoints.get(nid)
            for address in (endpoints.control, endpoints.data) if endpoints is not None else ():
                if not address.startswith("ipc://"):
                    continue
                directory = Path(address.removeprefix("ipc://")).parent
                if directory.parent == Path("/tmp") and directory.name.startswith(OWN_IPC_DIR_PREFIX):
                    shutil.rmtree(directory, ignore_errors=True)
