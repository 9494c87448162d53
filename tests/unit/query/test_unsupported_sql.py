"""SQL outside the subset is refused with PARSING, naming the part, instead of being answered as if the part
were not there: sqlglot parses much more than the subset, and a part the translation did not read was
silently dropped (GROUP BY ... WITH ROLLUP answered without its total row, TABLESAMPLE with every row)."""

from __future__ import annotations

import pytest

from sparkbus.roles.query.errors import ErrorCode, SqlError
from sparkbus.roles.query.plan import Scan, Sort, SortKey
from sparkbus.roles.query.sql import parse_sql


@pytest.mark.parametrize(
    ("sql", "reason", "at"),
    [
        (
            "SELECT k, count(*) AS c FROM t GROUP BY k WITH ROLLUP",
            "GROUP BY WITH ROLLUP is not supported",
            None,
        ),
        ("SELECT k, count(*) AS c FROM t GROUP BY k WITH CUBE", "GROUP BY WITH CUBE is not supported", None),
        ("SELECT k, count(*) AS c FROM t GROUP BY ALL", "GROUP BY ALL is not supported", None),
        (
            "SELECT x FROM t TABLESAMPLE (1 ROWS)",
            "TABLESAMPLE (1 ROWS) in FROM is not supported",
            "TABLESAMPLE (1 ROWS)",
        ),
        (
            "SELECT k FROM t PIVOT (sum(x) FOR y IN (1.0, 2.0))",
            "in FROM is not supported",
            "PIVOT (sum(x) FOR y IN (1.0, 2.0))",
        ),
        (
            "SELECT k FROM t UNPIVOT (v FOR c IN (x, y))",
            "in FROM is not supported",
            "UNPIVOT (v FOR c IN (x, y))",
        ),
        ("SELECT x FROM t VERSION AS OF 1", "VERSION AS OF 1 in FROM is not supported", "VERSION AS OF 1"),
        ("SELECT a FROM t u (a, b)", "a table alias that renames columns is not supported", "u (a, b)"),
        ("SELECT count(x, k) AS c FROM t", "COUNT of more than one argument is not supported", "count(x, k)"),
        ("SELECT max(x, y) AS m FROM t", "MAX of more than one argument is not supported", "max(x, y)"),
        (
            "SELECT k, min(x, y) AS m FROM t GROUP BY k",
            "MIN of more than one argument is not supported",
            "min(x, y)",
        ),
        ("SELECT x FROM t ORDER BY x WITH FILL", "ORDER BY ... WITH FILL is not supported", "x WITH FILL"),
        (
            "SELECT x FROM t WHERE x BETWEEN SYMMETRIC 3 AND 1",
            "BETWEEN with SYMMETRIC is not supported",
            "x BETWEEN SYMMETRIC 3 AND 1",
        ),
        ("SELECT x FROM t WHERE x = :p", "named parameters (:p) are not supported; use ?", None),
        ("SELECT db.t.x FROM t", "COLUMN with DB is not supported", "db.t.x"),
        ("SELECT * EXCEPT (x) FROM t", "* with EXCEPT is not supported", "* EXCEPT (x)"),
        ("SELECT DISTINCT x FROM t", "DISTINCT is not supported; use GROUP BY", None),
        ("SELECT x FROM c.db.t", "FROM takes one table name", "c.db.t"),
        # a token sqlglot reads as a number (Spark reads `1e` as a name): GENERIC "ValueError" before
        ("SELECT count(*) AS n FROM t WHERE x = 1e", "malformed number 1e", "1e"),
        ("SELECT x FROM t WHERE x > 1.e", "malformed number 1.e", "1.e"),
        # t.* is read only as the whole select list; it failed at run time ("no column '*'")
        ("SELECT t.*, x FROM t", "* must be the only item of the select list", "t.*"),
        ("SELECT count(t.*) FROM t", "t.* is supported only as the whole select list", "t.*"),
        ("SELECT u.* FROM t", "unknown table 'u' (the query reads 't')", "u.*"),
        ("SELECT t.* EXCEPT (x) FROM t", "* with EXCEPT is not supported", "t.*"),
        ("SELECT db.t.* FROM t", "* qualified by a database is not supported", "db.t.*"),
        ("SELECT t.* FROM t GROUP BY k", "SELECT * cannot be aggregated", "t.*"),
    ],
)
def test_a_part_outside_the_subset_is_refused(sql: str, reason: str, at: str | None) -> None:
    with pytest.raises(SqlError) as caught:
        parse_sql(sql)
    error = caught.value
    assert error.code is ErrorCode.PARSING and reason in error.reason, error.reason
    if at is not None:  # the pointer is inside the part (sqlglot keeps the positions of some tokens only)
        assert error.start is not None and sql.index(at) <= error.start < sql.index(at) + len(at)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT x FROM t WHERE k NOT LIKE 'a%' AND x IN (1, 2) AND x IS NOT NULL AND NOT (x = 1) AND TRUE",
        "SELECT nvl(x, 0) AS a, ifnull(x, 1) AS b, coalesce(x, 2, 3) AS c, x / 2 AS h FROM t",
        "SELECT u.x FROM t AS u WHERE u.x BETWEEN ? AND 3 ORDER BY x DESC NULLS FIRST",
        "SELECT k, count(DISTINCT x) AS d, count(*) AS n, count(1) AS o, count(x) AS p FROM t GROUP BY k",
    ],
)
def test_the_subset_itself_still_parses(sql: str) -> None:
    parse_sql(sql)


@pytest.mark.parametrize(("order", "at"), [("1", "1"), ("2 DESC", "2"), ("x + 1", "x + 1")])
def test_select_star_orders_by_column_names_only(order: str, at: str) -> None:
    # The output columns are the table's, unknown when the text is parsed; ORDER BY 1 failed at run time
    # with "[-1 GENERIC] execute: IndexError".
    sql = f"SELECT * FROM t ORDER BY {order}"
    with pytest.raises(SqlError) as caught:
        parse_sql(sql)
    assert caught.value.reason == "with SELECT *, ORDER BY takes column names, not positions or expressions"
    assert caught.value.start == sql.index(at, len("SELECT * FROM t"))


def test_select_star_orders_by_a_column_name() -> None:
    assert parse_sql("SELECT * FROM t ORDER BY x DESC, t.k") == Sort(
        input=Scan(table="t"),
        keys=(
            SortKey(column="x", descending=True, nulls_first=False),
            SortKey(column="k", descending=False, nulls_first=True),
        ),
    )


@pytest.mark.parametrize(
    "sql", ["SELECT t.* FROM t", "SELECT T.* FROM t", "SELECT a.* FROM t a", "SELECT * FROM t"]
)
def test_a_star_qualified_by_the_table_reads_every_column(sql: str) -> None:
    assert parse_sql(f"{sql} ORDER BY x") == Sort(input=Scan(table="t"), keys=(SortKey(column="x"),))
