"""The thin client: logical connection restore time and per-operation overhead, default settings.

* ``restore_ms``: a TCP proxy between client and node is broken (every connection closed) while a query
  runs and accepts again at once; from the break until the client's logical connection is restored
  (RESTORED received). ``restored_result_delivered``: the query's result then arrived, once.
* ``op_overhead_us``: the client's round trip (a STATUS operation through the ``client.gateway`` role)
  minus the raw round trip of the same sockets (a DEALER -> ROUTER echo on 127.0.0.1), p50 of each, both
  measured in this run.
* ``stream_*``: a 32 MiB Arrow result (4M int64 rows, ready on the node) read with ``sql_batches``
  (default window, 8 chunks of about 1 MiB): time to the first batch, to the last, and the rate; the
  restore and round-trip figures are taken first, on small results.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pyarrow as pa
from _common import parser, table, write

import sparkbus
from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
from sparkbus.bus.node import Node, context
from sparkbus.roles.client import Gateway, Op
from sparkbus.roles.query import table_to_ipc
from tests.integration.client.proxy import Proxy


@dataclass
class SlowQuery:
    delay: float = 0.3
    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()
    calls: list[int] = field(default_factory=list)

    big: bytes = b""

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall) and event.args.get("sql") == "big":
            return [c.Reply(call_id=event.call_id, result=self.big)]
        if isinstance(event, c.LocalCall):
            self.calls.append(event.call_id)
            return [c.SetTimer(key=str(event.call_id), at=now + self.delay)]
        if isinstance(event, c.TimerFired):
            return [c.Reply(call_id=int(event.key), result=table_to_ipc(pa.table({"n": [len(self.calls)]})))]
        return []


BIG_ROWS = 4 * 2**20


def raw_rtt(n: int) -> list[float]:
    ctx = context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
    router.bind("tcp://127.0.0.1:0")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if router.poll(100):
                router.send_multipart(router.recv_multipart())

    t = threading.Thread(target=echo)
    t.start()
    out = []
    payload = [b"h" * 20, b"b" * 40]
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            dealer.send_multipart(payload)
            dealer.recv_multipart()
            out.append(time.perf_counter() - t0)
    finally:
        stop.set()
        t.join(5)
        router.close()
        dealer.close()
    return out


def main() -> int:
    args = parser(__doc__ or "").parse_args()
    rounds, ops = (3, 300) if args.quick else (10, 3000)
    query = SlowQuery()
    node = Node("n1", BusConfig(cluster_tag="bench"), [query, Gateway("n1")])
    ep = node.bind()
    node.start({})
    host, port = ep.control.removeprefix("tcp://").rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    restores: list[float] = []
    delivered = True
    try:
        with sparkbus.connect([proxy.address], cluster_tag="bench") as client:
            for i in range(rounds):
                fut = client.submit(Op.SQL, {"sql": "select 1", "participants": ["n1"]})
                deadline = time.monotonic() + 10
                while len(query.calls) <= i and time.monotonic() < deadline:
                    time.sleep(0.001)
                t0 = time.perf_counter()
                proxy.down()
                proxy.up()
                while client.status_of_links()[proxy.address] <= i:
                    time.sleep(0.0005)
                restores.append(time.perf_counter() - t0)
                delivered &= fut.result(timeout=10).num_rows == 1
            client_rtt = []
            for _ in range(ops):
                t0 = time.perf_counter()
                client.call(Op.PING)
                client_rtt.append(time.perf_counter() - t0)
            query.big = table_to_ipc(pa.table({"i": pa.array(range(BIG_ROWS), pa.int64())}))
            firsts, totals, rows_ok = [], [], True
            for _ in range(rounds):
                t0 = time.perf_counter()
                first, rows = 0.0, 0
                for batch in client.sql_batches("big"):
                    first = first or time.perf_counter() - t0
                    rows += batch.num_rows
                totals.append(time.perf_counter() - t0)
                firsts.append(first)
                rows_ok &= rows == BIG_ROWS
        raw = raw_rtt(ops)
    finally:
        proxy.close()
        node.stop()
    figures = {
        "restore_ms": round(statistics.median(restores) * 1000, 2),
        "restore_ms_max": round(max(restores) * 1000, 2),
        "restored_result_delivered": bool(delivered and len(query.calls) == rounds),
        "client_rtt_us": round(statistics.median(client_rtt) * 1e6, 1),
        "raw_zmq_rtt_us": round(statistics.median(raw) * 1e6, 1),
    }
    figures["op_overhead_us"] = round(figures["client_rtt_us"] - figures["raw_zmq_rtt_us"], 1)
    total = statistics.median(totals)
    figures["stream_first_batch_ms"] = round(statistics.median(firsts) * 1000, 2)
    figures["stream_total_ms"] = round(total * 1000, 1)
    figures["stream_mib_s"] = round(BIG_ROWS * 8 / 2**20 / total, 1)
    figures["stream_rows_complete"] = bool(rows_ok)
    write(args.out, "client", figures, args.quick)
    print(table([(k, str(v)) for k, v in figures.items()], ("figure", "value")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
