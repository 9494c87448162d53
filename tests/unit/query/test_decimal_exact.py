"""DECIMAL sums, averages and remainders as Spark SQL 4 answers them (each expectation is Spark's answer to the same
text). A SUM past the type's 38 digits fails (Spark: ARITHMETIC_OVERFLOW), where Arrow's decimal sums wrap
in 128 bits and answered a wrong number with no error; ``%`` of decimals is exact, where it was computed in
float64 and answered wrong digits; AVG of decimals is an exact DECIMAL with 4 more decimal places, where it
was a rounded DOUBLE."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from sparkbus.roles.query import ErrorCode, QueryError
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

D = decimal.Decimal
NINES = D("9" * 38)


def run(text: str, table: pa.Table, cuts: list[int], *, repartition: bool = False) -> list[dict[str, object]]:
    got = distributed(parse_sql(text), split(table, cuts), repartition=repartition)
    assert got is not None
    return got.to_pylist()


@pytest.mark.parametrize("repartition", [False, True])
@pytest.mark.parametrize(
    ("text", "cuts"),
    [
        ("SELECT sum(a) AS s FROM t", [2]),  # each member's partial fits; their sum does not
        ("SELECT sum(a) AS s FROM t", [4]),  # the first member's partial wraps alone
        ("SELECT g, sum(a) AS s FROM t GROUP BY g", [2]),
        ("SELECT g, sum(a) AS s FROM t GROUP BY g", [4]),
    ],
)
def test_a_decimal_sum_past_38_digits_fails(text: str, cuts: list[int], repartition: bool) -> None:
    t = pa.table({"g": [1] * 8, "a": pa.array([NINES] * 4 + [D(1)] * 4, pa.decimal128(38, 0))})
    with pytest.raises(QueryError) as failed:
        run(text, t, cuts, repartition=repartition)
    assert failed.value.code is ErrorCode.DATA_EXCEPTION
    assert "sum: overflow (a sum of decimal128(38, 0) values passes its range)" in failed.value.message


def test_decimal_sums_that_fit_are_answered_exactly() -> None:
    """Past the quick bound (largest magnitude times the count), the exact sums decide: these fit."""
    near = D("9" * 37 + "5")  # 10**38 - 5
    t = pa.table({"g": [1, 1, 2, 2], "a": pa.array([near, D(1), D(1), D(2)], pa.decimal128(38, 0))})
    assert run("SELECT sum(a) AS s FROM t", t, [2]) == [{"s": NINES}]
    grouped = run("SELECT g, sum(a) AS s FROM t GROUP BY g ORDER BY g", t, [1, 3])
    assert grouped == [{"g": 1, "s": D("9" * 37 + "6")}, {"g": 2, "s": D(3)}]
    small = pa.table({"a": pa.array([D("-99999999.99"), D("99999999.99"), D("0.01")], pa.decimal128(10, 2))})
    assert run("SELECT sum(a) AS s FROM t", small, [1]) == [{"s": D("0.01")}]


def test_the_remainder_of_decimals_is_exact() -> None:
    c = pa.array(
        [D("12345678901234567890123.4567890123"), D("99999999.99"), D("-7.5"), None], pa.decimal128(38, 10)
    )
    t = pa.table(
        {"id": [0, 1, 2, 3], "c": c, "d": pa.array([D("0.7"), D(3), D(2), D(1)], pa.decimal128(4, 1))}
    )
    got = run("SELECT id, c % 7 AS m, c % d AS n FROM t ORDER BY id", t, [2])
    assert [r["m"] for r in got] == [D("3.4567890123"), D("1.9900000000"), D("-0.5000000000"), None]
    assert [r["n"] for r in got] == [D("0.6567890123"), D("0.9900000000"), D("-1.5000000000"), None]
    with pytest.raises(QueryError, match="mod: divide by zero"):
        run("SELECT c % 0 AS m FROM t", t, [2])


@pytest.mark.parametrize("repartition", [False, True])
def test_the_average_of_decimals_is_exact(repartition: bool) -> None:
    c = [D("12345678901234567890123.4567890123"), D("12345678901234567890123.4567890121"), None, D("1.5")]
    t = pa.table({"g": [1, 1, 2, 3], "c": pa.array(c, pa.decimal128(38, 10))})
    # Spark: decimal(38, 14), 12345678901234567890123.45678901220000
    got = distributed(
        parse_sql("SELECT avg(c) AS a FROM t WHERE g = 1"), split(t, [1]), repartition=repartition
    )
    assert got is not None and got.schema.field("a").type == pa.decimal128(38, 14)
    assert got.to_pylist() == [{"a": D("12345678901234567890123.45678901220000")}]
    grouped = run("SELECT g, avg(c) AS a FROM t GROUP BY g ORDER BY g", t, [1, 3], repartition=repartition)
    assert grouped == [
        {"g": 1, "a": D("12345678901234567890123.45678901220000")},
        {"g": 2, "a": None},
        {"g": 3, "a": D("1.50000000000000")},
    ]
    thirds = pa.table({"c": pa.array([D("1.00"), D("1.00"), D("2.00")], pa.decimal128(5, 2))})
    assert run("SELECT avg(c) AS a FROM t", thirds, [2]) == [{"a": D("1.333333")}]  # Spark: 1.333333


def test_decimal_arithmetic_past_38_digits_is_typed_as_spark_types_it() -> None:
    """Spark caps the result at 38 digits and cuts the scale (keeping at least 6 places), where Arrow
    refused the type: "Decimal precision out of range [1, 38]: 39" on every row, whatever the values."""
    c = pa.array([D("12345678901234567890123.4567890123"), D("1.0000000001"), None], pa.decimal128(38, 10))
    t = pa.table(
        {"id": [0, 1, 2], "c": c, "s": pa.array([D("1.25"), D("2.50"), D("0")], pa.decimal128(10, 2))}
    )
    got = distributed(
        parse_sql("SELECT id, c + c AS a, c - c AS z, s + s AS small FROM t ORDER BY id"), split(t, [1])
    )
    assert got is not None
    assert got.schema.field("a").type == pa.decimal128(38, 9)  # Spark: decimal(38, 9)
    assert got.schema.field("small").type == pa.decimal128(11, 2)  # within 38 digits: Arrow's, as Spark's
    assert got.column("a").to_pylist() == [D("24691357802469135780246.913578025"), D("2.000000000"), None]
    assert got.column("z").to_pylist() == [D("0E-9"), D("0E-9"), None]
    assert got.column("small").to_pylist() == [D("2.50"), D("5.00"), D("0.00")]
    doubled = run("SELECT id, c * 2 AS m FROM t ORDER BY id", t, [2])
    assert [r["m"] for r in doubled] == [D("24691357802469135780246.913578"), D("2.000000"), None]
    nines = pa.table({"c": pa.array([NINES], pa.decimal128(38, 0))})
    with pytest.raises(QueryError, match=r"add: overflow \(past decimal128\(38, 0\)\)"):
        run("SELECT c + c AS a FROM t", nines, [0])
