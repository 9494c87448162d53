"""Seeded simulations: long OR and AND chains and long IN lists are answered, up to documented bounds.

Spark SQL answers these (PySpark 4.3 over t with x = 0..199 gives the counts below); sqlglot nests a chain
one level per term, so each chain is one call here, and an IN list takes up to 16,384 values.
"""

from __future__ import annotations

from .cluster import Cluster

MAX_TERMS = 16_384  # the documented bound (docs/QUERY.md, SQL)


def _count(c: Cluster, where: str) -> int:
    got, err = c.outcome(c.execute(f"SELECT count(*) AS n FROM t WHERE {where}"))
    assert err is None and got is not None, (err or "")[:300]
    return int(got.column("n")[0].as_py())


def test_long_chains_and_in_lists_are_answered() -> None:
    c = Cluster(1, rows=200)
    assert _count(c, " OR ".join(f"x = {i}" for i in range(70))) == 70
    assert _count(c, " AND ".join(f"x <> {i}" for i in range(70))) == 130
    assert _count(c, f"x IN ({', '.join(str(i) for i in range(1500))})") == 200
    assert _count(c, f"x NOT IN ({', '.join(str(i) for i in range(MAX_TERMS))})") == 0
    # a chain inside a chain, under NOT, and beside a grouped aggregate
    assert _count(c, f"NOT ({' OR '.join(f'x = {i}' for i in range(100))}) AND (x < 150 OR x = 199)") == 51
    sql = f"SELECT k, count(*) AS n FROM t WHERE {' OR '.join(f'x = {i}' for i in range(100))} GROUP BY k ORDER BY k"
    got, err = c.outcome(c.execute(sql, repartition=True))
    assert err is None and got is not None and got.column("n").to_pylist() == [25, 25, 25, 25]


def test_beyond_the_bounds_is_refused_naming_them() -> None:
    c = Cluster(1, rows=8)
    refusals = {
        f"x IN ({', '.join(['1'] * (MAX_TERMS + 1))})": f"IN takes at most {MAX_TERMS} values",
        " OR ".join(["x = 1"] * (MAX_TERMS + 1)): f"at most {MAX_TERMS} are supported",
        "x" + " + 1" * 70 + " > 0": "an expression nests deeper than 64 levels",
        "(" * 400 + "x" + ")" * 400 + " > 0": "an expression nests deeper than 64 levels",
    }
    for where, text in refusals.items():
        got, err = c.outcome(c.execute(f"SELECT count(*) AS n FROM t WHERE {where}"))
        assert got is None and err is not None and err.startswith("[1005 PARSING]"), (err or "")[:300]
        assert text in err, err[:300]
