"""benchmarks/exchange.py's query section: its result check and the queries it runs (no nodes started)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "exchange.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # The script puts benchmarks/ first on sys.path (for _common); its files must not shadow anything later.
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("bench_exchange", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = path
        if "_common" not in modules:
            sys.modules.pop("_common", None)


def test_results_that_differ_only_in_row_order_match(bench: ModuleType) -> None:
    t = bench.query_table(1_000)
    shuffled = t.take(pa.array(list(range(999, -1, -1))))
    assert bench.same_rows(t, shuffled)
    assert bench.same_rows(t.slice(0, 10), pa.concat_tables([t.slice(5, 5), t.slice(0, 5)]))


def test_a_missing_extra_or_changed_row_does_not_match(bench: ModuleType) -> None:
    t = bench.query_table(100)
    assert not bench.same_rows(t, t.slice(1))
    assert not bench.same_rows(t.slice(1), t)
    changed = t.set_column(1, "x", pa.array([0, *range(1, 99), 1000], pa.int64()))
    assert not bench.same_rows(t, changed)
    # The same multiset of rows per column but not per row.
    swapped = t.set_column(2, "y", pa.array(list(reversed(t.column("y").to_pylist())), pa.float64()))
    assert not bench.same_rows(t, swapped)
    assert not bench.same_rows(t, t.select(["k", "x"]))
    assert not bench.same_rows(t, t.rename_columns(["k", "x", "z"]))


def test_a_null_key_sorts_and_compares(bench: ModuleType) -> None:
    t = bench.query_table(8)
    assert t.column("k").null_count == 2
    assert bench.same_rows(t, t.take(pa.array([3, 7, 0, 1, 2, 4, 5, 6])))
    one_less_null = t.set_column(0, "k", pa.array(["a", "b", "c", "a", "a", "b", "c", None]))
    assert not bench.same_rows(t, one_less_null)


def test_the_table_and_the_queries_have_the_shapes_the_docs_name(bench: ModuleType) -> None:
    assert bench.QUERY_ROWS == 200_000
    assert set(bench.NODE_QUERIES) == {"filter", "group_by", "top_k", "wide_select"}
    assert bench.QUERY_EXCHANGES == ("push", "binx", "http")
    t = bench.query_table(6)
    assert t.column_names == ["k", "x", "y"]
    assert t.column("x").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert t.column("k").to_pylist() == ["a", "b", "c", None, "a", "b"]
