"""Float group keys, distinct values and MIN/MAX follow Spark SQL: -0.0 is 0.0, NaN is one value above all."""

from __future__ import annotations

import math
import struct

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed

NAN = float("nan")
#: a NaN with another payload: still NaN, other bits
OTHER_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]


def rows(text: str, parts: list[pa.Table], *, repartition: bool = False) -> list[tuple[object, ...]]:
    got = distributed(parse_sql(text), parts, repartition=repartition)
    assert got is not None
    # NaN as a string, so that rows compare and sort
    return sorted(
        (
            tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r.values())
            for r in got.to_pylist()
        ),
        key=repr,
    )


PARTS = [
    pa.table({"k": ["a", "a", "b"], "f": [0.0, NAN, 1.0]}),
    pa.table({"k": ["a", "b", "b", "b"], "f": [-0.0, OTHER_NAN, None, 1.0]}),
]


@pytest.mark.parametrize("repartition", [False, True])
def test_group_by_a_float_puts_minus_zero_with_zero_and_every_nan_together(repartition: bool) -> None:
    got = rows("SELECT f, count(*) AS n FROM t GROUP BY f", PARTS, repartition=repartition)
    assert got == sorted([(0.0, 2), ("NaN", 2), (1.0, 2), (None, 1)], key=repr)
    # The zero group's key is 0.0, not -0.0 (as in Spark).
    table = distributed(parse_sql("SELECT f FROM t WHERE f = 0 GROUP BY f"), PARTS)
    assert table is not None and [math.copysign(1, v) for v in table.column("f").to_pylist()] == [1.0]


@pytest.mark.parametrize("repartition", [False, True])
def test_count_distinct_of_floats(repartition: bool) -> None:
    assert rows("SELECT count(DISTINCT f) AS d FROM t", PARTS) == [(3,)]
    got = rows("SELECT k, count(DISTINCT f) AS d FROM t GROUP BY k", PARTS, repartition=repartition)
    assert got == [("a", 2), ("b", 2)]


@pytest.mark.parametrize("repartition", [False, True])
def test_max_is_nan_where_a_nan_is_and_min_skips_nan_unless_nothing_else(repartition: bool) -> None:
    assert rows("SELECT max(f) AS hi, min(f) AS lo FROM t", PARTS) == [("NaN", 0.0)]
    # Group a: one member's partial state is all NaN; the merge must keep NaN as the maximum.
    parts = [
        pa.table({"k": ["a", "b", "c"], "f": [NAN, NAN, None]}),
        pa.table({"k": ["a", "b", "c"], "f": [1.0, None, 2.0]}),
    ]
    got = rows("SELECT k, max(f) AS hi, min(f) AS lo FROM t GROUP BY k", parts, repartition=repartition)
    assert got == [("a", "NaN", 1.0), ("b", "NaN", "NaN"), ("c", 2.0, 2.0)]
    assert rows("SELECT max(f) AS hi FROM t WHERE f IS NULL", parts) == [(None,)]


def test_nan_keys_with_other_payloads_hash_to_one_part() -> None:
    table = pa.table({"f": pa.array([NAN, OTHER_NAN, -0.0, 0.0] * 8)})
    parts = engine.hash_partition(table, ["f"], 5)
    homes = {
        kind: {i for i, p in enumerate(parts) for v in p.column("f").to_pylist() if kind(v)}
        for kind in (math.isnan, lambda v: v == 0.0)
    }
    assert all(len(h) == 1 for h in homes.values())
