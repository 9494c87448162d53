"""COUNT(DISTINCT)'s states are one row per distinct value: they cut into small batches, and merge right."""

from __future__ import annotations

import itertools
import math

import pyarrow as pa
import pytest

from sparkbus.roles.query import aggregate
from sparkbus.roles.query import exchange as x
from sparkbus.roles.query.plan import AggCall

AGGS = [
    AggCall(name="d", func="count_distinct", column="x"),
    AggCall(name="s", func="sum", column="x"),
    AggCall(name="a", func="avg", column="f"),
    AggCall(name="e", func="count_distinct", column="f"),
    AggCall(name="n", func="count", column=None),
]


@pytest.mark.parametrize("keys", [[], ["k"]])
def test_states_of_many_distinct_values_cut_into_small_batches(keys: list[str]) -> None:
    rows = 100_000
    table = pa.table({"k": ["a", "b"] * (rows // 2), "x": list(range(rows)), "f": [0.5] * rows})
    states = aggregate.partial(table, keys, AGGS)
    assert states.num_rows > rows  # a row per distinct value beside the group rows
    for offset in (0, states.num_rows // 2, states.num_rows - 1):
        data, sent = x.next_batch(states, offset, 16_384)
        assert len(data) <= 16_384 and (sent > 100 or offset + sent == states.num_rows)
    # The same states twice, as two participants holding the same rows would send them.
    got = aggregate.final(pa.concat_tables([states, states]), keys, AGGS)
    got = got.sort_by("k") if keys else got
    if keys:
        want = [
            {"k": "a", "d": rows // 2, "s": 2 * sum(range(0, rows, 2)), "a": 0.5, "e": 1, "n": rows},
            {"k": "b", "d": rows // 2, "s": 2 * sum(range(1, rows, 2)), "a": 0.5, "e": 1, "n": rows},
        ]
    else:
        want = [{"d": rows, "s": 2 * sum(range(rows)), "a": 0.5, "e": 1, "n": 2 * rows}]
    assert got.to_pylist() == want


def _reference(table: pa.Table) -> dict[object, tuple[int, int, int]]:
    """Per key: distinct non-null x, distinct non-null f (-0.0 is 0.0, NaN one value), rows."""
    out: dict[object, tuple[set[object], set[object], int]] = {}
    for r in table.to_pylist():
        xs, fs, n = out.get(r["k"], (set(), set(), 0))
        if r["x"] is not None:
            xs.add(r["x"])
        f = r["f"]
        if f is not None:
            fs.add("nan" if math.isnan(f) else f + 0.0)
        out[r["k"]] = (xs, fs, n + 1)
    return {k: (len(xs), len(fs), n) for k, (xs, fs, n) in out.items()}


@pytest.mark.parametrize("cuts", [(), (5,), (3, 11), (0, 24), (8, 9, 16)])
def test_states_fold_batch_by_batch_with_nulls_nan_and_negative_zero(cuts: tuple[int, ...]) -> None:
    nan = float("nan")
    table = pa.table(
        {
            "k": pa.array(["a", None, "a", "b", None, "b", "a", "c"] * 3),
            "x": pa.array([1, 2, None, 1, 2, 3, 1, None] * 3, pa.int64()),
            "f": pa.array([0.0, -0.0, nan, None, 1.5, nan, -0.0, None] * 3),
        }
    )
    bounds = [0, *cuts, table.num_rows]
    parts = [aggregate.partial(table.slice(a, b - a), ["k"], AGGS) for a, b in itertools.pairwise(bounds)]
    folded = parts[0]
    for p in parts[1:]:  # as an Inbox folds the batches it receives
        folded = aggregate.combine(pa.concat_tables([folded, p]), ["k"], AGGS)
    got = aggregate.finalize(folded, ["k"], AGGS).to_pylist()
    assert {r["k"]: (r["d"], r["e"], r["n"]) for r in got} == _reference(table)
    single = aggregate.single(table, ["k"], AGGS).to_pylist()
    assert {r["k"]: (r["d"], r["e"], r["n"]) for r in single} == _reference(table)
