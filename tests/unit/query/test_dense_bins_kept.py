"""Dense aggregation keeps the bin numbers of big key columns: whatever it keeps, answers stay right."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.query import aggregate
from sparkbus.roles.query.plan import AggCall

AGGS = [
    AggCall(name="n", func="count", column=None),
    AggCall(name="s", func="sum", column="v"),
]
ROWS = 1 << 17  # above the size from which bins are kept


def reference(table: pa.Table, key: str) -> dict[object, tuple[int, float]]:
    grouped = table.group_by([key]).aggregate([([], "count_all"), ("v", "sum")])
    return {
        k: (n, s)
        for k, n, s in zip(
            grouped.column(key).to_pylist(),
            grouped.column("count_all").to_pylist(),
            grouped.column("v_sum").to_pylist(),
            strict=True,
        )
    }


def states(table: pa.Table, key: str) -> dict[object, tuple[int, float]]:
    """The partial states, grouped three times: a column is kept the second time, found the third."""
    answers = []
    for _ in range(3):
        out = aggregate.partial(table, [key], AGGS)
        cols = [out.column(c).to_pylist() for c in (key, "n", "s")]
        answers.append({k: (n, s) for k, n, s in zip(*cols, strict=True)})
    assert answers[0] == answers[1] == answers[2]
    return answers[0]


def test_a_column_is_kept_the_second_time_it_is_grouped() -> None:
    table = events(12)
    col = table.column("k").chunk(0)
    assert aggregate._BINNED.get(aggregate._BINNED.key(col)) is None
    aggregate.partial(table, ["k"], AGGS)
    assert (
        aggregate._BINNED.get(aggregate._BINNED.key(col)) is None
    )  # once: a filtered column of one query, say; no copy
    aggregate.partial(table, ["k"], AGGS)
    assert aggregate._BINNED.get(aggregate._BINNED.key(col)) is not None


def events(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"k": rng.integers(0, 1000, ROWS), "v": rng.random(ROWS)})


def test_grouping_the_same_column_again_gives_the_same_answer() -> None:
    table = events(1)
    first = states(table, "k")
    assert first == reference(table, "k")
    assert states(table, "k") == first  # from the kept bins


def test_slices_of_one_buffer_are_told_apart() -> None:
    table = events(2)
    whole = table.combine_chunks()
    assert states(whole, "k") == reference(whole, "k")
    for start, length in ((0, ROWS // 2), (ROWS // 2, ROWS // 2), (1, ROWS - 1)):
        part = whole.slice(start, length).combine_chunks() if start == 1 else whole.slice(start, length)
        assert states(part, "k") == reference(part, "k")


def test_another_table_with_other_keys_is_not_answered_from_the_first() -> None:
    for seed in range(3, 9):  # more tables than entries kept, and freed memory reused in between
        table = events(seed)
        table = table.set_column(0, "k", pc.add(table.column("k"), seed * 7))
        assert states(table, "k") == reference(table, "k")


def test_dictionary_keys_with_the_same_indices_and_another_dictionary() -> None:
    rng = np.random.default_rng(10)
    indices = pa.array(rng.integers(0, 3, ROWS).astype(np.int32))
    values = pa.array(rng.random(ROWS))
    one = pa.table({"k": pa.DictionaryArray.from_arrays(indices, ["a", "b", "c"]), "v": values})
    two = pa.table({"k": pa.DictionaryArray.from_arrays(indices, ["x", "y", "z"]), "v": values})
    assert states(one, "k") == reference(one, "k")
    assert states(two, "k") == reference(two, "k")
    assert set(states(two, "k")) == {"x", "y", "z"}


def test_null_keys_are_counted_in_their_own_group_from_kept_bins() -> None:
    table = events(11)
    keys = table.column("k").combine_chunks()
    mask = np.zeros(ROWS, bool)
    mask[::5] = True
    table = table.set_column(0, "k", pa.array(keys.to_numpy(), mask=mask))
    expected = reference(table, "k")
    assert states(table, "k") == expected
    assert states(table, "k") == expected
    assert expected[None][0] == mask.sum()
