"""WHERE and HAVING conditions as Spark SQL (4, ANSI) takes them: a WHERE condition must be a BOOLEAN, so
``WHERE NULL`` (an untyped NULL, Spark's VOID), ``WHERE 1`` and ``WHERE upper(NULL)`` are refused
(FILTER_NOT_BOOLEAN), while a NULL that its context types (``WHERE NULL AND x > 1``, ``WHERE NOT NULL``,
``WHERE CAST(NULL AS BOOLEAN)``) selects no rows; a HAVING condition that is no predicate is cast to
BOOLEAN, so ``HAVING NULL`` keeps no group and ``HAVING 1`` every group. Each expectation is what Spark
4.3 answered for the same text."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError, SqlError
from sparkbus.roles.query.expressions import Expr, Literal, Param
from sparkbus.roles.query.plan import Filter, Scan
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, split, stores

TABLE = pa.table(
    {
        "k": pa.array(["a", "b", "a"]),
        "x": pa.array([1, 2, 5], pa.int64()),
        "b": pa.array([True, None, False]),
        "y": pa.array([float("nan"), -0.0, 2.5]),
    }
)


def run(sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1", "p2"])
    got = run_fragments(fragments, stores(split(TABLE, [1])), params)
    assert got is not None
    return [tuple(r.values()) for r in got.to_pylist()]


@pytest.mark.parametrize(
    ("where", "what"),
    [
        ("NULL", "an untyped NULL"),
        ("(NULL)", "an untyped NULL"),
        ("coalesce(NULL, NULL)", "an untyped NULL"),
        ("1", "a number"),
        ("-NULL", "a number"),
        ("x + 1", "a number"),
        ("'a'", "a STRING"),
        ("'true'", "a STRING"),
        ("upper(NULL)", "a STRING"),
        ("coalesce(NULL, 1)", "a number"),
    ],
)
def test_a_where_condition_the_text_shows_is_no_boolean_is_refused(where: str, what: str) -> None:
    with pytest.raises(SqlError) as caught:
        parse_sql(f"SELECT x FROM t WHERE {where}")
    assert caught.value.code is ErrorCode.PARSING
    assert f"is {what}" in caught.value.message and "not a BOOLEAN" in caught.value.message
    assert "FILTER_NOT_BOOLEAN" in caught.value.message


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("NULL AND x > 1", []),
        ("x > 1 AND NULL", []),
        ("NULL OR x > 1", [(2,), (5,)]),
        ("NOT NULL", []),
        ("NOT (NULL)", []),
        ("CAST(NULL AS BOOLEAN)", []),
        ("NULL = NULL", []),
        ("NULL IN (1, 2)", []),
        ("NULL LIKE 'a'", []),
        ("NULL BETWEEN 1 AND 2", []),
        ("NULL IS NULL", [(1,), (2,), (5,)]),
        ("b", [(1,)]),
        ("coalesce(NULL, b)", [(1,)]),
        ("CAST(x - 1 AS BOOLEAN)", [(2,), (5,)]),
    ],
)
def test_a_typed_null_in_a_where_condition_selects_no_rows(where: str, expected: list[tuple[int]]) -> None:
    assert run(f"SELECT x FROM t WHERE {where} ORDER BY x") == expected


@pytest.mark.parametrize(("value", "kind"), [(None, "VOID"), (1, "INT"), ("true", "STRING")])
def test_a_where_parameter_bound_to_no_boolean_is_refused(value: object, kind: str) -> None:
    with pytest.raises(QueryError) as caught:
        run("SELECT x FROM t WHERE ?", (value,))
    assert caught.value.code is ErrorCode.PARSING
    assert f"of type {kind}, not BOOLEAN" in caught.value.message


def test_a_where_parameter_bound_to_a_boolean_or_typed_by_its_context_is_taken() -> None:
    assert run("SELECT x FROM t WHERE ? ORDER BY x", (True,)) == [(1,), (2,), (5,)]
    assert run("SELECT x FROM t WHERE ? ORDER BY x", (False,)) == []
    assert run("SELECT x FROM t WHERE ? AND x > 1", (None,)) == []
    assert run("SELECT x FROM t WHERE NOT ?", (None,)) == []


def test_a_where_column_of_another_type_is_refused_by_the_scan() -> None:
    with pytest.raises(ExecutionError, match="a predicate must be boolean, got int64"):
        run("SELECT x FROM t WHERE x")


@pytest.mark.parametrize(
    ("predicate", "kind"),
    [(Literal(value=3), "int32"), (Literal(value="yes"), "string"), (Param(index=0), "int32")],
)
def test_a_plain_plan_filter_on_a_constant_of_another_type_is_refused(predicate: Expr, kind: str) -> None:
    """A plan built by hand (``client.query``) is not planned from SQL, so nothing refused ``Filter(3)``
    before it ran: the constant filtered every row out, an answer of no rows instead of an error."""
    store = engine.PartitionStore()
    store.load("t", TABLE)
    plan = Filter(input=Scan(table="t", columns=("x",)), predicate=predicate)
    with pytest.raises(ExecutionError, match=f"a predicate must be boolean, got {kind}"):
        engine.run(plan, store, (7,), None)
    for ok, rows in ((Literal(value=True), 3), (Literal(value=None), 0), (Param(index=0), 0)):
        assert engine.run(Filter(input=plan.input, predicate=ok), store, (None,), None).num_rows == rows


GROUPS = "SELECT k, count(*) AS c FROM t GROUP BY k HAVING {} ORDER BY k"
ALL = [("a", 2), ("b", 1)]


@pytest.mark.parametrize(
    ("having", "expected"),
    [
        ("NULL", []),
        ("(NULL)", []),
        ("NOT NULL", []),
        ("NULL AND count(*) > 1", []),
        ("NULL OR count(*) > 1", [("a", 2)]),
        ("CAST(NULL AS BOOLEAN)", []),
        ("coalesce(NULL, NULL)", []),
        ("-NULL", []),
        ("upper(NULL)", []),
        ("1", ALL),
        ("0", []),
        ("'true'", ALL),
        ("' No '", []),
        ("count(*) - 1", [("a", 2)]),
        ("avg(x) - 3", [("b", 1)]),
        ("c", ALL),
        ("max(b)", [("a", 2)]),
    ],
)
def test_a_having_condition_that_is_no_predicate_is_cast_to_boolean(
    having: str, expected: list[tuple[object, ...]]
) -> None:
    assert run(GROUPS.format(having)) == expected


def test_having_without_group_by_and_having_parameters() -> None:
    assert run("SELECT count(*) AS c FROM t HAVING NULL") == []
    assert run("SELECT count(*) AS c FROM t HAVING 1") == [(3,)]
    assert run(GROUPS.format("?"), (None,)) == []
    assert run(GROUPS.format("?"), (1,)) == ALL


@pytest.mark.parametrize("having", ["'a'", "max(k)", "k"])
def test_a_having_string_that_is_no_boolean_fails_as_sparks_cast(having: str) -> None:
    with pytest.raises(ExecutionError, match="the value 'a' of the type STRING cannot be cast to BOOLEAN"):
        run(GROUPS.format(having))


def test_cast_to_boolean_reads_numbers_and_strings_as_spark() -> None:
    got = run(
        "SELECT CAST(' true ' AS BOOLEAN) AS a, CAST('\tYes\n' AS BOOLEAN) AS b, CAST('0' AS BOOLEAN) AS c, "
        "CAST('N' AS BOOLEAN) AS d, CAST(y AS BOOLEAN) AS e, CAST(-0.0 AS BOOLEAN) AS f, "
        "CAST(x - 1 AS BOOLEAN) AS g, CAST(NULL AS BOOLEAN) AS h, CAST(b AS BOOLEAN) AS i FROM t ORDER BY x"
    )
    assert [r[:4] for r in got] == [(True, True, False, False)] * 3
    assert [r[4:] for r in got] == [
        (True, False, False, None, True),
        (False, False, True, None, None),
        (True, False, True, None, False),
    ]
    for text in ("'off'", "''", "'2'", "'1.0'", "'\u00a0true'"):
        with pytest.raises(ExecutionError, match="cannot be cast to BOOLEAN because it is malformed"):
            run(f"SELECT CAST({text} AS BOOLEAN) AS v FROM t")


@pytest.mark.parametrize(
    ("sql", "refusal"),
    [
        ("SELECT CAST(x AS BINARY) AS v FROM t", "CAST to BINARY is not supported"),
        ("SELECT CAST(x AS ARRAY<INT>) AS v FROM t", "CAST to ARRAY<INT> is not supported"),
        ("SELECT CAST(x AS DECIMAL(39,0)) AS v FROM t", r"CAST to DECIMAL\(39, 0\) is not supported"),
        ("SELECT CAST(x AS DECIMAL(5,6)) AS v FROM t", r"CAST to DECIMAL\(5, 6\) is not supported"),
        ("SELECT TRY_CAST(x AS BOOLEAN) AS v FROM t", "TRY_CAST is not supported"),
        ("SELECT x FROM t WHERE CAST(NULL AS INT)", "is a number, not a BOOLEAN"),
        ("SELECT x FROM t WHERE CAST(x AS STRING)", "is a STRING, not a BOOLEAN"),
    ],
)
def test_other_casts_are_refused(sql: str, refusal: str) -> None:
    with pytest.raises(SqlError, match=refusal):
        parse_sql(sql)
