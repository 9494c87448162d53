"""Load: 1,000 concurrent short queries and 100 concurrent BinX exchanges against one cluster.

The initiator ``i`` (query role and BinX client) runs in the test process; ``p1`` and ``p2`` (query
participants and BinX servers) are processes. Everything is submitted at once through ``call_async``; each
exchange pulls its next part as soon as the previous one arrived. Afterwards the participants' memory and
every process's file descriptors must be back to their level before the load, within ``RSS_TOLERANCE``:
Python keeps freed memory in its arenas, so resident memory settles somewhat above where it started even
when nothing is held (the figures seen are printed and in docs/RELIABILITY.md).
"""

from __future__ import annotations

import random
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import pytest

from sparkbus.roles.exchange import BinxClient
from sparkbus.roles.query import Query, result_table

from .cluster import ROWS, QueryCluster, query_cluster
from .node_proc import open_streams
from .procs import children, fd_count, until

pytestmark = [pytest.mark.load, pytest.mark.timeout(300)]
QUERIES = 1000
EXCHANGES = 100
PAGES = 20
RSS_TOLERANCE = 32 << 20  # bytes of resident memory a participant may keep above its level before the load


def page(source: int, n: int) -> bytes:
    return source.to_bytes(4, "big") + n.to_bytes(4, "big") + bytes([n % 256]) * 1016


def produce(cluster: QueryCluster, first: int, count: int) -> list[tuple[str, int]]:
    """``count`` buffers (task ``t{k}``) spread over p1 and p2; returns (peer, k) for each."""
    sources = []
    for k in range(first, first + count):
        peer = f"p{k % 2 + 1}"
        pages = [page(k, n).hex() for n in range(PAGES)]
        answer = cluster.participants[peer].ask("produce", task_id=f"t{k}", buffer_id=0, pages=pages)
        assert answer == {"ok": True}
        sources.append((peer, k))
    return sources


def run_load(cluster: QueryCluster, queries: int, sources: list[tuple[str, int]]) -> float:
    """Run the queries and the exchanges at once; check every result; return the wall time."""
    node = cluster.node
    assert node is not None
    started = time.monotonic()
    limits = [random.Random(q).randrange(ROWS + 10) for q in range(queries)]
    qfuts = [
        node.call_async("query", "execute", Query(sql=f"SELECT COUNT(*) AS n FROM t WHERE k < {lim}").args())
        for lim in limits
    ]
    got: dict[int, list[bytes]] = {k: [] for _, k in sources}
    fetching: dict[Future[Any], tuple[str, int]] = {}

    def fetch(peer: str, k: int) -> None:
        args = {"peer": peer, "task_id": f"t{k}", "buffer_id": 0}
        fetching[node.call_async("binx.client", "fetch", args)] = (peer, k)

    for peer, k in sources:
        fetch(peer, k)
    while fetching:
        done, _ = wait(list(fetching), timeout=120, return_when=FIRST_COMPLETED)
        assert done, "no exchange made progress within 120 s"
        for fut in done:
            peer, k = fetching.pop(fut)
            res = fut.result()
            got[k] += res["pages"]
            if not res["complete"]:
                fetch(peer, k)
    for fut, lim in zip(qfuts, limits, strict=True):
        assert result_table(fut.result(timeout=120))["n"].to_pylist() == [min(lim, ROWS)]
    wall = time.monotonic() - started
    for _, k in sources:
        assert got[k] == [page(k, n) for n in range(PAGES)], k
    return wall


def levels(cluster: QueryCluster) -> dict[str, int]:
    out = {"i_fds": fd_count()}
    for name, p in cluster.participants.items():
        out[f"{name}_rss"] = p.rss_bytes()
        out[f"{name}_fds"] = p.fds()
    return out


def settled(cluster: QueryCluster) -> bool:
    assert cluster.node is not None
    if any(cluster.open_state().values()) or open_streams(cluster.node.status()) != 0:
        return False
    for p in cluster.participants.values():
        state = p.ask("state")
        if any(state["open"].values()) or open_streams(state["status"]) != 0:
            return False
    return True


def test_1000_queries_and_100_exchanges_at_once(fds_back: None) -> None:
    """What the user sees: every query and every exchange succeeds with the correct result; afterwards
    nothing is left open, file descriptors are back to their level and the participants' resident memory
    within ``RSS_TOLERANCE`` of it."""
    client = BinxClient(rng=random.Random(3), max_request_bytes=8192)
    with children() as procs, query_cluster(procs, kind="query+binx", extra_roles=(client,)) as cluster:
        run_load(cluster, 50, produce(cluster, 0, 10))  # warm up: imports, caches, allocator arenas
        until("the warm-up has settled", lambda: settled(cluster))
        before = levels(cluster)
        sources = produce(cluster, 1000, EXCHANGES)
        wall = run_load(cluster, QUERIES, sources)
        until("nothing is left open after the load", lambda: settled(cluster), timeout=30)
        until(
            "file descriptors are back",
            lambda: all(levels(cluster)[k] <= before[k] for k in before if k.endswith("_fds")),
        )
        after = levels(cluster)
        for name in cluster.participants:
            assert after[f"{name}_rss"] <= before[f"{name}_rss"] + RSS_TOLERANCE, (before, after)
        print(
            f"LOAD queries={QUERIES} exchanges={EXCHANGES} wall={wall:.2f}s qps={QUERIES / wall:.0f} "
            f"before={before} after={after}"
        )
