"""GROUP BY with repartition hashes each key to a member: a DATE (or TIME) key failed ("Unsupported cast
from date32[day] to int64") and a DECIMAL key was refused ("cannot hash-partition"), where the same query
without repartition, and Spark, answered. Equal decimals hash alike at any precision and scale, as members
may hold a loaded column at different ones."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

D = decimal.Decimal
KEYS = {
    "dt": pa.array([datetime.date(2020, 1, 1), datetime.date(2020, 1, 2), None, datetime.date(2020, 1, 1)]),
    "tm": pa.array(
        [datetime.time(1, 2, 3), datetime.time(4, 5, 6), None, datetime.time(1, 2, 3)], pa.time32("s")
    ),
    "d": pa.array([D("1.10"), D("2.00"), None, D("1.10")], pa.decimal128(10, 2)),
}


@pytest.mark.parametrize("column", sorted(KEYS))
def test_group_by_a_date_time_or_decimal_key_with_repartition_answers_as_without(column: str) -> None:
    t = pa.table({column: KEYS[column], "x": [1, 2, 3, 4]})
    plan = parse_sql(
        f"SELECT {column}, count(*) AS n, sum(x) AS s FROM t GROUP BY {column} ORDER BY {column}"
    )
    plain = distributed(plan, split(t, [1, 3]))
    assert plain is not None
    values = KEYS[column]
    assert plain.to_pylist() == [
        {column: None, "n": 1, "s": 3},
        {column: values[0].as_py(), "n": 2, "s": 5},
        {column: values[1].as_py(), "n": 1, "s": 2},
    ]
    again = distributed(plan, split(t, [1, 3]), repartition=True)
    assert again is not None and again.to_pylist() == plain.to_pylist()


def test_equal_decimals_at_other_scales_hash_to_the_same_part() -> None:
    values = [D("1.1"), D("100"), D("-0.5"), D("0"), D("12345678901234567890.123456789")]
    a = pa.table({"k": pa.array(values, pa.decimal128(30, 9))})
    b = pa.table({"k": pa.array(values, pa.decimal128(38, 12))})
    for parts in (2, 3, 7):
        where_a = [p.column("k").to_pylist() for p in engine.hash_partition(a, ["k"], parts)]
        where_b = [p.column("k").to_pylist() for p in engine.hash_partition(b, ["k"], parts)]
        assert where_a == where_b
