"""Segment replication figures (issue 6): fast-forward cost against segment size, merge and write rates,
and a two-replica run that checks both replicas end identical.

Stores live on disk (DiskStorage, real fsyncs) in a temporary directory. The two-replica run drives two
``replication`` roles with an in-process pump (actions of one become events of the other); the bus core is
not used, so ``replication_vs_bus_ratio`` is reported as null until it lands.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, parser, table, write

from sparkbus.bus.contract import (
    BatchReceived,
    Consumed,
    CreditChanged,
    LocalCall,
    MessageReceived,
    OpenStream,
    PeerUp,
    Reply,
    Send,
    SendBatch,
    TimerFired,
)
from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import DiskStorage, write_whole
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, segment_file

P = "bench/0"


def rows(n: int, start: int = 0) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table({"key": ids, "value": pc.multiply(pc.random(n, initializer=start + 1), 100.0)})


def segment_of(root: Path, n: int) -> tuple[PartitionStore, Any]:
    store = PartitionStore.open(DiskStorage(root), P, 1, StoreConfig(flush_rows=1 << 30, flush_bytes=1 << 40))
    store.write(rows(n), 0.0)
    return store, store.flush()


def fast_forward_seconds(tmp: Path, n: int, repeats: int) -> float:
    """Time to make an already-received segment file the root (rename + manifest): the spec's metadata op."""
    source, entry = segment_of(tmp / f"src{n}", n)
    times = []
    for i in range(repeats):
        target = PartitionStore.open(DiskStorage(tmp / f"ff{n}-{i}"), P, 2, StoreConfig())
        data = source.storage.read(segment_file(entry.segment_id))
        write_whole(target.storage, f"in-{entry.segment_id}", [data])
        t0 = time.perf_counter()
        target.storage.rename(f"in-{entry.segment_id}", segment_file(entry.segment_id))
        target.add_segment(entry)
        times.append(time.perf_counter() - t0)
    return median(times)


def merge_rate(tmp: Path, n: int) -> float:
    source, entry = segment_of(tmp / "merge-src", n)
    target = PartitionStore.open(DiskStorage(tmp / "merge-dst"), P, 2, StoreConfig(flush_rows=1 << 30))
    write_whole(target.storage, "in-x", [source.storage.read(segment_file(entry.segment_id))])
    t0 = time.perf_counter()
    target.merge_segment_file("in-x", 0.0)
    target.flush()
    return n / (time.perf_counter() - t0)


class Pump:
    """Two or more roles wired directly: actions become the other role's events, in order."""

    def __init__(self, roles: dict[str, ReplicationRole]) -> None:
        self.roles = roles
        self.queue: deque[tuple[str, Any]] = deque()
        self.credit: dict[tuple[str, str, str], int] = {}
        self.replies: dict[int, Reply] = {}
        self.now = 0.0
        for name in roles:
            self.deliver(name, TimerFired(key="start"))
        for a in roles:
            for b in roles:
                if a != b:
                    self.deliver(a, PeerUp(peer=b))

    def deliver(self, node: str, event: Any) -> None:
        for action in self.roles[node].handle(event, self.now):
            if isinstance(action, Send):
                self.queue.append((action.peer, MessageReceived(peer=node, message=action.message)))
            elif isinstance(action, OpenStream):
                self.credit[node, action.peer, action.stream] = action.credit
            elif isinstance(action, SendBatch):
                key = (node, action.peer, action.stream)
                self.credit[key] -= len(action.data)
                event = BatchReceived(
                    peer=node,
                    stream=action.stream,
                    ordinal=0,
                    last=action.last,
                    data=action.data,
                    size=len(action.data),
                    remaining=self.credit[key],
                )
                self.queue.append((action.peer, event))
            elif isinstance(action, Consumed):
                key = (action.peer, node, action.stream)
                self.credit[key] = self.credit.get(key, 0) + action.size
                self.queue.append(
                    (action.peer, CreditChanged(peer=node, stream=action.stream, credit=self.credit[key]))
                )
            elif isinstance(action, Reply):
                self.replies[action.call_id] = action

    def drain(self) -> None:
        while self.queue:
            node, event = self.queue.popleft()
            self.deliver(node, event)

    def call(self, node: str, name: str, call_id: int, **args: Any) -> Reply:
        self.deliver(node, LocalCall(call_id=call_id, name=name, args=args))
        return self.replies.pop(call_id)


