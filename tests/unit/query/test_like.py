"""LIKE and NOT LIKE select complementary rows, NULL in neither, as in Spark SQL."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

K = ["apple", "banana", None, "avocado", "cherry", "a"]
TABLE = pa.table({"k": pa.array(K), "x": pa.array(range(len(K)), pa.int64())})


def xs(where: str) -> list[int]:
    got = distributed(parse_sql(f"SELECT x FROM t WHERE {where} ORDER BY x"), split(TABLE, [3]))
    assert got is not None
    return got.column("x").to_pylist()


@pytest.mark.parametrize(
    ("pattern", "like"), [("a%", [0, 3, 5]), ("%an%", [1]), ("_", [5]), ("cherry", [4]), ("z%", [])]
)
def test_not_like_keeps_the_rows_like_drops(pattern: str, like: list[int]) -> None:
    unlike = [i for i, k in enumerate(K) if k is not None and i not in like]
    assert xs(f"k LIKE '{pattern}'") == like
    assert xs(f"k NOT LIKE '{pattern}'") == unlike
    assert xs(f"NOT k LIKE '{pattern}'") == unlike
