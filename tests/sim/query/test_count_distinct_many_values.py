"""COUNT(DISTINCT x) over more distinct values than one batch can hold, under push.

A participant's partial state of a COUNT(DISTINCT) is one row per distinct value (beside one row per
group), so it streams in batches under the batch limit however many values there are; a state that held
every value of a group in one row would exceed 40 % of the edge credit past about 52k BIGINTs and fail
the query. The expected answers are plain counts of the loaded data, as Spark SQL gives them.
"""

from __future__ import annotations

from .cluster import Cluster

ROWS = 120_000  # x = 0 .. ROWS-1: 60,000 distinct values on each of p1 and p2


def test_global_count_distinct_of_many_values_is_answered() -> None:
    c = Cluster(1, rows=ROWS)
    got, err = c.outcome(c.execute("SELECT count(DISTINCT x) AS d, count(*) AS n FROM t"), limit=120)
    assert err is None, err
    assert got is not None and got.to_pylist() == [{"d": ROWS, "n": ROWS}]


def test_grouped_count_distinct_of_many_values_is_answered_under_repartition() -> None:
    # k cycles a, b, c, NULL: 4 groups of 120,000 distinct x each, 60,000 of them on each participant.
    c = Cluster(1, rows=4 * ROWS)
    sql = "SELECT k, count(DISTINCT x) AS d, count(DISTINCT k) AS e FROM t GROUP BY k ORDER BY k"
    for repartition in (False, True):
        got, err = c.outcome(c.execute(sql, repartition=repartition), limit=120)
        assert err is None, err
        assert got is not None
        assert got.to_pylist() == [
            {"k": None, "d": ROWS, "e": 0},
            {"k": "a", "d": ROWS, "e": 1},
            {"k": "b", "d": ROWS, "e": 1},
            {"k": "c", "d": ROWS, "e": 1},
        ]
