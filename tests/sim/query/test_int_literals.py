"""Seeded simulations: an integer literal is an INT when it fits in 32 bits, else a BIGINT, as in Spark SQL.

So INT arithmetic with a literal stays INT, and overflows (an error, ``DATA_EXCEPTION``) where Spark's
fails with ARITHMETIC_OVERFLOW. The expected rows and types are PySpark 4.3's over an INT column i and a
BIGINT column x holding 1 and 5.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from .cluster import Cluster

I32, I64, F64 = pa.int32(), pa.int64(), pa.float64()


def _cluster(i: list[int], seed: int = 1) -> Cluster:
    c = Cluster(seed, rows=8)
    half = len(i) // 2
    for node, part in (("p1", i[:half]), ("p2", i[half:])):
        c.load(node, pa.table({"i": pa.array(part, I32), "x": pa.array(part, I64)}), name="it")
    return c


@pytest.mark.parametrize("seed", [1, 2])
def test_int_arithmetic_with_literals_keeps_sparks_types(seed: int) -> None:
    c = _cluster([1, 5], seed)
    sql = (
        "SELECT NULL % 2 AS r, 1 AS one, 2147483648 AS big, -2147483648 AS lo, i + 1 AS a, x + 1 AS b, "
        "i * 2 AS c, i % 3 AS d, coalesce(i, 1) AS e, abs(i) AS f, -i AS g, i / 2 AS h, "
        "i + 2147483648 AS j, 1 + 1 AS k FROM it ORDER BY i"
    )
    got, err = c.outcome(c.execute(sql))
    assert err is None and got is not None, err
    spark = {
        "r": (I32, [None, None]),
        "one": (I32, [1, 1]),
        "big": (I64, [2147483648] * 2),
        "lo": (I32, [-2147483648] * 2),
        "a": (I32, [2, 6]),
        "b": (I64, [2, 6]),
        "c": (I32, [2, 10]),
        "d": (I32, [1, 2]),
        "e": (I32, [1, 5]),
        "f": (I32, [1, 5]),
        "g": (I32, [-1, -5]),
        "h": (F64, [0.5, 2.5]),
        "j": (I64, [2147483649, 2147483653]),
        "k": (I32, [2, 2]),
    }
    assert {f.name: (f.type, got.column(f.name).to_pylist()) for f in got.schema} == spark
    sql = "SELECT sum(i + 1) AS s, max(i + 1) AS m, min(2) AS n, count(*) AS k FROM it"
    for repartition in (False, True):
        got, err = c.outcome(c.execute(sql, repartition=repartition))
        assert err is None and got is not None, err
        assert got.to_pylist() == [{"s": 8, "m": 6, "n": 2, "k": 2}]
        assert [f.type for f in got.schema] == [I64, I32, I32, I64]
    got, err = c.outcome(c.execute("SELECT count(*) AS n FROM it WHERE i IN (3000000000, 1)"))
    assert got is not None and got.to_pylist() == [{"n": 1}], err


def test_int_overflow_with_literals_is_an_error_as_in_spark() -> None:
    c = _cluster([2147483647, 5])
    for sql in (
        "SELECT i + 1 AS v FROM it",
        "SELECT i * 2147483647 AS v FROM it",
        "SELECT 2147483647 * 2 AS v FROM it",
        "SELECT -(-2147483648) AS v FROM it",
        "SELECT abs(-2147483648) AS v FROM it",
    ):
        got, err = c.outcome(c.execute(sql))
        assert got is None and err is not None, sql
        assert err.startswith("[2000 DATA_EXCEPTION]") and "overflow" in err, err
    got, err = c.outcome(c.execute("SELECT x + 1 AS v, 2147483647 + 2147483648 AS w FROM it ORDER BY v"))
    assert got is not None and got.to_pylist() == [
        {"v": 6, "w": 4294967295},
        {"v": 2147483648, "w": 4294967295},
    ]
