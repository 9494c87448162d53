"""Property: random interleavings (seeds) and faults never leak query state and never give a wrong answer."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.roles.query.config import QueryConfig

from .cluster import Cluster

QUERIES = {
    "SELECT k, count(*) AS n, sum(x) AS s, min(y) AS lo FROM t GROUP BY k": lambda t: (
        t.group_by(["k"])
        .aggregate([([], "count_all"), ("x", "sum"), ("y", "min")])
        .rename_columns(["k", "n", "s", "lo"])
    ),
    "SELECT x FROM t ORDER BY x DESC LIMIT 7": lambda t: (
        t.sort_by([("x", "descending")]).slice(0, 7).select(["x"])
    ),
    "SELECT count(DISTINCT k) AS d FROM t WHERE x > 5": lambda t: pa.table({"d": [3]}),
    "SELECT x, k FROM t": lambda t: t.select(["x", "k"]),
}
FAULTS = ["none", "crash p1", "crash p2", "crash i", "cut p1 p2", "cut i p1", "cancel"]


def canonical(t: pa.Table) -> list[str]:
    return sorted(map(repr, t.to_pylist()))


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    sql=st.sampled_from(sorted(QUERIES)),
    repartition=st.booleans(),
    fault=st.sampled_from(FAULTS),
    at=st.floats(0.0, 0.02),
)
def test_no_leaks_and_no_wrong_answers(seed: int, sql: str, repartition: bool, fault: str, at: float) -> None:
    c = Cluster(seed, rows=1200, config=QueryConfig(edge_credit=8192, batch_bytes=2048, check_period=0.5))
    cid = c.execute(sql, repartition=repartition)
    c.sim.run_for(at)
    kind, *nodes = fault.split()
    if kind == "crash":
        c.sim.crash(nodes[0])
    elif kind == "cut":
        c.sim.cut(nodes[0], nodes[1])
    elif kind == "cancel":
        c.sim.call("i", "query", "cancel", {"call_id": cid[1]})
    if c.sim.node("i").alive:
        got, err = c.outcome(cid)
        if got is not None:
            assert canonical(got) == canonical(QUERIES[sql](c.data))
        else:
            assert err is not None and err.startswith("[")
    c.settle()
    assert set(c.leaks().values()) <= {0}
