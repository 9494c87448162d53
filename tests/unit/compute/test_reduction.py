"""The slot-based group-by state: several key columns, null keys, groups that vanish and come back, and the
reclaiming of vanished groups' slots all give what a recomputation from scratch gives."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.roles.compute import (
    DIFF,
    TIME,
    Aggregate,
    Arrangement,
    ComputeReplica,
    Dataflow,
    KeyedArrangement,
    ViewDef,
    index_arrangement,
)
from sparkbus.roles.compute import keyed as keyed_module
from sparkbus.roles.compute import reduction as reduction_module
from sparkbus.roles.compute.arrangement import encode_table

from .harness import Cluster

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
SPECIAL = (math.inf, -math.inf, math.nan)


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


@settings(max_examples=150, deadline=None)
@given(
    batches=history,
    view=st.sampled_from([TWO_KEYS, ONE_KEY, SUMS_ONLY]),
    reclaim=st.booleans(),
    preaggregate=st.booleans(),
    dense_cells=st.sampled_from([0, 40, 1 << 22]),
)
def test_maintained_equals_recomputed(
    batches: list[list[tuple[bool, Row, int]]],
    view: ViewDef,
    reclaim: bool,
    preaggregate: bool,
    dense_cells: int,
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        # Integer min/max keep a slots x values matrix up to this many cells, then a multiplicity table:
        # 0 means never a matrix, 40 means moving from one to the other midway.
        patch.setattr(reduction_module, "_DENSE_CELLS", dense_cells)
        # With the floor at 0, vanished groups' slots are reclaimed once they outnumber the live ones; with
        # the threshold at 0, every batch is aggregated per group before interning (as big batches are).
        patch.setattr(reduction_module, "_RECLAIM_FLOOR", 0 if reclaim else 1024)
        patch.setattr(reduction_module, "_PREAGGREGATE", 0 if preaggregate else 16384)
        check(batches, view)


def updates_at(
    batch: list[tuple[bool, Row, int]], t: int, present: Counter[Row]
) -> list[tuple[Row, int, int]]:
    """A drawn batch as updates at time ``t``: inserts, and retractions of rows ``present`` holds (updated)."""
    rows: list[tuple[Row, int, int]] = []
    for insert, row, pick in batch:
        if insert or not present:
            rows.append((row, t, 1))
            present[row] += 1
        else:
            victim = sorted(present.elements(), key=repr)[pick % sum(present.values())]
            rows.append((victim, t, -1))
            present[victim] -= 1
            present += Counter()  # drop zero counts
    return rows


def check(batches: list[list[tuple[bool, Row, int]]], view: ViewDef) -> None:
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = Arrangement(flow.schema)
    present: Counter[Row] = Counter()
    for t, batch in enumerate(batches):
        out.append(flow.feed(table(updates_at(batch, t, present))), t + 1)
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


def test_a_column_whose_first_null_comes_late_counts_its_values_from_then_on() -> None:
    """A column's non-null count is the row count until its first null (no accumulator of its own); from
    that batch on it is counted apart, and a global aggregate over no rows still has null sums."""
    aggs = (
        Aggregate(func="count", column=None, name="n"),
        Aggregate(func="count", column="v", name="nv"),
        Aggregate(func="sum", column="v", name="s"),
        Aggregate(func="avg", column="v", name="m"),
    )
    late_nulls = [
        [((1, "p", 4, 0.0), 1), ((2, "p", 6, 0.0), 1)],
        [((1, "p", None, 0.0), 1), ((2, "p", 6, 0.0), -1)],
        [((2, "q", None, 0.0), 1), ((1, "p", 4, 0.0), -1)],
        [((1, "p", None, 0.0), -1), ((2, "q", None, 0.0), -1)],
    ]
    no_nulls = [[((1, "p", 4, 0.0), 1)], [((1, "p", 4, 0.0), -1)]]
    views = (ViewDef(source="t", group_by=("a",), aggregates=aggs), ViewDef(source="t", aggregates=aggs))
    for view, history in itertools.product(views, (late_nulls, no_nulls)):
        flow = Dataflow(view, SCHEMA, 0, "v")
        out = index_arrangement(view, flow.schema, since=0, upper=0)
        present: Counter[Row] = Counter()
        for t, batch in enumerate(history):
            for row, d in batch:
                present[row] += d
            present += Counter()
            changes = flow.feed(table([(row, t, d) for row, d in batch]))
            out.append(changes, t + 1, flow.steps_of(changes))
            if view.group_by:
                expected = oracle(view, present)
            else:
                values = [(r[2], m) for r, m in present.items() if r[2] is not None]
                nv = sum(m for _, m in values)
                s = sum(v * m for v, m in values) if values else None
                expected = [(sum(present.values()), nv, s, s / nv if s is not None else None)]
            assert read(out, t) == expected, f"{view.group_by} at time {t}"


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


FLOAT_SUMS = ViewDef(
    source="t",
    group_by=("a",),
    aggregates=(Aggregate(func="sum", column="x", name="s"), Aggregate(func="avg", column="x", name="m")),
)
float_history = st.lists(
    st.lists(
        st.tuples(
            st.booleans(),
            st.tuples(
                st.sampled_from([1, 2]), st.just("p"), st.just(0), st.sampled_from([1.0, 2.5, *SPECIAL])
            ),
            st.integers(0, 40),
        ),
        max_size=6,
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=100, deadline=None)
@given(batches=float_history, reclaim=st.booleans(), preaggregate=st.booleans())
def test_retracting_infinities_and_nan_restores_a_float_sum(
    batches: list[list[tuple[bool, Row, int]]], reclaim: bool, preaggregate: bool
) -> None:
    """A float sum once given inf, -inf or NaN and then rid of it again is the sum of what is left, as a
    replica that built the view from scratch computes it (``inf - inf`` used to leave it NaN for good)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reduction_module, "_RECLAIM_FLOOR", 0 if reclaim else 1024)
        patch.setattr(reduction_module, "_PREAGGREGATE", 0 if preaggregate else 16384)
        flow = Dataflow(FLOAT_SUMS, SCHEMA, 0, "v")
        out = Arrangement(flow.schema)
        present: Counter[Row] = Counter()
        for t, batch in enumerate(batches):
            out.append(flow.feed(table(updates_at(batch, t, present))), t + 1)
            groups: dict[int, list[float]] = {}
            for row, m in present.items():
                groups.setdefault(row[0], []).extend([row[3]] * m)
            # Python's float sum is SQL's: inf + -inf and anything + NaN are NaN.
            expected = sorted(((a, sum(xs), sum(xs) / len(xs)) for a, xs in groups.items()), key=repr)
            assert list(map(repr, read(out, t))) == list(map(repr, expected)), f"at time {t}"


