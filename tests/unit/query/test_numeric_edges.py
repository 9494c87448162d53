"""Numbers at the edges (large sums, uint64 keys, huge limits and literals), distributed as the role runs them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.roles.query import aggregate, engine
from sparkbus.roles.query.plan import AggCall
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

EPOCH_MS = 1_700_000_000_000


def sql(text: str, parts: list[pa.Table], *, repartition: bool = False) -> list[dict[str, object]]:
    got = distributed(parse_sql(text), parts, repartition=repartition)
    assert got is not None
    return sorted(got.to_pylist(), key=repr)


@pytest.mark.parametrize("repartition", [False, True])
def test_avg_of_integers_whose_sum_passes_2_53(repartition: bool) -> None:
    # Epoch milliseconds: the sum (1.02e16) is beyond 2**53, far from overflowing int64.
    ts = [EPOCH_MS + i for i in range(6000)]
    table = pa.table({"ts": pa.array(ts, pa.int64()), "k": [i % 2 for i in range(6000)]})
    parts = split(table, [3000])
    assert sql("SELECT avg(ts) AS a FROM t", parts) == [{"a": sum(ts) / len(ts)}]
    got = sql("SELECT k, avg(ts) AS a FROM t GROUP BY k", parts, repartition=repartition)
    assert got == [{"k": k, "a": sum(ts[k::2]) / 3000} for k in (0, 1)]


def test_avg_adds_in_float64_as_spark_does_and_does_not_overflow() -> None:
    big = 2**62
    table = pa.table({"x": pa.array([big, big, big, 1], pa.int64()), "k": ["a", "a", "a", "b"]})
    assert sql("SELECT avg(x) AS a FROM t", split(table, [2])) == [{"a": (3 * big + 1) / 4}]
    got = sql("SELECT k, avg(x) AS a FROM t GROUP BY k", split(table, [1]))
    assert got == [{"a": float(big), "k": "a"}, {"a": 1.0, "k": "b"}]


@pytest.mark.parametrize("rows", [10, 100_000])  # the hash aggregation, and the dense bins
def test_avg_and_sum_of_one_integer_column_keep_their_own_types(rows: int) -> None:
    table = pa.table({"k": pa.array([i % 3 for i in range(rows)], pa.int64()), "v": pa.array(range(rows))})
    aggs = [AggCall(name="s", func="sum", column="v"), AggCall(name="a", func="avg", column="v")]
    got = aggregate.single(table, ["k"], aggs).sort_by("k")
    assert got.schema.field("s").type == pa.int64() and got.schema.field("a").type == pa.float64()
    for k in range(3):
        mine = [v for v in range(rows) if v % 3 == k]
        assert got.column("s")[k].as_py() == sum(mine)
        assert got.column("a")[k].as_py() == pytest.approx(sum(mine) / len(mine), rel=1e-15)


def test_uint64_keys_past_2_63_hash_partition_by_their_bits() -> None:
    big = 2**63 + 5
    keys = pa.array([1, big, None, 7, big, 2**64 - 1], pa.uint64())
    parts = engine.hash_partition(pa.table({"u": keys}), ["u"], 3)
    assert sorted(r["u"] or -1 for p in parts for r in p.to_pylist()) == sorted(
        v if v is not None else -1 for v in keys.to_pylist()
    )
    holding = [i for i, p in enumerate(parts) if big in p.column("u").to_pylist()]
    assert len(holding) == 1  # equal keys in one part
    # Below 2**63 a uint64 key lands where the same int64 key does.
    small = pa.array(range(50))
    signed = engine.hash_partition(pa.table({"u": small}), ["u"], 3)
    unsigned = engine.hash_partition(pa.table({"u": pc.cast(small, pa.uint64())}), ["u"], 3)
    assert [p.column("u").to_pylist() for p in signed] == [p.column("u").to_pylist() for p in unsigned]


def test_repartitioned_group_by_on_a_uint64_key_past_2_63() -> None:
    p1 = pa.table({"u": pa.array([1, 2**63 + 5], pa.uint64()), "v": [1, 2]})
    p2 = pa.table({"u": pa.array([1, 7], pa.uint64()), "v": [3, 4]})
    want = sorted([{"u": 2**63 + 5, "s": 2}, {"u": 1, "s": 4}, {"u": 7, "s": 4}], key=repr)
    for repartition in (False, True):
        assert sql("SELECT u, sum(v) AS s FROM t GROUP BY u", [p1, p2], repartition=repartition) == want
