"""The bus against the raw pyzmq sockets under it, measured in the same run.

Sender and receiver run in two processes on 127.0.0.1, for the bus and for the raw baseline alike. Every
figure is measured in rounds (3 with ``--quick``, 7 in the full run). A round spawns a fresh process pair
per side, connects and warms both up, and only then times each figure on the two sides back to back, bus
first in even rounds and raw first in odd ones, so that a change of load on the machine falls on both.
Spawning and connecting are in no figure. Pairs are not kept across rounds: a pair keeps whatever luck
it had (which cores its threads share, where its memory lies) for as long as it lives, and two pairs
running the same code, alternated for 16 rounds, differed by 5 % in round trip and 9 % in CPU time. A
throughput figure is the median of each side's rounds, and its ratio the ratio of those medians; the
JSON also keeps every round's value and ratio (``*_rounds``) and the load average before and after. The
figures:

* stream throughput: a credit stream (batches of 1 MiB and 64 KiB, 8 MiB of credit) against raw
  PUSH/PULL of the same sizes, zero-copy above 64 KiB, timed at the receiver from first to last batch;
* control rate: 100-byte control messages per second, against raw DEALER -> ROUTER, timed the same way;
* round trip: a control ping answered by the peer, against raw DEALER/ROUTER echo; the p50 of each side
  is taken over the pings of all its rounds (the first tenth of each round left out), and the JSON keeps
  each round's p50 too. The echo answers on the connection the ping came in on (the peer's ROUTER
  sends); a node answers on a second one, as the bus is wired: each node sends control through its own
  DEALER to the other's ROUTER. So the raw side also times that wiring, a raw DEALER to the peer's
  ROUTER and the peer's DEALER back to ours (``rtt_p50_raw_bus_wiring_us``,
  ``rtt_p50_ratio_bus_wiring``); ``rtt_p50_ratio`` stays over the echo. A node polls for a while
  before it sleeps (``BusConfig.idle_spin``), which raw pyzmq's blocking receive does not: a second pair
  of nodes with ``idle_spin=0`` times the round trip without it (``rtt_p50_bus_no_spin_us``,
  ``rtt_p50_ratio_no_spin``), and each side's CPU per round trip, both processes and all their threads,
  is kept (``rtt_cpu_us_bus``, ``rtt_cpu_us_bus_no_spin``, ``rtt_cpu_us_raw``);
* peer loss: SIGKILL of a peer process to the ``PeerLost`` event, default settings (1 kill with
  ``--quick``, the median of 3 otherwise; a fresh pair each time, since the peer dies).

A node sets glibc's allocator thresholds for its process (``sparkbus.bus.allocator``), which raw pyzmq
does not do, and which spares a receiver page faults on every large message. The raw baseline of the
ratios is pyzmq as it comes. So that what the bus gains from its allocator settings can be told from what
it costs as a protocol, the streams are also measured against a second raw pair whose receiver has the
same settings (``*_raw_tuned_mb_s`` and ``*_ratio_same_allocator``; in the same rounds, the three sides'
order rotating).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from _common import cpu_seconds, parser, table, write

from sparkbus.bus import BusConfig, Reply, allocator
from sparkbus.bus import contract as c
from sparkbus.bus.node import Endpoints, Node
from sparkbus.codecs import MiB, message

CREDIT = 8 * MiB


@message(0x7F01)
@dataclass(frozen=True, kw_only=True)
class Ping:
    n: int
    pad: bytes


@dataclass
class Bench:
    """Sends a stream within credit, or control messages, or pings; records what arrives with ``now``."""

    name: str = "bench"
    messages: ClassVar[tuple[type, ...]] = (Ping,)
    batch: bytes = b""
    to_send: int = 0
    peer: str = ""
    stream: str = ""
    got: int = 0
    first: float = 0.0
    last_at: float = 0.0
    pongs: list[float] = field(default_factory=list)
    waiting: int | None = None
    expect: int = 0
    rtt_left: int = 0

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        # The measured events first, and as little work on them as raw pyzmq's loop does (a timestamp):
        # the figures are the bus's cost, not this role's.
        if type(event) is c.MessageReceived:
            msg = event.message
            if msg.n < 0:  # a ping to answer
                return [c.Send(peer=event.peer, message=Ping(n=-msg.n, pad=msg.pad))]
            if self.rtt_left:
                self.pongs.append(now)
                self.rtt_left -= 1
                if self.rtt_left:
                    return [c.Send(peer=event.peer, message=Ping(n=-1, pad=msg.pad))]
                return self._finish()
            self._count(now)
            return self._done() if self.got >= self.expect else ()
        if type(event) is c.BatchReceived:
            self._count(now)
            out: list[c.Action] = [c.Consumed(peer=event.peer, stream=event.stream, size=event.size)]
            return out + self._done()
        if isinstance(event, c.LocalCall):
            return self._call(event, now)
        if isinstance(event, c.CreditChanged) and event.stream == self.stream:
            return self._pump(event.credit)
        return []

    def _call(self, call: c.LocalCall, now: float) -> list[c.Action]:
        a = call.args
        if call.name == "expect":
            self.got, self.expect, self.waiting = 0, a["count"], call.call_id
            return []
        if call.name == "stream":
            # A stream of its own each time: the one before is closed by its last batch.
            self.peer, self.batch, self.to_send, self.stream = (
                a["peer"],
                b"\x01" * a["size"],
                a["count"],
                a["name"],
            )
            out: list[c.Action] = [c.OpenStream(peer=self.peer, stream=self.stream, credit=a["credit"])]
            return out + self._pump(a["credit"]) + [Reply(call_id=call.call_id)]
        if call.name == "control":
            pad = b"x" * a["size"]
            msgs: list[c.Action] = [
                c.Send(peer=a["peer"], message=Ping(n=i + 1, pad=pad)) for i in range(a["count"])
            ]
            return [*msgs, Reply(call_id=call.call_id)]
        if call.name == "rtt":
            self.pongs, self.rtt_left, self.waiting = [now], a["count"], call.call_id
            return [c.Send(peer=a["peer"], message=Ping(n=-1, pad=b"x" * a["size"]))]
        raise ValueError(call.name)

    def _pump(self, credit: int) -> list[c.Action]:
        out: list[c.Action] = []
        while self.to_send and credit >= len(self.batch):
            credit -= len(self.batch)
            self.to_send -= 1
            out.append(
                c.SendBatch(peer=self.peer, stream=self.stream, data=self.batch, last=self.to_send == 0)
            )
        return out

    def _count(self, now: float) -> None:
        if self.got == 0:
            self.first = now
        self.got += 1
        self.last_at = now

    def _done(self) -> list[c.Action]:
        if self.waiting is not None and self.got >= self.expect:
            return self._finish()
        return []

    def _finish(self) -> list[c.Action]:
        cid, self.waiting = self.waiting, None
        assert cid is not None
        return [
            Reply(
                call_id=cid,
                result={"first": self.first, "last": self.last_at, "got": self.got, "pongs": self.pongs},
            )
        ]


def _config(idle_spin: float | None = None) -> BusConfig:
    spin = BusConfig().idle_spin if idle_spin is None else idle_spin
    return BusConfig(
        cluster_tag="bench", initial_credit=CREDIT, batch_size=512 * 1024, hwm=100_000, idle_spin=spin
    )


def _rate(count: int, first: float, last: float) -> float:
    """Messages per second from the first to the last of ``count`` (the first one starts the clock)."""
    return (count - 1) / (last - first)


def _after_warmup(times: list[float]) -> list[float]:
    return times[len(times) // 10 :]


# ---------------------------------------------------------------- sparkbus side


def _bus_peer(conn: Any, idle_spin: float | None) -> None:
    node = Node("b", _config(idle_spin), [Bench()])
    conn.send(node.bind().to_json())
    node.start({"a": Endpoints.from_json(conn.recv())})
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        name, args = cmd
        fut = node.call_async("bench", name, args)
        node.status(timeout=60)  # after the call on the loop's queue: the call has been handled
        conn.send("ready")
        conn.send(fut.result(timeout=600))
    node.stop()


class BusPair:
    """Node "a" here, node "b" in a process of its own; the receiving side's role is driven over a pipe.

    ``idle_spin``: both nodes' ``BusConfig.idle_spin`` (None: the default).
    """

    def __init__(self, idle_spin: float | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_bus_peer, args=(child, idle_spin), daemon=True)
        self.proc.start()
        peer_ep = Endpoints.from_json(self.conn.recv())
        self.node = Node("a", _config(idle_spin), [Bench()])
        self.conn.send(self.node.bind().to_json())
        self.node.start({"b": peer_ep})
        self.node.wait_ready(timeout=30)
        self.streams = 0
        self.cpu_per_rtt = 0.0

    def _expect(self, count: int) -> None:
        # The peer counts from the call on: it must be in place before the first message leaves.
        self.conn.send(("expect", {"count": count}))
        assert self.conn.recv() == "ready"

    def stream(self, size: int, count: int) -> float:
        """Bytes per second."""
        self._expect(count)
        self.streams += 1
        args = {"peer": "b", "size": size, "count": count, "credit": CREDIT, "name": f"bench/{self.streams}"}
        self.node.call("bench", "stream", args)
        r = self.conn.recv()
        return size * _rate(count, r["first"], r["last"])

    def control(self, size: int, count: int) -> float:
        """Messages per second."""
        self._expect(count)
        self.node.call("bench", "control", {"peer": "b", "size": size, "count": count}, timeout=600)
        r = self.conn.recv()
        return _rate(count, r["first"], r["last"])

    def rtt(self, size: int, count: int) -> list[float]:
        """Seconds per round trip, the first tenth left out. ``cpu_per_rtt``: both processes' CPU per
        round trip over the whole call (s)."""
        pids = (os.getpid(), self.proc.pid or 0)
        before = sum(map(cpu_seconds, pids))
        r = self.node.call("bench", "rtt", {"peer": "b", "size": size, "count": count}, timeout=600)
        self.cpu_per_rtt = (sum(map(cpu_seconds, pids)) - before) / count
        return _after_warmup([b - a for a, b in itertools.pairwise(r["pongs"])])

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)
        self.node.stop()


# ---------------------------------------------------------------- raw pyzmq side


def _raw_peer(conn: Any, tune: bool) -> None:
    if tune:
        allocator.tune()
    ctx = zmq.Context()
    pull, router, dealer = ctx.socket(zmq.PULL), ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (pull, router, dealer):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SNDHWM, 100_000)
    for sock in (pull, router):
        sock.bind("tcp://127.0.0.1:0")
    conn.send((pull.getsockopt_string(zmq.LAST_ENDPOINT), router.getsockopt_string(zmq.LAST_ENDPOINT)))
    dealer.connect(conn.recv())  # back to the other side's ROUTER, as a node's answers go
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        what, count = cmd
        sock = pull if what == "stream" else router
        conn.send("ready")
        if what == "echo":
            for _ in range(count):
                sock.send_multipart(sock.recv_multipart(copy=False))
            conn.send(None)
            continue
        if what == "forward":
            for _ in range(count):
                dealer.send_multipart(sock.recv_multipart(copy=False)[1:])
            conn.send(None)
            continue
        first = last = 0.0
        for i in range(count):
            sock.recv_multipart(copy=False)
            last = time.monotonic()
            if i == 0:
                first = last
        conn.send((first, last))
    pull.close()
    router.close()
    dealer.close()
    ctx.term()


class RawPair:
    """A PUSH and a DEALER here, connected to a PULL and a ROUTER in a process of its own (with the
    node's allocator settings if ``tune``); and a ROUTER here that the other process's DEALER connects to."""

    def __init__(self, *, tune: bool = False) -> None:
        ctx_mp = mp.get_context("spawn")
        self.conn, child = ctx_mp.Pipe()
        self.proc = ctx_mp.Process(target=_raw_peer, args=(child, tune), daemon=True)
        self.proc.start()
        pull_ep, router_ep = self.conn.recv()
        self.ctx = zmq.Context()
        self.push, self.dealer = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.DEALER)
        self.router = self.ctx.socket(zmq.ROUTER)
        for sock in (self.push, self.dealer, self.router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.RCVTIMEO, 60_000)
        self.push.connect(pull_ep)
        self.dealer.connect(router_ep)
        self.router.bind("tcp://127.0.0.1:0")
        self.conn.send(self.router.getsockopt_string(zmq.LAST_ENDPOINT))
        self.cpu_per_rtt = 0.0

    def _send(self, sock: zmq.Socket[bytes], what: str, size: int, count: int) -> float:
        self.conn.send((what, count))
        assert self.conn.recv() == "ready"
        payload = b"\x01" * size
        copy = size < 64 * 1024
        for _ in range(count):
            sock.send(payload, copy=copy)
        first, last = self.conn.recv()
        return _rate(count, first, last)

    def stream(self, size: int, count: int) -> float:
        return size * self._send(self.push, "stream", size, count)

    def control(self, size: int, count: int) -> float:
        return self._send(self.dealer, "control", size, count)

    def rtt(self, size: int, count: int) -> list[float]:
        """As ``BusPair.rtt``, ``cpu_per_rtt`` included."""
        self.conn.send(("echo", count))
        assert self.conn.recv() == "ready"
        payload, sock = b"x" * size, self.dealer
        times = []
        pids = (os.getpid(), self.proc.pid or 0)
        before = sum(map(cpu_seconds, pids))
        for _ in range(count):
            t0 = time.monotonic()
            sock.send(payload)
            sock.recv()
            times.append(time.monotonic() - t0)
        self.cpu_per_rtt = (sum(map(cpu_seconds, pids)) - before) / count
        assert self.conn.recv() is None
        return _after_warmup(times)

    def rtt_bus_wiring(self, size: int, count: int) -> list[float]:
        """``rtt`` with the answer on a second connection: the peer's DEALER to our ROUTER."""
        self.conn.send(("forward", count))
        assert self.conn.recv() == "ready"
        payload, out, back = b"x" * size, self.dealer, self.router
        times = []
        for _ in range(count):
            t0 = time.monotonic()
            out.send(payload)
            back.recv()  # the peer's routing id
            back.recv()  # the payload: received as rtt's DEALER receives it
            times.append(time.monotonic() - t0)
        assert self.conn.recv() is None
        return _after_warmup(times)

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)
        self.push.close()
        self.dealer.close()
        self.router.close()
        self.ctx.term()


