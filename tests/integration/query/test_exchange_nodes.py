"""Push and binx inside a query on real bus nodes (ZeroMQ, one loop thread each, in this process)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from sparkbus.bus.config import BusConfig
from sparkbus.bus.node import Node
from sparkbus.roles.exchange import BinxClient, BinxServer, OutputBuffers
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
            [QueryRole(n), BinxServer(OutputBuffers(instance_id=n)), BinxClient(rng=random.Random(n))],
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


def test_push_and_binx_give_the_same_results_on_real_nodes(nodes: dict[str, Node]) -> None:
    data = table(20_000)
    load(nodes["p1"], "t", data.slice(0, 10_000))
    load(nodes["p2"], "t", data.slice(10_000))
    for sql, repartition, keep_order in QUERIES:
        got: dict[str, Any] = {}
        for kind in ("push", "binx"):
            q = Query(sql=sql, participants=NAMES, repartition=repartition, exchange=kind, timeout=20.0)
            rows = q.run(nodes["i"]).to_pylist()
            got[kind] = rows if keep_order else sorted(rows, key=repr)
        assert got["binx"] == got["push"], sql
