"""A bus node in its own process for the fault tests: query participant, BinX server or compute replica.

Usage: python node_proc.py KIND NODE_ID TRANSPORT [ROWS SEED INDEX PARTS]

``TRANSPORT`` is ``ipc:DIR`` (sockets ``DIR/{node}-ctl`` and ``-data``, so a restarted node is found where
it was) or ``tcp:HOST`` (ephemeral ports on HOST, for nodes inside network namespaces). The node prints its
endpoints as one JSON line, reads the peer table as one JSON line, starts, and then answers one JSON
command per stdin line with one JSON line: ``{"op": "state"}`` (bus status and the roles' open state),
``{"op": "sql", "text": ...}`` (a query initiated here: rows or the error code), ``{"op": "produce",
...}`` (BinX pages into an output buffer). It stops when stdin closes.

``Probe`` is also used by the test process: a role that reads the other roles' open state (pending
queries, sources, parked requests, peeks) on the node's loop thread, where that state lives.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, ClassVar

import pyarrow as pa

from sparkbus.bus import contract as c


def numbers(rows: int, seed: int, index: int, parts: int) -> pa.Table:
    """Part ``index`` of ``parts`` of the table ``t``: ``k`` 0..rows-1, ``g = k % 7``, ``v = (k * seed) % 1000``."""
    step = -(-rows // parts)
    ks = list(range(index * step, min(rows, (index + 1) * step)))
    return pa.table(
        {
            "k": pa.array(ks, pa.int64()),
            "g": pa.array([k % 7 for k in ks], pa.int64()),
            "v": pa.array([(k * seed) % 1000 for k in ks], pa.int64()),
        }
    )


def _open_state(role: Any) -> dict[str, int]:
    """The state a role holds for work in progress; all zero when nothing is in progress."""
    name = role.name
    if name == "query":
        return {"queries": len(role.queries), "query_calls": len(role.calls)}
    if name == "binx.client":
        return {"sources": len(role._sources), "requests": len(role._requests)}
    if name == "binx.server":
        return {"parked": len(role._parked), "buffers": len(role.buffers.keys())}
    if name == "compute.controller":
        return {"peeks": len(role.peeks), "peek_calls": len(role._peek_calls)}
    if name == "compute.replica":
        return {"peeks": len(role.peeks)}
    return {}


class Probe:
    """Answers the local call ``open_state`` with the open state of the node's other roles."""

    name = "probe"
    messages: ClassVar[tuple[type, ...]] = ()

    def __init__(self, roles: Iterable[Any]) -> None:
        self.roles = list(roles)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall) and event.name == "open_state":
            state: dict[str, int] = {}
            for role in self.roles:
                state.update(_open_state(role))
            return [c.Reply(call_id=event.call_id, result=state)]
        return []


def open_streams(status: dict[str, Any]) -> int:
    """Streams still open in a node's ``status()``, in either direction, with any peer."""
    return sum(p["streams_in"] + p["streams_out"] for p in status["peers"].values())


def main() -> None:
    from sparkbus.bus import BusConfig
    from sparkbus.bus.node import Endpoints, Node
    from sparkbus.roles.compute import ComputeReplica
    from sparkbus.roles.exchange import BinxServer, OutputBuffers
    from sparkbus.roles.query import QueryError, QueryRole, load, sql

    kind, node_id, transport = sys.argv[1], sys.argv[2], sys.argv[3]
    roles: list[Any]
    if kind == "query":
        roles = [QueryRole(node_id)]
    elif kind == "query+binx":
        roles = [QueryRole(node_id), BinxServer(OutputBuffers(instance_id=node_id), max_wait=1.0)]
    elif kind == "binx":
        roles = [BinxServer(OutputBuffers(instance_id=f"{node_id}-{id(object())}"), max_wait=1.0)]
    elif kind == "compute":
        roles = [ComputeReplica()]
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    mode, where = transport.split(":", 1)
    config = BusConfig(cluster_tag="faults")
    if mode == "ipc":
        node = Node(node_id, config, [*roles, Probe(roles)], transport="ipc", ipc_dir=where)
    else:
        node = Node(node_id, config, [*roles, Probe(roles)], host=where)
    print(json.dumps(node.bind().to_json()), flush=True)
    peers = {k: Endpoints.from_json(v) for k, v in json.loads(sys.stdin.readline()).items()}
    node.start(peers)
    try:
        if kind.startswith("query") and len(sys.argv) > 4:
            rows, seed, index, parts = map(int, sys.argv[4:8])
            load(node, "t", numbers(rows, seed, index, parts))
        print(json.dumps({"started": node_id}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "state":
                answer: Any = {"status": node.status(), "open": node.call("probe", "open_state", timeout=10)}
            elif op == "sql":
                try:
                    table = sql(node, cmd["text"], timeout=cmd.get("query_timeout", 20.0))
                    answer = {"rows": table.to_pylist()}
                except QueryError as exc:
                    answer = {"error": int(exc.code), "message": exc.message}
            elif op == "produce":
                key = {"task_id": cmd["task_id"], "buffer_id": cmd["buffer_id"]}
                node.call("binx.server", "create", key, timeout=10)
                pages = [bytes.fromhex(p) for p in cmd["pages"]]
                node.call("binx.server", "add_pages", {**key, "pages": pages}, timeout=10)
                node.call("binx.server", "no_more_pages", key, timeout=10)
                answer = {"ok": True}
            else:
                answer = {"unknown": op}
            print(json.dumps(answer), flush=True)
    finally:
        node.stop()


if __name__ == "__main__":
    main()
