"""docs/QUERY.md's table of output names ("Output names") says how Spark SQL names each unaliased select
item: each of its rows is checked against the column names of Spark's answer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.query.test_output_names import documented

pytestmark = pytest.mark.spark


def test_sparks_documented_names_are_the_names_of_its_answers(spark: Any) -> None:
    spark.createDataFrame([("a", 1)], "k string, x bigint").createOrReplaceTempView("t")
    pairs = documented(2)
    assert len(pairs) >= 25
    for item, name in pairs:
        sql = f"SELECT {item} FROM t GROUP BY x, k"
        got = spark.sql(sql, args=[7]) if "?" in item else spark.sql(sql)
        assert got.columns == [name], item
