"""A replication node in its own process, for the integration tests.

Usage: python replica_proc.py NODE_ID NODES IPC_DIR STORE_DIR
``NODES`` is the comma-separated placement order of partition ``t/0``. Sockets are ipc files in IPC_DIR
(``{node}-ctl``, ``{node}-data``), so a restarted node is found where it was and its peers' sockets
reconnect by themselves; the replica's files are in ``STORE_DIR/{node}``.

Reads one JSON command per stdin line and answers one JSON line on stdout:
``{"op": "write", "keys": [...]}`` -> ``{"ok": {...}}`` or ``{"error": "..."}``;
``{"op": "read"}`` -> ``{"keys": [...], "v": [...]}``; ``{"op": "status"}`` -> the role's status.
It stops when stdin closes.

Incoming segment files are appended slowly (a slow disk, ``SLOW_APPEND`` seconds per chunk), so a transfer
lasts long enough for the test to SIGKILL a process while one is on its way.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.replication import (
    DiskStorage,
    Layout,
    PartitionSpec,
    Replica,
    ReplicationConfig,
    ReplicationRole,
    StoreConfig,
)
from sparkbus.roles.replication.storage import FileWriter, Tap

P = "t/0"
SLOW_APPEND = 0.02
CONFIG = ReplicationConfig(
    store=StoreConfig(flush_rows=2000, flush_age=0.5, compact_minors=4),
    chunk_bytes=16 << 10,
    credit_bytes=64 << 10,
    tick=0.1,
    retry_after=0.2,
)


def endpoints(ipc_dir: str, node: str) -> Endpoints:
    return Endpoints(control=f"ipc://{ipc_dir}/{node}-ctl", data=f"ipc://{ipc_dir}/{node}-data")


class _SlowWriter:
    def __init__(self, inner: FileWriter) -> None:
        self.inner = inner

    def append(self, data: bytes) -> None:
        time.sleep(SLOW_APPEND)
        self.inner.append(data)

    def drain(self) -> None:
        self.inner.drain()

    def commit(self) -> None:
        self.inner.commit()

    def abort(self) -> None:
        self.inner.abort()


class SlowIncomingDisk(DiskStorage):
    """Incoming transfers are written in place under the segment's name (or ``in-`` when it exists)."""

    def create(self, name: str) -> FileWriter:
        writer = super().create(name)
        return _SlowWriter(writer) if name.startswith("in-") else writer

    def create_in_place(self, name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        return _SlowWriter(super().create_in_place(name, tap, size))


def rows(keys: list[int]) -> bytes:
    values = [f"{k:08d}-" + bytes(range(k % 7, k % 7 + 96)).hex() for k in keys]
    batch = pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.int64()), "v": values})
    return bytes(encode_batch(batch))


def serve(node: Node, command: dict[str, Any]) -> Any:
    op = command["op"]
    if op == "write":
        args = {"partition": P, "rows": rows(command["keys"])}
        try:
            return {"ok": node.call("replication", "write", args, timeout=10)}
        except RuntimeError as exc:
            return {"error": str(exc)}
    if op == "read":
        table = decode_batch(node.call("replication", "read", {"partition": P}, timeout=10))
        return {"keys": table.column("key").to_pylist() if table.num_columns else []}
    if op == "status":
        return node.call("replication", "status", {}, timeout=10)
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    node_id, names, ipc_dir, store_dir = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    spec = PartitionSpec(
        partition=P, replicas=tuple(Replica(node=n, placement=i + 1) for i, n in enumerate(names))
    )
    root = Path(store_dir) / node_id
    role = ReplicationRole(
        node_id, Layout.of([spec]), lambda p: SlowIncomingDisk(root / p.replace("/", "~")), CONFIG
    )
    node = Node(node_id, BusConfig(cluster_tag="repl-it"), [role], transport="ipc", ipc_dir=ipc_dir)
    node.bind()
    node.start({n: endpoints(ipc_dir, n) for n in names})
    try:
        print(json.dumps({"started": node_id}), flush=True)
        for line in sys.stdin:
            print(json.dumps(serve(node, json.loads(line))), flush=True)
    finally:
        node.stop()


if __name__ == "__main__":
    main()
