"""BinX against Presto's HTTP exchange, shaped like RFC-0009's micro-benchmark.

Each cell: ``parallel`` exchanges each pull one buffer of ``chunks`` chunks of ``chunk`` bytes, one chunk
per data request (BinX ``maxSizeOctets`` 1, HTTP ``X-Presto-Max-Size: 1B``), then DELETE it. Both servers
run in their own processes over identical ``OutputBuffers``; the clients run in this process, one thread
per exchange (pyzmq and http.client release the GIL while waiting).

* BinX: the real ``BinxServer`` and ``BinxClient`` roles, their PDUs encoded by ``EnvelopeCodec``, carried
  over a plain pyzmq ROUTER (server) / DEALER (one per exchange) pair, because the bus node loop is not
  used here (see ``"binx_transport"`` in the JSON). Both loops wait for input as a node's loop does:
  after a turn, they poll for up to ``BusConfig.idle_spin`` before sleeping, while that pays
  (``binx_idle_spin_s`` in the JSON; ``Idle``).
* HTTP: ``HttpExchangeServer`` (ThreadingHTTPServer, keep-alive) and ``HttpExchangeClient``.

Every process of the matrix (both servers, the clients) has the allocator settings a bus node gives its
process (``sparkbus.bus.allocator``), as both exchanges have inside a node (its driver serves and fetches
HTTP); ``--allocator default`` leaves glibc's defaults everywhere.

Figures: the full matrix (MB/s for both, ratio binx/http), ``binx_vs_http_small_min_ratio`` (worst ratio
over chunks <= 256 KiB) and ``binx_vs_http_large_min_ratio`` (chunks >= 1 MiB), and a heatmap of the ratio
like the RFC's (chunk size by parallel exchanges) in a PNG next to the JSON (``--out x.json`` -> ``x.png``;
matplotlib comes with the ``spark`` extra). Cells whose total would
exceed ``--max-cell-bytes`` use fewer chunks per buffer (recorded per cell).

Then the exchanges inside a query: three real bus nodes in this process on 127.0.0.1 (initiator ``i``,
participants ``p1`` and ``p2`` holding 200k rows of ``t`` between them; each runs the query role,
``binx.server``, ``binx.client`` and ``http.client``) run the same queries (filter, group-by, top-k, a wide
SELECT) with ``push``, ``binx`` and ``http``, interleaved (the order rotates every run) after a few warm-up
runs. Figures: ``query_p50_ms`` (query -> exchange -> p50 of the wall time of ``Query.run`` on the
initiator), ``query_results_match`` (every run's result equals push's once both are sorted) and the run
counts.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, parser, table, write

from sparkbus.bus import BusConfig, allocator
from sparkbus.bus.contract import LocalCall, MessageReceived, PeerUp, Reply, Send
from sparkbus.bus.http_exchange import HttpExchangeServer
from sparkbus.bus.http_fetch import HttpExchangeClient
from sparkbus.bus.node import Node
from sparkbus.codecs import EnvelopeCodec, Limits
from sparkbus.roles.exchange import BinxClient, BinxServer, HttpClient, OutputBuffers
from sparkbus.roles.query import QueryRole
from sparkbus.roles.query.api import Query, load

KiB, MiB = 1024, 1024 * 1024
LIMITS = Limits(max_frame_bytes=64 * MiB, max_message_bytes=128 * MiB)
COPY_BELOW = 64 * KiB  # as the bus node: frames below this are copied, larger ones sent without a copy


def receive(sock: zmq.Socket[Any], flags: int = 0, *, routed: bool = False) -> list[Any]:
    """One whole message, as the bus node's ROUTER receives a control message (``bus/node.py``
    ``_drain_control``): frame by frame as ``zmq.Frame``s, whose ``more`` ends the message; a frame after
    the envelope's header and body (a blob: a BinX reply's pages) of at least 64 KiB is kept as a
    memoryview on ZeroMQ's buffer, every other frame copied out (below 64 KiB a copy costs less than the
    view). ``routed``: the message starts with a routing id (a ROUTER), which is not the envelope's."""
    frame = sock.recv(flags, copy=False)
    parts: list[Any] = [frame.bytes]
    first_blob = 3 if routed else 2
    while frame.more:
        frame = sock.recv(flags, copy=False)
        parts.append(frame.buffer if len(frame) >= COPY_BELOW and len(parts) >= first_blob else frame.bytes)
    return parts