def replicated_run(tmp: Path, rf: int, total: int, batch: int, chunk: int) -> tuple[float, float, bool]:
    """Write ``total`` rows to a leader with ``rf`` replicas; returns (write rows/s, replication MB/s, identical)."""
    nodes = [f"n{i}" for i in range(rf)]
    spec = PartitionSpec(
        partition=P, replicas=tuple(Replica(node=n, placement=i + 1) for i, n in enumerate(nodes))
    )
    config = ReplicationConfig(
        store=StoreConfig(flush_rows=max(batch * 10, 1), compact_minors=1_000),
        chunk_bytes=chunk,
        credit_bytes=chunk * 4,
    )
    roles = {
        n: ReplicationRole(n, Layout.of([spec]), lambda p, n=n: DiskStorage(tmp / f"rf{rf}" / n), config)
        for n in nodes
    }
    pump = Pump(roles)
    t0 = time.perf_counter()
    for i in range(total // batch):
        reply = pump.call(
            "n0", "write", i, partition=P, rows=bytes(encode_batch(rows(batch, i * batch).to_batches()[0]))
        )
        assert reply.error is None, reply.error
    pump.call("n0", "flush", 10**9, partition=P)
    write_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    pump.drain()
    repl_s = time.perf_counter() - t1
    moved = sum(e.size for e in roles["n0"].local[P].store.entries)
    reads = [decode_batch(pump.call(n, "read", 10**9 + 1, partition=P).result) for n in nodes]
    identical = all(r.equals(reads[0]) for r in reads) and reads[0].num_rows == total
    return total / write_s, (moved / 1e6) / repl_s if rf > 1 else 0.0, identical


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    big = 100_000 if args.quick else 1_000_000
    repeats = 3 if args.quick else 5
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        small_s = fast_forward_seconds(tmp, 1_000, repeats)
        big_s = fast_forward_seconds(tmp, big, repeats)
        merge = merge_rate(tmp, big)
        total = 200_000 if args.quick else 1_000_000
        w1, _, same1 = replicated_run(tmp, 1, total, 10_000, 1 << 20)
        w2, mbps, same2 = replicated_run(tmp, 2, total, 10_000, 1 << 20)
    figures = {
        "fast_forward_size_ratio": big_s / small_s,
        "fast_forward_seconds": {"1k_rows": small_s, f"{big}_rows": big_s},
        "merge_rows_per_s": merge,
        "write_rows_per_s": {"rf1": w1, "rf2": w2},
        "replication_mb_per_s": mbps,
        "replication_vs_bus_ratio": None,
        "replicas_identical": same1 and same2,
    }
    write(args.out, "replication", figures, args.quick)
    print(
        table(
            [
                ("fast_forward_size_ratio", f"{figures['fast_forward_size_ratio']:.2f}", "goal <= 2"),
                ("merge_rows_per_s", f"{merge:,.0f}", ""),
                ("write_rows_per_s rf1", f"{w1:,.0f}", "10k-row writes, fsync each"),
                ("write_rows_per_s rf2", f"{w2:,.0f}", ""),
                ("replication_mb_per_s", f"{mbps:.1f}", "in-process pump, no bus"),
                ("replication_vs_bus_ratio", "n/a", "needs bus streams"),
                ("replicas_identical", str(figures["replicas_identical"]), ""),
            ],
            ("figure", "value", "note"),
        )
    )


if __name__ == "__main__":
    main()
