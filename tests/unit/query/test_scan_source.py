"""Scans over prepared partitions: dictionary-encoded string columns give exactly the plain results."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.roles.query import aggregate, engine
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import canonical, run_fragments, split, tables

QUERIES = [
    "SELECT k, x FROM t WHERE k = 'a'",
    "SELECT k, x FROM t WHERE k <> 'b' AND x > 0",
    "SELECT x FROM t WHERE 'c' = k OR x IS NULL",
    "SELECT x FROM t WHERE k = 'zz'",
    "SELECT x FROM t WHERE NOT (k = 'a')",
    "SELECT x FROM t WHERE k = 'a' OR NULL",
    "SELECT x FROM t WHERE NULL AND k <> 'b'",
    "SELECT k, x FROM t WHERE k = ?",
    "SELECT k, count(*) AS n, sum(x) AS s, avg(y) AS m FROM t GROUP BY k",
    "SELECT k, g, count(*) AS n, min(x) AS lo FROM t WHERE k <> 'c' GROUP BY k, g",
    "SELECT lower(k) AS lk, count(*) AS n FROM t GROUP BY lower(k)",
    "SELECT k, min(k) AS lo, count(DISTINCT k) AS d FROM t GROUP BY k",
    "SELECT count(DISTINCT x) AS d FROM t WHERE k = 'a'",
    "SELECT k, sum(x) AS s FROM t GROUP BY k ORDER BY s DESC, k LIMIT 2",
]


def _stores(parts: list[pa.Table], min_rows: int) -> list[engine.PartitionStore]:
    out: list[engine.PartitionStore] = []
    for p in parts:
        s = engine.PartitionStore()
        s.DICTIONARY_MIN_ROWS = min_rows
        s.load("t", p)
        out.append(s)
    return out


@given(tables(), st.lists(st.integers(0, 40), max_size=2), st.sampled_from(QUERIES))
def test_dictionary_scans_match_plain_scans(table: pa.Table, at: list[int], sql: str) -> None:
    fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p0", "p1", "p2"][: len(at) + 1])
    parts = split(table, at)
    params = ("a",) if "?" in sql else ()
    plain = run_fragments(fragments, _stores(parts, 1 << 30), params)
    encoded = run_fragments(fragments, _stores(parts, 0), params)
    assert plain is not None and encoded is not None
    assert encoded.schema == plain.schema
    if "ORDER BY" in sql:
        assert repr(encoded.to_pylist()) == repr(plain.to_pylist())
    else:
        assert canonical(encoded) == canonical(plain)


def test_a_source_is_prepared_once_per_published_version() -> None:
    rows = {"t": pa.table({"k": ["a", "b", "a", None], "x": [1, 2, 3, 4]})}
    catalog = TableCatalog()
    catalog.DICTIONARY_MIN_ROWS = 0
    catalog.publish("t", lambda: rows["t"])
    first = catalog.source("t")
    assert first is not None and catalog.source("t") is first
    encoded = first.dictionary("k")
    assert encoded is not None and encoded.dictionary.to_pylist() == ["a", "b"]
    assert first.dictionary("x") is None  # not a string column
    got = engine.run(parse_sql("SELECT x FROM t WHERE k = 'a'"), catalog)
    assert got is not None and got.column("x").to_pylist() == [1, 3]
    rows["t"] = pa.table({"k": ["b", "b"], "x": [5, 6]})  # the publisher's rows changed: a new version
    second = catalog.source("t")
    assert second is not None and second is not first
    got = engine.run(parse_sql("SELECT x FROM t WHERE k = 'b'"), catalog)
    assert got is not None and got.column("x").to_pylist() == [5, 6]


def test_many_distinct_strings_are_not_encoded() -> None:
    store = engine.PartitionStore()
    store.DICTIONARY_MIN_ROWS = 0
    store.load("t", pa.table({"k": [f"v{i}" for i in range(100)]}))
    source = store.source("t")
    assert source is not None and source.dictionary("k") is None


@st.composite
def keyed(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(1, 60))
    ints = st.one_of(st.none(), st.integers(-3, 3), st.just(2**40))
    floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=False, width=64))
    big = st.one_of(st.none(), st.integers(-(2**62), 2**62), st.integers(-5, 5))
    return pa.table(
        {
            "i": pa.array(draw(st.lists(ints, min_size=n, max_size=n)), pa.int64()),
            "s": pa.array(draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n))),
            "f": pa.array(draw(st.lists(floats, min_size=n, max_size=n)), pa.float64()),
            "j": pa.array(draw(st.lists(big, min_size=n, max_size=n)), pa.int64()),
        }
    )


SPECS: list[list[tuple[str, str | None, str]]] = [
    [("n", None, "count"), ("c", "f", "count"), ("t", "f", "sum"), ("t2", "f", "sum")],
    [("z", "j", "sum0"), ("t", "j", "sum"), ("c", "j", "count"), ("f", "f", "sum0")],
    [("lo", "j", "min"), ("hi", "j", "max"), ("n", None, "count"), ("hi2", "i", "max")],
]


@given(keyed(), st.sampled_from(["i", "s"]), st.booleans(), st.sampled_from(SPECS), st.booleans())
def test_dense_states_equal_the_hash_aggregation(
    table: pa.Table, key: str, encode: bool, specs: list[tuple[str, str | None, str]], ordered: bool
) -> None:
    if encode and key == "s":
        table = table.set_column(1, "s", table.column("s").dictionary_encode())
    dense = aggregate._apply_dense(table, [key], specs, ordered=ordered)
    hashed = aggregate._apply_hashed(table, [key], specs, ordered=True)
    if dense is None:  # a span too wide for bins, a string key that was not encoded, an inexact sum
        magnitudes = [abs(v) for v in table.column("j").to_pylist() if v is not None]
        big = max(magnitudes, default=0) * table.num_rows >= 2**52  # the bound the dense path uses
        wide = 2**40 in table.column("i").to_pylist()
        inexact = "sum" in repr(specs) and big
        assert (key == "s" and not encode) or (key == "i" and wide) or inexact
        return
    dense, hashed = aggregate._decoded(dense, [key]), aggregate._decoded(hashed, [key])
    assert dense.schema == hashed.schema
    if ordered:  # first appearance, row for row
        assert repr(dense.to_pylist()) == repr(hashed.to_pylist())
    else:
        assert sorted(map(repr, dense.to_pylist())) == sorted(map(repr, hashed.to_pylist()))


def test_dense_bins_place_null_keys_and_all_null_sums() -> None:
    specs: list[tuple[str, str | None, str]] = [("n", None, "count"), ("s", "f", "sum")]
    table = pa.table({"i": pa.array([0, None, 2, 0], pa.int64()), "f": [1.0, 2.0, None, 4.0]})
    assert aggregate._apply_dense(table, ["i"], specs) is not None
    got = aggregate._apply_dense(table, ["i"], specs, ordered=True)
    assert got is not None  # first appearance: 0, NULL, 2
    assert [r["i"] for r in got.to_pylist()] == [0, None, 2]
    got = aggregate._apply_dense(table, ["i"], specs, ordered=False)
    assert got is not None  # bin order: NULL last
    assert got.to_pylist() == [
        {"i": 0, "n": 2, "s": 5.0},
        {"i": 2, "n": 1, "s": None},
        {"i": None, "n": 1, "s": 2.0},
    ]
    only_nulls = pa.table({"i": pa.array([None, None], pa.int64()), "f": [1.0, 2.0]})
    got = aggregate._apply_dense(only_nulls, ["i"], specs)
    assert got is not None and got.to_pylist() == [{"i": None, "n": 2, "s": 3.0}]


@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-200, 200)), max_size=300),
    st.sampled_from([pa.int8(), pa.int64()]),
)
def test_distinct_values_by_bins_or_hashing_are_the_same_set(
    values: list[int | None], t: pa.DataType
) -> None:
    if t == pa.int8():
        values = [None if v is None else max(-128, min(127, v)) for v in values]
    arr = pa.array(values, t)
    got = aggregate._distinct(arr).to_pylist()
    assert sorted(got) == sorted({v for v in values if v is not None})
    assert len(got) == len(set(got))
