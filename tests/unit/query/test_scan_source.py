"""Scans over prepared partitions: dictionary-encoded string columns give exactly the plain results."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.roles.query import engine
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
