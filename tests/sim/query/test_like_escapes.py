"""Seeded simulations: LIKE patterns with the escape character (a backslash) match as in Spark SQL, and the
patterns Spark refuses are refused.

In SQL text ``'%\\\\\\\\'`` is the pattern ``%\\\\``: text ending with one backslash. The expected counts are
PySpark 4's over the same rows (``tests/spark/test_query_matches_spark.py`` compares them with Spark).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from .cluster import Cluster

S = ["a\\", "\\", "x", "a\\b", None, "a.b", "a%b", "a_b", "(a)\n\\"]


def _cluster(seed: int) -> Cluster:
    c = Cluster(seed, rows=8)
    half = len(S) // 2
    for node, part in (("p1", S[:half]), ("p2", S[half:])):
        c.load(node, pa.table({"s": pa.array(part, pa.string())}), name="w")
    return c


def _count(c: Cluster, where: str, parameters: list[object] | None = None) -> int:
    args = {"parameters": parameters} if parameters is not None else {}
    got, err = c.outcome(c.execute(f"SELECT count(*) AS n FROM w WHERE {where}", **args))
    assert err is None and got is not None, err
    return int(got.column("n")[0].as_py())


@pytest.mark.parametrize("seed", [1, 2])
def test_an_escaped_backslash_percent_or_underscore_is_literal(seed: int) -> None:
    c = _cluster(seed)
    assert _count(c, "s LIKE '%\\\\\\\\'") == 3  # ends with a backslash: 'a\', '\', '(a)\n\'
    assert _count(c, "s LIKE '%\\\\\\\\b'") == 1
    assert _count(c, "s NOT LIKE '%\\\\\\\\'") == 5  # NULL is in neither
    assert _count(c, "NOT s LIKE '%\\\\\\\\'") == 5
    assert _count(c, "s LIKE 'a\\\\%b'") == 1  # a literal %, not 'a.b' or 'a_b'
    assert _count(c, "s LIKE 'a\\\\_b'") == 1
    assert _count(c, "s LIKE '(_)_\\\\\\\\'") == 1  # regex characters stay literal, _ takes a newline
    assert _count(c, "s LIKE '%.%' AND s LIKE '%\\\\\\\\%'") == 0
    assert _count(c, "s IS NULL AND s LIKE '%\\\\\\\\'") == 0
    got, err = c.outcome(
        c.execute("SELECT s LIKE '%\\\\\\\\' AS m FROM w WHERE s IS NULL OR s = 'x' ORDER BY s")
    )
    assert err is None and got is not None and got.column("m").to_pylist() == [None, False], err


@pytest.mark.parametrize("seed", [1, 2])
def test_a_parameter_pattern_is_translated_and_checked_as_a_literal_one(seed: int) -> None:
    c = _cluster(seed)
    assert _count(c, "s LIKE ?", ["%\\\\"]) == 3
    assert _count(c, "s NOT LIKE ?", ["%\\\\"]) == 5
    assert _count(c, "s LIKE ?", ["a\\%b"]) == 1
    assert _count(c, "s LIKE ?", [None]) == 0
    for pattern, reason in (("x\\y", "not allowed to precede 'y'"), ("a\\", "not allowed at its end")):
        got, err = c.outcome(c.execute("SELECT count(*) AS n FROM w WHERE s LIKE ?", parameters=[pattern]))
        assert got is None and err is not None and err.startswith("[1005 PARSING] LIKE pattern"), err
        assert reason in err, err
    c.settle()
    assert not any(c.leaks().values())


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("s LIKE 'x\\\\y'", "the escape character \\ is not allowed to precede 'y'"),
        ("s NOT LIKE 'a\\\\'", "the escape character \\ is not allowed at its end"),
    ],
)
def test_a_pattern_spark_refuses_is_refused_before_it_runs(where: str, reason: str) -> None:
    c = _cluster(1)
    got, err = c.outcome(c.execute(f"SELECT count(*) AS n FROM w WHERE {where}"))
    assert got is None and err is not None and err.startswith("[1005 PARSING]") and reason in err, err
