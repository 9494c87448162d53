"""Two participant processes and an initiator in the test process, on real sockets (127.0.0.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.roles.query import ErrorCode, QueryError, QueryRole, sql

from ...childproc import Proc
from .participant_proc import generate

pytestmark = pytest.mark.integration
PROC = Path(__file__).with_name("participant_proc.py")
ROWS, SEED = 20_000, 11


def participant(node_id: str, index: int) -> Proc:
    return Proc(node_id, [str(PROC), node_id, str(ROWS), str(SEED), str(index), "2"])


@pytest.fixture(scope="module")
def initiator() -> Iterator[Node]:
    procs: list[Proc] = []
    node: Node | None = None
    try:
        procs = [participant("p1", 0), participant("p2", 1)]
        node = Node("i", BusConfig(cluster_tag="query-it"), [QueryRole("i")])
        peers = {"i": node.bind(), **{p.name: Endpoints.from_json(p.receive()) for p in procs}}
        for p in procs:
            p.send({k: v.to_json() for k, v in peers.items()})
        node.start(peers)
        node.wait_ready(timeout=15)
        loaded = [p.receive()["loaded"] for p in procs]
        assert sum(loaded) == ROWS
        yield node
    finally:
        if node is not None:
            node.stop()
        for p in procs:
            p.reap()


DATA = generate(ROWS, SEED)


def _point() -> pa.Table:
    return pa.table({"n": pa.array([pc.sum(pc.equal(DATA["user"], 42)).as_py()], pa.int64())})


def _group_top() -> pa.Table:
    g = DATA.group_by("kind").aggregate([("value", "count"), ("value", "sum"), ("ts", "max")])
    g = pa.table({"kind": g["kind"], "n": g["value_count"], "s": g["value_sum"], "mx": g["ts_max"]})
    return g.sort_by([("s", "descending")]).slice(0, 10)


def _order_limit() -> pa.Table:
    f = DATA.filter(pc.equal(DATA["kind"], "buy")).select(["user", "ts", "value"])
    return f.sort_by([("ts", "descending")]).slice(0, 7)


def _having() -> pa.Table:
    f = DATA.filter(pc.less(DATA["user"], 40))
    g = f.group_by("user").aggregate([("kind", "count_distinct"), ("value", "count")])
    g = g.filter(pc.greater(g["value_count"], 1)).select(["user", "kind_count_distinct"])
    return g.rename_columns(["user", "dk"]).sort_by("user")


CASES: list[tuple[str, Callable[[], pa.Table]]] = [
    ("SELECT COUNT(*) AS n FROM t WHERE user = 42", _point),
    (
        "SELECT kind, COUNT(*) AS n, SUM(value) AS s, MAX(ts) AS mx FROM t GROUP BY kind ORDER BY s DESC LIMIT 10",
        _group_top,
    ),
    ("SELECT user, ts, value FROM t WHERE kind = 'buy' ORDER BY ts DESC LIMIT 7", _order_limit),
    (
        "SELECT user, COUNT(DISTINCT kind) AS dk FROM t WHERE user < 40 GROUP BY user HAVING COUNT(*) > 1 "
        "ORDER BY user",
        _having,
    ),
]


def same(got: pa.Table, want: pa.Table) -> None:
    assert got.column_names == want.column_names
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        g, w = got[name].to_pylist(), want[name].to_pylist()
        if pa.types.is_floating(want.schema.field(name).type):
            assert g == pytest.approx(w, rel=1e-9), name
        else:
            assert g == w, name


@pytest.mark.parametrize(("text", "reference"), CASES, ids=["point", "group_top", "order_limit", "having"])
def test_results_equal_the_reference(initiator: Node, text: str, reference: Callable[[], pa.Table]) -> None:
    same(sql(initiator, text, timeout=20), reference())


def test_full_scan_streams_every_row(initiator: Node) -> None:
    got = sql(initiator, "SELECT user, kind, value, ts FROM t ORDER BY ts", timeout=20)
    assert got.num_rows == ROWS
    same(got, DATA.sort_by("ts"))


def test_errors_come_back_with_their_code(initiator: Node) -> None:
    with pytest.raises(QueryError) as info:
        sql(initiator, "SELECT user FROM t WHERE", timeout=20)
    assert info.value.code is ErrorCode.PARSING
    with pytest.raises(QueryError) as info:
        sql(initiator, "SELECT nope FROM t", timeout=20)  # columns are known only where the data is
    assert info.value.code is ErrorCode.DATA_EXCEPTION
    assert info.value.origin in {"p1", "p2"} and "nope" in info.value.message
    with pytest.raises(QueryError) as info:
        sql(initiator, "SELECT value / (user - user) AS z FROM t", timeout=20)
    assert info.value.code is ErrorCode.DATA_EXCEPTION
    # the node still answers afterwards
    assert sql(initiator, "SELECT COUNT(*) AS n FROM t", timeout=20)["n"].to_pylist() == [ROWS]
