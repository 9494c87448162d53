"""HAVING resolves names as Spark SQL does: an unqualified name the select list outputs means that output,
unless it names a GROUP BY column; inside an aggregate, names are input columns. The expected rows are
Spark SQL's answers to the same text over the same rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query.errors import SqlError
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, split, stores

TABLE = pa.table({"k": pa.array(["a", "a", "b", "c"]), "x": pa.array([1, 2, 5, -3], pa.int64())})


def rows(sql: str) -> list[tuple[object, ...]]:
    fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1", "p2"])
    got = run_fragments(fragments, stores(split(TABLE, [2])), ())
    assert got is not None
    return sorted(tuple(r.values()) for r in got.to_pylist())


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT k, sum(x) AS n FROM t GROUP BY k HAVING n > 2", [("a", 3), ("b", 5)]),
        ("SELECT k, sum(x) AS x FROM t GROUP BY k HAVING x > 2", [("a", 3), ("b", 5)]),  # the output
        ("SELECT upper(k) AS k, count(*) AS c FROM t GROUP BY k HAVING k = 'A'", []),  # the group key
        ("SELECT upper(k) AS k, count(*) AS c FROM t GROUP BY k HAVING k = 'a'", [("A", 2)]),
        ("SELECT k, sum(x) AS s FROM t GROUP BY k HAVING s + 1 > 3 AND count(*) > 1", [("a", 3)]),
        ("SELECT k, -sum(x) AS x FROM t GROUP BY k HAVING max(x) > 1", [("a", -3), ("b", -5)]),  # input
        ("SELECT count(*) AS n FROM t HAVING n > 3", [(4,)]),
    ],
)
def test_having_names_mean_what_spark_sql_takes_them_for(
    sql: str, expected: list[tuple[object, ...]]
) -> None:
    assert rows(sql) == expected


def test_having_a_name_that_is_neither_output_nor_key_is_refused() -> None:
    with pytest.raises(SqlError, match="column 'x' must appear in GROUP BY"):
        parse_sql("SELECT k, count(*) AS n FROM t GROUP BY k HAVING x > 1")