class Idle:
    """How a node's loop waits for input (``bus/node.py``, ``BusConfig.idle_spin``): after a turn that
    served input it polls without sleeping for up to ``spin`` seconds, yielding the CPU between polls,
    once two waits in a row were that short; then it sleeps. (These loops have no timers to keep.)"""

    def __init__(self, spin: float | None = None) -> None:
        self.spin = BusConfig().idle_spin if spin is None else spin
        self.short_waits = 2

    def wait(self, sock: zmq.Socket[Any]) -> Callable[[], None]:
        """Spin if it pays; the returned function, called once the input is in, learns from the wait."""
        start = time.monotonic()
        if self.spin and self.short_waits >= 2:
            until = start + self.spin
            while not sock.poll(0) and time.monotonic() < until:
                os.sched_yield()

        def waited() -> None:
            self.short_waits = self.short_waits + 1 if time.monotonic() - start <= self.spin else 0

        return waited


def drain(sock: zmq.Socket[Any], idle: Idle, most: int = 256, *, routed: bool = False) -> list[list[Any]]:
    """The next message (waiting for it as the node waits: ``idle``), then every one already queued, up
    to ``most``."""
    waited = idle.wait(sock)
    batch = [receive(sock, routed=routed)]
    waited()
    # ZMQ_EVENTS costs about half a refused NOBLOCK receive (no exception).
    while len(batch) < most and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
        batch.append(receive(sock, zmq.NOBLOCK, routed=routed))
    return batch


