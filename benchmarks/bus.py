"""The bus against the raw pyzmq sockets under it, measured in the same run.

Every figure runs sender and receiver in two processes on 127.0.0.1 (the raw baseline too):

* stream throughput: a credit stream (batches of 1 MiB and 64 KiB, 8 batches of credit) against raw
  PUSH/PULL of the same sizes, zero-copy above 64 KiB, timed at the receiver from first to last batch;
* control rate: 100-byte control messages per second, against raw DEALER -> ROUTER;
* round trip: a control ping answered by the peer, p50, against raw DEALER/ROUTER echo;
* peer loss: SIGKILL of a peer process to the ``PeerLost`` event, default settings.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from _common import parser, table, write

from sparkbus.bus import BusConfig, Reply
from sparkbus.bus import contract as c
from sparkbus.bus.node import Endpoints, Node
from sparkbus.codecs import MiB, message


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
    got: int = 0
    first: float = 0.0
    last_at: float = 0.0
    pongs: list[float] = field(default_factory=list)
    waiting: int | None = None
    expect: int = 0
    rtt_left: int = 0
    pad: bytes = b""
    ctl_left: int = 0
    ctl_sent: int = 0

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
        if isinstance(event, c.TimerFired):
            return self._control_chunk(now)
        if isinstance(event, c.CreditChanged):
            return self._pump(event.credit)
        return []

    def _call(self, call: c.LocalCall, now: float) -> list[c.Action]:
        a = call.args
        if call.name == "expect":
            self.got, self.expect, self.waiting = 0, a["count"], call.call_id
            return []
        if call.name == "stream":
            self.peer, self.batch, self.to_send = a["peer"], b"\x01" * a["size"], a["count"]
            out: list[c.Action] = [c.OpenStream(peer=self.peer, stream="bench/s", credit=a["credit"])]
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

    def _control_chunk(self, now: float) -> list[c.Action]:
        # Bursts go out in chunks with a timer in between, so the loop keeps reading and heartbeating.
        n = min(self.ctl_left, 2000)
        msgs: list[c.Action] = [
            c.Send(peer=self.peer, message=Ping(n=self.ctl_sent + i + 1, pad=self.pad)) for i in range(n)
        ]
        self.ctl_left -= n
        self.ctl_sent += n
        if self.ctl_left:
            msgs.append(c.SetTimer(key="more", at=now))
        return msgs

    def _pump(self, credit: int) -> list[c.Action]:
        out: list[c.Action] = []
        while self.to_send and credit >= len(self.batch):
            credit -= len(self.batch)
            self.to_send -= 1
            out.append(c.SendBatch(peer=self.peer, stream="bench/s", data=self.batch, last=self.to_send == 0))
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


def _config(credit: int) -> BusConfig:
    return BusConfig(
        cluster_tag="bench", initial_credit=credit, batch_size=min(credit, 512 * 1024), hwm=100_000
    )


# ---------------------------------------------------------------- sparkbus side


def _bus_peer(conn: Any, credit: int) -> None:
    node = Node("b", _config(credit), [Bench()])
    conn.send(node.bind().to_json())
    node.start({"a": Endpoints.from_json(conn.recv())})
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        name, args = cmd
        conn.send(node.call("bench", name, args, timeout=600))
    node.stop()


class BusPair:
    def __init__(self, credit: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_bus_peer, args=(child, credit), daemon=True)
        self.proc.start()
        peer_ep = Endpoints.from_json(self.conn.recv())
        self.node = Node("a", _config(credit), [Bench()])
        self.conn.send(self.node.bind().to_json())
        self.node.start({"b": peer_ep})
        self.node.wait_ready(timeout=30)

    def remote(self, name: str, args: dict[str, Any]) -> None:
        self.conn.send((name, args))

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)
        self.node.stop()


def bus_stream(size: int, count: int, credit: int) -> float:
    pair = BusPair(credit)
    try:
        pair.remote("expect", {"count": count})
        pair.node.call("bench", "stream", {"peer": "b", "size": size, "count": count, "credit": credit})
        r = pair.conn.recv()
        return size * (count - 1) / (r["last"] - r["first"])
    finally:
        pair.close()


def bus_control(size: int, count: int) -> float:
    pair = BusPair(MiB)
    try:
        pair.remote("expect", {"count": count})
        pair.node.call("bench", "control", {"peer": "b", "size": size, "count": count}, timeout=600)
        r = pair.conn.recv()
        return (count - 1) / (r["last"] - r["first"])
    finally:
        pair.close()


def bus_rtt(size: int, count: int) -> list[float]:
    pair = BusPair(MiB)
    try:
        r = pair.node.call("bench", "rtt", {"peer": "b", "size": size, "count": count}, timeout=600)
        p = r["pongs"]
        return [b - a for a, b in itertools.pairwise(p)][count // 10 :]
    finally:
        pair.close()


# ---------------------------------------------------------------- raw pyzmq side


def _raw_sink(conn: Any, kind: int, count: int, echo: bool) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.bind("tcp://127.0.0.1:0")
    conn.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    first = last = 0.0
    for i in range(count):
        parts = sock.recv_multipart(copy=False)
        if echo:
            sock.send_multipart(parts)
            continue
        last = time.monotonic()
        if i == 0:
            first = last
    conn.send((first, last))
    sock.close()
    ctx.term()


def raw_run(kind_in: int, kind_out: int, size: int, count: int, *, echo: bool = False) -> Any:
    ctx_mp = mp.get_context("spawn")
    conn, child = ctx_mp.Pipe()
    proc = ctx_mp.Process(target=_raw_sink, args=(child, kind_in, count, echo), daemon=True)
    proc.start()
    endpoint = conn.recv()
    ctx = zmq.Context()
    sock = ctx.socket(kind_out)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    payload = b"\x01" * size
    copy = size < 64 * 1024
    try:
        if echo:
            sock.setsockopt(zmq.RCVTIMEO, 10_000)
            times = []
            for _ in range(count):
                t0 = time.monotonic()
                sock.send(payload, copy=copy)
                sock.recv()
                times.append(time.monotonic() - t0)
            return times[count // 10 :]
        for _ in range(count):
            sock.send(payload, copy=copy)
        first, last = conn.recv()
        return (count - 1) / (last - first)
    finally:
        proc.join(10)
        sock.close()
        ctx.term()


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


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    q = args.quick
    n1m, n64k, nctl, nrtt = (200, 2000, 20_000, 500) if q else (2000, 20_000, 60_000, 5000)
    credit = 8 * MiB
    f: dict[str, Any] = {}
    f["stream_1mib_bus_mb_s"] = bus_stream(MiB, n1m, credit) / 1e6
    f["stream_1mib_raw_mb_s"] = raw_run(zmq.PULL, zmq.PUSH, MiB, n1m) * MiB / 1e6
    f["stream_64kib_bus_mb_s"] = bus_stream(64 * 1024, n64k, credit) / 1e6
    f["stream_64kib_raw_mb_s"] = raw_run(zmq.PULL, zmq.PUSH, 64 * 1024, n64k) * 64 * 1024 / 1e6
    f["control_bus_msg_s"] = bus_control(100, nctl)
    f["control_raw_msg_s"] = raw_run(zmq.ROUTER, zmq.DEALER, 100, nctl)
    bus_rtts = bus_rtt(100, nrtt)
    raw_rtts = raw_run(zmq.ROUTER, zmq.DEALER, 100, nrtt, echo=True)
    f["rtt_p50_bus_us"] = statistics.median(bus_rtts) * 1e6
    f["rtt_p50_raw_us"] = statistics.median(raw_rtts) * 1e6
    kills = [peer_loss_kill_ms() for _ in range(1 if q else 3)]
    f["peer_loss_kill_ms"] = statistics.median(kills)
    f["peer_loss_kill_ms_runs"] = kills
    f["stream_1mib_ratio"] = f["stream_1mib_bus_mb_s"] / f["stream_1mib_raw_mb_s"]
    f["stream_64kib_ratio"] = f["stream_64kib_bus_mb_s"] / f["stream_64kib_raw_mb_s"]
    f["control_rate_ratio"] = f["control_bus_msg_s"] / f["control_raw_msg_s"]
    f["rtt_p50_ratio"] = f["rtt_p50_bus_us"] / f["rtt_p50_raw_us"]
    f["credit_bytes"] = credit
    write(args.out, "bus", f, q)
    rows = [
        (
            "stream 1 MiB (MB/s)",
            f"{f['stream_1mib_bus_mb_s']:.0f}",
            f"{f['stream_1mib_raw_mb_s']:.0f}",
            f"{f['stream_1mib_ratio']:.2f}",
            ">= 0.85",
        ),
        (
            "stream 64 KiB (MB/s)",
            f"{f['stream_64kib_bus_mb_s']:.0f}",
            f"{f['stream_64kib_raw_mb_s']:.0f}",
            f"{f['stream_64kib_ratio']:.2f}",
            ">= 0.70",
        ),
        (
            "control 100 B (msg/s)",
            f"{f['control_bus_msg_s']:.0f}",
            f"{f['control_raw_msg_s']:.0f}",
            f"{f['control_rate_ratio']:.2f}",
            ">= 0.5",
        ),
        (
            "round trip p50 (us)",
            f"{f['rtt_p50_bus_us']:.0f}",
            f"{f['rtt_p50_raw_us']:.0f}",
            f"{f['rtt_p50_ratio']:.2f}",
            "<= 1.5",
        ),
        ("peer loss after SIGKILL (ms)", f"{f['peer_loss_kill_ms']:.1f}", "", "", "<= 1000"),
    ]
    print(table(rows, ("figure", "sparkbus", "raw pyzmq", "ratio", "goal")))


if __name__ == "__main__":
    main()