# ---------------------------------------------------------------- peer loss


def _victim(conn: Any) -> None:
    node = Node("v", BusConfig(cluster_tag="bench"), [Bench()])
    conn.send(node.bind().to_json())
    node.start({"w": Endpoints.from_json(conn.recv())})
    conn.recv()


@dataclass
class Watch:
    name: str = "watch"
    messages: ClassVar[tuple[type, ...]] = ()
    lost: queue.Queue[float] = field(default_factory=queue.Queue)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.PeerLost):
            self.lost.put(time.monotonic())
        return []


def peer_loss_kill_ms() -> float:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_victim, args=(child,), daemon=True)
    proc.start()
    victim_ep = Endpoints.from_json(conn.recv())
    watch = Watch()
    node = Node("w", BusConfig(cluster_tag="bench"), [watch])
    conn.send(node.bind().to_json())
    node.start({"v": victim_ep})
    try:
        node.wait_ready(timeout=30)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        return (watch.lost.get(timeout=30) - t0) * 1000
    finally:
        proc.join(10)
        node.stop()


# ---------------------------------------------------------------- rounds


Pair = BusPair | RawPair
#: What each figure measures on a pair, given its count.
MEASURES: dict[str, Callable[[Pair, int], Any]] = {
    "stream_1mib": lambda pair, n: pair.stream(MiB, n),
    "stream_64kib": lambda pair, n: pair.stream(64 * 1024, n),
    "control": lambda pair, n: pair.control(100, n),
    "rtt": lambda pair, n: pair.rtt(100, n),
    "rtt_bus_wiring": lambda pair, n: pair.rtt_bus_wiring(100, n),  # type: ignore[union-attr]
}


