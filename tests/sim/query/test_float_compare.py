"""Seeded simulations: comparisons of DOUBLE values give Spark SQL's answers.

Spark compares NaN as equal to itself and above every other double, and -0.0 as equal to 0.0, IN
included; comparisons with NULL stay NULL. The expected answers are PySpark 4.3's (ANSI mode) over the
same rows, built in memory (a Parquet scan with pushed-down filters answers ``y = 0.0`` without the -0.0
row, its own bug).
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from .cluster import Cluster

SEEDS = [1, 2, 3]
ROWS = pa.table(
    {
        "x": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "y": pa.array([math.nan, 1e10, 4.0, -0.0, 0.5, None], pa.float64()),
        "g": pa.array([1, 1, 2, 3, 3, 4], pa.int64()),
    }
)

# (sql, Spark's x values, sorted)
FILTERS = [
    ("SELECT x FROM t WHERE y > 2", [1, 2, 3]),
    ("SELECT x FROM t WHERE y >= 4.0", [1, 2, 3]),
    ("SELECT x FROM t WHERE y = y", [1, 2, 3, 4, 5]),
    ("SELECT x FROM t WHERE y <> y", []),
    ("SELECT x FROM t WHERE y < y", []),
    ("SELECT x FROM t WHERE y <= y", [1, 2, 3, 4, 5]),
    ("SELECT x FROM t WHERE y < 1e20", [2, 3, 4, 5]),
    ("SELECT x FROM t WHERE NOT (y < 5)", [1, 2]),
    ("SELECT x FROM t WHERE y BETWEEN 1 AND 1e300", [2, 3]),
    ("SELECT x FROM t WHERE (y = y) IS NULL", [6]),
    ("SELECT x FROM t WHERE (y > 2) IS NULL", [6]),
    ("SELECT x FROM t WHERE y = 0.0", [4]),
    ("SELECT x FROM t WHERE y IN (0.0, 1e10)", [2, 4]),
    ("SELECT x FROM t WHERE y NOT IN (0.0, 1e10)", [1, 3, 5]),
    ("SELECT x FROM t WHERE y IN (0.0, NULL)", [4]),
]


def _cluster(seed: int) -> Cluster:
    c = Cluster(seed)
    for node, part in (("p1", ROWS.slice(0, 3)), ("p2", ROWS.slice(3))):
        c.load(node, part, name="f")
    return c


@pytest.mark.parametrize("seed", SEEDS)
def test_double_comparisons_match_spark(seed: int) -> None:
    c = _cluster(seed)
    for sql, spark in FILTERS:
        got, err = c.outcome(c.execute(sql.replace("FROM t", "FROM f")))
        assert err is None and got is not None, (sql, err)
        assert sorted(got.column("x").to_pylist()) == spark, sql
    got, err = c.outcome(c.execute("SELECT count(*) AS n FROM f WHERE y > 2"))
    assert got is not None and got.to_pylist() == [{"n": 3}], err
    got, err = c.outcome(c.execute("SELECT x FROM f WHERE y > -1 ORDER BY y DESC LIMIT 3"))
    assert got is not None and got.column("x").to_pylist() == [1, 2, 3], err
    for repartition in (False, True):
        sql = "SELECT g, sum(y) AS s FROM f GROUP BY g HAVING sum(y) > 0"
        got, err = c.outcome(c.execute(sql, repartition=repartition))
        assert got is not None, err
        sums = {r["g"]: r["s"] for r in got.to_pylist()}
        assert sums.keys() == {1, 2, 3} and math.isnan(sums[1]) and (sums[2], sums[3]) == (4.0, 0.5)
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


# FLOAT (float32) beside DOUBLE literals: Spark widens the FLOAT to DOUBLE, in IN as in `=`, so 0.1f
# (0.10000000149...) is not 0.1. (sql, Spark's count over f = CAST(0.1 AS FLOAT), 1.5, 2.0)
FLOAT_FILTERS = [
    ("f = 0.1", 0),
    ("f IN (0.1)", 0),
    ("f IN (0.1, 1.5)", 1),
    ("f NOT IN (0.1)", 3),
    ("f IN (1.5, 2)", 2),
    ("f = 1.5", 1),
    ("coalesce(f, 0.1) = 0.1", 0),
]


def test_float_compares_with_doubles_as_double() -> None:
    c = Cluster(1, rows=8)
    c.load("p1", pa.table({"f": pa.array([0.1, 1.5], pa.float32())}), name="ft")
    c.load("p2", pa.table({"f": pa.array([2.0], pa.float32())}), name="ft")
    for where, spark in FLOAT_FILTERS:
        got, err = c.outcome(c.execute(f"SELECT count(*) AS n FROM ft WHERE {where}"))
        assert err is None and got is not None, (where, err)
        assert got.to_pylist() == [{"n": spark}], where
