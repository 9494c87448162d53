"""The main job's exchange comparison: one query run with each of the three exchanges, and its output moved
by each.

``query_per_exchange`` runs the query through the thin client with ``exchange`` push, binx and http in
turn (every node of the shipped topologies runs ``binx.server``, ``binx.client`` and ``http.client``),
checks the three results are the same rows, and gives each exchange's p50.

``compare_exchanges`` measures the *transport* of the same bytes alone: the rows the chosen query's
participants send to its initiator, cut into Arrow IPC pages of the bus batch size, moved from one bus
node to another inside the driver process over loopback TCP:

* push: the ``echo`` service's credit stream (``stream`` call), the bus mechanism query fragments use,
  with as many batches as there are pages, each the size of the largest page;
* BinX: the ``binx.server`` role holds the pages in an output buffer, the ``binx.client`` role fetches
  them (1 MiB per request), then deletes the buffer;
* HTTP: ``HttpExchangeServer`` serves the same pages, ``HttpExchangeClient.fetch_all`` reads them
  (1 MiB per request), then deletes the buffer.

Filling the buffers is not timed; each transfer is, from the first request to the last page received.

Under CURVE both run push and BinX only: no node of a CURVE cluster serves the HTTP exchange, which is
plain HTTP (docs/EXCHANGE.md section 5), so the query would be refused. HTTP is then reported as not run,
with the reason (``not_run``), rather than timed outside the cluster's rules.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from sparkbus.bus import security
from sparkbus.bus.config import BusConfig, CurveSettings
from sparkbus.bus.http_exchange import HttpExchangeServer
from sparkbus.bus.http_fetch import HttpExchangeClient
from sparkbus.bus.node import Node
from sparkbus.codecs import encode_batch
from sparkbus.roles.exchange import BinxClient, BinxServer, OutputBuffers
from sparkbus.topologies.echo import EchoRole
from sparkbus.topologies.mainjob_report import compare

MiB = 1 << 20
_SERVER, _CLIENT = "exchange-server", "exchange-client"
EXCHANGES = ("push", "binx", "http")
#: why the comparison leaves HTTP out in a CURVE topology
HTTP_NOT_RUN = "not run under CURVE: no node serves the HTTP exchange, which is plain HTTP"


def exchanges(curve: bool) -> tuple[str, ...]:
    """The exchanges the comparison runs: all three, or push and BinX when the bus uses ``curve``."""
    return EXCHANGES[:2] if curve else EXCHANGES


def not_run(curve: bool) -> dict[str, str]:
    """The exchanges the comparison leaves out, each with the reason (``not_run`` in the report)."""
    return {"http": HTTP_NOT_RUN} if curve else {}


def pages_of(table: pa.Table, page_bytes: int) -> list[bytes]:
    """``table`` as Arrow IPC pages of about ``page_bytes`` each (at least one page)."""
    rows = max(1, table.num_rows)
    per_page = max(1, int(page_bytes // max(1, table.nbytes / rows)))
    batches = table.combine_chunks().to_batches(max_chunksize=per_page) or [
        pa.RecordBatch.from_pylist([], schema=table.schema)
    ]
    return [bytes(encode_batch(b)) for b in batches]


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def query_per_exchange(
    cluster: Any, sql: str, *, curve: bool = False, reps: int = 10, timeout: float = 60.0
) -> dict[str, Any]:
    """Run ``sql`` ``reps`` times with each exchange (the order rotating every round); p50 milliseconds per
    exchange and whether every run returned the same rows as the first push run, in any order and by the
    comparison the reference queries use (NaN equal to NaN, as in Spark SQL; ``Table.equals`` holds no
    table with a NaN equal even to itself).

    Args:
        cluster: a connected thin client (``Client.sql`` takes ``exchange``).
        curve: the cluster's bus uses CURVE: HTTP is not run (``exchanges``), and ``query_not_run`` says why.
    """
    kinds = exchanges(curve)
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    reference: pa.Table | None = None
    mismatch = ""
    for i in range(reps):
        turn = i % len(kinds)
        for kind in kinds[turn:] + kinds[:turn]:
            t0 = time.perf_counter()
            got = cluster.sql(sql, timeout=timeout, exchange=kind)
            samples[kind].append(time.perf_counter() - t0)
            if reference is None:
                reference = got
            elif not mismatch and not compare(got, reference, ordered=False)[0]:
                mismatch = f"{kind}: {got.num_rows} rows differ from the first run's {reference.num_rows}"
    return {
        "query_p50_ms": {k: round(_p50_ms(v), 3) for k, v in samples.items()},
        "query_reps": reps,
        "query_results_match": not mismatch,
        "query_mismatch": mismatch,
        "query_not_run": not_run(curve),
    }


@contextmanager
def _loopback(config: BusConfig) -> Iterator[BusConfig]:
    """``config`` for the two nodes ``compare_exchanges`` runs in this process. Under CURVE they get pairs of
    their own in a temporary directory, as the topology's key directory has none for them (only the shared
    pair would serve), and no address list, which names the cluster's machines and not loopback."""
    if config.curve is None:
        yield config
        return
    with tempfile.TemporaryDirectory(prefix="sparkbus-exchange-keys-") as where:
        security.generate(where, [_SERVER, _CLIENT])
        yield dataclasses.replace(config, curve=CurveSettings(key_dir=where))