STREAMS = ("stream_1mib", "stream_64kib")
#: Figures of the raw pair only (the bus's own round trip is ``rtt``).
RAW_ONLY = ("rtt_bus_wiring",)


def _round(i: int, counts: dict[str, int]) -> tuple[dict[str, Any], ...]:
    """Round ``i``: a fresh pair per side, warmed up; then each figure on every side back to back (the
    raw pair with the node's allocator settings only for the streams, the nodes that never spin only
    for the round trip). The round trips' CPU per round trip is kept as ``rtt_cpu``."""
    bus, raw, tuned, still = BusPair(), RawPair(), RawPair(tune=True), BusPair(idle_spin=0.0)
    try:
        for pair in (bus, raw, tuned):  # connections, buffers and code paths warm before anything is timed
            pair.stream(MiB, 20)
            pair.stream(64 * 1024, 200)
            if pair is not tuned:  # it times only the streams
                pair.control(100, 2000)
                pair.rtt(100, 200)
        raw.rtt_bus_wiring(100, 200)
        still.rtt(100, 200)
        got: tuple[dict[str, Any], ...] = ({}, {}, {}, {})
        sides: list[tuple[dict[str, Any], BusPair | RawPair]] = [
            (got[0], bus),
            (got[1], raw),
            (got[2], tuned),
            (got[3], still),
        ]
        for figure, measure in MEASURES.items():
            for into, pair in sides[i % 4 :] + sides[: i % 4]:
                if (
                    pair is raw
                    or (pair is bus and figure not in RAW_ONLY)
                    or (pair is tuned and figure in STREAMS)
                    or (pair is still and figure == "rtt")
                ):
                    into[figure] = measure(pair, counts[figure])
                    if figure == "rtt":
                        into["rtt_cpu"] = pair.cpu_per_rtt
        return got
    finally:
        for pair in (bus, raw, tuned, still):
            pair.close()


