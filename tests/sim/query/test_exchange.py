"""The same queries with each exchange a query can use: push (credit streams), binx (pulled pages) and http
(pulled pages over the HTTP exchange, which the simulator carries out as the node driver does)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.codecs import encode_batch
from sparkbus.roles.exchange import BackoffPolicy, BinxClient, BinxServer, HttpClient, OutputBuffers
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.role import QueryRole

from .cluster import table

NODES = ("i", "p1", "p2")
SMALL = QueryConfig(edge_credit=4096, batch_bytes=1024)
QUERIES: list[tuple[str, dict[str, Any], bool]] = [  # sql, extra execute args, is the row order defined
    ("SELECT x, y FROM t WHERE x % 7 = 3", {}, False),
    ("SELECT k, count(*) AS n, sum(x) AS s, avg(y) AS a FROM t GROUP BY k", {}, False),
    ("SELECT k, count(*) AS n, max(x) AS m FROM t GROUP BY k", {"repartition": True}, False),
    ("SELECT x, k FROM t WHERE x >= ? ORDER BY k DESC, x LIMIT 17", {"parameters": [50]}, True),
    ("SELECT x FROM t WHERE x < 0", {}, False),
]


class ExchangeCluster:
    """Query, BinX server, BinX client and HTTP client roles on each of ``i``, ``p1``, ``p2``; ``t`` on p1
    and p2."""

    def __init__(
        self,
        seed: int,
        rows: int = 2000,
        config: QueryConfig = SMALL,
        node_bytes: int = 512 << 20,
        http: dict[str, Any] | None = None,
        serving: tuple[str, ...] = NODES,
    ) -> None:
        self.sim = SimBus(seed=seed)
        self.node_bytes = node_bytes
        self.http = http or {}
        self.serving = serving  # the nodes that run binx.server
        self.config = config
        self.queries: dict[str, QueryRole] = {}
        for name in NODES:
            self.sim.add_node(name, roles=self.roles(name))
        self.sim.start()
        self.sim.run_until(self.sim.all_up)
        self.data = table(rows)
        half = rows // 2
        for node, part in (("p1", self.data.slice(0, half)), ("p2", self.data.slice(half))):
            batches = [bytes(encode_batch(b)) for b in part.to_batches(max_chunksize=100)]
            self.sim.result(self.sim.call(node, "query", "load", {"table": "t", "batches": batches}))

    def roles(self, name: str) -> list[Any]:
        self.queries[name] = QueryRole(name, config=self.config, incarnation=f"{name}0")
        server = BinxServer(OutputBuffers(instance_id=name, max_total_bytes=self.node_bytes))
        return [
            self.queries[name],
            *([server] if name in self.serving else []),
            BinxClient(rng=random.Random(name)),
            HttpClient(rng=random.Random(f"http/{name}"), **self.http),
        ]

    def run(self, sql: str, **args: Any) -> tuple[pa.Table | None, str | None]:
        return self.outcome(self.sim.call("i", "query", "execute", {"sql": sql, **args}))

    def outcome(self, cid: tuple[str, int]) -> tuple[pa.Table | None, str | None]:
        self.sim.run_until(lambda: self.sim.reply(cid) is not None, limit=120.0)
        done = self.sim.reply(cid)
        assert done is not None
        if done.error is not None:
            return None, done.error
        return pa.ipc.open_stream(done.result).read_all(), None

    def settle(self) -> None:
        self.sim.run_for(5.0)
        self.sim.run_until_idle()

    def leaks(self) -> dict[str, Any]:
        """What any live node still holds: query states, BinX and HTTP sources, published bytes."""
        held: dict[str, Any] = {}
        for name in NODES:
            node = self.sim.node(name)
            if not node.alive:
                continue
            q = node.roles["query"]
            client = node.roles["binx.client"]
            http = node.roles["http.client"]
            server = node.roles["binx.server"]
            assert isinstance(q, QueryRole) and isinstance(client, BinxClient)
            assert isinstance(server, BinxServer) and isinstance(http, HttpClient)
            held[name] = (
                len(q.queries) + len(q.calls) + len(q._tags),
                len(client._sources) + len(http._sources) + http.in_flight,
                server.buffers.bytes_held,
            )
        return held


def ordered(t: pa.Table, keep_order: bool) -> list[dict[str, Any]]:
    rows = t.to_pylist()
    return rows if keep_order else sorted(rows, key=repr)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_query_gives_the_same_result_with_push_binx_and_http(seed: int) -> None:
    c = ExchangeCluster(seed)
    for sql, args, keep_order in QUERIES:
        push, err = c.run(sql, exchange="push", **args)
        assert err is None and push is not None, err
        for kind in ("binx", "http"):
            got, err = c.run(sql, exchange=kind, **args)
            assert err is None and got is not None, (kind, err)
            assert got.schema == push.schema, (kind, sql)
            assert ordered(got, keep_order) == ordered(push, keep_order), (kind, sql)
    assert c.queries["p1"].counters["exchange_results_ignored"] == 0
    assert c.sim.http_requests > 0
    c.sim.run_for(5.0)
    c.sim.run_until_idle()
    assert c.leaks() == {n: (0, 0, 0) for n in NODES}


def test_binx_pages_cross_the_binx_roles() -> None:
    c = ExchangeCluster(4)
    before = {n: c.queries[n].counters["batches_out"] for n in NODES}
    got, err = c.run("SELECT x FROM t", exchange="binx")
    assert err is None and got is not None and sorted(got.column("x").to_pylist()) == list(range(2000))
    assert c.queries["p1"].counters["batches_out"] - before["p1"] > 10  # small pages: many of them
    client = c.sim.node("i").roles["binx.client"]
    assert isinstance(client, BinxClient) and client.counters["requests"] >= 2


def test_the_role_default_exchange_applies_when_execute_names_none() -> None:
    c = ExchangeCluster(5, config=QueryConfig(edge_credit=4096, batch_bytes=1024, exchange="binx"))
    got, err = c.run("SELECT k, count(*) AS n FROM t GROUP BY k")
    assert err is None and got is not None and sum(got.column("n").to_pylist()) == 2000
    client = c.sim.node("i").roles["binx.client"]
    assert isinstance(client, BinxClient) and client.counters["requests"] > 0


def test_http_pages_cross_the_http_client_and_not_the_binx_one() -> None:
    c = ExchangeCluster(6)
    got, err = c.run("SELECT x FROM t", exchange="http")
    assert err is None and got is not None and sorted(got.column("x").to_pylist()) == list(range(2000))
    http = c.sim.node("i").roles["http.client"]
    binx = c.sim.node("i").roles["binx.client"]
    assert isinstance(http, HttpClient) and isinstance(binx, BinxClient)
    assert http.counters["requests"] >= 2 and http.counters["deletes"] >= 2  # one DELETE per buffer read
    assert binx.counters["requests"] == 0
    c.sim.run_for(5.0)
    c.sim.run_until_idle()
    assert c.leaks() == {n: (0, 0, 0) for n in NODES}


def test_the_role_default_exchange_can_be_http() -> None:
    c = ExchangeCluster(13, config=QueryConfig(edge_credit=4096, batch_bytes=1024, exchange="http"))
    got, err = c.run("SELECT k, count(*) AS n FROM t GROUP BY k")
    assert err is None and got is not None and sum(got.column("n").to_pylist()) == 2000
    http = c.sim.node("i").roles["http.client"]
    assert isinstance(http, HttpClient) and http.counters["requests"] > 0


def test_unknown_exchanges_are_refused_clearly() -> None:
    c = ExchangeCluster(6)
    got, err = c.run("SELECT x FROM t", exchange="carrier-pigeon")
    assert got is None and err is not None and "exchange must be one of push, binx, http" in err


@pytest.mark.parametrize(("seed", "kind"), [(7, "binx"), (8, "binx"), (9, "binx"), (7, "http"), (8, "http")])
def test_a_participant_lost_mid_query_under_a_pulled_exchange_fails_with_member_leave(
    seed: int, kind: str
) -> None:
    c = ExchangeCluster(seed, rows=4000)
    cid = c.sim.call("i", "query", "execute", {"sql": "SELECT x, y FROM t", "exchange": kind})
    c.sim.crash("p2")
    c.sim.run_until(lambda: c.sim.reply(cid) is not None, limit=60.0)
    done = c.sim.reply(cid)
    assert done is not None and done.error is not None, done
    assert done.error.startswith("[1002 MEMBER_LEAVE]") and "p2" in done.error
    c.sim.run_for(5.0)
    c.sim.run_until_idle()
    assert c.leaks() == {"i": (0, 0, 0), "p1": (0, 0, 0)}


@pytest.mark.parametrize("seed", [10, 11])
def test_a_participant_lost_under_binx_or_http_fails_the_same_way_as_under_push(seed: int) -> None:
    errors = {}
    for kind in ("push", "binx", "http"):
        c = ExchangeCluster(seed, rows=4000)
        cid = c.sim.call("i", "query", "execute", {"sql": "SELECT x FROM t", "exchange": kind})
        c.sim.crash("p1")
        c.sim.run_until(lambda: c.sim.reply(cid) is not None, limit=60.0)  # noqa: B023 (used at once)
        done = c.sim.reply(cid)
        assert done is not None and done.error is not None
        errors[kind] = done.error
    assert all(e.startswith("[1002 MEMBER_LEAVE] member p1 left the cluster") for e in errors.values())


def test_output_beyond_the_nodes_buffer_bound_fails_the_query_clearly() -> None:
    c = ExchangeCluster(12, rows=4000, node_bytes=8192)
    held = {"task_id": "other", "buffer_id": 0, "pages": [b"x" * 1024], "last": True}
    c.sim.result(c.sim.call("p1", "binx.server", "publish", held))  # another producer's pages
    got, err = c.run("SELECT x, y FROM t", exchange="binx")
    assert got is None and err is not None
    assert err.startswith("[2000 DATA_EXCEPTION] binx output buffer") and "BufferFullError" in err
    c.sim.run_for(5.0)
    c.sim.run_until_idle()
    assert c.leaks() == {"i": (0, 0, 0), "p1": (0, 0, 1024), "p2": (0, 0, 0)}


def test_http_rides_out_a_producer_whose_start_is_late_and_gives_up_clearly_when_it_stays_away() -> None:
    # The initiator pulls from p1 before p1 has the query's start (held on the link): its buffers are
    # unknown, the pull backs off and retries, and the result is whole once they appear.
    c = ExchangeCluster(14)
    push, err = c.run("SELECT x, k FROM t", exchange="push")
    assert err is None and push is not None
    cid = c.sim.call("i", "query", "execute", {"sql": "SELECT x, k FROM t", "exchange": "http"})
    c.sim.stall("i", "p1", 1.0, channels=("ctl",))
    got, err = c.outcome(cid)
    assert err is None and got is not None and ordered(got, False) == ordered(push, False)
    http = c.sim.node("i").roles["http.client"]
    assert isinstance(http, HttpClient) and http.counters["retries"] > 0
    # Held longer than the pull's give-up time: the query fails naming the source and the 404.
    c = ExchangeCluster(14, http={"policy": BackoffPolicy(max_error_duration=0.5)})
    cid = c.sim.call("i", "query", "execute", {"sql": "SELECT x, k FROM t", "exchange": "http"})
    c.sim.stall("i", "p1", 3.0, channels=("ctl",))
    got, err = c.outcome(cid)
    assert got is None and err is not None
    assert err.startswith("[-1 GENERIC] http exchange from p1 failed: ExchangeGaveUp: http source task")
    assert "HTTP 404" in err and "no such buffer" in err
    c.settle()
    assert c.leaks() == {n: (0, 0, 0) for n in NODES}


def test_an_aborted_producer_under_http_fails_the_query_with_its_reason() -> None:
    c = ExchangeCluster(15, rows=4000, http={"max_request_bytes": 2048})
    cid = c.sim.call("i", "query", "execute", {"sql": "SELECT x, y FROM t", "exchange": "http"})
    http = c.sim.node("i").roles["http.client"]
    assert isinstance(http, HttpClient)

    def pulling_from_p1() -> bool:
        return any(s.peer == "p1" and s.token > 0 for s in http._sources.values())

    c.sim.run_until(pulling_from_p1)  # the first pages came; the rest are still on p1
    server = c.sim.node("p1").roles["binx.server"]
    assert isinstance(server, BinxServer)
    [key] = server.buffers.keys()
    c.sim.result(
        c.sim.call(
            "p1", "binx.server", "abort", {"task_id": key[0], "buffer_id": key[1], "reason": "disk on fire"}
        )
    )
    got, err = c.outcome(cid)
    assert got is None and err is not None
    assert err.startswith("[-1 GENERIC] http exchange from p1 failed: ExchangeFailed: http source task")
    assert "HTTP 500" in err and "disk on fire" in err
    c.settle()
    assert c.leaks() == {n: (0, 0, 0) for n in NODES}


def test_a_participant_whose_node_serves_no_http_fails_the_query_clearly() -> None:
    c = ExchangeCluster(16, serving=("i", "p1"))  # p2 runs no binx.server: nothing to publish into or serve
    got, err = c.run("SELECT x FROM t", exchange="http")
    assert got is None and err is not None and "p2" in err
    assert ("advertises no HTTP exchange" in err) or ("runs no role 'binx.server'" in err), err


def test_rows_wider_than_the_push_batch_limit_go_through_pulled_exchanges() -> None:
    c = ExchangeCluster(1, config=QueryConfig())
    wide = pa.table({"s": ["a" * 500_000, "b" * 560_000], "x": [1, 2]})
    batches = [bytes(encode_batch(b)) for b in wide.to_batches()]
    c.sim.result(c.sim.call("p1", "query", "load", {"table": "w", "batches": batches}))
    for kind in ("binx", "http"):
        got, err = c.run("SELECT s, x FROM w", exchange=kind)
        assert err is None and got is not None and sorted(got.column("x").to_pylist()) == [1, 2]
    _, err = c.run("SELECT s, x FROM w", exchange="push")
    assert err is not None and "exceeds the batch limit" in err
    c.settle()
    assert all(held == (0, 0, 0) for held in c.leaks().values())
