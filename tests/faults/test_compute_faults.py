"""SIGKILL and SIGSTOP of a compute replica while a peek waits on it.

The controller runs in the test process, replicas ``r1`` and ``r2`` are processes on ipc sockets. The
replica is stopped before the peek is issued, so the signal lands while the peek is pending on it.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.roles.compute import (
    TARGET_FAILED,
    Aggregate,
    ComputeController,
    Finishing,
    SortKey,
    ViewDef,
    decode_table,
    encode_table,
)

from .cluster import short_tmp
from .node_proc import Probe, open_streams
from .procs import NodeProc, Procs, children, until

pytestmark = pytest.mark.timeout(120)
CTL = "compute.controller"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
SUM = ViewDef(
    source="t",
    group_by=("k",),
    aggregates=(Aggregate(func="count", column=None, name="n"), Aggregate(func="sum", column="v", name="s")),
)
ORDERED = Finishing(order_by=(SortKey(column="k"),))
WRITES = [[("a", 1), ("b", 2)], [("a", 3)], [("c", 5), ("b", 1)]]
EXPECTED = [{"k": "a", "n": 2, "s": 4}, {"k": "b", "n": 2, "s": 3}, {"k": "c", "n": 1, "s": 5}]
REPLICAS = ("r1", "r2")


class ComputeCluster:
    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        self.ipc = short_tmp("faults-c-")
        self.replicas: dict[str, NodeProc] = {}
        self.controller = ComputeController(replicas=REPLICAS)
        self.node = Node(
            "ctl",
            BusConfig(cluster_tag="faults"),
            [self.controller, Probe([self.controller])],
            transport="ipc",
            ipc_dir=str(self.ipc),
        )

    def endpoints(self) -> dict[str, Endpoints]:
        return {
            n: Endpoints(control=f"ipc://{self.ipc}/{n}-ctl", data=f"ipc://{self.ipc}/{n}-data")
            for n in ("ctl", *REPLICAS)
        }

    def start_replica(self, name: str) -> NodeProc:
        proc = NodeProc("compute", name, f"ipc:{self.ipc}")
        self.procs.add(proc)
        proc.give_peers(self.endpoints())
        proc.started()
        self.replicas[name] = proc
        return proc

    def call(self, call_name: str, /, **args: Any) -> Any:
        return self.node.call(CTL, call_name, args, timeout=20)

    def peek(self, target: str | None = None) -> Future[Any]:
        args: dict[str, Any] = {"view": "v", "finishing": ORDERED}
        if target is not None:
            args["target_replica"] = target
        return self.node.call_async(CTL, "peek", args)

    def up(self, name: str) -> bool:
        peer = self.node.status()["peers"].get(name)
        return bool(peer and peer["up"])

    def answers(self, target: str) -> bool:
        """A peek targeted at ``target`` succeeds (after a restart, once it is hydrated)."""
        try:
            return rows(self.peek(target).result(timeout=20)) == EXPECTED
        except RuntimeError:
            return False


def rows(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = decode_table(data).to_pylist()
    return out


@pytest.fixture
def cluster(fds_back: None) -> Iterator[ComputeCluster]:
    with children() as procs:
        cl = ComputeCluster(procs)
        try:
            cl.node.bind()
            for r in REPLICAS:
                cl.start_replica(r)
            cl.node.start(cl.endpoints())
            cl.node.wait_ready(30)
            cl.call("create_table", name="t", schema=SCHEMA)
            for values in WRITES:
                table = pa.table({"k": [k for k, _ in values], "v": [v for _, v in values]}, schema=SCHEMA)
                cl.call("write", table="t", batch=encode_table(table))
            cl.call("create_view", name="v", view=SUM)
            until("both replicas answer", lambda: all(cl.answers(r) for r in REPLICAS), timeout=30)
            yield cl
        finally:
            try:
                cl.node.stop()
            finally:
                procs.reap_all()
                shutil.rmtree(cl.ipc, ignore_errors=True)


def assert_no_leaks(cl: ComputeCluster) -> None:
    until("the controller holds no peek", lambda: not any(cl.node.call("probe", "open_state").values()))
    until("no stream is open", lambda: open_streams(cl.node.status()) == 0)
    for name, proc in cl.replicas.items():
        if proc.proc.poll() is None:
            until(f"{name} holds no peek", lambda proc=proc: not any(proc.ask("state")["open"].values()))


def test_sigkill_of_the_target_replica_fails_the_peek_and_a_restart_answers(cluster: ComputeCluster) -> None:
    """What the user sees: a peek targeted at r1 fails with ``TARGET_FAILED`` as soon as r1 is killed;
    an untargeted peek meanwhile is answered by r2, correctly; r1 restarted empty is hydrated from the
    controller's history and answers the same rows. Nothing acknowledged is lost (every write is in the
    answer) and no peek is left pending anywhere."""
    r1 = cluster.replicas["r1"]
    r1.signal(signal.SIGSTOP)
    fut = cluster.peek("r1")
    until("the peek is pending", lambda: cluster.node.call("probe", "open_state")["peeks"] == 1)
    killed = time.monotonic()
    r1.kill()
    with pytest.raises(RuntimeError, match=TARGET_FAILED):
        fut.result(timeout=20)
    detected = time.monotonic() - killed
    assert rows(cluster.peek().result(timeout=20)) == EXPECTED  # r2 answers
    restarted = time.monotonic()
    cluster.start_replica("r1")
    until("the restarted r1 answers", lambda: cluster.answers("r1"), timeout=30)
    recovered = time.monotonic() - restarted
    assert_no_leaks(cluster)
    print(f"FAULT compute-sigkill detected={detected:.3f} recovered={recovered:.3f}")


def test_sigstop_of_the_target_replica_fails_the_peek_after_the_peer_timeout(cluster: ComputeCluster) -> None:
    """What the user sees: a peek targeted at a stopped r1 fails with ``TARGET_FAILED`` once r1 has been
    silent for the peer timeout (1.5 s); after SIGCONT r1 reconnects, is hydrated again, and a peek
    targeted at it returns the correct rows. No peek is left pending."""
    r1 = cluster.replicas["r1"]
    r1.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    fut = cluster.peek("r1")
    with pytest.raises(RuntimeError, match=TARGET_FAILED):
        fut.result(timeout=20)
    detected = time.monotonic() - stopped
    r1.signal(signal.SIGCONT)
    resumed = time.monotonic()
    until("r1 answers again", lambda: cluster.answers("r1"), timeout=30)
    recovered = time.monotonic() - resumed
    assert_no_leaks(cluster)
    print(f"FAULT compute-sigstop detected={detected:.3f} recovered={recovered:.3f}")