def test_a_rebuilt_replica_and_a_maintaining_one_agree_on_a_float_sum() -> None:
    c = Cluster(("r1", "r2"))
    for r in ("r1", "r2"):
        c.up(r)
    c.run()
    schema = pa.schema([("k", pa.string()), ("x", pa.float64())])
    c.do("create_table", name="t", schema=schema)
    view = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="sum", column="x", name="s"),))
    c.do("create_view", name="v", view=view)
    for x, diff in [(1.0, 1), (math.inf, 1), (math.nan, 1), (math.inf, -1), (math.nan, -1)]:
        batch = {"k": ["a"], "x": pa.array([x], pa.float64()), DIFF: pa.array([diff], pa.int64())}
        c.do("write", table="t", batch=ipc(pa.table(batch)))
    c.cut("r2")
    c.replicas["r2"] = ComputeReplica()  # r2 restarts: it builds the view from the compacted table
    c.up("r2")
    c.run()
    for r in ("r1", "r2"):
        assert rows_of(c, c.call("peek", view="v", target_replica=r)) == [{"k": "a", "s": 1.0}]


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


# ---------------------------------------------------------------- the keyed index arrangement

# Each write: (rows, how many times later it lands (0 = the next time), how far to compact behind it).
keyed_history = st.lists(
    st.tuples(
        st.lists(st.tuples(st.booleans(), row_strategy, st.integers(0, 40)), max_size=10),
        st.integers(0, 2),
        st.one_of(st.none(), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=120, deadline=None)
@given(
    writes=keyed_history,
    view=st.sampled_from([TWO_KEYS, ONE_KEY, SUMS_ONLY]),
    collect=st.booleans(),
    reclaim=st.booleans(),
    steps=st.booleans(),
)
def test_keyed_index_reads_what_a_recomputation_gives_at_every_readable_time(
    writes: list[tuple[list[tuple[bool, Row, int]], int, int | None]],
    view: ViewDef,
    collect: bool,
    reclaim: bool,
    steps: bool,
) -> None:
    """Peeks at several timestamps, compaction, retractions to zero, groups that vanish and come back, and
    null keys: the keyed arrangement reads at every time >= since what the oracle computes for that time,
    and holds the same consolidated updates as the generic arrangement, whether it interns the keys itself
    or takes the slots from the reduction's steps (as a replica's index does), across the renumbering of
    either side's slots."""
    with pytest.MonkeyPatch.context() as patch:
        # A floor of 0 drops dead store parts, or collects the store (and reclaims key slots), as soon as
        # garbage outnumbers live rows.
        patch.setattr(keyed_module, "_GC_FLOOR", 0 if collect else 4096)
        patch.setattr(reduction_module, "_RECLAIM_FLOOR", 0 if reclaim else 1024)
        flow = Dataflow(view, SCHEMA, 0, "v")
        keyed = index_arrangement(view, flow.schema, since=0, upper=0)
        generic = Arrangement(flow.schema)
        assert isinstance(keyed, KeyedArrangement)
        present: Counter[Row] = Counter()
        states: dict[int, list[tuple[Any, ...]]] = {}
        t = 0
        for batch, gap, lag in writes:
            t += gap
            changes = flow.feed(table(updates_at(batch, t, present)))
            keyed.append(changes, t + 1, flow.steps_of(changes) if steps else None)
            generic.append(changes, t + 1, flow.steps_of(changes))
            for u in range(max(states, default=-1) + 1, t + 1):
                states[u] = oracle(view, present) if u == t else states.get(u - 1, [])
            if lag is not None and t - lag > keyed.since[0]:
                keyed.compact((t - lag,))
                generic.compact((t - lag,))
            since = keyed.since[0]
            for u in range(since, t + 1):
                assert read(keyed, u) == states[u], f"at time {u} (since {since}, written up to {t})"
            t += 1
        assert keyed.keyed
        assert canonical(keyed.updates) == canonical(generic.updates)
        assert len(keyed) >= len(keyed.read_at(t))


def canonical(updates: pa.Table) -> list[str]:
    return sorted(repr(tuple(r.values())) for r in updates.to_pylist())


def test_a_batch_that_does_not_fit_a_keyed_index_turns_it_into_a_generic_one() -> None:
    schema = pa.schema([("k", pa.int64()), ("n", pa.int64())])
    full = pa.schema([*schema, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])
    arr = KeyedArrangement(schema, ["k"])
    arr.append(pa.table({"k": [1, 2], "n": [10, 20], TIME: [0, 0], DIFF: [1, 1]}, schema=full), 1)
    arr.append(pa.table({"k": [1, 1], "n": [10, 11], TIME: [1, 1], DIFF: [-1, 1]}, schema=full), 2)
    assert arr.keyed
    # A second row for key 2 (a collection that is not one row per key): the arrangement keeps both.
    arr.append(pa.table({"k": [2], "n": [21], TIME: [2], DIFF: [1]}, schema=full), 3)
    assert not arr.keyed
    assert sorted(arr.read_at(2).to_pylist(), key=repr) == sorted(
        [{"k": 1, "n": 11}, {"k": 2, "n": 20}, {"k": 2, "n": 21}], key=repr
    )
    assert sorted(arr.read_at(0).to_pylist(), key=repr) == [{"k": 1, "n": 10}, {"k": 2, "n": 20}]
    # Retracting a key that has no row, or a diff of 2, also falls back (on fresh arrangements).
    for bad in ({"k": [3], "n": [1], TIME: [1], DIFF: [-1]}, {"k": [3], "n": [1], TIME: [1], DIFF: [2]}):
        other = KeyedArrangement(schema, ["k"])
        other.append(pa.table({"k": [1], "n": [10], TIME: [0], DIFF: [1]}, schema=full), 1)
        other.append(pa.table(bad, schema=full), 2)
        assert not other.keyed
        assert other.read_at(0).to_pylist() == [{"k": 1, "n": 10}]


def test_a_keyed_index_forgets_rows_and_keys_that_compaction_left_behind() -> None:
    view = ViewDef(source="t", group_by=("a",), aggregates=(Aggregate(func="count", column=None, name="n"),))
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = index_arrangement(view, flow.schema, since=0, upper=0)
    assert isinstance(out, KeyedArrangement)
    out.append(flow.feed(table([((-1, "keep", 0, 0.0), 0, 1)])), 1)
    # 3,000 short-lived keys, compacted as the controller does after each write.
    for t in range(1, 31):
        churn = [((t * 100 + i, "tmp", 0, 0.0), t, 1) for i in range(100)]
        out.append(flow.feed(table(churn)), t + 1)
        out.append(flow.feed(table([(row, t + 1, -1) for row, _, _ in churn])), t + 2)
        out.compact((t + 1,))
    assert out._stored <= 4 * keyed_module._GC_FLOOR
    assert len(out._map) <= 2 * keyed_module._GC_FLOOR
    assert read(out, 31) == [(-1, 1)]


def test_a_keyed_index_drops_dead_store_parts_without_copying_the_live_rows() -> None:
    """Groups that stay untouched keep their rows in the oldest part while the touched ones are replaced
    each write: once the store outgrows the live rows the dead parts are dropped (the old part stays, no
    row is copied), and reads at every time from the since on still match a generic arrangement."""
    view = ViewDef(source="t", group_by=("a",), aggregates=AGGS[:4])
    flow = Dataflow(view, SCHEMA, 0, "v")
    out = index_arrangement(view, flow.schema, since=0, upper=0)
    generic = Arrangement(flow.schema)
    assert isinstance(out, KeyedArrangement)
    copies: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keyed_module, "_GC_FLOOR", 0)
        patch.setattr(KeyedArrangement, "_collect", lambda self: copies.append(self._stored))
        first = flow.feed(table([((a, "p", a, 0.0), 0, 1) for a in range(20)]))
        out.append(first, 1, flow.steps_of(first))
        generic.append(first, 1)
        held = []
        for t in range(1, 150):
            # Groups 0-4 change at every write (a row out, another in); groups 5-19 never do.
            batch = [((a, "p", a + t - 1, 0.0), t, -1) for a in range(5)]
            batch += [((a, "p", a + t, 0.0), t, 1) for a in range(5)]
            changes = flow.feed(table(batch))
            out.append(changes, t + 1, flow.steps_of(changes))
            generic.append(changes, t + 1)
            if t > 2:
                out.compact((t - 2,))
                generic.compact((t - 2,))
            if t % 7 == 0:
                for u in range(out.since[0], t + 1):
                    assert read(out, u) == read(generic, u), f"at time {u}"
            held.append(out._stored)
    assert copies == []
    # The store grows by 5 rows a write and shrinks back to the first part's 20 rows and the live ones.
    assert max(held) <= 4 * (20 + 2 * 3 * 10) + 5
    assert any(after < before for before, after in itertools.pairwise(held))
    assert canonical(out.updates) == canonical(generic.updates)


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.one_of(st.none(), st.integers(-5, 20), st.integers(-(2**63), 2**63 - 1)), max_size=12),
        max_size=8,
    )
)
def test_the_interner_codes_values_by_first_appearance_whichever_lookup_it_uses(
    batches: list[list[int | None]],
) -> None:
    """Integer values in a small range are looked up in a direct table, others hashed: same codes."""
    interner = reduction_module._Interner(pa.int64())
    seen: dict[int | None, int] = {}
    for batch in batches:
        for value in batch:
            seen.setdefault(value, len(seen))
        codes = interner.codes(pa.array(batch, pa.int64()))
        assert codes.tolist() == [seen[v] for v in batch]


