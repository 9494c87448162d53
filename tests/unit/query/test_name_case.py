"""Tables and columns are found whatever the case of their names, as Spark SQL finds them by default."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.sql import parse_sql


def test_a_table_and_its_columns_are_found_in_any_case() -> None:
    store = TableCatalog()
    store.load("Events", pa.table({"UserId": [1, 2, 3], "kind": ["a", "b", "a"]}))
    store.publish("Pub", lambda: pa.table({"v": [7]}))
    got = engine.run(parse_sql("SELECT userid AS u FROM EVENTS WHERE KIND = 'a' ORDER BY USERID DESC"), store)
    assert got is not None and got.to_pylist() == [{"u": 3}, {"u": 1}]
    got = engine.run(parse_sql("SELECT V FROM pub"), store)
    assert got is not None and got.to_pylist() == [{"V": 7}]


def test_names_that_match_several_are_ambiguous() -> None:
    store = engine.PartitionStore()
    store.load("t", pa.table({"x": [1]}))
    store.load("T", pa.table({"x": [2]}))
    store.load("u", pa.table({"x": [1], "X": [2]}))
    with pytest.raises(ExecutionError, match=r"table name 't' is ambiguous: it could be any of \['t', 'T'\]"):
        engine.run(parse_sql("SELECT x FROM t"), store)
    with pytest.raises(
        ExecutionError, match=r"column name 'x' is ambiguous: it could be any of \['x', 'X'\]"
    ):
        engine.run(parse_sql("SELECT x FROM u"), store)
