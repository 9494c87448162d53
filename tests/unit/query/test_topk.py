"""Top-k, sorting and grouping fast paths against plain pyarrow references.

``top_k`` must return exactly the prefix of the stable sort (ties in input order), for every key type,
direction and NULL placement, with NaN above every other float as Spark orders it. The reference here
sorts explicit flag columns (NULL, NaN) and the values with a plain ``pc.sort_indices``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.roles.query import aggregate, engine
from sparkbus.roles.query.expressions import Call, Column, Literal
from sparkbus.roles.query.plan import Limit, Project, Scan, Sort, SortKey, TopK

from .helpers import distributed, split

NAN = math.nan


def reference_sort(table: pa.Table, keys: list[SortKey]) -> pa.Table:
    columns: dict[str, pa.ChunkedArray] = {}
    order: list[tuple[str, str]] = []
    for i, k in enumerate(keys):
        col = table.column(k.column)
        columns[f"n{i}"] = pc.is_null(col)
        order.append((f"n{i}", "descending" if k.nulls_first else "ascending"))
        direction = "descending" if k.descending else "ascending"
        if pa.types.is_floating(col.type):
            columns[f"f{i}"] = pc.fill_null(pc.is_nan(col), False)
            order.append((f"f{i}", direction))  # NaN is the greatest float
        columns[f"v{i}"] = col
        order.append((f"v{i}", direction))
    return table.take(pc.sort_indices(pa.table(columns), sort_keys=order))


@st.composite
def keyed_tables(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(0, 120))
    few = st.one_of(st.none(), st.integers(0, 3))
    ints = draw(st.lists(st.one_of(few, st.integers(-1000, 1000)), min_size=n, max_size=n))
    floats = st.one_of(st.none(), st.sampled_from([NAN, 0.0, -0.0, 1.5]), st.floats(-1e3, 1e3))
    strs = st.one_of(st.none(), st.sampled_from(["a", "b", ""]), st.text("xyz", max_size=3))
    return pa.table(
        {
            "i": pa.array(ints, pa.int64()),
            "f": pa.array(draw(st.lists(floats, min_size=n, max_size=n)), pa.float64()),
            "s": pa.array(draw(st.lists(strs, min_size=n, max_size=n)), pa.string()),
            "b": pa.array(
                draw(st.lists(st.one_of(st.none(), st.booleans()), min_size=n, max_size=n)), pa.bool_()
            ),
            "row": pa.array(range(n), pa.int64()),
        }
    )


sort_keys = st.lists(
    st.builds(
        SortKey,
        column=st.sampled_from(["i", "f", "s", "b"]),
        descending=st.booleans(),
        nulls_first=st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda k: k.column,
)


@given(keyed_tables(), sort_keys, st.integers(0, 150), st.integers(1, 3))
def test_top_k_is_the_stable_sort_prefix(
    table: pa.Table, keys: list[SortKey], count: int, chunks: int
) -> None:
    step = max(1, table.num_rows // chunks)
    chunked = pa.concat_tables([table.slice(i, step) for i in range(0, table.num_rows, step)] or [table])
    want = reference_sort(table, keys).slice(0, count)
    assert engine.top_k(chunked, keys, count).column("row").to_pylist() == want.column("row").to_pylist()
    assert (
        engine.sort_table(chunked, keys).column("row").to_pylist()
        == reference_sort(table, keys).column("row").to_pylist()
    )


def test_top_k_with_ties_keeps_input_order() -> None:
    table = pa.table({"v": [5, 1, 5, 5, 3, 5, 5, 2, 5, 5] * 10, "row": range(100)})
    keys = [SortKey(column="v", descending=True, nulls_first=False)]
    got = engine.top_k(table, keys, 7).column("row").to_pylist()
    assert got == [0, 2, 3, 5, 6, 8, 9]


def test_top_k_float_nan_and_nulls_in_each_placement() -> None:
    values = [1.0, NAN, None, 5.0, -2.0, NAN, None, 3.0] * 8
    table = pa.table({"v": pa.array(values, pa.float64()), "row": range(len(values))})
    for desc in (False, True):
        for nulls_first in (False, True):
            keys = [SortKey(column="v", descending=desc, nulls_first=nulls_first)]
            for count in (1, 3, 10, 17, 40, 64, 100):
                want = reference_sort(table, keys).slice(0, count).column("row").to_pylist()
                assert engine.top_k(table, keys, count).column("row").to_pylist() == want


def test_sort_puts_nan_above_every_float() -> None:
    table = pa.table({"v": pa.array([1.0, NAN, None, 5.0], pa.float64())})
    asc = engine.sort_table(table, [SortKey(column="v", descending=False, nulls_first=True)])
    desc = engine.sort_table(table, [SortKey(column="v", descending=True, nulls_first=False)])
    assert [repr(v) for v in asc.column("v").to_pylist()] == ["None", "1.0", "5.0", "nan"]
    assert [repr(v) for v in desc.column("v").to_pylist()] == ["nan", "5.0", "1.0", "None"]


@given(
    keyed_tables(),
    sort_keys,
    st.lists(st.integers(0, 120), max_size=3),
    st.integers(0, 30),
    st.integers(0, 30),
)
def test_distributed_limit_offset_matches_reference(
    table: pa.Table, keys: list[SortKey], at: list[int], count: int, offset: int
) -> None:
    plan = Limit(input=Sort(input=Scan(table="t"), keys=tuple(keys)), count=count, offset=offset)
    got = distributed(plan, split(table, at))
    want = reference_sort(table, keys).slice(offset, count)
    assert got is not None
    # Partitions are consecutive slices, so the stable order across them is the whole table's.
    assert got.column("row").to_pylist() == want.column("row").to_pylist()


@given(keyed_tables(), st.sampled_from([["s"], ["i"], ["b", "s"], ["s", "i", "b"]]), st.integers(1, 3))
def test_grouping_keeps_first_appearance_order(table: pa.Table, keys: list[str], chunks: int) -> None:
    step = max(1, table.num_rows // chunks)
    chunked = pa.concat_tables([table.slice(i, step) for i in range(0, table.num_rows, step)] or [table])
    specs: list[tuple[str, str | None, str]] = [
        ("n", None, "count"),
        ("c", "f", "count"),
        ("sm", "i", "sum"),
        ("z", "i", "sum0"),
        ("lo", "s", "min"),
        ("hi", "f", "max"),
    ]
    got = aggregate._apply_grouped(chunked, keys, specs)
    want = aggregate._apply_numbered(table, keys, specs)
    assert got.schema == want.schema
    assert repr(got.to_pylist()) == repr(want.to_pylist())  # repr: NaN equals NaN
    first: dict[tuple[object, ...], None] = {}
    for row in table.select(keys).to_pylist():
        first.setdefault(tuple(repr(v) for v in row.values()), None)
    assert [tuple(repr(v) for v in r.values()) for r in got.select(keys).to_pylist()] == list(first)


def test_store_and_inbox_realign_buffers() -> None:
    data = pa.array([1, 2, 3], pa.int64()).buffers()[1].to_pybytes()
    raw = pa.py_buffer(b"\0" * 3 + data).slice(3)
    odd = pa.Array.from_buffers(pa.int64(), 3, [None, raw])
    assert odd.buffers()[1].address % 8 != 0
    store = engine.PartitionStore()
    store.load("t", pa.table({"v": pa.chunked_array([odd])}))
    stored = store.get("t")
    assert stored is not None
    assert stored.column("v").num_chunks == 1
    assert stored.column("v").chunk(0).buffers()[1].address % 64 == 0
    assert stored.column("v").to_pylist() == [1, 2, 3]


@given(keyed_tables(), st.sampled_from([("i",), ("s", "row"), ("f",)]), st.integers(-5, 5))
def test_scan_filters_only_the_columns_the_projection_reads(
    table: pa.Table, names: tuple[str, ...], bound: int
) -> None:
    pred = Call(op="gt", args=(Column(name="i"), Literal(value=bound)))
    plan = Project(
        input=Scan(table="t", predicate=pred), items=tuple((f"o{n}", Column(name=n)) for n in names)
    )
    store = engine.PartitionStore()
    store.load("t", table)
    got = engine.run(plan, store)
    want = table.filter(pc.greater(table.column("i"), bound))
    assert got is not None
    assert got.column_names == [f"o{n}" for n in names]
    assert repr(got.to_pydict()) == repr({f"o{n}": want.column(n).to_pylist() for n in names})
    count = engine.run(Scan(table="t", columns=(), predicate=pred), store)
    assert count is not None
    assert (count.num_columns, count.num_rows) == (0, want.num_rows)


def _scan_top_k(keys: list[SortKey], count: int, predicate: Call | None) -> TopK:
    renamed = tuple((f"o_{n}", Column(name=n)) for n in ("i", "f", "s", "b", "row"))
    project = Project(input=Scan(table="t", predicate=predicate), items=renamed)
    return TopK(input=project, keys=tuple(replace(k, column=f"o_{k.column}") for k in keys), count=count)


@given(keyed_tables(), sort_keys, st.integers(0, 40), st.sampled_from([None, -3, 0, 2, 5000]))
def test_kept_sort_order_gives_the_top_k_rows(
    table: pa.Table, keys: list[SortKey], count: int, bound: int | None
) -> None:
    pred = None if bound is None else Call(op="lt", args=(Column(name="i"), Literal(value=bound)))
    plan = _scan_top_k(keys, count, pred)
    want = table if pred is None else table.filter(pc.less(table.column("i"), bound))
    want_rows = reference_sort(want, keys).slice(0, count).column("row").to_pylist()
    store = engine.PartitionStore()
    store.load("t", table)
    for _ in range(3):  # no order kept, order built, order used
        got = engine.run(plan, store)
        assert got is not None
        assert got.column("o_row").to_pylist() == want_rows


def test_kept_sort_order_walks_in_growing_slices_and_follows_reloads() -> None:
    n = 20_000
    table = pa.table(
        {
            "i": pc.cast(pc.bit_wise_and(pa.array(range(n), pa.int64()), 1023), pa.int64()),
            "f": pa.array([float(x % 97) if x % 13 else None for x in range(n)], pa.float64()),
            "s": pa.array([str(x % 7) for x in range(n)]),
            "b": pa.array([x % 3 == 0 for x in range(n)]),
            "row": pa.array(range(n), pa.int64()),
        }
    )
    keys = [SortKey(column="f", descending=True, nulls_first=False), SortKey(column="row", descending=True)]
    store = engine.PartitionStore()
    store.load("t", table)
    for bound, count in ((3, 10), (1, 25), (0, 5), (1024, 7)):  # few matches: slices grow, or give up
        pred = Call(op="lt", args=(Column(name="i"), Literal(value=bound)))
        want = reference_sort(table.filter(pc.less(table.column("i"), bound)), keys).slice(0, count)
        for _ in range(3):
            got = engine.run(_scan_top_k(keys, count, pred), store)
            assert got is not None
            assert got.column("o_row").to_pylist() == want.column("row").to_pylist()
    store.load("t", table.slice(0, 100), replace=True)
    for _ in range(3):
        got = engine.run(_scan_top_k(keys, 4, None), store)
        assert got is not None
        assert (
            got.column("o_row").to_pylist()
            == reference_sort(table.slice(0, 100), keys).slice(0, 4).column("row").to_pylist()
        )


def test_store_keeps_a_bounded_number_of_orders() -> None:
    store = engine.PartitionStore()
    table = pa.table({"v": [3, 1, 2]})
    for i in range(store.ORDERS + 5):
        keys = [SortKey(column="v", descending=bool(i % 2), nulls_first=i % 4 < 2)]
        store.sorted_order(f"t{i}", table, keys)
        assert store.sorted_order(f"t{i}", table, keys) is not None
    assert len(store._orders) == store.ORDERS


@given(st.lists(st.integers(0, 5000), max_size=6))
def test_arange_is_zero_to_n_in_any_call_order(sizes: list[int]) -> None:
    for n in [*sizes, aggregate._ARANGE_KEPT + 3]:
        got = aggregate.arange(n)
        assert got.type == pa.int64()
        assert len(got) == n
        if n:
            assert (got[0].as_py(), got[n - 1].as_py()) == (0, n - 1)
            assert pc.all(pc.equal(pc.pairwise_diff(got), 1)).as_py() in (True, None)