def compare_exchanges(table: pa.Table, config: BusConfig, *, reps: int = 5) -> dict[str, Any]:
    """Move ``table``'s pages through push, BinX and HTTP ``reps`` times each; p50 milliseconds per exchange.

    Push and BinX speak CURVE when ``config`` does, as the cluster's links do; HTTP is plain, so under CURVE,
    where no node serves it, it is not run (``not_run`` says why).
    """
    with _loopback(config) as loopback:
        return _compare(table, loopback, reps)


def _compare(table: pa.Table, config: BusConfig, reps: int) -> dict[str, Any]:
    pages = pages_of(table, config.batch_size)
    total = sum(len(p) for p in pages)
    timeout = 30.0

    def echo(node: str) -> EchoRole:
        return EchoRole(
            node_id=node, batch_size=config.batch_size, credit=config.initial_credit, timeout=timeout
        )

    # The whole output goes in with one call, so the node's bound must hold it, as the HTTP side's does.
    held = OutputBuffers(
        instance_id="mainjob-binx", max_buffer_bytes=total + MiB, max_total_bytes=4 * total + 4 * MiB
    )
    server = Node(_SERVER, config, [BinxServer(held), echo(_SERVER)])
    client = Node(_CLIENT, config, [BinxClient(rng=random.Random(0), max_wait=0.0), echo(_CLIENT)])
    buffers = OutputBuffers(
        instance_id="mainjob", max_buffer_bytes=total + MiB, max_total_bytes=4 * total + 4 * MiB
    )
    curve = config.curve is not None
    http = None if curve else HttpExchangeServer(buffers, host="127.0.0.1", port=0, max_wait=0.0)
    samples: dict[str, list[float]] = {k: [] for k in exchanges(curve)}
    try:
        s_ep, c_ep = server.bind(), client.bind()
        server.start({_CLIENT: c_ep})
        client.start({_SERVER: s_ep})
        server.wait_ready(timeout)
        client.wait_ready(timeout)
        if http is not None:
            http.start()
        biggest = max(len(p) for p in pages)
        for i in range(reps):
            t0 = time.perf_counter()
            client.call(
                "echo",
                "stream",
                {"peer": _SERVER, "batches": len(pages), "batch_size": biggest, "timeout": timeout},
                timeout=timeout + 5,
            )
            samples["push"].append(time.perf_counter() - t0)

            task = f"mainjob-{i}"
            server.call("binx.server", "create", {"task_id": task, "buffer_id": 0, "max_bytes": total + MiB})
            server.call("binx.server", "add_pages", {"task_id": task, "buffer_id": 0, "pages": pages})
            server.call("binx.server", "no_more_pages", {"task_id": task, "buffer_id": 0})
            got = 0
            t0 = time.perf_counter()
            while True:
                reply = client.call(
                    "binx.client",
                    "fetch",
                    {"peer": _SERVER, "task_id": task, "buffer_id": 0},
                    timeout=timeout,
                )
                got += sum(len(p) for p in reply["pages"])
                if reply["complete"]:
                    break
            samples["binx"].append(time.perf_counter() - t0)
            if got != total:
                raise RuntimeError(f"BinX moved {got} bytes of {total}")
            if http is None:
                continue
            with http.producer():  # holds the server's lock and wakes its long-polls
                buffers.create(task, 0)
                buffers.add_pages(task, 0, pages)
                buffers.no_more_pages(task, 0)
            t0 = time.perf_counter()
            with HttpExchangeClient("127.0.0.1", http.port, timeout=timeout) as hc:
                got = sum(len(p) for p in hc.fetch_all(task, 0, max_bytes=MiB, max_wait=0.0))
            samples["http"].append(time.perf_counter() - t0)
            if got != total:
                raise RuntimeError(f"HTTP moved {got} bytes of {total}")
    finally:
        if http is not None:
            http.close()
        client.stop()
        server.stop()
    return {
        "rows": table.num_rows,
        "bytes": total,
        "pages": len(pages),
        "reps": reps,
        "p50_ms": {k: round(_p50_ms(v), 3) for k, v in samples.items()},
        "mb_per_s": {k: round(total / statistics.median(v) / 1e6, 1) for k, v in samples.items()},
        "not_run": not_run(curve),
        "what": "p50_ms, mb_per_s: the transport alone, the query's participant output as Arrow IPC pages "
        "moved between two bus nodes in the driver process over loopback; query_p50_ms: the query run "
        "through the thin client with each exchange",
    }
