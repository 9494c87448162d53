"""Seeded simulations: UPPER and LOWER give Spark SQL's answers, which follow Java's full case mapping.

The expected answers are PySpark 4.3's over the same rows (``upper('ß')`` is 'SS', ``lower('İ')`` is 'i'
and U+0307, a final sigma lowers to U+03C2; utf8proc's one-to-one mapping gives 'ẞ', 'i' and U+03C3).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from .cluster import Cluster

SEEDS = [1, 2, 3]
ROWS = pa.table(
    {
        "x": pa.array(range(1, 10), pa.int64()),
        "k": ["ßs", "İx", "SSs", "\ufb01", "FI", "ΟΔΟΣ", "abC", None, "ǅ"],
    }
)
SPARK_CASED = [
    {"x": 1, "u": "SSS", "l": "ßs"},
    {"x": 2, "u": "İX", "l": "i\u0307x"},
    {"x": 3, "u": "SSS", "l": "sss"},
    {"x": 4, "u": "FI", "l": "\ufb01"},
    {"x": 5, "u": "FI", "l": "fi"},
    {"x": 6, "u": "ΟΔΟΣ", "l": "οδος"},
    {"x": 7, "u": "ABC", "l": "abc"},
    {"x": 8, "u": None, "l": None},
    {"x": 9, "u": "Ǆ", "l": "ǆ"},
]
SPARK_GROUPS = [(None, 1), ("ABC", 1), ("FI", 2), ("SSS", 2), ("İX", 1), ("Ǆ", 1), ("ΟΔΟΣ", 1)]


@pytest.mark.parametrize("seed", SEEDS)
def test_upper_and_lower_match_spark(seed: int) -> None:
    c = Cluster(seed)
    c.load("p1", ROWS.slice(0, 4), name="s")
    c.load("p2", ROWS.slice(4), name="s")
    got, err = c.outcome(c.execute("SELECT x, upper(k) AS u, lower(k) AS l FROM s ORDER BY x"))
    assert got is not None and got.to_pylist() == SPARK_CASED, err
    assert SPARK_CASED[5]["l"] == "\u03bf\u03b4\u03bf\u03c2"  # the final sigma
    for repartition in (False, True):
        sql = "SELECT upper(k) AS u, count(*) AS n FROM s GROUP BY upper(k) ORDER BY u"
        got, err = c.outcome(c.execute(sql, repartition=repartition))
        assert got is not None and [(r["u"], r["n"]) for r in got.to_pylist()] == SPARK_GROUPS, err
    got, err = c.outcome(c.execute("SELECT x FROM s WHERE lower(k) = 'i\u0307x' OR upper(k) = 'SSS'"))
    assert got is not None and sorted(got.column("x").to_pylist()) == [1, 2, 3], err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