def _throughput(
    f: dict[str, Any], keys: tuple[str, str, str], b: list[float], r: list[float], scale: float
) -> None:
    """Each side's median (``keys``: bus, raw, ratio), the ratio of the medians, and every round."""
    bus_key, raw_key, ratio_key = keys
    f[bus_key], f[raw_key] = statistics.median(b) / scale, statistics.median(r) / scale
    f[ratio_key] = f[bus_key] / f[raw_key]
    f[f"{bus_key}_rounds"] = [x / scale for x in b]
    f[f"{raw_key}_rounds"] = [x / scale for x in r]
    f[f"{ratio_key}_rounds"] = [x / y for x, y in zip(b, r, strict=True)]


def _p50(f: dict[str, Any], key: str, rounds: list[list[float]], over: tuple[str, str] | None = None) -> None:
    """``f[key]``: the p50 over every round's round trips (us), and each round's (``key_rounds``); none
    given, the ones already in ``f``. ``over`` (ratio, bus key): also that bus figure over this one, in
    all and per round."""
    if rounds:
        f[key] = statistics.median(itertools.chain(*rounds)) * 1e6
        f[f"{key}_rounds"] = [statistics.median(x) * 1e6 for x in rounds]
    if over is not None:
        ratio, bus = over
        f[ratio] = f[bus] / f[key]
        f[f"{ratio}_rounds"] = [x / y for x, y in zip(f[f"{bus}_rounds"], f[f"{key}_rounds"], strict=True)]


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    q = args.quick
    rounds = 3 if q else 7
    counts = dict(
        zip(
            MEASURES,
            (400, 4000, 20_000, 1000, 1000) if q else (2000, 20_000, 60_000, 5000, 5000),
            strict=True,
        )
    )
    f: dict[str, Any] = {"rounds": rounds, "load_average_before": list(os.getloadavg())}
    b: list[dict[str, Any]] = []
    r: list[dict[str, Any]] = []
    t: list[dict[str, Any]] = []
    s: list[dict[str, Any]] = []
    for i in range(rounds):
        bus_round, raw_round, tuned_round, still_round = _round(i, counts)
        b.append(bus_round)
        r.append(raw_round)
        t.append(tuned_round)
        s.append(still_round)
    for figure, keys, scale in (
        ("stream_1mib", ("stream_1mib_bus_mb_s", "stream_1mib_raw_mb_s", "stream_1mib_ratio"), 1e6),
        ("stream_64kib", ("stream_64kib_bus_mb_s", "stream_64kib_raw_mb_s", "stream_64kib_ratio"), 1e6),
        ("control", ("control_bus_msg_s", "control_raw_msg_s", "control_rate_ratio"), 1),
    ):
        _throughput(f, keys, [x[figure] for x in b], [x[figure] for x in r], scale)
    for figure in STREAMS:
        keys = (f"{figure}_bus_mb_s", f"{figure}_raw_tuned_mb_s", f"{figure}_ratio_same_allocator")
        _throughput(f, keys, [x[figure] for x in b], [x[figure] for x in t], 1e6)
    _p50(f, "rtt_p50_bus_us", [x["rtt"] for x in b])
    _p50(f, "rtt_p50_raw_us", [x["rtt"] for x in r], over=("rtt_p50_ratio", "rtt_p50_bus_us"))
    _p50(f, "rtt_p50_bus_no_spin_us", [x["rtt"] for x in s])
    _p50(f, "rtt_p50_raw_us", [], over=("rtt_p50_ratio_no_spin", "rtt_p50_bus_no_spin_us"))
    _p50(
        f,
        "rtt_p50_raw_bus_wiring_us",
        [x["rtt_bus_wiring"] for x in r],
        over=("rtt_p50_ratio_bus_wiring", "rtt_p50_bus_us"),
    )
    for key, sides in (("bus", b), ("raw", r), ("bus_no_spin", s)):
        f[f"rtt_cpu_us_{key}_rounds"] = [x["rtt_cpu"] * 1e6 for x in sides]
        f[f"rtt_cpu_us_{key}"] = statistics.median(f[f"rtt_cpu_us_{key}_rounds"])
    kills = [peer_loss_kill_ms() for _ in range(1 if q else 3)]
    f["peer_loss_kill_ms"] = statistics.median(kills)
    f["peer_loss_kill_ms_runs"] = kills
    f["credit_bytes"] = CREDIT
    f["load_average_after"] = list(os.getloadavg())
    write(args.out, "bus", f, q)
    print(table(_rows(f), ("figure", "sparkbus", "raw pyzmq", "ratio", "goal", "ratio per round")))


