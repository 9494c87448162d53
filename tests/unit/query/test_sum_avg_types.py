"""SUM and AVG take numbers, as in Spark SQL: a BOOLEAN (or any other non-numeric) input is refused with
``DATA_EXCEPTION`` by the aggregate that reads the rows (single, or partial on each participant), where
Arrow would answer a count of TRUE values as an unsigned sum; MIN, MAX and COUNT still take it."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable

import pyarrow as pa
import pytest

from sparkbus.roles.query import ErrorCode, QueryError, aggregate
from sparkbus.roles.query.plan import AggCall, AggFunc
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

T = pa.table(
    {
        "g": pa.array([1, 1, 2, 2, 1, 2], pa.int64()),
        "b": pa.array([True, False, None, True, True, False]),
        "x": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
    }
)
OTHERS = {
    "s": pa.array(["a", "b"]),
    "ts": pa.array([datetime.datetime(2024, 1, 1)] * 2, pa.timestamp("us")),
    "d": pa.array([datetime.timedelta(seconds=1)] * 2, pa.duration("s")),
}


@pytest.mark.parametrize("phase", [aggregate.single, aggregate.partial])
@pytest.mark.parametrize("func", ["sum", "avg"])
@pytest.mark.parametrize("keys", [[], ["g"]])
def test_sum_or_avg_of_a_boolean_is_refused_where_the_rows_are_read(
    phase: Callable[[pa.Table, list[str], list[AggCall]], pa.Table], func: AggFunc, keys: list[str]
) -> None:
    with pytest.raises(QueryError) as refused:
        phase(T, keys, [AggCall(name="a", func=func, column="x"), AggCall(name="s", func=func, column="b")])
    assert refused.value.code is ErrorCode.DATA_EXCEPTION
    assert refused.value.message == (
        f"{func.upper()} takes numbers (integer, floating point or decimal), not bool, as in Spark SQL"
    )


@pytest.mark.parametrize("column", sorted(OTHERS))
def test_sum_or_avg_of_another_non_numeric_type_is_refused_naming_it(column: str) -> None:
    table = pa.table({column: OTHERS[column]})
    for func in ("sum", "avg"):
        with pytest.raises(QueryError) as refused:
            aggregate.single(table, [], [AggCall(name="a", func=func, column=column)])
        assert f"{func.upper()} takes numbers" in refused.value.message
        assert f"not {table[column].type}," in refused.value.message


@pytest.mark.parametrize("repartition", [False, True])
@pytest.mark.parametrize(
    "text",
    [
        "SELECT sum(b) AS s FROM t",
        "SELECT avg(b) AS a FROM t",
        "SELECT g, sum(b) AS s FROM t GROUP BY g",
        "SELECT g, count(*) AS n, avg(x > 2) AS a FROM t GROUP BY g",
    ],
)
def test_a_query_summing_booleans_is_refused(text: str, repartition: bool) -> None:
    with pytest.raises(QueryError) as refused:
        distributed(parse_sql(text), split(T, [2, 4]), repartition=repartition)
    assert refused.value.code is ErrorCode.DATA_EXCEPTION and "not bool" in refused.value.message


def test_min_max_and_count_of_a_boolean_and_sums_of_numbers_are_answered() -> None:
    got = distributed(
        parse_sql("SELECT min(b) AS lo, max(b) AS hi, count(b) AS n, sum(x) AS s, avg(x) AS a FROM t"),
        split(T, [3]),
    )
    assert got is not None and got.to_pylist() == [{"lo": False, "hi": True, "n": 5, "s": 21, "a": 3.5}]
    d = pa.table(
        {"d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("2.25")], pa.decimal128(6, 2))}
    )
    out = aggregate.single(
        d, [], [AggCall(name="s", func="sum", column="d"), AggCall(name="a", func="avg", column="d")]
    )
    assert out.to_pylist() == [{"s": decimal.Decimal("3.75"), "a": decimal.Decimal("1.875000")}]
    assert out.schema.field("a").type == pa.decimal128(38, 6)  # exact, as Spark's DECIMAL(10, 6)
