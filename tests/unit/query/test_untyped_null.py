"""An untyped NULL (the literal NULL, a ``?`` bound to None) takes its type from its context, as in Spark SQL:
the other argument's type, else BOOLEAN in logic, STRING in string functions, DOUBLE in arithmetic. Arrow
types such a value null, for which its kernels have no overloads."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, run_fragments, split, stores

X = list(range(12))
K = ["a", "b", "c", None] * 3
TABLE = pa.table({"k": pa.array(K), "x": pa.array(X, pa.int64())})


def run(sql: str, params: tuple[object, ...] = ()) -> pa.Table:
    fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1", "p2"])
    got = run_fragments(fragments, stores(split(TABLE, [5])), params)
    assert got is not None
    return got


@pytest.mark.parametrize(
    ("where", "params", "expected"),
    [
        ("x < 3 OR NULL", (), [0, 1, 2]),
        ("x < 3 AND NULL", (), []),
        ("NULL OR x > 9", (), [10, 11]),
        ("NOT NULL", (), []),
        ("NOT ?", (None,), []),
        ("x < 3 OR ?", (None,), [0, 1, 2]),
        ("k IN (NULL, NULL)", (), []),
        ("k IN (?, 'a')", (None,), [0, 4, 8]),
        ("NULL IN (1, 2)", (), []),
        ("x = ?", (None,), []),
        ("x BETWEEN NULL AND 3", (), []),
        ("coalesce(NULL, x) < 2", (), [0, 1]),
        ("upper(NULL) IS NULL AND x < 1", (), [0]),
        ("k LIKE NULL", (), []),
        ("NULL LIKE 'a%'", (), []),
    ],
)
def test_a_null_in_a_predicate_is_typed_by_its_context(
    where: str, params: tuple[object, ...], expected: list[int]
) -> None:
    got = run(f"SELECT x FROM t WHERE {where} ORDER BY x", params)
    assert got.column("x").to_pylist() == expected


def test_a_null_in_the_select_list_takes_sparks_type() -> None:
    got = run(
        "SELECT coalesce(NULL, x) AS c, upper(NULL) AS u, length(NULL) AS n, NULL = NULL AS e, "
        "NULL + NULL AS s, -NULL AS m, abs(NULL) AS a, NULL % 2 AS r, x + ? AS p FROM t WHERE x < 2 ORDER BY x",
        (None,),
    )
    assert got.to_pylist() == [
        {"c": x, "u": None, "n": None, "e": None, "s": None, "m": None, "a": None, "r": None, "p": None}
        for x in (0, 1)
    ]
    types = {f.name: f.type for f in got.schema}
    assert types["c"] == pa.int64() and types["u"] == pa.string() and types["e"] == pa.bool_()
    assert types["s"] == types["m"] == types["a"] == pa.float64()
    assert types["p"] == pa.int64()  # typed by the other argument, a BIGINT
    assert types["r"] == pa.int32()  # typed by the other argument, the INT literal 2 (Spark: int)


def test_a_null_beside_a_column_of_the_null_type_is_left_to_the_kernels() -> None:
    table = pa.table({"n": pa.nulls(4)})
    got = distributed(parse_sql("SELECT coalesce(n, NULL) AS c, n IS NULL AS z FROM t"), split(table, [2]))
    assert got is not None and got.to_pylist() == [{"c": None, "z": True}] * 4


@pytest.mark.parametrize("repartition", [False, True])
def test_sum_and_avg_of_a_null_are_double_nulls_as_in_spark(repartition: bool) -> None:
    for sql, params in (
        ("SELECT sum(NULL) AS s, avg(NULL) AS a, count(NULL) AS c FROM t", ()),
        ("SELECT sum(?) AS s, avg(?) AS a, count(?) AS c FROM t", (None, None, None)),
        ("SELECT sum(NULL) AS s, avg(NULL) AS a, count(DISTINCT NULL) AS c FROM t", ()),
    ):
        fragments = plan_fragments(
            parse_sql(sql), initiator="i", participants=["p1", "p2"], repartition=repartition
        )
        got = run_fragments(fragments, stores(split(TABLE, [5])), params)
        assert got is not None and got.to_pylist() == [{"s": None, "a": None, "c": 0}], sql
        assert got.schema.types == [pa.float64(), pa.float64(), pa.int64()], (
            sql
        )  # Spark: double, double, bigint
    grouped = distributed(
        parse_sql("SELECT k, sum(NULL) AS s, sum(n) AS sn, sum(x) AS sx FROM t GROUP BY k ORDER BY k"),
        split(TABLE.append_column("n", pa.nulls(len(X))), [5]),
        repartition=repartition,
    )
    assert grouped is not None and grouped.column("sx").to_pylist() == [21, 12, 15, 18]
    assert grouped.column("s").to_pylist() == grouped.column("sn").to_pylist() == [None] * 4
    assert grouped.schema.types == [pa.string(), pa.float64(), pa.float64(), pa.int64()]
