"""The implicit casts of a STRING beside another type, and CAST, against Spark SQL itself: every query of
``tests/unit/query/test_string_coercion.py`` is answered with the same values as Spark answers it, or
refused where Spark refuses it (Spark 4's default ANSI mode; two in-process participants here)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.roles.query.errors import QueryError
from tests.unit.query.test_string_coercion import ANSWERED, CASTS, CASTS_REFUSED, REFUSED, TABLE, values

pytestmark = pytest.mark.spark

SCHEMA = "x bigint, i int, s string, dt date, ts timestamp_ntz, d decimal(10,2), f double, b boolean"


def test_strings_beside_other_types_and_casts_are_answered_as_spark_answers_them(spark: Any) -> None:
    spark.createDataFrame(TABLE.to_pylist(), SCHEMA).createOrReplaceTempView("t")
    differ = []
    queries = [q for q, _ in ANSWERED + CASTS] + [q for q, _, _ in REFUSED] + [q for q, _ in CASTS_REFUSED]
    for sql in queries:
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
