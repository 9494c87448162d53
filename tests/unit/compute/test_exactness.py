"""Results that must not depend on how a replica came to them: integer overflow fails a view instead of
wrapping, a view maintained through rows of negative multiplicity (retracted before they were inserted)
is what a recomputation from scratch over the same updates gives, and NaN equals NaN whatever its bits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparkbus.roles.compute import (
    DIFF,
    TIME,
    Aggregate,
    AppendUpdates,
    Arrangement,
    ComputeReplica,
    Dataflow,
    MapExpr,
    ViewDef,
    encode_table,
)
from sparkbus.roles.compute import reduction as reduction_module
from sparkbus.roles.compute.storage import checked_updates

from .harness import Cluster, ipc

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
SUM = ViewDef(
    source="t",
    group_by=("k",),
    aggregates=(Aggregate(func="count", column=None, name="n"), Aggregate(func="sum", column="v", name="s")),
)
BIG = 2**62


def updates(*rows: tuple[str, int, int, int]) -> pa.Table:
    """``(k, v, time, diff)`` rows as an update batch."""
    return pa.table(
        {
            "k": [r[0] for r in rows],
            "v": pa.array([r[1] for r in rows], pa.int64()),
            TIME: pa.array([r[2] for r in rows], pa.int64()),
            DIFF: pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def write(c: Cluster, *rows: tuple[str, int, int]) -> None:
    """Write ``(k, v, diff)`` rows to table t."""
    data = {
        "k": [r[0] for r in rows],
        "v": pa.array([r[1] for r in rows], pa.int64()),
        DIFF: pa.array([r[2] for r in rows], pa.int64()),
    }
    c.do("write", table="t", batch=ipc(pa.table(data)))


def cluster() -> Cluster:
    c = Cluster(("r1", "r2"))
    for r in ("r1", "r2"):
        c.up(r)
    c.run()
    c.do("create_table", name="t", schema=SCHEMA)
    return c


def peeks(c: Cluster, view: str) -> dict[str, Any]:
    """Each replica's answer to a peek at ``view``: its rows, sorted, or its error."""
    out: dict[str, Any] = {}
    for r in c.replicas:
        cid = c.call("peek", view=view, target_replica=r)
        c.run()
        reply = c.replies[cid]
        out[r] = reply.error if reply.error is not None else sorted(c.rows(cid), key=repr)
    return out


@pytest.mark.parametrize(
    ("op", "value", "operand"),
    [("add", 2**63 - 1, 1), ("subtract", -(2**63), 1), ("multiply", 2**40, None)],
)
def test_a_map_that_overflows_fails_the_view_on_every_replica(
    op: str, value: int, operand: int | None
) -> None:
    c = cluster()
    expr = (
        MapExpr(name="w", op=op, left="v", right="v")
        if operand is None
        else MapExpr(name="w", op=op, left="v", literal=operand)
    )
    c.do("create_view", name="m", view=ViewDef(source="t", maps=(expr,), project=("k", "w")))
    write(c, ("ok", 3, 1), ("big", value, 1))
    for error in peeks(c, "m").values():
        assert "view 'm' failed on its data" in error and "overflow" in error


@pytest.mark.parametrize("preaggregate", [False, True])
def test_a_sum_beyond_int64_fails_the_view_and_one_back_in_range_is_exact(preaggregate: bool) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reduction_module, "_PREAGGREGATE", 0 if preaggregate else 16384)
        flow = Dataflow(SUM, SCHEMA, 0, "v")
        # Beyond int64 on the way (2**63), back in range at the end of the step: exact.
        got = flow.feed(updates(("a", BIG, 1, 1), ("a", BIG, 1, 1), ("a", -BIG, 1, 1), ("b", 1, 1, 1)))
        assert sorted(got.to_pylist(), key=repr) == [
            {"k": "a", "n": 3, "s": BIG, TIME: 1, DIFF: 1},
            {"k": "b", "n": 1, "s": 1, TIME: 1, DIFF: 1},
        ]
        with pytest.raises(OverflowError, match="'s'"):
            flow.feed(updates(("a", BIG, 2, 1)))  # 2**63
        with pytest.raises(OverflowError, match="'s'"):
            Dataflow(SUM, SCHEMA, 0, "v").feed(updates(("a", -BIG, 1, 3)))  # value times diff
        with pytest.raises(OverflowError, match="'s'"):
            Dataflow(SUM, SCHEMA, 0, "v").feed(updates(*[("a", 2**50, 1, 1)] * 9000))


def test_a_sum_beyond_int64_fails_the_view_on_every_replica_and_the_rest_goes_on() -> None:
    c = cluster()
    c.do("create_view", name="s", view=SUM)
    c.do("create_view", name="n", view=ViewDef(source="t", group_by=("k",), aggregates=SUM.aggregates[:1]))
    write(c, ("a", BIG, 1), ("b", 1, 1))
    write(c, ("a", BIG, 1))  # a's sum would be 2**63
    for error in peeks(c, "s").values():
        assert "view 's' failed on its data" in error and "overflow" in error
    assert peeks(c, "n") == {r: [{"k": "a", "n": 2}, {"k": "b", "n": 1}] for r in ("r1", "r2")}


