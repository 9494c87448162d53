"""The query API (``Query``, ``sql``, ``load``) over a simulated cluster: pure, no sockets."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.query import (
    ErrorCode,
    Query,
    QueryConfig,
    QueryError,
    QueryRole,
    error_from_reply,
    load,
    sql,
)
from sparkbus.roles.query.plan import AggCall, Aggregate, Scan


class SimTarget:
    """``call(role, name, args, timeout=)`` on one node of a ``SimBus`` (runs the simulation to the reply)."""

    def __init__(self, sim: SimBus, node: str) -> None:
        self.sim, self.node = sim, node

    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        return self.sim.result(self.sim.call(self.node, role, name, args), limit=timeout)


def data(rows: int) -> pa.Table:
    idx = pa.array(range(rows), pa.int64())
    kinds = pa.array(["a", "b", "c"])
    return pa.table(
        {
            "k": pc.take(kinds, pc.remainder(idx, 3)),
            "x": idx,
            "y": pc.multiply(pc.cast(idx, pa.float64()), 0.5),
        }
    )


@pytest.fixture
def cluster() -> tuple[SimBus, dict[str, QueryRole], pa.Table]:
    sim = SimBus(seed=7)
    roles = {n: QueryRole(n, config=QueryConfig(), incarnation=f"{n}0") for n in ("i", "p1", "p2")}
    for n, r in roles.items():
        sim.add_node(n, roles=[r])
    sim.start()
    sim.run_until(sim.all_up)
    t = data(300)
    assert load(SimTarget(sim, "p1"), "t", t.slice(0, 150), batch_rows=40) == 150
    assert load(SimTarget(sim, "p2"), "t", t.slice(150)) == 150
    return sim, roles, t


def no_leaks(sim: SimBus, roles: dict[str, QueryRole]) -> None:
    sim.run_for(3.0)
    sim.run_until_idle()
    assert {n: len(r.queries) + len(r.calls) for n, r in roles.items()} == {"i": 0, "p1": 0, "p2": 0}


def test_sql_returns_an_arrow_table(cluster: tuple[SimBus, dict[str, QueryRole], pa.Table]) -> None:
    sim, roles, t = cluster
    got = sql(SimTarget(sim, "i"), "SELECT k, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY k ORDER BY k")
    assert isinstance(got, pa.Table)
    assert got.column("k").to_pylist() == ["a", "b", "c"]
    assert got.column("n").to_pylist() == [100, 100, 100]
    xs = t.column("x").to_pylist()
    assert got.column("s").to_pylist() == [sum(xs[j::3]) for j in range(3)]
    no_leaks(sim, roles)


def test_parameters_and_query_objects(cluster: tuple[SimBus, dict[str, QueryRole], pa.Table]) -> None:
    sim, roles, _ = cluster
    target = SimTarget(sim, "i")
    got = sql(target, "SELECT x FROM t WHERE x >= ? ORDER BY x DESC LIMIT 3", [290])
    assert got.column("x").to_pylist() == [299, 298, 297]
    q = Query(sql="SELECT COUNT(*) AS n FROM t WHERE k = ?", parameters=("b",), timeout=10.0)
    assert q.args() == {"sql": q.sql, "parameters": ["b"], "timeout": 10.0}
    assert q.run(target).column("n").to_pylist() == [100]
    plan = Aggregate(input=Scan(table="t"), keys=(), aggs=(AggCall(name="n", func="count", column=None),))
    assert Query(plan=plan, repartition=False).run(target).column("n").to_pylist() == [300]
    no_leaks(sim, roles)


def test_sql_error_carries_the_code_and_message(
    cluster: tuple[SimBus, dict[str, QueryRole], pa.Table],
) -> None:
    sim, roles, _ = cluster
    with pytest.raises(QueryError) as info:
        sql(SimTarget(sim, "i"), "SELECT k, x FROM t GROUP BY k")
    assert info.value.code is ErrorCode.PARSING
    assert "must appear in GROUP BY" in info.value.message
    with pytest.raises(QueryError) as info:
        sql(SimTarget(sim, "i"), "SELECT COUNT(*) FROM missing")
    assert info.value.code is ErrorCode.PARSING
    assert "not loaded on any participant" in info.value.message
    with pytest.raises(QueryError) as info:
        sql(SimTarget(sim, "i"), "SELECT x / (x - x) AS z FROM t")
    assert info.value.code is ErrorCode.DATA_EXCEPTION
    assert info.value.query_id is not None and info.value.query_id.startswith("i@")
    no_leaks(sim, roles)


def test_member_connection_error(cluster: tuple[SimBus, dict[str, QueryRole], pa.Table]) -> None:
    sim, roles, _ = cluster
    with pytest.raises(QueryError) as info:
        sql(SimTarget(sim, "i"), "SELECT COUNT(*) FROM t", participants=["p1", "nobody"])
    assert info.value.code is ErrorCode.MEMBER_CONNECTION
    no_leaks(sim, roles)


@pytest.mark.parametrize(
    ("text", "code", "message", "qid", "origin"),
    [
        ("[1004 TIMEOUT] too slow (query i@a.1, on i)", ErrorCode.TIMEOUT, "too slow", "i@a.1", "i"),
        ("[2000 DATA_EXCEPTION] bad (query i@a.2)", ErrorCode.DATA_EXCEPTION, "bad", "i@a.2", None),
        ("[1002 MEMBER_LEAVE] gone (on p1)", ErrorCode.MEMBER_LEAVE, "gone", None, "p1"),
        ("[1005 PARSING] x\n  SELECT (a)\n  ^", ErrorCode.PARSING, "x\n  SELECT (a)\n  ^", None, None),
        (
            "[-1 GENERIC] Query is no longer active.",
            ErrorCode.GENERIC,
            "Query is no longer active.",
            None,
            None,
        ),
        ("node i stopped", ErrorCode.GENERIC, "node i stopped", None, None),
        ("[77 NOPE] unknown code", ErrorCode.GENERIC, "[77 NOPE] unknown code", None, None),
    ],
)
def test_error_from_reply(
    text: str, code: ErrorCode, message: str, qid: str | None, origin: str | None
) -> None:
    err = error_from_reply(text)
    assert (err.code, err.message, err.query_id, err.origin) == (code, message, qid, origin)


def test_query_validates() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Query()
    with pytest.raises(ValueError, match="exactly one"):
        Query(sql="SELECT 1", plan=Scan(table="t"))
    with pytest.raises(ValueError, match="timeout"):
        Query(sql="SELECT 1", timeout=-1)


class _Slow:
    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        raise TimeoutError


def test_no_reply_is_a_timeout() -> None:
    with pytest.raises(QueryError) as info:
        sql(_Slow(), "SELECT COUNT(*) FROM t", timeout=1.0)
    assert info.value.code is ErrorCode.TIMEOUT
