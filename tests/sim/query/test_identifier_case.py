"""Seeded simulations: column, alias and table names compare case-insensitively, as in Spark SQL.

Spark's default (``spark.sql.caseSensitive=false``) resolves a name whatever its case; an output keeps the
select list's spelling. The expected rows are PySpark 4.3's over the same data (the cluster's table ``t``:
x = 0..7, k cycling 'a', 'b', 'c', NULL, y = x / 2).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from .cluster import Cluster

# (sql, Spark's rows)
QUERIES: list[tuple[str, list[dict[str, object]]]] = [
    ("SELECT -x AS X FROM t ORDER BY x", [{"X": -v} for v in range(7, -1, -1)]),
    ("SELECT X FROM t ORDER BY x", [{"X": v} for v in range(8)]),
    ("SELECT count(*) AS n FROM T", [{"n": 8}]),
    ("SELECT `x` FROM t WHERE `K` = 'a' ORDER BY x", [{"x": 0}, {"x": 4}]),
    ("SELECT x AS v FROM t ORDER BY V DESC LIMIT 3", [{"v": 7}, {"v": 6}, {"v": 5}]),
    (
        "SELECT * FROM t ORDER BY X DESC LIMIT 2",
        [{"k": None, "x": 7, "y": 3.5}, {"k": "c", "x": 6, "y": 3.0}],
    ),
    ("SELECT * FROM T WHERE X < 2 ORDER BY Y", [{"k": "a", "x": 0, "y": 0.0}, {"k": "b", "x": 1, "y": 0.5}]),
    ("SELECT T.X AS a FROM t AS T ORDER BY A LIMIT 2", [{"a": 0}, {"a": 1}]),
    ("SELECT max(Y) AS m FROM t WHERE K IN ('a', 'b')", [{"m": 2.5}]),
]
GROUPED: list[tuple[str, list[dict[str, object]]]] = [
    (
        "SELECT K, count(*) AS n FROM t GROUP BY k ORDER BY K",
        [{"K": k, "n": 2} for k in (None, "a", "b", "c")],
    ),
    (
        "SELECT k, count(*) AS n FROM t GROUP BY K ORDER BY k",
        [{"k": k, "n": 2} for k in (None, "a", "b", "c")],
    ),
    (
        "SELECT k, sum(x) AS S FROM t GROUP BY k HAVING s > 6 ORDER BY k",
        [{"k": None, "S": 10}, {"k": "c", "S": 8}],
    ),
]


@pytest.mark.parametrize("seed", [1, 2])
def test_names_in_another_case_mean_the_same_column_output_and_table(seed: int) -> None:
    c = Cluster(seed, rows=8)
    for sql, spark in QUERIES:
        got, err = c.outcome(c.execute(sql))
        assert err is None and got is not None, (sql, err)
        assert got.to_pylist() == spark, sql
    for sql, spark in GROUPED:
        for repartition in (False, True):
            got, err = c.outcome(c.execute(sql, repartition=repartition))
            assert err is None and got is not None, (sql, err)
            assert got.to_pylist() == spark, sql
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


def test_a_name_two_columns_match_is_ambiguous() -> None:
    c = Cluster(1, rows=8)
    for node in ("p1", "p2"):
        c.load(node, pa.table({"x": pa.array([1], pa.int64()), "X": pa.array([2], pa.int64())}), name="dup")
    got, err = c.outcome(c.execute("SELECT * FROM dup"))
    assert err is None and got is not None and got.column_names == ["x", "X"]
    for sql in ("SELECT x FROM dup", "SELECT count(*) AS n FROM dup WHERE X = 1"):
        got, err = c.outcome(c.execute(sql))
        assert got is None and err is not None, sql
        assert err.startswith("[2000 DATA_EXCEPTION]") and "column name " in err and "is ambiguous" in err, (
            err
        )


def test_outputs_that_differ_only_in_case_are_refused() -> None:
    c = Cluster(1, rows=8)
    got, err = c.outcome(c.execute("SELECT x AS a, x AS A FROM t"))
    assert got is None and err is not None
    assert err.startswith("[1005 PARSING] duplicate or reserved output name 'A'; use AS"), err