def test_a_sum_that_went_beyond_int64_and_came_back_agrees_between_a_rebuilt_and_a_maintaining_replica() -> (
    None
):
    c = cluster()
    c.do("create_view", name="s", view=SUM)
    write(c, ("a", BIG, 1), ("a", BIG, 1), ("a", -BIG, 1))  # in range at the write's time
    write(c, ("a", 5, 1))
    c.cut("r2")
    c.replicas["r2"] = ComputeReplica()  # r2 restarts: it builds the view from the compacted table
    c.up("r2")
    c.run()
    assert peeks(c, "s") == {r: [{"k": "a", "n": 4, "s": BIG + 5}] for r in ("r1", "r2")}


# ---------------------------------------------------------------- negative multiplicities

WIDE = pa.schema([("a", pa.int64()), ("v", pa.int64()), ("x", pa.float64())])
WIDE_AGGS = tuple(
    Aggregate(func=func, column=column, name=f"{func}_{column or 'all'}")
    for func, column in [
        ("count", None),
        ("count", "v"),
        ("sum", "v"),
        ("avg", "v"),
        ("sum", "x"),
        ("avg", "x"),
        ("min", "v"),
        ("max", "x"),
    ]
)
NO_ROWS = {a.name: 0 if a.func == "count" else None for a in WIDE_AGGS}
# Values whose float sums are exact in any order, so maintained and recomputed must be equal, not close.
wide_update = st.tuples(
    st.sampled_from([1, 2, None]),
    st.one_of(st.none(), st.integers(-4, 9)),
    st.sampled_from([None, 0.0, -0.0, 0.5, 1.25, -3.0, 2.0]),
    st.sampled_from([-2, -1, 1, 2]),
)


def wide_updates(rows: list[tuple[Any, Any, Any, int]], t: int) -> pa.Table:
    cols = {name: [r[i] for r in rows] for i, name in enumerate(WIDE.names)}
    cols[TIME] = [t] * len(rows)
    cols[DIFF] = [r[3] for r in rows]
    return pa.table(cols, schema=pa.schema([*WIDE, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]))


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.lists(wide_update, max_size=8), min_size=1, max_size=8),
    keyed=st.booleans(),
    reclaim=st.booleans(),
    preaggregate=st.booleans(),
)
# -0.0 equals 0.0: the greatest of the two must not depend on the order the rows came in.
@example(
    batches=[[(1, None, -0.0, -1), (1, None, -0.0, 1)], [(1, None, 0.0, 1), (1, None, -0.0, 1)]],
    keyed=False,
    reclaim=False,
    preaggregate=False,
)
@example(
    batches=[[(1, None, 0.0, -2), (1, None, 0.0, 2), (1, None, -0.0, 1)], [(1, None, 0.0, 1)]],
    keyed=True,
    reclaim=False,
    preaggregate=False,
)
def test_a_view_over_negative_multiplicities_equals_its_recomputation_at_every_time(
    batches: list[list[tuple[Any, Any, Any, int]]], keyed: bool, reclaim: bool, preaggregate: bool
) -> None:
    """Any diffs, with no regard to what is present: a group's row count passes through zero and below."""
    view = ViewDef(source="t", group_by=("a",) if keyed else (), aggregates=WIDE_AGGS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reduction_module, "_RECLAIM_FLOOR", 0 if reclaim else 1024)
        patch.setattr(reduction_module, "_PREAGGREGATE", 0 if preaggregate else 16384)
        flow = Dataflow(view, WIDE, 0, "v")
        out = Arrangement(flow.schema)
        seen: list[pa.Table] = []
        for t, rows in enumerate(batches, start=1):
            seen.append(wide_updates(rows, t))
            out.append(flow.feed(seen[-1]), t + 1)
            fresh = Dataflow(view, WIDE, t, "v")
            again = Arrangement(fresh.schema, since=t, upper=t)
            again.append(fresh.feed(pa.concat_tables(seen)), t + 1)
            maintained = sorted(map(repr, out.read_at(t).to_pylist()))
            assert maintained == sorted(map(repr, again.read_at(t).to_pylist())), f"at time {t}"
            if not keyed:  # one row; with no rows in the collection (a row count <= 0), the row of no rows
                (row,) = out.read_at(t).to_pylist()
                total = sum(r[3] for batch in batches[:t] for r in batch)
                assert (row == NO_ROWS) if total <= 0 else (row["count_all"] == total), f"at time {t}"


