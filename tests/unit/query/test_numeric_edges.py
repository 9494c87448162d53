"""Numbers at the edges (large sums, uint64 keys, huge limits and literals), distributed as the role runs them."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus import contract as c
from sparkbus.roles.query import aggregate, engine
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, PlanError, SqlError
from sparkbus.roles.query.expressions import Literal, expr_from_plain
from sparkbus.roles.query.plan import AggCall, Limit, Scan, SortKey, TopK
from sparkbus.roles.query.role import QueryRole
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


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        ("SELECT x FROM t ORDER BY x LIMIT 9223372036854775807 OFFSET 1", [2, 3, 4, 5]),
        ("SELECT x FROM t ORDER BY x DESC LIMIT 2 OFFSET 99999999999999999999", []),
        ("SELECT x FROM t LIMIT 99999999999999999999999 OFFSET 1", None),  # any 4 of the 5
    ],
)
def test_limits_beyond_any_table_are_no_limits(text: str, rows: list[int] | None) -> None:
    table = pa.table({"x": pa.array([5, 3, 1, 4, 2], pa.int64())})
    got = distributed(parse_sql(text), split(table, [2]))
    assert got is not None
    if rows is None:
        assert got.num_rows == 4
    else:
        assert got.column("x").to_pylist() == rows


def test_a_huge_limit_through_a_kept_sort_order() -> None:
    # The second top-k over the same partition version reads it through its kept order.
    store = engine.PartitionStore()
    store.load("t", pa.table({"x": pa.array(range(10_000, 0, -1), pa.int64())}))
    plan = TopK(input=Scan(table="t"), keys=(SortKey(column="x"),), count=2**62)  # a participant's leaf
    for _ in range(3):
        got = engine.run(plan, store)
        assert got is not None and got.column("x").to_pylist() == list(range(1, 10_001))


def test_plans_naming_more_rows_than_max_rows_are_refused() -> None:
    with pytest.raises(PlanError, match=r"limit\.count: expected an int in 0..2\*\*62"):
        Limit(input=Scan(table="t"), count=2**62 + 1)
    with pytest.raises(PlanError, match=r"limit\.offset"):
        Limit(input=Scan(table="t"), count=1, offset=2**63)
    with pytest.raises(PlanError, match=r"top_k\.count"):
        TopK(input=Scan(table="t"), keys=(SortKey(column="x"),), count=2**64)
    assert Limit(input=Scan(table="t"), count=2**62, offset=2**62).rows == 2**62


@pytest.mark.parametrize(
    ("literal", "kind"),
    [
        ("99999999999999999999", "BIGINT"),
        ("9223372036854775808", "BIGINT"),
        ("-9223372036854775809", "BIGINT"),
        # As Spark SQL (INVALID_NUMERIC_LITERAL_RANGE): before, 1e400 became infinity and matched rows.
        ("1e400", "DOUBLE"),
        ("-1E400", "DOUBLE"),
        ("1.5e309", "DOUBLE"),
    ],
)
def test_numeric_literals_out_of_range_are_refused_when_parsed(literal: str, kind: str) -> None:
    text = f"SELECT x FROM t WHERE x < {literal}"
    with pytest.raises(SqlError, match=f"outside the range of {kind}") as info:
        parse_sql(text)
    assert info.value.code is ErrorCode.PARSING
    assert text[info.value.start : info.value.end] in (literal, literal.lstrip("-"))  # type: ignore[misc]


def test_the_largest_doubles_are_literals() -> None:
    table = pa.table({"x": pa.array([1.0, 2.0], pa.float64())})
    assert sql("SELECT x FROM t WHERE x < 1.7976931348623157e308 AND x > -1e308", [table]) == [
        {"x": 1.0},
        {"x": 2.0},
    ]


def test_the_int64_bounds_themselves_are_literals() -> None:
    table = pa.table({"x": pa.array([-(2**63), 0, 2**63 - 1], pa.int64())})
    got = sql("SELECT x FROM t WHERE x > -9223372036854775808 AND x < 9223372036854775807", [table])
    assert got == [{"x": 0}]
    assert sql("SELECT x FROM t WHERE x = -9223372036854775808", [table]) == [{"x": -(2**63)}]


def test_plain_plans_with_integer_literals_outside_int64_are_refused() -> None:
    with pytest.raises(PlanError, match="outside int64"):
        expr_from_plain(["lit", 2**64])
    assert expr_from_plain(["lit", -(2**63)]) == Literal(value=-(2**63))


def test_execute_answers_a_literal_outside_int64_with_parsing() -> None:
    role = QueryRole("i", incarnation="x")
    role.handle(c.PeerUp(peer="p1"), 0.0)
    args = {"sql": "SELECT x FROM t WHERE x < 99999999999999999999"}
    acts = role.handle(c.LocalCall(call_id=1, name="execute", args=args), 0.0)
    assert len(acts) == 1 and isinstance(acts[0], c.Reply)
    assert acts[0].error is not None and acts[0].error.startswith("[1005 PARSING] integer literal")
    assert role.queries == {} and role.calls == {}


def overflow(text: str, parts: list[pa.Table], *, repartition: bool = False) -> None:
    with pytest.raises(ExecutionError, match=r"sum: overflow") as info:
        distributed(parse_sql(text), parts, repartition=repartition)
    assert info.value.code is ErrorCode.DATA_EXCEPTION


@pytest.mark.parametrize("repartition", [False, True])
def test_sum_of_int64_that_overflows_fails_in_the_partial_and_in_the_final_phase(repartition: bool) -> None:
    big = 2**62
    k = pa.array(["a", "a"])
    # One member's partial sum overflows (2**63).
    overflow("SELECT sum(x) AS s FROM t", [pa.table({"x": pa.array([big, big], pa.int64())})])
    both = pa.table({"k": k, "x": pa.array([big, big], pa.int64())})
    overflow("SELECT k, sum(x) AS s FROM t GROUP BY k", [both, both.slice(0, 0)], repartition=repartition)
    # Each member's sum fits (2**63 - 1 and 1); only the merge overflows.
    p1 = pa.table({"k": k, "x": pa.array([big, big - 1], pa.int64())})
    p2 = pa.table({"k": k.slice(0, 1), "x": pa.array([1], pa.int64())})
    overflow("SELECT sum(x) AS s FROM t", [p1, p2])
    overflow("SELECT k, sum(x) AS s FROM t GROUP BY k", [p1, p2], repartition=repartition)
    # Downwards too.
    low = pa.table({"k": k, "x": pa.array([-big, -big], pa.int64())})
    overflow("SELECT k, sum(x) AS s FROM t GROUP BY k", [low, p2.set_column(1, "x", pa.array([-1]))])


def test_sums_that_come_close_to_the_int64_range_are_exact() -> None:
    big = 2**62
    p1 = pa.table({"k": ["a", "a", "b"], "x": pa.array([big, big - 1, -big], pa.int64())})
    p2 = pa.table({"k": ["a", "b", "b"], "x": pa.array([-5, -big, None], pa.int64())})
    assert sql("SELECT sum(x) AS s FROM t", [p1, p2]) == [{"s": -6}]
    got = sql("SELECT k, sum(x) AS s, count(DISTINCT x) AS d FROM t GROUP BY k", [p1, p2])
    assert got == sorted([{"k": "a", "s": 2**63 - 6, "d": 3}, {"k": "b", "s": -(2**63), "d": 1}], key=repr)


def test_sum_of_uint64_that_overflows_fails() -> None:
    table = pa.table({"x": pa.array([2**63, 2**63], pa.uint64())})
    with pytest.raises(ExecutionError, match="sum: overflow"):
        aggregate.single(table, [], [AggCall(name="s", func="sum", column="x")])
    fits = pa.table({"x": pa.array([2**63, 2**63 - 1], pa.uint64())})
    got = aggregate.single(fits, [], [AggCall(name="s", func="sum", column="x")])
    assert got.column("s").to_pylist() == [2**64 - 1]


NS = [1_700_000_000_123_456_789, None, 1_700_000_000_987_654_321, 5]  # epoch nanoseconds: past 2**53
EVENTS = pa.table({"ts": pa.array(NS, pa.int64()), "y": pa.array([1.0, 1e20, -7.5, 5.0])})


def column(text: str) -> list[object]:
    got = distributed(parse_sql(text), split(EVENTS, [2]))
    assert got is not None
    return got.column(0).to_pylist()


def test_a_bigint_past_2_53_beside_a_double_is_cast_to_double_as_in_spark() -> None:
    # Arrow's implicit (safe) cast refuses such integers: "Integer value ... not in range".
    ordered = sorted(v for v in NS if v is not None)
    assert column("SELECT ts / 1000000000 AS s FROM t WHERE ts IS NOT NULL ORDER BY ts") == [
        v / 1e9 for v in ordered
    ]
    assert column("SELECT count(*) AS n FROM t WHERE ts > 1.5") == [3]
    assert column("SELECT ts + y AS s FROM t WHERE ts IS NOT NULL ORDER BY ts") == [
        float(NS[3]) + 5.0,
        float(NS[0]) + 1.0,
        float(NS[2]) - 7.5,
    ]
    assert column("SELECT ts = 1700000000123456789.0 AS e FROM t WHERE ts > 9 ORDER BY ts") == [True, False]
    assert column("SELECT coalesce(ts, 0.5) AS c FROM t") == [float(NS[0]), 0.5, float(NS[2]), 5.0]
    assert column("SELECT ts FROM t WHERE ts IN (5.0, 2.5)") == [5]
    assert column("SELECT max(ts * 1.0) AS m FROM t") == [float(NS[2])]


def test_the_remainder_of_doubles_is_exact_as_javas() -> None:
    # Spark's % on DOUBLE is Java's, C's fmod: 1e20 % 3 is 1.0 and 1.0 % 0.1 is 0.09999999999999995, where
    # a - trunc(a / b) * b rounds the quotient and gives 0.0 for both.
    ys = sorted(v.as_py() for v in EVENTS.column("y"))
    assert column("SELECT y % 3 AS m FROM t ORDER BY y") == [math.fmod(v, 3) for v in ys]
    assert column("SELECT y % 0.1 AS m FROM t ORDER BY y") == [math.fmod(v, 0.1) for v in ys]
    assert column("SELECT 1e20 % y AS m FROM t ORDER BY y") == [math.fmod(1e20, v) for v in ys]
    ts = sorted(v for v in NS if v is not None)
    assert column("SELECT ts % 1.5 AS m FROM t ORDER BY ts") == [None] + [
        math.fmod(float(v), 1.5) for v in ts
    ]


def test_int64_min_remainder_minus_one_is_zero_as_in_spark() -> None:
    table = pa.table({"x": pa.array([-(2**63), 7, -7, None], pa.int64()), "d": pa.array([-1, -1, 2, -1])})
    got = distributed(
        parse_sql("SELECT x % -1 AS a, x % d AS b, -9223372036854775808 % -1 AS c FROM t"), [table]
    )
    assert got is not None
    assert got.to_pylist() == [
        {"a": 0, "b": 0, "c": 0},
        {"a": 0, "b": 0, "c": 0},
        {"a": 0, "b": -1, "c": 0},
        {"a": None, "b": None, "c": 0},
    ]


@pytest.mark.parametrize(
    "text", ["SELECT y % 0 AS m FROM t", "SELECT y % 0.0 AS m FROM t", "SELECT ts % 0 AS m FROM t"]
)
def test_a_remainder_by_zero_is_an_error(text: str) -> None:
    with pytest.raises(ExecutionError, match="mod: divide by zero"):
        column(text)
