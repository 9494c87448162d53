"""Segment replication figures (issue 6): fast-forward cost against segment size, merge and write rates,
replication over the bus against a raw bus stream, and checks that replicas end identical.

Stores live on disk (DiskStorage, real fsyncs) in a temporary directory. ``replication_vs_bus_ratio``: two
real bus ``Node``s, the leader in this process and the follower in a spawned one (the layout of
benchmarks/bus.py), run a ``replication`` role and a plain stream role side by side. Alternately, the
follower is given a fresh placement (after leaving the partition and draining, so its store starts
empty), so the leader offers it a large segment again (timed from the ``assign`` call on the leader to
the SEGMENT_ACK there: transit, checksum, fsync, manifest), and
the plain role streams the same number of bytes in batches of the same size under the same credit (timed
to the last batch at the receiver; CLOCK_MONOTONIC is one clock for both processes). The ratio is of the
medians. Each round also times the disk alone: as many bytes written in chunks of the same size to a new
file of the same directory by the writer a follower uses, then fdatasync'd. A follower acks only a durable
segment, so a replication takes at least about that long: ``durable_write_vs_bus_ratio`` is about the best
``replication_vs_bus_ratio`` this disk allows, and ``replication_vs_durable_write_ratio`` how close the
replication came to it (1: the network and the protocol added nothing to the disk's time).

The write-rate runs drive roles with an in-process pump (actions of one become events of the other).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, parser, table, write

from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
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
from sparkbus.bus.node import Endpoints, Node
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
    """Time to make an already-received segment file the root (the manifest listing it, as a receiver
    does after the file, written in place under its name, is fsync'd): the spec's metadata operation."""
    source, entry = segment_of(tmp / f"src{n}", n)
    times = []
    for i in range(repeats):
        target = PartitionStore.open(DiskStorage(tmp / f"ff{n}-{i}"), P, 2, StoreConfig())
        writer = target.storage.create_in_place(segment_file(entry.segment_id))
        writer.append(source.storage.read(segment_file(entry.segment_id)))
        writer.commit()
        t0 = time.perf_counter()
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


# ---------------------------------------------------------------- replication against a raw bus stream


@dataclass
class PlainStream:
    """The raw bus stream: sends ``total`` bytes in ``chunk``-byte batches within credit; the receiver
    consumes each batch at once and notes when the last one arrived (``done`` is set then)."""

    name: str = "plain"
    messages: ClassVar[tuple[type, ...]] = ()
    peer: str = ""
    left: int = 0
    chunk: bytes = b""
    stream: str = ""
    runs: int = 0
    last_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall) and event.name == "send":
            a = event.args
            self.runs += 1
            self.peer, self.left, self.chunk = a["peer"], a["total"], b"\x01" * a["chunk"]
            self.stream = f"plain/{self.runs}"
            out: list[c.Action] = [c.OpenStream(peer=self.peer, stream=self.stream, credit=a["credit"])]
            return out + self._pump(a["credit"]) + [c.Reply(call_id=event.call_id)]
        if isinstance(event, c.LocalCall):
            return [c.Reply(call_id=event.call_id, result=self.last_at)]
        if isinstance(event, c.CreditChanged):
            return self._pump(event.credit)
        if isinstance(event, c.BatchReceived):
            if event.last:
                self.last_at = now
                self.done.set()
            return [c.Consumed(peer=event.peer, stream=event.stream, size=event.size)]
        return []

    def _pump(self, credit: int) -> list[c.Action]:
        out: list[c.Action] = []
        while self.left and credit >= min(len(self.chunk), self.left):
            n = min(len(self.chunk), self.left)
            credit -= n
            self.left -= n
            data = self.chunk if n == len(self.chunk) else self.chunk[:n]
            out.append(c.SendBatch(peer=self.peer, stream=self.stream, data=data, last=self.left == 0))
        return out


class TimedReplication(ReplicationRole):
    """The replication role, noting (with the node's clock) when a SEGMENT_ACK last marked a segment acked
    (``acked`` is set then)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acked_at = 0.0
        self.acked = threading.Event()

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        before = self.counters.get("acked", 0)
        out = super().handle(event, now)
        if self.counters.get("acked", 0) > before:
            self.acked_at = now
            self.acked.set()
        return out


def _bus_config() -> BusConfig:
    # The plain stream is accepted on its first batch with the initial credit: the replication default.
    return BusConfig(cluster_tag="bench-repl", hwm=100_000, initial_credit=ReplicationConfig().credit_bytes)


def _follower(conn: Any, root: str, spec: PartitionSpec, config: ReplicationConfig) -> None:
    role = ReplicationRole("b", Layout.of([spec]), lambda p: DiskStorage(Path(root) / "b"), config)
    plain = PlainStream()
    node = Node("b", _bus_config(), [role, plain])
    conn.send(node.bind().to_json())
    node.start({"a": Endpoints.from_json(conn.recv())})
    while (cmd := conn.recv()) is not None:
        name, args = cmd
        if name == "plain.arm":
            plain.done.clear()
            conn.send(None)
        elif name == "plain.wait":  # blocks without asking the node anything while the stream runs
            if not plain.done.wait(600):
                raise TimeoutError("the plain stream never ended")
            conn.send(plain.last_at)
        elif name == "grants":  # FLOW_CONTROL sent so far (asked between rounds, never during one)
            conn.send(node.status(timeout=60)["counters"].get("flow_control_out", 0))
        else:
            conn.send(node.call(*name.split("."), args, timeout=600))
    node.stop()


def durable_write_seconds(directory: Path, size: int, chunk: int) -> float:
    """Seconds to make ``size`` bytes durable in a new file of ``directory`` with the writer a follower
    writes a received segment with (space reserved up front, ``chunk``-byte appends, writeback started as
    it goes, fdatasync at the end): the transfer's disk part alone, without the network or the protocol."""
    data = b"\x02" * chunk
    storage = DiskStorage(directory)
    t0 = time.monotonic()
    writer = storage.create_in_place("durable-write.bin", size=size)
    for offset in range(0, size, chunk):
        writer.append(data if size - offset >= chunk else data[: size - offset])
    writer.commit()
    seconds = time.monotonic() - t0
    storage.delete("durable-write.bin")
    return seconds


def replication_vs_bus(tmp: Path, n: int, repeats: int) -> dict[str, Any]:
    """Replication of one ``n``-row segment over the bus, and a plain stream of as many bytes."""
    config = ReplicationConfig(store=StoreConfig(flush_rows=1 << 30, flush_bytes=1 << 40))
    alone = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1),))
    role = TimedReplication("a", Layout.of([alone]), lambda p: DiskStorage(tmp / "bus-a"), config)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_follower, args=(child, str(tmp), alone, config), daemon=True)
    proc.start()
    node = Node("a", _bus_config(), [role, PlainStream()])
    try:
        peer = Endpoints.from_json(conn.recv())
        conn.send(node.bind().to_json())
        node.start({"b": peer})
        node.wait_ready(timeout=30)
        step = 1 << 18
        for i in range(0, n, step):
            batch = rows(min(step, n - i), i).combine_chunks().to_batches()[0]
            node.call(
                "replication", "write", {"partition": P, "rows": bytes(encode_batch(batch))}, timeout=600
            )
        node.call("replication", "flush", {"partition": P}, timeout=600)
        # Writing and flushing millions of rows holds the loop longer than the peer timeout: the link may
        # have been reset meanwhile, so time nothing before it is up again.
        node.wait_ready(timeout=30)
        size = role.local[P].store.entries[-1].size
        repl_s, bus_s, disk_s = [], [], []
        grants: dict[str, list[int]] = {"replication": [], "plain": []}

        def granted() -> int:
            conn.send(("grants", {}))
            return int(conn.recv())

        for i in range(repeats):
            if i:
                _unplace_follower(node, conn, alone)
            # A new placement of b: its store starts empty and the leader offers the segment again.
            spec = replace(alone, replicas=(*alone.replicas, Replica(node="b", placement=100 + i)))
            conn.send(("replication.assign", {"spec": spec}))
            conn.recv()
            # Both ends are awaited on events, not polled: a poll every half millisecond took CPU from
            # the nodes being measured (4 to 7 ms a replication round in the leader's main thread; during
            # the plain stream 3 to 4 ms in each process and a local call into the receiving node's loop).
            before = granted()
            role.acked.clear()
            t0 = time.monotonic()
            node.call("replication", "assign", {"spec": spec}, timeout=600)
            if not role.acked.wait(600):
                raise TimeoutError("the segment was never acked")
            repl_s.append(role.acked_at - t0)
            after = granted()
            grants["replication"].append(after - before)
            conn.send(("plain.arm", {}))
            conn.recv()
            t0 = time.monotonic()
            args = {"peer": "b", "total": size, "chunk": config.chunk_bytes, "credit": config.credit_bytes}
            node.call("plain", "send", args, timeout=600)
            conn.send(("plain.wait", {}))
            bus_s.append(conn.recv() - t0)
            grants["plain"].append(granted() - after)
            disk_s.append(durable_write_seconds(tmp, size, config.chunk_bytes))
        reads = [node.call("replication", "read", {"partition": P}, timeout=600)]
        conn.send(("replication.read", {"partition": P}))
        reads.append(conn.recv())
        repl, bus, disk = statistics.median(repl_s), statistics.median(bus_s), statistics.median(disk_s)
        return {
            "segment_bytes": size,
            "segment_rows": n,
            "chunk_bytes": config.chunk_bytes,
            "credit_bytes": config.credit_bytes,
            "replication_mb_per_s": size / repl / 1e6,
            "bus_stream_mb_per_s": size / bus / 1e6,
            "ratio": bus / repl,
            "durable_write_mb_per_s": size / disk / 1e6,
            "durable_write_vs_bus_ratio": bus / disk,
            "replication_vs_durable_write_ratio": disk / repl,
            "identical": reads[0] == reads[1],
            "replication_s": repl_s,
            "bus_s": bus_s,
            "durable_write_s": disk_s,
            # The receiver's credit grants per segment-sized transfer (medians): with 4 MiB of credit and
            # 1 MiB chunks, one per three chunks, not one per chunk.
            "grants_per_transfer": {k: statistics.median(v) for k, v in grants.items()},
        }
    finally:
        conn.send(None)
        proc.join(30)
        node.stop()