def test_a_row_retracted_before_it_was_inserted_is_counted_by_every_replica_and_every_view_alike() -> None:
    c = cluster()
    c.do("create_view", name="s", view=SUM)
    write(c, ("z", 5, -1))  # a delete of a row never inserted: z holds it at multiplicity -1
    write(c, ("z", 7, 1))  # z's row count is back to 0, its sum is 2
    write(c, ("z", 3, 1))
    c.do("create_view", name="again", view=SUM)  # the same view, built from the table as it is now
    c.cut("r2")
    c.replicas["r2"] = ComputeReplica()  # r2 restarts: it builds both views from the table
    c.up("r2")
    c.run()
    expected = {r: [{"k": "z", "n": 1, "s": 5}] for r in ("r1", "r2")}
    assert peeks(c, "s") == expected
    assert peeks(c, "again") == expected
    write(c, ("z", 5, 1))  # the retracted row comes: z holds 7 and 3
    assert peeks(c, "s") == {r: [{"k": "z", "n": 2, "s": 10}] for r in ("r1", "r2")}
    assert peeks(c, "t") == {r: [{"k": "z", "v": 3}, {"k": "z", "v": 7}] for r in ("r1", "r2")}


def test_a_global_aggregate_over_rows_only_retracted_is_the_row_of_no_rows() -> None:
    c = cluster()
    aggs = (
        *SUM.aggregates,
        Aggregate(func="avg", column="v", name="a"),
        Aggregate(func="min", column="v", name="lo"),
    )
    c.do("create_view", name="g", view=ViewDef(source="t", group_by=(), aggregates=aggs))
    no_rows = {r: [{"n": 0, "s": None, "a": None, "lo": None}] for r in ("r1", "r2")}
    write(c, ("z", 5, -1))  # a delete of a row never inserted: the table shows no row
    assert peeks(c, "t") == {"r1": [], "r2": []}
    assert peeks(c, "g") == no_rows
    write(c, ("y", 3, 1))  # the row count is back to 0 with y shown: still no rows counted
    assert peeks(c, "g") == no_rows
    write(c, ("x", 4, 1))  # one row counted; the sums are those of the accumulated collection
    assert peeks(c, "g") == {r: [{"n": 1, "s": 2, "a": 2.0, "lo": 3}] for r in ("r1", "r2")}


# ---------------------------------------------------------------- NaN keys

FLOATS = pa.schema([("x", pa.float64()), ("y", pa.float64())])
#: The NaN with the sign bit set, which Arrow's own 0.0 / 0.0 yields; float("nan") has it clear.
SIGNED_NAN = float(np.array([0xFFF8000000000000], np.uint64).view(np.float64)[0])


def bits(values: list[float | None]) -> list[int | None]:
    return [None if v is None else int(np.array([v]).view(np.uint64)[0]) for v in values]


def write_floats(c: Cluster, xs: list[float], ys: list[float], diff: int = 1) -> None:
    data = {"x": pa.array(xs, pa.float64()), "y": pa.array(ys, pa.float64())}
    data[DIFF] = pa.array([diff] * len(xs), pa.int64())
    c.do("write", table="f", batch=ipc(pa.table(data)))


def test_nans_of_any_bits_are_one_group_one_row_and_one_key() -> None:
    assert bits([SIGNED_NAN]) != bits([math.nan])
    c = cluster()
    c.do("create_table", name="f", schema=FLOATS)
    count = (Aggregate(func="count", column=None, name="n"),)
    ratio = MapExpr(name="r", op="divide", left="x", right="y")
    c.do(
        "create_view", name="by_r", view=ViewDef(source="f", maps=(ratio,), group_by=("r",), aggregates=count)
    )
    c.do("create_view", name="by_x", view=ViewDef(source="f", group_by=("x",), aggregates=count))
    write_floats(c, [0.0, math.nan, SIGNED_NAN], [0.0, 1.0, 2.0])  # 0/0, NaN/1 and NaN/2: three NaNs
    for r, got in peeks(c, "by_r").items():
        assert len(got) == 1 and math.isnan(got[0]["r"]) and got[0]["n"] == 3, r
    for got in peeks(c, "by_x").values():
        assert sorted(map(repr, got)) == ["{'x': 0.0, 'n': 1}", "{'x': nan, 'n': 2}"]
    # A retraction of a NaN row cancels the row written with the other NaN.
    write_floats(c, [math.nan, SIGNED_NAN], [2.0, 1.0], diff=-1)
    assert peeks(c, "f") == {r: [{"x": 0.0, "y": 0.0}] for r in ("r1", "r2")}
    assert peeks(c, "by_x") == {r: [{"x": 0.0, "n": 1}] for r in ("r1", "r2")}
    # A literal constraint with either NaN finds the NaN group.
    for nan in (math.nan, SIGNED_NAN):
        cid = c.call("peek", view="by_r", literal_constraints=[(nan,)])
        c.run()
        (row,) = c.rows(cid)
        assert math.isnan(row["r"]) and row["n"] == 1


def test_a_replica_makes_the_nans_of_an_append_one() -> None:
    data = pa.table({"x": [SIGNED_NAN, math.nan, None, 1.5], TIME: [1] * 4, DIFF: [1] * 4})
    data = data.cast(pa.schema([("x", pa.float64()), (TIME, pa.int64()), (DIFF, pa.int64())]))
    updates = checked_updates(AppendUpdates(id="f", lower=1, upper=2, updates=encode_table(data)), "f")
    assert bits(updates["x"].to_pylist()) == bits([math.nan, math.nan, None, 1.5])
