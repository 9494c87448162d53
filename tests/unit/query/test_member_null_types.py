"""A column that one member holds as Arrow's null type (its partition has only NULLs there, as a table loaded
with None values) and another as BIGINT is one BIGINT column of the query: the members' rows, partial
states and group keys take the other members' type where they meet (``exchange.concat_rows``), as in Spark
SQL, where a table has one type per column. Types with no common type (STRING and BIGINT) stay an error
that names the column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, stores

TYPED = pa.table({"k": pa.array(["a", "b", "a"]), "x": pa.array([1, 2, 5], pa.int64())})
UNTYPED = pa.table({"k": pa.array(["a", "c"]), "x": pa.nulls(2)})


def rows(sql: str, parts: list[pa.Table], *, repartition: bool) -> pa.Table:
    fragments = plan_fragments(
        parse_sql(sql),
        initiator="i",
        participants=[f"p{i}" for i in range(len(parts))],
        repartition=repartition,
    )
    got = run_fragments(fragments, stores(parts))
    assert got is not None
    return got


ORDERS = [[TYPED, UNTYPED], [UNTYPED, TYPED]]


@pytest.mark.parametrize("repartition", [False, True])
@pytest.mark.parametrize("parts", ORDERS, ids=["typed-first", "untyped-first"])
@pytest.mark.parametrize(
    ("sql", "expected", "types"),
    [
        ("SELECT sum(x) AS s FROM t", [{"s": 8}], [pa.int64()]),
        (
            "SELECT max(x) AS hi, min(x) AS lo, avg(x) AS a, count(x) AS c, count(DISTINCT x) AS d FROM t",
            [{"hi": 5, "lo": 1, "a": 8 / 3, "c": 3, "d": 3}],
            [pa.int64(), pa.int64(), pa.float64(), pa.int64(), pa.int64()],
        ),
        ("SELECT x FROM t ORDER BY x", [{"x": v} for v in (None, None, 1, 2, 5)], [pa.int64()]),
        ("SELECT x FROM t ORDER BY x DESC LIMIT 2", [{"x": 5}, {"x": 2}], [pa.int64()]),
        ("SELECT x FROM t ORDER BY x LIMIT 3", [{"x": None}, {"x": None}, {"x": 1}], [pa.int64()]),
        (
            "SELECT x, count(*) AS c FROM t GROUP BY x ORDER BY x",
            [{"x": None, "c": 2}, {"x": 1, "c": 1}, {"x": 2, "c": 1}, {"x": 5, "c": 1}],
            [pa.int64(), pa.int64()],
        ),
        (
            "SELECT k, sum(x) AS s, count(DISTINCT x) AS d, max(x) AS m FROM t GROUP BY k ORDER BY k",
            [
                {"k": "a", "s": 6, "d": 2, "m": 5},
                {"k": "b", "s": 2, "d": 1, "m": 2},
                {"k": "c", "s": None, "d": 0, "m": None},
            ],
            [pa.string(), pa.int64(), pa.int64(), pa.int64()],
        ),
        (
            "SELECT x + 1 AS y, coalesce(x, 0) AS z FROM t ORDER BY y",
            [{"y": None, "z": 0}, {"y": None, "z": 0}, {"y": 2, "z": 1}, {"y": 3, "z": 2}, {"y": 6, "z": 5}],
            [pa.int64(), pa.int64()],  # INT where x is untyped (Spark's type of 1 and 0), BIGINT elsewhere
        ),
    ],
)
def test_an_untyped_column_takes_the_other_members_type(
    sql: str,
    expected: list[dict[str, object]],
    types: list[pa.DataType],
    parts: list[pa.Table],
    repartition: bool,
) -> None:
    got = rows(sql, parts, repartition=repartition)
    assert got.to_pylist() == expected
    assert got.schema.types == types


@pytest.mark.parametrize("repartition", [False, True])
def test_a_sum_every_member_holds_untyped_is_a_double_null(repartition: bool) -> None:
    got = rows("SELECT sum(x) AS s, max(x) AS m FROM t", [UNTYPED, UNTYPED], repartition=repartition)
    assert got.to_pylist() == [{"s": None, "m": None}]
    assert got.schema.field("s").type == pa.float64()


def test_count_distinct_of_an_untyped_string_column_beside_a_typed_one() -> None:
    typed = pa.table({"s": pa.array(["u", "v", "u"])})
    got = rows(
        "SELECT count(DISTINCT s) AS d FROM t", [pa.table({"s": pa.nulls(3)}), typed], repartition=False
    )
    assert got.to_pylist() == [{"d": 2}]


def test_an_untyped_column_beside_a_string_one_is_answered_and_a_number_beside_it_refused() -> None:
    text = pa.table({"k": pa.array(["z"]), "x": pa.array(["q"])})
    got = rows("SELECT x FROM t ORDER BY x", [UNTYPED, text], repartition=False)
    assert got.to_pylist() == [{"x": None}, {"x": None}, {"x": "q"}]
    with pytest.raises(ExecutionError, match="column x with types that have no common type"):
        rows("SELECT x FROM t", [TYPED, text], repartition=False)
