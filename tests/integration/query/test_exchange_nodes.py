"""Push, binx and http inside a query on real bus nodes (ZeroMQ, one loop thread each, in this process; http
over each node's HTTP exchange server and fetcher threads)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from sparkbus.bus.config import BusConfig
from sparkbus.bus.node import Node
from sparkbus.roles.exchange import BinxClient, BinxServer, HttpClient, OutputBuffers
from sparkbus.roles.query.api import Query, load
from sparkbus.roles.query.role import QueryRole
from tests.sim.query.cluster import table

NAMES = ("i", "p1", "p2")
QUERIES = [
    ("SELECT x, y FROM t WHERE x % 7 = 3", False, False),
    ("SELECT k, count(*) AS n, sum(x) AS s FROM t GROUP BY k", False, False),
    ("SELECT k, count(*) AS n, max(x) AS m FROM t GROUP BY k", True, False),
    ("SELECT x, k FROM t WHERE x >= 50 ORDER BY k DESC, x LIMIT 17", False, True),
]


@pytest.fixture
def nodes() -> Iterator[dict[str, Node]]:
    config = BusConfig(cluster_tag="exch-it", heartbeat_interval=0.2, peer_timeout=2.0)
    made = {
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
        for n in NAMES
    }
    try:
        endpoints = {n: node.bind() for n, node in made.items()}
        for n, node in made.items():
            node.start({k: v for k, v in endpoints.items() if k != n})
        for node in made.values():
            node.wait_ready(30)
        yield made
    finally:
        for node in made.values():
            node.stop()


def test_push_binx_and_http_give_the_same_results_on_real_nodes(nodes: dict[str, Node]) -> None:
    data = table(20_000)
    load(nodes["p1"], "t", data.slice(0, 10_000))
    load(nodes["p2"], "t", data.slice(10_000))
    for sql, repartition, keep_order in QUERIES:
        got: dict[str, Any] = {}
        for kind in ("push", "binx", "http"):
            q = Query(sql=sql, participants=NAMES, repartition=repartition, exchange=kind, timeout=20.0)
            rows = q.run(nodes["i"]).to_pylist()
            got[kind] = rows if keep_order else sorted(rows, key=repr)
        assert got["binx"] == got["push"], sql
        assert got["http"] == got["push"], sql
    # The http runs went over HTTP: the initiator's client made requests, each node serves its buffers.
    http = nodes["i"].core.roles["http.client"]
    assert isinstance(http, HttpClient) and http.counters["requests"] > 0 and http.counters["deletes"] > 0
    assert all(node.endpoints is not None and node.endpoints.http for node in nodes.values())


def test_the_http_exchange_stops_with_the_node_and_leaves_no_thread() -> None:
    import threading

    config = BusConfig(cluster_tag="exch-http-stop", heartbeat_interval=0.2, peer_timeout=2.0)
    before = set(threading.enumerate())
    a = Node("a", config, [BinxServer(OutputBuffers(instance_id="a"))])
    b = Node("b", config, [HttpClient(rng=random.Random(1), max_wait=5.0)])
    try:
        ea, eb = a.bind(), b.bind()
        assert ea.http.startswith("127.0.0.1:") and eb.http == ""  # only a node running binx.server serves
        a.start({"b": eb})
        b.start({"a": ea})
        a.wait_ready(30)
        b.wait_ready(30)
        a.call("binx.server", "create", {"task_id": "t", "buffer_id": 0})
        parked = b.call_async("http.client", "fetch", {"peer": "a", "task_id": "t", "buffer_id": 0})
        a.call("binx.server", "add_pages", {"task_id": "t", "buffer_id": 0, "pages": [b"one", b"two"]})
        assert parked.result(timeout=10) == {"pages": [b"one", b"two"], "token": 0, "complete": False}
        # A long-poll is parked in a's role when both nodes stop: neither stop waits for it.
        second = b.call_async("http.client", "fetch", {"peer": "a", "task_id": "t", "buffer_id": 0})
    finally:
        a.stop()
        b.stop()
    with pytest.raises(RuntimeError):
        second.result(timeout=5)
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], left
