"""Seeded simulations: ``t.*`` reads every column, as Spark SQL's does (PySpark 4.3 gives the rows below for
the cluster's table: x = 0..7, k cycling 'a', 'b', 'c', NULL, y = x / 2)."""

from __future__ import annotations

import pytest

from .cluster import Cluster


@pytest.mark.parametrize("seed", [1, 2])
def test_a_star_qualified_by_the_table_or_its_alias_answers_every_column(seed: int) -> None:
    c = Cluster(seed, rows=8)
    spark = [{"k": "a", "x": 0, "y": 0.0}, {"k": "b", "x": 1, "y": 0.5}]
    for sql in (
        "SELECT t.* FROM t WHERE x < 2 ORDER BY x",
        "SELECT T.* FROM t WHERE x < 2 ORDER BY x",
        "SELECT a.* FROM t a WHERE a.x < 2 ORDER BY x",
        "SELECT t.* FROM t ORDER BY x LIMIT 2",
    ):
        got, err = c.outcome(c.execute(sql))
        assert err is None and got is not None, (sql, err)
        assert got.to_pylist() == spark, sql
    got, err = c.outcome(c.execute("SELECT count(*) AS n FROM t WHERE x = 1e"))
    assert got is None and err is not None and err.startswith("[1005 PARSING] malformed number 1e"), err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