def transmit(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """Send one message frame by frame, as the bus node does (``send_multipart`` type-checks each frame)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, zmq.SNDMORE if i < last else 0, copy=len(frame) < COPY_BELOW, track=False)


def cell_plan(
    sizes: list[int], parallel: list[int], chunks: int, max_cell_bytes: int
) -> list[dict[str, int]]:
    plan = []
    for size in sizes:
        for par in parallel:
            n = max(4, min(chunks, max_cell_bytes // (size * par)))
            plan.append({"chunk": size, "parallel": par, "chunks": n})
    return plan


def task_ids(cell: dict[str, int], rep: int) -> list[str]:
    return [f"c{cell['chunk']}-p{cell['parallel']}-r{rep}-{i}" for i in range(cell["parallel"])]


def fill(plan: list[dict[str, int]], repeat: int) -> OutputBuffers:
    bufs = OutputBuffers(instance_id="bench", max_buffer_bytes=1 << 50, max_total_bytes=1 << 60)
    payload = {c["chunk"]: random.Random(c["chunk"]).randbytes(c["chunk"]) for c in plan}
    for c in plan:
        for task in (t for rep in range(repeat) for t in task_ids(c, rep)):
            bufs.create(task, 0)
            bufs.add_pages(task, 0, [payload[c["chunk"]]] * c["chunks"])  # one object, shared: no copies
            bufs.no_more_pages(task, 0)
    return bufs


def binx_server_main(plan: list[dict[str, int]], repeat: int, port_q: Any, tune: bool) -> None:
    if tune:
        allocator.tune()
    server = BinxServer(fill(plan, repeat), max_wait=0.0)
    codec = EnvelopeCodec(limits=LIMITS)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    port_q.put(port)
    idle = Idle()
    while True:
        # As the bus node's loop: read what has arrived, handle it, then send everything the turn produced.
        batch = drain(sock, idle, routed=True)
        if any(frames[1] == b"STOP" for frames in batch):
            break
        out: list[list[Any]] = []
        now = time.monotonic()
        for ident, *frames in batch:
            msg = codec.decode(frames).message
            for action in server.handle(MessageReceived(peer=ident.hex(), message=msg), now):
                if isinstance(action, Send):
                    out.append([ident, *codec.encode(action.message)])
        for frames in out:
            transmit(sock, frames)
    sock.close()
    ctx.term()


def http_server_main(plan: list[dict[str, int]], repeat: int, port_q: Any, stop: Any, tune: bool) -> None:
    if tune:
        allocator.tune()
    server = HttpExchangeServer(fill(plan, repeat), host="127.0.0.1", port=0, max_wait=0.0).start()
    port_q.put(server.port)
    stop.wait()
    server.close()


class BinxDriver:
    """The client node's side of BinX: one ``BinxClient`` role over one DEALER, driven by one loop.

    This is how a node runs the role (one loop thread, one connection per peer, every exchange source
    multiplexed over it), minus the bus: the loop hands the role its replies and fetch calls directly and
    sends its requests. Each source keeps one DATA request outstanding (RFC-0009); the sources of a cell
    are pipelined over the one connection, which is BinX's point against HTTP/1.1.
    """

    def __init__(self, ctx: zmq.Context[Any], port: int) -> None:
        self.codec = EnvelopeCodec(limits=LIMITS)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 30_000)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.client = BinxClient(rng=random.Random(0), max_request_bytes=1, max_wait=0.0)
        self._handle(PeerUp(peer="srv"))
        self._calls = 0
        self._replies: dict[int, Reply] = {}
        self._out: list[list[Any]] = []
        self.idle = Idle()

    def _handle(self, event: Any) -> None:
        for a in self.client.handle(event, 0.0):
            if isinstance(a, Send):
                self._out.append(self.codec.encode(a.message))
            elif isinstance(a, Reply):
                self._replies[a.call_id] = a

    def _flush(self) -> None:
        for frames in self._out:
            transmit(self.sock, frames)
        self._out.clear()

    def _call(self, name: str, task: str) -> int:
        self._calls += 1
        args = {"peer": "srv", "task_id": task, "buffer_id": 0}
        self._handle(LocalCall(call_id=self._calls, name=name, args=args))
        return self._calls

    def _receive(self) -> None:
        """One loop turn: send what is pending, then handle every reply that has arrived."""
        self._flush()
        for frames in drain(self.sock, self.idle):
            # Blobs as received, as the node's core decodes control messages (a large one stays a view).
            msg = self.codec.decode(frames, copy_blobs=False).message
            self._handle(MessageReceived(peer="srv", message=msg))

    def warm_up(self) -> None:
        """One DELETE round trip, so that the connection exists before anything is timed."""
        call = self._call("close", "warm-up")
        while call not in self._replies:
            self._receive()
        del self._replies[call]

    def pull(self, tasks: list[str]) -> int:
        """Fetch every page of ``tasks`` at once; return the bytes received once every DELETE is answered."""
        calls = {self._call("fetch", t): t for t in tasks}
        got = 0
        while calls:
            if not any(c in self._replies for c in calls):
                self._receive()
                continue
            for call in [c for c in calls if c in self._replies]:
                task = calls.pop(call)
                reply = self._replies.pop(call)
                if reply.error:
                    raise RuntimeError(reply.error)
                got += sum(len(p) for p in reply.result["pages"])
                if not reply.result["complete"]:
                    calls[self._call("fetch", task)] = task
        while any(self.client.source("srv", t, 0) is not None for t in tasks):
            self._receive()  # the DELETE acknowledgements
        return got

    def close(self) -> None:
        self.sock.close()


def http_exchange(client: HttpExchangeClient, task: str, start: threading.Barrier, out: list[int]) -> None:
    start.wait()
    out.append(sum(len(p) for p in client.fetch_all(task, 0, max_bytes=1, max_wait=0.0)))


def run_cell(
    kind: str, cell: dict[str, int], rep: int, binx: BinxDriver, http: list[HttpExchangeClient]
) -> float:
    """Seconds to pull the cell's buffers, connections already open (both protocols keep theirs)."""
    tasks = task_ids(cell, rep)
    out: list[int] = []
    if kind == "binx":
        t0 = time.perf_counter()
        out.append(binx.pull(tasks))
        elapsed = time.perf_counter() - t0
    else:
        # HTTP/1.1 has no multiplexing: one keep-alive connection (and one blocking thread) per exchange,
        # as a connection pool gives; the threads start together behind a barrier.
        start = threading.Barrier(len(tasks) + 1)
        threads = [
            threading.Thread(target=http_exchange, args=(http[i], t, start, out)) for i, t in enumerate(tasks)
        ]
        for th in threads:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in threads:
            th.join(600)
        elapsed = time.perf_counter() - t0
    expected = cell["chunk"] * cell["chunks"] * cell["parallel"]
    if sum(out) != expected:
        raise RuntimeError(f"{kind} {cell}: got {sum(out)} bytes, expected {expected}")
    return elapsed


def heatmap(matrix: list[dict[str, Any]], path: Path, quick: bool) -> Path | None:
    """The binx/http time ratio per (chunk size, parallel exchanges), annotated, as RFC-0009's figure, and
    beside it the CPU-per-request ratio (steadier than wall time on a shared machine)."""
    try:
        import matplotlib  # noqa: PLC0415 (optional: only the figure needs it)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed (pip install 'sparkbus[spark]'): no heatmap written")
        return None
    sizes = sorted({m["chunk"] for m in matrix})
    pars = sorted({m["parallel"] for m in matrix})
    panels = (
        ("ratio", "BinX speed-up over HTTP (time ratio)", "http time / binx time"),
        ("cpu_ratio", "CPU per request, HTTP / BinX", "http CPU / binx CPU"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(2 * (1.2 * len(pars) + 2.5), 0.55 * len(sizes) + 1.6))
    for ax, (key, title, label) in zip(axes, panels, strict=True):
        ratio = {(m["chunk"], m["parallel"]): m[key] or float("nan") for m in matrix}
        grid = [[ratio.get((s, p), float("nan")) for p in pars] for s in sizes]
        top = max(2.0, *(v for v in ratio.values() if not math.isnan(v)))
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=top, aspect="auto", origin="lower")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(pars)), [str(p) for p in pars])
        ax.set_yticks(range(len(sizes)), [_size(s) for s in sizes])
        ax.set_xlabel("parallel exchanges")
        ax.set_ylabel("chunk size")
        ax.set_title(title + (" [quick]" if quick else ""))
        fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _size(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------- the exchanges inside a query

QUERY_NODES = ("i", "p1", "p2")
QUERY_EXCHANGES = ("push", "binx", "http")
QUERY_ROWS = 200_000
#: name -> SQL; the shapes of the table in QUERY.md (Exchanges).
NODE_QUERIES: dict[str, str] = {
    "filter": "SELECT x, y FROM t WHERE x % 1000 = 3",
    "group_by": "SELECT k, count(*) AS n, sum(x) AS s, max(y) AS m FROM t GROUP BY k",
    "top_k": "SELECT x, k FROM t ORDER BY x DESC LIMIT 20",
    "wide_select": "SELECT x FROM t",
}


def query_table(rows: int) -> pa.Table:
    """``t``: ``k`` (a, b, c, null in turn), ``x`` (0 .. rows - 1), ``y`` (x / 2)."""
    idx = pa.array(range(rows), pa.int64())
    keys = pa.array(["a", "b", "c", None])
    return pa.table(
        {
            "k": pc.take(keys, pc.bit_wise_and(idx, 3)),
            "x": idx,
            "y": pc.multiply(pc.cast(idx, pa.float64()), 0.5),
        }
    )


def canonical(result: pa.Table) -> pa.Table:
    """The rows sorted on every column, so results that differ only in row order compare equal."""
    return result.sort_by([(name, "ascending") for name in result.column_names]).combine_chunks()


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        return False
    ca, cb = canonical(a), canonical(b)
    # Table.equals also compares schema details (field nullability); fall back to the values themselves.
    return ca.equals(cb) or ca.to_pylist() == cb.to_pylist()


def query_exchanges(quick: bool) -> dict[str, Any]:
    """Start three nodes in this process, run every query of ``NODE_QUERIES`` with each exchange, stop them."""
    warm_up, runs = (3, 15) if quick else (3, 30)
    config = BusConfig(cluster_tag="bench-exchange", heartbeat_interval=1.0, peer_timeout=15.0)
    nodes = {
        n: Node(
            n,
            config,
            [
                QueryRole(n),
                BinxServer(OutputBuffers(instance_id=n)),
                BinxClient(rng=random.Random(n)),
                HttpClient(rng=random.Random(f"http/{n}")),
            ],
        )
        for n in QUERY_NODES
    }
    times: dict[str, dict[str, list[float]]] = {q: {x: [] for x in QUERY_EXCHANGES} for q in NODE_QUERIES}
    mismatches: list[str] = []
    try:
        endpoints = {n: node.bind() for n, node in nodes.items()}
        for n, node in nodes.items():
            node.start({k: v for k, v in endpoints.items() if k != n})
        for node in nodes.values():
            node.wait_ready(30)
        data = query_table(QUERY_ROWS)
        half = QUERY_ROWS // 2
        load(nodes["p1"], "t", data.slice(0, half))
        load(nodes["p2"], "t", data.slice(half))
        for name, text in NODE_QUERIES.items():
            queries = {
                x: Query(sql=text, participants=QUERY_NODES, exchange=x, timeout=20.0)
                for x in QUERY_EXCHANGES
            }
            expected = queries["push"].run(nodes["i"])
            for rep in range(warm_up + runs):
                shift = rep % len(QUERY_EXCHANGES)  # push, binx, http; binx, http, push; http, push, binx
                for x in QUERY_EXCHANGES[shift:] + QUERY_EXCHANGES[:shift]:
                    t0 = time.perf_counter()
                    got = queries[x].run(nodes["i"])
                    elapsed = time.perf_counter() - t0
                    if rep >= warm_up:
                        times[name][x].append(elapsed)
                    if not same_rows(got, expected):
                        mismatches.append(f"{name}/{x}/run {rep}")
    finally:
        for node in nodes.values():
            node.stop()
    return {
        "query_transport": (
            "three bus nodes in this process on 127.0.0.1 (initiator i, participants p1 and p2 with "
            f"{QUERY_ROWS // 2} rows of t each), each running query, binx.server, binx.client and http.client; "
            "wall time of Query.run on the initiator"
        ),
        "query_rows": QUERY_ROWS,
        "query_sql": dict(NODE_QUERIES),
        "query_warm_up_runs": warm_up,
        "query_runs": runs,
        "query_p50_ms": {
            q: {x: statistics.median(ts) * 1e3 for x, ts in by_x.items()} for q, by_x in times.items()
        },
        "query_results_match": not mismatches,
        "query_mismatches": mismatches[:20],
    }


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--max-cell-bytes", type=int, default=1 << 30, help="cap on bytes moved per cell")
    p.add_argument("--repeat", type=int, default=None, help="runs per cell (median kept); 5 quick, 1 full")
    p.add_argument(
        "--allocator",
        choices=("node", "default"),
        default="node",
        help="the allocator settings of a bus node in every process (default), or glibc's defaults",
    )
    args = p.parse_args()
    tune = args.allocator == "node"
    if tune:
        allocator.tune()
    repeat = args.repeat or (5 if args.quick else 1)
    if args.quick:
        sizes, parallel, chunks, cap = [32, 256 * KiB, 1 * MiB], [1, 4], 128, 64 * MiB
    else:
        sizes = [32, 1 * KiB, 32 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB]
        parallel, chunks, cap = [1, 4, 16], 128, args.max_cell_bytes
    plan = cell_plan(sizes, parallel, chunks, cap)
    mpctx = mp.get_context("spawn")
    port_q: Any = mpctx.Queue()
    stop = mpctx.Event()
    binx_proc = mpctx.Process(target=binx_server_main, args=(plan, repeat, port_q, tune), daemon=True)
    http_proc = mpctx.Process(target=http_server_main, args=(plan, repeat, port_q, stop, tune), daemon=True)
    binx_proc.start()
    binx_port = port_q.get(timeout=120)
    http_proc.start()
    http_port = port_q.get(timeout=120)
    ctx: zmq.Context[Any] = zmq.Context()
    matrix = []
    binx = BinxDriver(ctx, binx_port)
    http = [HttpExchangeClient("127.0.0.1", http_port, timeout=30.0) for _ in range(max(parallel))]
    try:
        binx.warm_up()
        for i, client in enumerate(http):
            client.delete(f"warm-up-{i}", 0)  # opens the keep-alive connection
        for cell in plan:
            total = cell["chunk"] * cell["chunks"] * cell["parallel"]
            runs: dict[str, list[float]] = {"binx": [], "http": []}
            cpu = {"binx": 0.0, "http": 0.0}
            for rep in range(repeat):
                for kind in ("binx", "http") if rep % 2 == 0 else ("http", "binx"):
                    pid = (binx_proc if kind == "binx" else http_proc).pid
                    before = time.process_time() + cpu_seconds(pid)
                    runs[kind].append(run_cell(kind, cell, rep, binx, http))
                    cpu[kind] += time.process_time() + cpu_seconds(pid) - before
            binx_s, http_s = statistics.median(runs["binx"]), statistics.median(runs["http"])
            requests = cell["chunks"] * cell["parallel"] * repeat
            matrix.append(
                {
                    **cell,
                    "repeat": repeat,
                    "bytes": total,
                    "binx_s": binx_s,
                    "http_s": http_s,
                    "binx_mb_s": total / binx_s / 1e6,
                    "http_mb_s": total / http_s / 1e6,
                    "binx_req_s": cell["chunks"] * cell["parallel"] / binx_s,
                    "http_req_s": cell["chunks"] * cell["parallel"] / http_s,
                    "ratio": http_s / binx_s,
                    # CPU (client and server process, every thread) per data request: on a shared machine
                    # wall time also measures who got the cores; this does not.
                    "binx_cpu_us_per_req": cpu["binx"] / requests * 1e6,
                    "http_cpu_us_per_req": cpu["http"] / requests * 1e6,
                    "cpu_ratio": cpu["http"] / cpu["binx"] if cpu["binx"] > 0 else None,
                }
            )
    finally:
        binx.close()
        for client in http:
            client.close()
        stop.set()
        stopper = ctx.socket(zmq.DEALER)
        stopper.setsockopt(zmq.LINGER, 1000)
        stopper.connect(f"tcp://127.0.0.1:{binx_port}")
        stopper.send(b"STOP")
        binx_proc.join(30)
        http_proc.join(30)
        stopper.close()
        ctx.term()
    small = [m["ratio"] for m in matrix if m["chunk"] <= 256 * KiB]
    large = [m["ratio"] for m in matrix if m["chunk"] >= 1 * MiB]
    small_cpu = [m["cpu_ratio"] for m in matrix if m["chunk"] <= 256 * KiB and m["cpu_ratio"]]
    large_cpu = [m["cpu_ratio"] for m in matrix if m["chunk"] >= 1 * MiB and m["cpu_ratio"]]
    figures = {
        "binx_transport": (
            "pyzmq DEALER/ROUTER carrying EnvelopeCodec-encoded BinX PDUs (not the bus node loop); "
            "client: one loop, one connection, every exchange multiplexed; both loops wait for input as "
            "a node's loop does"
        ),
        "binx_idle_spin_s": Idle().spin,
        "http_transport": (
            "http.server.ThreadingHTTPServer (HTTP/1.1 keep-alive, TCP_NODELAY both sides) and http.client; "
            "one connection and one thread per exchange"
        ),
        "allocator": allocator.state(),
        "connections_opened_before_timing": True,
        "one_chunk_per_request": True,
        "matrix": matrix,
        "binx_vs_http_small_min_ratio": min(small) if small else None,
        "binx_vs_http_large_min_ratio": min(large) if large else None,
        "binx_vs_http_small_min_cpu_ratio": min(small_cpu) if small_cpu else None,
        "binx_vs_http_large_min_cpu_ratio": min(large_cpu) if large_cpu else None,
        # After the server processes above have stopped, so the nodes have the cores to themselves.
        **query_exchanges(args.quick),
    }
    png = heatmap(matrix, args.out.with_suffix(".png"), args.quick)
    figures["heatmap"] = png.name if png is not None else None
    write(args.out, "exchange", figures, args.quick)
    rows = [
        (
            str(m["chunk"]),
            str(m["parallel"]),
            str(m["chunks"]),
            f"{m['binx_mb_s']:.1f}",
            f"{m['http_mb_s']:.1f}",
            f"{m['binx_req_s']:.0f}",
            f"{m['http_req_s']:.0f}",
            f"{m['binx_cpu_us_per_req']:.0f}",
            f"{m['http_cpu_us_per_req']:.0f}",
            f"{m['ratio']:.2f}",
            f"{m['cpu_ratio'] or 0:.2f}",
        )
        for m in matrix
    ]
    header = ("chunk B", "parallel", "chunks", "binx MB/s", "http MB/s", "binx req/s", "http req/s")
    print(table(rows, (*header, "binx cpu us/req", "http cpu us/req", "ratio", "cpu ratio")))
    print(
        f"min ratio: small {figures['binx_vs_http_small_min_ratio']:.2f}, "
        f"large {figures['binx_vs_http_large_min_ratio']:.2f}; min cpu ratio: small "
        f"{figures['binx_vs_http_small_min_cpu_ratio'] or 0:.2f}, "
        f"large {figures['binx_vs_http_large_min_cpu_ratio'] or 0:.2f}"
    )
    p50 = figures["query_p50_ms"]
    q_rows = [(q, *(f"{p50[q][x]:.2f}" for x in QUERY_EXCHANGES)) for q in p50]
    print()
    print(table(q_rows, ("query", *(f"{x} p50 ms" for x in QUERY_EXCHANGES))))
    print(
        f"{figures['query_runs']} runs per exchange after {figures['query_warm_up_runs']} warm-up runs; "
        f"results match push's: {figures['query_results_match']}"
        + ("" if figures["query_results_match"] else f" (not: {', '.join(figures['query_mismatches'])})")
    )


if __name__ == "__main__":
    main()
