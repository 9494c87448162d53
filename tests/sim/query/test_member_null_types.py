"""Seeded simulations: a column that one participant loaded with only None values (Arrow's null type) and
the other as BIGINT is answered as BIGINT with every exchange (push streams, binx and http pages) and
through the repartitioned middle stage, as Spark SQL answers a table whose partition holds only NULLs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.codecs import encode_batch

from .test_exchange import NODES, ExchangeCluster

PARTS = {
    "p1": pa.table({"k": pa.array(["a", "c"]), "x": pa.nulls(2)}),
    "p2": pa.table({"k": pa.array(["a", "b", "a"]), "x": pa.array([1, 2, 5], pa.int64())}),
}
QUERIES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("SELECT sum(x) AS s, max(x) AS m, count(DISTINCT x) AS d FROM n", {}, [{"s": 8, "m": 5, "d": 3}]),
    ("SELECT x FROM n ORDER BY x DESC", {}, [{"x": v} for v in (5, 2, 1, None, None)]),
    (
        "SELECT k, sum(x) AS s FROM n GROUP BY k ORDER BY k",
        {"repartition": True},
        [{"k": "a", "s": 6}, {"k": "b", "s": 2}, {"k": "c", "s": None}],
    ),
    (
        "SELECT x, count(*) AS c FROM n GROUP BY x ORDER BY x",
        {"repartition": True},
        [{"x": None, "c": 2}, {"x": 1, "c": 1}, {"x": 2, "c": 1}, {"x": 5, "c": 1}],
    ),
]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("exchange", ["push", "binx", "http"])
def test_an_untyped_column_on_one_participant_is_answered_in_the_others_type(
    seed: int, exchange: str
) -> None:
    c = ExchangeCluster(seed, rows=8)
    for node, part in PARTS.items():
        batches = [bytes(encode_batch(b)) for b in part.to_batches()]
        c.sim.result(c.sim.call(node, "query", "load", {"table": "n", "batches": batches}))
    for sql, args, expected in QUERIES:
        got, err = c.run(sql, exchange=exchange, **args)
        assert err is None and got is not None, (sql, err)
        assert got.to_pylist() == expected, sql
        assert pa.int64() in got.schema.types and pa.null() not in got.schema.types, sql
    c.settle()
    assert c.leaks() == {n: (0, 0, 0) for n in NODES}
