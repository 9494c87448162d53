"""The slot-based group-by state: several key columns, null keys, groups that vanish and come back, and the
reclaiming of vanished groups' slots all give what a recomputation from scratch gives."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.roles.compute import DIFF, TIME, Aggregate, Arrangement, Dataflow, ViewDef
from sparkbus.roles.compute import reduction as reduction_module

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64()), ("x", pa.float64())])
AGGS = (
    Aggregate(func="count", column=None, name="n"),
    Aggregate(func="count", column="v", name="nv"),
    Aggregate(func="sum", column="v", name="s"),
    Aggregate(func="avg", column="v", name="m"),
    Aggregate(func="min", column="v", name="lo"),
    Aggregate(func="max", column="b", name="hi"),
)
TWO_KEYS = ViewDef(source="t", group_by=("a", "b"), aggregates=AGGS)
ONE_KEY = ViewDef(source="t", group_by=("b",), aggregates=AGGS)
SUMS_ONLY = ViewDef(source="t", group_by=("a",), aggregates=AGGS[:4])

Row = tuple[Any, Any, Any, Any]


def table(rows: list[tuple[Row, int, int]]) -> pa.Table:
    cols: dict[str, list[Any]] = {n: [] for n in (*SCHEMA.names, TIME, DIFF)}
    for row, t, d in rows:
        for name, value in zip(SCHEMA.names, row, strict=True):
            cols[name].append(value)
        cols[TIME].append(t)
        cols[DIFF].append(d)
    return pa.table(cols, schema=pa.schema([*SCHEMA, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]))


def oracle(view: ViewDef, rows: Counter[Row]) -> list[tuple[Any, ...]]:
    index = {"a": 0, "b": 1}
    groups: dict[tuple[Any, ...], list[tuple[Row, int]]] = {}
    for row, m in rows.items():
        if m > 0:
            groups.setdefault(tuple(row[index[k]] for k in view.group_by), []).append((row, m))
    out = []
    for key, members in groups.items():
        values = [(r[2], m) for r, m in members if r[2] is not None]
        names = [(r[1], m) for r, m in members if r[1] is not None]
        n = sum(m for _, m in members)
        nv = sum(m for _, m in values)
        s = sum(v * m for v, m in values) if values else None
        agg: tuple[Any, ...] = (n, nv, s, s / nv if s is not None else None)
        if len(view.aggregates) > 4:
            agg += (min((v for v, _ in values), default=None), max((b for b, _ in names), default=None))
        out.append((*key, *agg))
    return sorted(out, key=repr)


def read(arr: Arrangement, t: int) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in arr.read_at(t).to_pylist()), key=repr)


row_strategy = st.tuples(
    st.sampled_from([1, 2, None]),
    st.sampled_from(["p", "q", None]),
    st.one_of(st.none(), st.integers(-3, 9)),
    st.just(0.5),
)
history = st.lists(
    st.lists(st.tuples(st.booleans(), row_strategy, st.integers(0, 40)), max_size=10), min_size=1, max_size=10
)


@settings(max_examples=80, deadline=None)
@given(
    batches=history,
    view=st.sampled_from([TWO_KEYS, ONE_KEY, SUMS_ONLY]),
    reclaim=st.booleans(),
    preaggregate=st.booleans(),
)
def test_maintained_equals_recomputed(
    batches: list[list[tuple[bool, Row, int]]], view: ViewDef, reclaim: bool, preaggregate: bool
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        # With the floor at 0, vanished groups' slots are reclaimed once they outnumber the live ones; with
        # the threshold at 0, every batch is aggregated per group before interning (as big batches are).
        patch.setattr(reduction_module, "_RECLAIM_FLOOR", 0 if reclaim else 1024)
        patch.setattr(reduction_module, "_PREAGGREGATE", 0 if preaggregate else 16384)
        check(batches, view)


def check(batches: list[list[tuple[bool, Row, int]]], view: ViewDef) -> None:
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = Arrangement(flow.schema)
    present: Counter[Row] = Counter()
    for t, batch in enumerate(batches):
        rows: list[tuple[Row, int, int]] = []
        for insert, row, pick in batch:
            if insert or not present:
                rows.append((row, t, 1))
                present[row] += 1
            else:
                victim = sorted(present.elements(), key=repr)[pick % sum(present.values())]
                rows.append((victim, t, -1))
                present[victim] -= 1
                present += Counter()
        out.append(flow.feed(table(rows)), t + 1)
        assert read(out, t) == oracle(view, present), f"at time {t}"


def test_a_group_retracted_to_zero_vanishes_and_comes_back_fresh() -> None:
    view = ViewDef(
        source="t",
        group_by=("a",),
        aggregates=(
            Aggregate(func="sum", column="x", name="s"),
            Aggregate(func="count", column=None, name="n"),
        ),
    )
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = Arrangement(flow.schema)
    rows = [(1, "p", 0, 0.1), (1, "p", 0, 0.2)]
    out.append(flow.feed(table([(r, 0, 1) for r in rows])), 1)
    # Retracting both leaves a float residue in a running sum (0.1 + 0.2 - 0.1 - 0.2 != 0): the group is gone.
    changes = flow.feed(table([(r, 1, -1) for r in rows]))
    assert changes.to_pylist() == [{"a": 1, "s": pytest.approx(0.3), "n": 2, TIME: 1, DIFF: -1}]
    out.append(changes, 2)
    assert read(out, 1) == []
    # It comes back with a sum from zero, not from the residue.
    out.append(flow.feed(table([((1, "p", 0, 0.7), 2, 1)])), 3)
    assert read(out, 2) == [(1, 0.7, 1)]


def test_null_nan_and_signed_zero_keys_group_as_arrow_groups_them() -> None:
    schema = pa.schema([("k", pa.float64()), ("v", pa.int64())])
    view = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="count", column=None, name="n"),))
    keys = [None, math.nan, 0.0, -0.0, None, math.nan]
    data = pa.table({"k": keys, "v": [1] * 6, TIME: [0] * 6, DIFF: [1] * 6})
    data = data.cast(pa.schema([*schema, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]))
    got = Dataflow(view, schema, 0, "v").feed(data)
    expected = data.group_by(["k"]).aggregate([(DIFF, "sum")])
    assert sorted(map(repr, got["n"].to_pylist())) == sorted(map(repr, expected[f"{DIFF}_sum"].to_pylist()))
    assert got.num_rows == 4


def test_reclaiming_keeps_the_live_groups_and_forgets_the_rest() -> None:
    view = ViewDef(
        source="t", group_by=("a", "b"), aggregates=(Aggregate(func="min", column="v", name="lo"),)
    )
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = Arrangement(flow.schema)
    keep = [((0, "keep", 5, 0.0), 0, 1), ((0, "keep", 3, 0.0), 0, 1)]
    out.append(flow.feed(table(keep)), 1)
    # 3,000 groups that each appear and vanish: their slots are reclaimed, the live group survives renumbering.
    for t in range(1, 4):
        churn = [((t * 1000 + i, "tmp", i, 0.0), t, 1) for i in range(1000)]
        out.append(flow.feed(table(churn)), t + 1)
        gone = [(row, t, -1) for row, _, _ in churn]
        out.append(flow.feed(table(gone)), t + 1)
    reduction = flow._reduction
    assert reduction is not None
    assert len(reduction._map or []) < 1024 + 2
    out.append(flow.feed(table([((0, "keep", 3, 0.0), 4, -1), ((7, "new", 1, 0.0), 4, 1)])), 5)
    assert read(out, 4) == [(0, "keep", 5), (7, "new", 1)]
