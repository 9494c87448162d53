"""A query cluster for the fault and load tests: initiator ``i`` in the test process, participants as processes."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.roles.query import QueryRole

from .node_proc import Probe, numbers
from .procs import NodeProc, Procs, until

ROWS, SEED = 6000, 13
GROUPED = "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY g ORDER BY g"


def grouped_reference() -> list[dict[str, Any]]:
    t = numbers(ROWS, SEED, 0, 1)
    g = t.group_by("g").aggregate([("v", "count"), ("v", "sum")]).sort_by("g")
    return pa.table({"n": g["v_count"], "s": g["v_sum"], "g": g["g"]}).select(["g", "n", "s"]).to_pylist()


def short_tmp(prefix: str) -> Path:
    """A short directory under /tmp (ipc socket paths have a length limit)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class QueryCluster:
    """``i`` (initiator, in this process) and participants ``p1``.. ``pN`` as ``node_proc.py`` children."""

    procs: Procs
    ipc_dir: Path
    parts: int = 2
    kind: str = "query"
    extra_roles: list[Any] = field(default_factory=list)
    node: Node | None = None
    participants: dict[str, NodeProc] = field(default_factory=dict)

    def endpoints(self, name: str) -> Endpoints:
        return Endpoints(control=f"ipc://{self.ipc_dir}/{name}-ctl", data=f"ipc://{self.ipc_dir}/{name}-data")

    def peers(self) -> dict[str, Endpoints]:
        return {n: self.endpoints(n) for n in ["i", *(f"p{k + 1}" for k in range(self.parts))]}

    def start_participant(self, name: str) -> NodeProc:
        index = int(name[1:]) - 1
        proc = NodeProc(
            self.kind, name, f"ipc:{self.ipc_dir}", str(ROWS), str(SEED), str(index), str(self.parts)
        )
        self.procs.add(proc)
        proc.give_peers(self.peers())
        self.participants[name] = proc
        return proc

    def start(self) -> Node:
        for k in range(self.parts):
            self.start_participant(f"p{k + 1}")
        roles = [QueryRole("i"), *self.extra_roles]
        self.node = Node(
            "i",
            BusConfig(cluster_tag="faults"),
            [*roles, Probe(roles)],
            transport="ipc",
            ipc_dir=str(self.ipc_dir),
        )
        self.node.bind()
        self.node.start(self.peers())
        for p in self.participants.values():
            p.started()
        self.node.wait_ready(30)
        return self.node

    def up(self, name: str) -> bool:
        assert self.node is not None
        peer = self.node.status()["peers"].get(name)
        return bool(peer and peer["up"])

    def restart(self, name: str) -> NodeProc:
        proc = self.start_participant(name)
        proc.started()
        until(f"i sees {name} up again", lambda: self.up(name), timeout=30)
        return proc

    def open_state(self) -> dict[str, int]:
        assert self.node is not None
        state: dict[str, int] = self.node.call("probe", "open_state", timeout=10)
        return state


@contextlib.contextmanager
def query_cluster(
    procs: Procs, parts: int = 2, kind: str = "query", extra_roles: tuple[Any, ...] = ()
) -> Iterator[QueryCluster]:
    cluster = QueryCluster(
        procs=procs, ipc_dir=short_tmp("faults-q-"), parts=parts, kind=kind, extra_roles=list(extra_roles)
    )
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            if cluster.node is not None:
                cluster.node.stop()
        finally:
            procs.reap_all()
            shutil.rmtree(cluster.ipc_dir, ignore_errors=True)
