"""A column one participant holds as Arrow's null type (only NULLs there) and the other as BIGINT answers as
Spark SQL answers the same rows in one BIGINT column: the same rows and Spark's types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql
from tests.unit.query.helpers import run_fragments, stores

pytestmark = pytest.mark.spark

UNTYPED = pa.table({"k": pa.array(["a", "c"]), "x": pa.nulls(2)})
TYPED = pa.table({"k": pa.array(["a", "b", "a"]), "x": pa.array([1, 2, 5], pa.int64())})
QUERIES = [
    "SELECT sum(x) AS s, max(x) AS hi, min(x) AS lo, count(x) AS c, count(DISTINCT x) AS d FROM t",
    "SELECT x FROM t ORDER BY x",
    "SELECT x FROM t ORDER BY x DESC LIMIT 2",
    "SELECT x, count(*) AS c FROM t GROUP BY x ORDER BY x",
    "SELECT k, sum(x) AS s, max(x) AS m, count(DISTINCT x) AS d FROM t GROUP BY k ORDER BY k",
    "SELECT x + 1 AS y, coalesce(x, 0) AS z FROM t ORDER BY y, z",
]
#: Spark's type names of the Arrow types the answers have
SPARK_TYPES = {pa.int64(): "bigint", pa.int32(): "int", pa.float64(): "double", pa.string(): "string"}


@pytest.mark.parametrize("repartition", [False, True])
def test_an_untyped_partition_answers_as_spark_answers_the_bigint_column(
    spark: Any, repartition: bool
) -> None:
    rows = pa.concat_tables([UNTYPED.cast(TYPED.schema), TYPED]).to_pylist()
    spark.createDataFrame(rows, "k string, x bigint").createOrReplaceTempView("t")
    for sql in QUERIES:
        theirs = spark.sql(sql)
        fragments = plan_fragments(
            parse_sql(sql), initiator="i", participants=["p1", "p2"], repartition=repartition
        )
        got = run_fragments(fragments, stores([UNTYPED, TYPED]))
        assert got is not None
        assert [tuple(r.values()) for r in got.to_pylist()] == [tuple(r) for r in theirs.collect()], sql
        assert [SPARK_TYPES[t] for t in got.schema.types] == [t for _, t in theirs.dtypes], sql
