"""GROUP BY resolves names as Spark SQL does (``spark.sql.groupByAliases``, on by default): an unqualified
name is the table's column when the table has one, else the select list's alias of that name, also inside an
expression. Which it is takes the table's columns, given to ``parse_sql``. The expected rows are Spark SQL's
(PySpark 4) answers to the same text over the same rows."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError, SqlError
from sparkbus.roles.query.plan import Scan, chain
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import Columns, parse_sql

from .helpers import run_fragments, split, stores

#: a table without a column named like the aliases below
PLAIN = pa.table({"x": pa.array([1, 2, 3, 4, 5], pa.int32()), "k": pa.array(["a", "b", "a", "c", None])})
#: the same with a column p, which GROUP BY p means before any alias p
WITH_P = PLAIN.append_column("p", pa.array([10, 11, 12, 13, 14], pa.int32()))


def schema(table: pa.Table) -> dict[str, list[str]]:
    return {"t": table.column_names}


def rows(
    sql: str, table: pa.Table = PLAIN, *, ordered: bool = False, known: bool = True
) -> list[tuple[object, ...]]:
    plan = parse_sql(sql, schema(table).get if known else None)
    got = run_fragments(
        plan_fragments(plan, initiator="i", participants=["p1", "p2"]), stores(split(table, [2]))
    )
    assert got is not None
    out = [tuple(r.values()) for r in got.to_pylist()]
    return out if ordered else sorted(out, key=repr)


def refused(sql: str, table: pa.Table = PLAIN) -> SqlError:
    with pytest.raises(SqlError) as caught:
        parse_sql(sql, schema(table).get)
    assert caught.value.code is ErrorCode.PARSING
    return caught.value


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p", [(0, 2), (1, 3)]),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY P", [(0, 2), (1, 3)]),  # in any case
        ("SELECT x % 2 AS P, count(*) AS n FROM t GROUP BY p", [(0, 2), (1, 3)]),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY (p)", [(0, 2), (1, 3)]),
        ("SELECT x % 2 AS p FROM t GROUP BY p", [(0,), (1,)]),
        ("SELECT k AS kk, count(*) AS n FROM t GROUP BY kk", [("a", 2), ("b", 1), ("c", 1), (None, 1)]),
        (
            "SELECT coalesce(k, 'none') AS kk, count(*) AS n FROM t GROUP BY kk",
            [("a", 2), ("b", 1), ("c", 1), ("none", 1)],
        ),
        ("SELECT 1 AS p, count(*) AS n FROM t GROUP BY p", [(1, 5)]),
        ("SELECT x % 2 AS p, sum(x) AS s, avg(x) AS a FROM t GROUP BY p", [(0, 6, 3.0), (1, 9, 3.0)]),
        ("SELECT x % 3 AS p, count(*) AS n FROM t WHERE x > 1 GROUP BY p", [(0, 1), (1, 1), (2, 2)]),
        # beside a column, an ordinal, and the alias inside a larger expression
        (
            "SELECT x % 2 AS p, k, count(*) AS n FROM t GROUP BY p, k",
            [(0, "b", 1), (0, "c", 1), (1, "a", 2), (1, None, 1)],
        ),
        (
            "SELECT x % 2 AS p, k, count(*) AS n FROM t GROUP BY p, 2",
            [(0, "b", 1), (0, "c", 1), (1, "a", 2), (1, None, 1)],
        ),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p, P + 1", [(0, 2), (1, 3)]),
        ("SELECT 1 AS p, count(*) AS n FROM t GROUP BY p + x", [(1, 1)] * 5),
        # HAVING and ORDER BY still mean the output p, here the group key
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p HAVING P = 0", [(0, 2)]),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p HAVING n > 2", [(1, 3)]),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p HAVING x % 2 = 0", [(0, 2)]),
        ("SELECT x % 2 AS p, sum(x) AS s FROM t GROUP BY p HAVING sum(x) > 6", [(1, 9)]),
    ],
)
def test_a_name_the_table_has_no_column_of_groups_by_the_alias(
    sql: str, expected: list[tuple[object, ...]]
) -> None:
    assert rows(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p ORDER BY p + 0 DESC",
        "SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p ORDER BY x % 2 DESC",
        "SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p ORDER BY 1 DESC",
    ],
)
def test_order_by_sorts_by_the_alias_grouped_by(sql: str) -> None:
    assert rows(sql, ordered=True) == [(1, 3), (0, 2)]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1 AS p, count(*) AS n FROM t GROUP BY p", [(1, 1)] * 5),  # by the column: five groups
        ("SELECT count(*) AS p FROM t GROUP BY p", [(1,)] * 5),  # an aggregate alias, but the column wins
        ("SELECT upper(k) AS k, count(*) AS n FROM t GROUP BY k", [("A", 2), ("B", 1), ("C", 1), (None, 1)]),
        (
            "SELECT upper(k) AS k, count(*) AS n FROM t GROUP BY upper(k)",
            [("A", 2), ("B", 1), ("C", 1), (None, 1)],
        ),
    ],
)
def test_a_column_of_the_name_comes_before_the_alias(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert rows(sql, WITH_P) == expected


@pytest.mark.parametrize(
    ("sql", "table", "name"),
    [
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p", WITH_P, "p"),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY P", WITH_P, "P"),
        ("SELECT x AS k, count(*) AS n FROM t GROUP BY k", PLAIN, "k"),
        ("SELECT x % 2 AS k, count(*) AS n FROM t GROUP BY upper(k)", PLAIN, "k"),
    ],
)
def test_an_alias_the_column_hides_leaves_its_expression_ungrouped(
    sql: str, table: pa.Table, name: str
) -> None:
    # Spark: MISSING_AGGREGATION, 'The non-aggregating expression "x" is based on columns which are not
    # participating in the GROUP BY clause'
    error = refused(sql, table)
    assert error.reason == (
        f"column 'x' must appear in GROUP BY or inside an aggregate; GROUP BY {name} means the column {name} of "
        "table t, which comes before the select list's alias, as in Spark: group by the alias's expression or "
        "its position"
    )


@pytest.mark.parametrize(
    ("sql", "name", "alias"),
    [
        ("SELECT count(*) AS c FROM t GROUP BY c", "c", "COUNT(*)"),
        ("SELECT sum(x) + 1 AS c FROM t GROUP BY c", "c", "SUM(x) + 1"),
        ("SELECT count(*) AS c FROM t GROUP BY c + 1", "c", "COUNT(*)"),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY N", "N", "COUNT(*)"),
    ],
)
def test_an_alias_of_an_aggregate_is_refused(sql: str, name: str, alias: str) -> None:
    # Spark: GROUP_BY_AGGREGATE, "Aggregate functions are not allowed in GROUP BY, but found count(1)"
    error = refused(sql)
    assert error.reason == f"GROUP BY cannot hold an aggregate: {name} is the select list's alias of {alias}"
    assert error.start == sql.rindex(name)


def test_an_alias_used_inside_a_larger_expression_does_not_group_the_alias_itself() -> None:
    # Spark groups by (x % 2) + 1 and then refuses the select item x % 2 (MISSING_AGGREGATION)
    error = refused("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p + 1")
    assert error.reason == "column 'x' must appear in GROUP BY or inside an aggregate"


def test_a_qualified_name_is_never_an_alias() -> None:
    error = refused("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY t.p")
    assert error.reason == "column 'x' must appear in GROUP BY or inside an aggregate"


def test_a_name_that_is_neither_column_nor_alias_still_fails_as_before() -> None:
    # Spark: UNRESOLVED_COLUMN; here the scan finds no such column, as it did before aliases were grouped by
    plan = parse_sql("SELECT count(*) AS n FROM t GROUP BY zz", schema(PLAIN).get)
    with pytest.raises(ExecutionError, match="no column 'zz'"):
        engine.run(plan, stores([PLAIN])[0])
    error = refused("SELECT x, count(*) AS n FROM t GROUP BY zz")
    assert error.reason == "column 'x' must appear in GROUP BY or inside an aggregate"


def test_the_columns_are_asked_only_for_a_name_an_alias_has() -> None:
    asked: list[str] = []

    def columns(table: str) -> Sequence[str]:
        asked.append(table)
        return PLAIN.column_names

    parse_sql("SELECT k, count(*) AS kk FROM T GROUP BY k", columns)
    parse_sql("SELECT k AS kk, count(*) AS n FROM T GROUP BY 1", columns)
    assert asked == []
    parse_sql("SELECT k AS kk, count(*) AS n FROM T GROUP BY kk", columns)
    assert asked == ["T"]


def scan_of(sql: str, columns: Columns | None = None) -> Scan:
    leaf = chain(parse_sql(sql, columns))[0]
    assert isinstance(leaf, Scan)
    return leaf


@pytest.mark.parametrize("columns", [None, lambda table: None])
def test_without_the_columns_the_name_is_the_alias_and_the_scan_names_it(columns: Columns | None) -> None:
    sql = "SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p"
    assert scan_of(sql, columns).group_aliases == ("p",)
    assert rows(sql, known=False) == rows(sql) == [(0, 2), (1, 3)]
    # with the columns known, the alias needs no check: the plan was made for them
    assert scan_of(sql, schema(PLAIN).get).group_aliases == ()


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ("SELECT x % 2 AS P, count(*) AS n FROM t GROUP BY p", ("p",)),  # folded, as every name of a plan
        ("SELECT x % 2 AS p, k AS q, count(*) AS n FROM t GROUP BY p, Q, p + 1", ("p", "q")),
        ("SELECT 1 AS p, count(*) AS n FROM t GROUP BY p + x", ("p",)),
        # an alias that reads a column of its own name: the table has that column, which GROUP BY means
        ("SELECT x AS X, count(*) AS n FROM t GROUP BY x", ()),
        ("SELECT t.x AS x, count(*) AS n FROM t GROUP BY x", ()),
        ("SELECT upper(k) AS k, count(*) AS n FROM t GROUP BY k", ()),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p, upper(K)", ("p",)),
        ("SELECT x % 2 AS p, upper(K) AS k, count(*) AS n FROM t GROUP BY p, k", ("p",)),
        # the alias of an aggregate cannot be grouped by: only the column can be meant
        ("SELECT count(*) AS p FROM t GROUP BY p", ()),
        # a qualified name, an ordinal and a name no alias has are never aliases
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY t.p, x", ()),
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY 1", ()),
        ("SELECT k, count(*) AS n FROM t GROUP BY k", ()),
    ],
)
def test_the_scan_names_every_alias_read_without_the_columns(sql: str, names: tuple[str, ...]) -> None:
    assert scan_of(sql).group_aliases == names


@pytest.mark.parametrize(
    ("sql", "table", "column"),
    [
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p", WITH_P, "p"),
        ("SELECT 1 AS p, count(*) AS n FROM t GROUP BY p", WITH_P, "p"),  # Spark: five groups, by the column
        ("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p", PLAIN.append_column("P", PLAIN["x"]), "P"),
        ("SELECT x AS k, count(*) AS n FROM t GROUP BY k", PLAIN, "k"),
    ],
)
def test_a_partition_with_a_column_of_the_name_refuses_the_alias(
    sql: str, table: pa.Table, column: str
) -> None:
    with pytest.raises(QueryError) as caught:
        rows(sql, table, known=False)
    error = caught.value
    assert error.code is ErrorCode.PARSING and not isinstance(error, ExecutionError)
    name = column.lower()
    assert error.message == (
        f"GROUP BY {name} was planned as the select list's alias {name} by a node that holds no partition of "
        f"table t, but table t has a column {column}, which GROUP BY {name} means before the alias, as in "
        "Spark: group by the alias's expression or its position (or qualify the name for the column)"
    )


def test_the_refusal_comes_before_any_row_is_read() -> None:
    # a predicate that fails on every row of the partition: the refusal is what the participant reports
    sql = "SELECT x % 2 AS p, count(*) AS n FROM t WHERE x / 0 > 1 GROUP BY p"
    with pytest.raises(QueryError) as caught:
        engine.run(parse_sql(sql), stores([WITH_P])[0])
    assert caught.value.code is ErrorCode.PARSING and "has a column p" in caught.value.message


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT upper(k) AS k, count(*) AS n FROM t GROUP BY k",  # Spark: by the column k, four groups
        "SELECT upper(k) AS K, count(*) AS n FROM t GROUP BY k HAVING k = 'a'",  # HAVING's k: the key k
        "SELECT x AS x, count(*) AS n FROM t GROUP BY x",
    ],
)
def test_an_alias_reading_its_own_name_is_the_column_without_the_columns(sql: str) -> None:
    assert rows(sql, known=False) == rows(sql)


def test_the_alias_of_an_aggregate_stays_the_column_without_the_columns() -> None:
    sql = "SELECT count(*) AS p FROM t GROUP BY p"
    assert rows(sql, WITH_P, known=False) == [(1,)] * 5  # as Spark: by the column
    with pytest.raises(ExecutionError, match="no column 'p'"):  # Spark: GROUP_BY_AGGREGATE
        rows(sql, known=False)


def test_the_plan_follows_the_columns_given() -> None:
    sql = "SELECT 1 AS p, count(*) AS n FROM t GROUP BY p"
    assert parse_sql(sql, schema(PLAIN).get) != parse_sql(sql, schema(WITH_P).get)
    assert parse_sql(sql, schema(PLAIN).get) == parse_sql(sql, schema(PLAIN).get)