@pytest.mark.parametrize("top", [2**62, 2**63 - 1])
def test_the_interner_tells_extreme_values_from_known_ones_near_the_other_end(top: int) -> None:
    """Known values at the top of the int64 range and a lookup of values at the bottom: ``value - base``
    wraps around, and must not land on a known value's code."""
    interner = reduction_module._Interner(pa.int64())
    known = list(range(top - 9, top + 1))
    assert interner.codes(pa.array(known, pa.int64())).tolist() == list(range(10))
    assert interner.codes(pa.array(known[::-1], pa.int64())).tolist() == list(range(10))[::-1]
    bottom = [-(2**63), -(2**63) + 3, -(2**62), top - 4]
    assert interner.codes(pa.array(bottom, pa.int64())).tolist() == [10, 11, 12, 5]


def test_peeks_through_a_replica_read_a_keyed_index_at_past_timestamps_and_refuse_below_its_since() -> None:
    """End to end (controller, replica, envelope codec): with a compaction lag of 2 a group-by view answers
    peeks at the last three timestamps as a recomputation does (a group retracted to zero, a group that
    comes back, a null key), a peek below the since is an error, and a peek ahead waits for the write."""
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    with_diff = schema.append(pa.field(DIFF, pa.int64()))
    view = ViewDef(
        source="t",
        group_by=("k",),
        aggregates=(
            Aggregate(func="count", column=None, name="n"),
            Aggregate(func="max", column="v", name="hi"),
        ),
    )
    c = Cluster(("r1",), compaction_lag=2)
    c.up("r1")
    c.run()
    c.do("create_table", name="t", schema=schema)
    c.do("create_view", name="v", view=view)
    writes: list[list[tuple[str | None, int, int]]] = [
        [("a", 1, 1), ("b", 5, 1), (None, 7, 1)],
        [("a", 1, -1)],  # a retracted to zero
        [("a", 4, 1), ("b", 5, -1), ("b", 2, 1)],  # a comes back, b changes
        [(None, 7, -1), ("c", 3, 1)],  # the null key vanishes
    ]
    present: Counter[tuple[str | None, int]] = Counter()
    states: dict[int, list[tuple[Any, ...]]] = {}
    for rows in writes:
        for k, v, d in rows:
            present[(k, v)] += d
        data = {"k": [r[0] for r in rows], "v": [r[1] for r in rows], DIFF: [r[2] for r in rows]}
        c.do("write", table="t", batch=ipc(pa.table(data, schema=with_diff)))
        groups: dict[str | None, list[int]] = {}
        for (k, v), m in present.items():
            groups.setdefault(k, []).extend([v] * m)
        states[c.controller.upper - 1] = sorted(
            ((k, len(vs), max(vs)) for k, vs in groups.items() if vs), key=repr
        )
    latest = c.controller.upper - 1
    for t in (latest - 2, latest - 1, latest):
        got = rows_of(c, c.call("peek", view="v", timestamp=t))
        assert sorted((tuple(r.values()) for r in got), key=repr) == states[t], f"at {t}"
    below = c.call("peek", view="v", timestamp=latest - 3)
    c.run()
    assert c.replies[below].error is not None and "since" in c.replies[below].error
    ahead = c.call("peek", view="v", timestamp=latest + 1)
    c.run()
    assert ahead not in c.replies  # waits until the frontier passes its timestamp
    c.do("write", table="t", batch=ipc(pa.table({"k": ["d"], "v": [9], DIFF: [1]}, schema=with_diff)))
    assert ("d", 1, 9) in {tuple(r.values()) for r in rows_of(c, ahead)}


def rows_of(c: Cluster, call_id: int) -> list[dict[str, Any]]:
    c.run()
    return c.rows(call_id)


def ipc(table: pa.Table) -> bytes:
    return encode_table(table)
