"""The implicit casts of a STRING beside another type, against Spark SQL itself: every query of
``tests/unit/query/test_string_coercion.py`` is answered with the same values as Spark answers it, or
refused where Spark refuses it (Spark 4's default ANSI mode; two in-process participants here)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.roles.query.errors import QueryError
from tests.unit.query.test_string_coercion import ANSWERED, REFUSED, TABLE, values

pytestmark = pytest.mark.spark

SCHEMA = "x bigint, i int, s string, dt date, ts timestamp_ntz, d decimal(10,2), f double, b boolean"


def test_strings_beside_other_types_are_read_as_spark_reads_them(spark: Any) -> None:
    spark.createDataFrame(TABLE.to_pylist(), SCHEMA).createOrReplaceTempView("t")
    differ = []
    for sql in [q for q, _ in ANSWERED] + [q for q, _, _ in REFUSED]:
        try:
            theirs: object = sorted((r[0] for r in spark.sql(sql).collect()), key=repr)
        except Exception as exc:  # CAST_INVALID_INPUT, raised when the query runs
            theirs = f"refused: {type(exc).__name__}"
        try:
            mine: object = values(sql)
        except QueryError as exc:
            mine = f"refused: {exc.code.name}"
        if isinstance(theirs, str) != isinstance(mine, str) or (
            not isinstance(theirs, str) and theirs != mine
        ):
            differ.append((sql, theirs, mine))
    assert differ == []