def _unplace_follower(node: Node, conn: Any, alone: PartitionSpec) -> None:
    """Take the follower off the partition and wait until its drain has ended and its files are gone
    (untimed). A replica re-placed where it stands carries its rows over into the new placement, which
    then pushes them to the leader: the next round would time that merge, not a segment offered to an
    empty store."""
    node.call("replication", "assign", {"spec": alone}, timeout=600)
    conn.send(("replication.assign", {"spec": alone}))
    conn.recv()
    deadline = time.monotonic() + 120
    while True:
        conn.send(("replication.status", {}))
        status = conn.recv()
        if P not in status["partitions"] and P not in status["draining"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the follower never finished draining {P}: {status['draining']}")
        time.sleep(0.01)


def size_chunks(vs_bus: dict[str, Any]) -> int:
    return -(-int(vs_bus["segment_bytes"]) // int(vs_bus["chunk_bytes"]))


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    big = 100_000 if args.quick else 1_000_000
    repeats = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="repl-bench-") as d:
        tmp = Path(d)
        # A fast-forward is one manifest write now (a few ms, as noisy as the disk): medians of more rounds.
        small_s = fast_forward_seconds(tmp, 1_000, 3 * repeats)
        big_s = fast_forward_seconds(tmp, big, 3 * repeats)
        merge = merge_rate(tmp, big)
        total = 200_000 if args.quick else 1_000_000
        w1, _, same1 = replicated_run(tmp, 1, total, 10_000, 1 << 20)
        w2, mbps, same2 = replicated_run(tmp, 2, total, 10_000, 1 << 20)
        vs_bus = replication_vs_bus(tmp, 1_000_000 if args.quick else 8_000_000, repeats)
    figures = {
        "fast_forward_size_ratio": big_s / small_s,
        "fast_forward_seconds": {"1k_rows": small_s, f"{big}_rows": big_s},
        "merge_rows_per_s": merge,
        "write_rows_per_s": {"rf1": w1, "rf2": w2},
        "replication_mb_per_s": mbps,
        "replication_vs_bus_ratio": vs_bus["ratio"],
        "durable_write_vs_bus_ratio": vs_bus["durable_write_vs_bus_ratio"],
        "replication_vs_durable_write_ratio": vs_bus["replication_vs_durable_write_ratio"],
        "replication_vs_bus": vs_bus,
        "replicas_identical": same1 and same2 and vs_bus["identical"],
    }
    write(args.out, "replication", figures, args.quick)
    seg_mb = vs_bus["segment_bytes"] / 1e6
    print(
        table(
            [
                ("fast_forward_size_ratio", f"{figures['fast_forward_size_ratio']:.2f}", "goal <= 2"),
                ("merge_rows_per_s", f"{merge:,.0f}", ""),
                ("write_rows_per_s rf1", f"{w1:,.0f}", "10k-row writes, fsync each"),
                ("write_rows_per_s rf2", f"{w2:,.0f}", "in-process pump"),
                ("replication_mb_per_s", f"{mbps:.1f}", "in-process pump, no bus"),
                (
                    "replication_vs_bus_ratio",
                    f"{vs_bus['ratio']:.2f}",
                    f"goal >= 0.5; {seg_mb:.0f} MB segment: {vs_bus['replication_mb_per_s']:.0f} MB/s "
                    f"replicated, {vs_bus['bus_stream_mb_per_s']:.0f} MB/s plain stream",
                ),
                (
                    "durable_write_vs_bus_ratio",
                    f"{vs_bus['durable_write_vs_bus_ratio']:.2f}",
                    f"about the best the ratio above can be here: {seg_mb:.0f} MB made durable at "
                    f"{vs_bus['durable_write_mb_per_s']:.0f} MB/s",
                ),
                (
                    "replication_vs_durable_write_ratio",
                    f"{vs_bus['replication_vs_durable_write_ratio']:.2f}",
                    "the disk's time alone over the replication's (1: as fast as the disk)",
                ),
                (
                    "credit grants per transfer",
                    f"{vs_bus['grants_per_transfer']['replication']:.0f} / "
                    f"{vs_bus['grants_per_transfer']['plain']:.0f}",
                    f"replication / plain stream, {size_chunks(vs_bus)} chunks each",
                ),
                ("replicas_identical", str(figures["replicas_identical"]), ""),
            ],
            ("figure", "value", "note"),
        )
    )


if __name__ == "__main__":
    main()
