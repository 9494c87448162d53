"""WHERE and HAVING conditions, and CAST(... AS BOOLEAN), against Spark SQL itself: where Spark refuses the
text our query is refused, where Spark answers, ours gives the same rows (two in-process participants)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.query.errors import QueryError
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql
from tests.unit.query.helpers import run_fragments, split, stores

pytestmark = pytest.mark.spark

TABLE = pa.table(
    {
        "k": pa.array(["a", "b", "a"]),
        "x": pa.array([1, 2, 5], pa.int64()),
        "b": pa.array([True, None, False]),
    }
)
GROUPS = "SELECT k, count(*) AS c FROM t GROUP BY k HAVING {} ORDER BY k"
QUERIES: list[tuple[str, list[Any]]] = [
    *(
        (f"SELECT x FROM t WHERE {w} ORDER BY x", [])
        for w in (
            "NULL",
            "coalesce(NULL, NULL)",
            "1",
            "-NULL",
            "'true'",
            "upper(NULL)",
            "NULL AND x > 1",
            "x > 1 AND NULL",
            "NULL OR x > 1",
            "NOT NULL",
            "CAST(NULL AS BOOLEAN)",
            "NULL = NULL",
            "NULL IN (1, 2)",
            "NULL IS NULL",
            "b",
            "CAST(x - 1 AS BOOLEAN)",
        )
    ),
    *(
        (GROUPS.format(h), [])
        for h in (
            "NULL",
            "NOT NULL",
            "NULL AND count(*) > 1",
            "NULL OR count(*) > 1",
            "CAST(NULL AS BOOLEAN)",
            "-NULL",
            "upper(NULL)",
            "1",
            "0",
            "'true'",
            "' No '",
            "'a'",
            "count(*) - 1",
            "avg(x) - 3",
            "c",
            "max(b)",
            "max(k)",
        )
    ),
    ("SELECT x FROM t WHERE ? ORDER BY x", [None]),
    ("SELECT x FROM t WHERE ? ORDER BY x", [1]),
    ("SELECT x FROM t WHERE ? ORDER BY x", [True]),
    ("SELECT x FROM t WHERE ? AND x > 1 ORDER BY x", [None]),
    (GROUPS.format("?"), [None]),
    (GROUPS.format("?"), [1]),
    (
        "SELECT CAST(' true ' AS BOOLEAN) AS a, CAST('\tYes\n' AS BOOLEAN) AS b, CAST('N' AS BOOLEAN) AS c, "
        "CAST('\x7f0' AS BOOLEAN) AS d, CAST(x - 2 AS BOOLEAN) AS e, CAST(b AS BOOLEAN) AS f FROM t ORDER BY x",
        [],
    ),
    ("SELECT CAST('off' AS BOOLEAN) AS v FROM t", []),
]


def ours(sql: str, params: list[Any]) -> list[tuple[Any, ...]] | str:
    try:
        fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1", "p2"])
        got = run_fragments(fragments, stores(split(TABLE, [1])), tuple(params))
    except QueryError as exc:
        return f"refused: {exc.code.name}"
    assert got is not None
    return [tuple(r.values()) for r in got.to_pylist()]


def sparks(spark: Any, sql: str, params: list[Any]) -> list[tuple[Any, ...]] | str:
    try:
        rows = spark.sql(sql, args=params).collect() if params else spark.sql(sql).collect()
    except Exception as exc:  # an AnalysisException, or a runtime error such as CAST_INVALID_INPUT
        return f"refused: {type(exc).__name__}"
    return [tuple(r) for r in rows]


def test_conditions_and_casts_are_answered_or_refused_as_spark_does(spark: Any) -> None:
    spark.createDataFrame(TABLE.to_pylist(), "k string, x bigint, b boolean").createOrReplaceTempView("t")
    differ = []
    for sql, params in QUERIES:
        theirs, mine = sparks(spark, sql, params), ours(sql, params)
        if isinstance(theirs, str) != isinstance(mine, str) or (
            not isinstance(theirs, str) and theirs != mine
        ):
            differ.append((sql, params, theirs, mine))
    assert differ == []