def _rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    def row(label: str, bus: str, raw: str, ratio: str, goal: str, digits: int = 0) -> tuple[str, ...]:
        per_round = " ".join(f"{x:.2f}" for x in f[f"{ratio}_rounds"])
        return (label, f"{f[bus]:.{digits}f}", f"{f[raw]:.{digits}f}", f"{f[ratio]:.2f}", goal, per_round)

    return [
        row(
            "stream 1 MiB (MB/s)",
            "stream_1mib_bus_mb_s",
            "stream_1mib_raw_mb_s",
            "stream_1mib_ratio",
            ">= 0.85",
        ),
        row(
            "  raw with the node's allocator",
            "stream_1mib_bus_mb_s",
            "stream_1mib_raw_tuned_mb_s",
            "stream_1mib_ratio_same_allocator",
            "",
        ),
        row(
            "stream 64 KiB (MB/s)",
            "stream_64kib_bus_mb_s",
            "stream_64kib_raw_mb_s",
            "stream_64kib_ratio",
            ">= 0.70",
        ),
        row(
            "  raw with the node's allocator",
            "stream_64kib_bus_mb_s",
            "stream_64kib_raw_tuned_mb_s",
            "stream_64kib_ratio_same_allocator",
            "",
        ),
        row(
            "control 100 B (msg/s)", "control_bus_msg_s", "control_raw_msg_s", "control_rate_ratio", ">= 0.5"
        ),
        row("round trip p50 (us)", "rtt_p50_bus_us", "rtt_p50_raw_us", "rtt_p50_ratio", "<= 1.5"),
        row(
            "  raw answering on a second link",
            "rtt_p50_bus_us",
            "rtt_p50_raw_bus_wiring_us",
            "rtt_p50_ratio_bus_wiring",
            "",
        ),
        row(
            "  the nodes never spinning (idle_spin=0)",
            "rtt_p50_bus_no_spin_us",
            "rtt_p50_raw_us",
            "rtt_p50_ratio_no_spin",
            "",
        ),
        (
            "CPU per round trip, both processes (us)",
            f"{f['rtt_cpu_us_bus']:.0f} (idle_spin=0: {f['rtt_cpu_us_bus_no_spin']:.0f})",
            f"{f['rtt_cpu_us_raw']:.0f}",
            "",
            "",
            "",
        ),
        ("peer loss after SIGKILL (ms)", f"{f['peer_loss_kill_ms']:.1f}", "", "", "<= 1000", ""),
    ]


if __name__ == "__main__":
    main()
