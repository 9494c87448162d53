"""Dictionary-encoded columns enter as their values: a table holds plain columns whatever encoding its writes
and appends use, so dictionaries that differ, or repeat a value, change nothing a view or a peek sees."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from sparkbus.roles.compute import DIFF, TIME, Aggregate, AppendUpdates, Arrangement, ViewDef, encode_table
from sparkbus.roles.compute import arrangement as arrangement_module
from sparkbus.roles.compute.storage import checked_updates

from .harness import Cluster, ipc
from .test_exactness import SIGNED_NAN, cluster, peeks

STRINGS = pa.dictionary(pa.int32(), pa.string())
COUNT = (Aggregate(func="count", column=None, name="n"),)


def dictionary_table(c: Cluster) -> None:
    c.do("create_table", name="d", schema=pa.schema([("x", STRINGS)]))
    c.do("create_view", name="by_x", view=ViewDef(source="d", group_by=("x",), aggregates=COUNT))


def test_writes_whose_dictionaries_differ_are_all_acknowledged_and_read_back() -> None:
    c = cluster()
    dictionary_table(c)
    assert c.controller.tables["d"] == pa.schema([("x", pa.string())])  # held as its values
    for values in (["a", "b"], ["c"]):
        c.do("write", table="d", batch=ipc(pa.table({"x": pa.array(values).dictionary_encode()})))
    c.do("write", table="d", batch=ipc(pa.table({"x": ["a"]})))  # the values themselves are taken too
    assert peeks(c, "d") == {r: [{"x": "a"}, {"x": "a"}, {"x": "b"}, {"x": "c"}] for r in ("r1", "r2")}
    expected = [{"x": "a", "n": 2}, {"x": "b", "n": 1}, {"x": "c", "n": 1}]
    assert peeks(c, "by_x") == {r: expected for r in ("r1", "r2")}


def test_a_retraction_cancels_its_row_whatever_dictionary_index_encodes_it() -> None:
    c = cluster()
    dictionary_table(c)
    # Arrow allows a dictionary to repeat a value: indices 0 and 1 are both 'a'.
    rows = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["a", "a"]))
    c.do("write", table="d", batch=ipc(pa.table({"x": rows, DIFF: pa.array([1, 1, -1], pa.int64())})))
    assert peeks(c, "by_x") == {r: [{"x": "a", "n": 1}] for r in ("r1", "r2")}
    assert peeks(c, "d") == {r: [{"x": "a"}] for r in ("r1", "r2")}


def test_a_replica_decodes_the_dictionary_columns_of_an_append() -> None:
    x = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["a", "a"]))
    data = pa.table({"x": x, TIME: pa.array([1] * 3, pa.int64()), DIFF: pa.array([1] * 3, pa.int64())})
    updates = checked_updates(AppendUpdates(id="d", lower=1, upper=2, updates=encode_table(data)), "d")
    assert updates.schema.field("x").type == pa.string()
    assert updates["x"].to_pylist() == ["a", "a", "a"]


def test_a_read_whose_consolidation_fails_loses_no_update(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pa.schema([("x", pa.string())])
    table = Arrangement(schema)
    for t, value in enumerate(["a", "b"]):
        rows = {"x": [value], TIME: pa.array([t], pa.int64()), DIFF: pa.array([1], pa.int64())}
        table.append(pa.table(rows), t + 1)
    real = arrangement_module.consolidate

    def failing(updates: pa.Table) -> pa.Table:
        raise pa.ArrowNotImplementedError("cannot consolidate")

    monkeypatch.setattr(arrangement_module, "consolidate", failing)
    with pytest.raises(pa.ArrowNotImplementedError):
        table.read_at(1)
    monkeypatch.setattr(arrangement_module, "consolidate", real)
    assert len(table) == 2
    assert table.read_at(1).to_pylist() == [{"x": "a"}, {"x": "b"}]


def test_nans_of_any_bits_in_a_dictionary_of_doubles_are_one_group_and_one_row() -> None:
    c = cluster()
    c.do("create_table", name="d", schema=pa.schema([("x", pa.dictionary(pa.int32(), pa.float64()))]))
    c.do("create_view", name="by_x", view=ViewDef(source="d", group_by=("x",), aggregates=COUNT))
    nans = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 2], pa.int32()), pa.array([math.nan, SIGNED_NAN, 1.0])
    )
    c.do("write", table="d", batch=ipc(pa.table({"x": nans})))
    for r, got in peeks(c, "by_x").items():
        assert sorted(map(repr, got)) == ["{'x': 1.0, 'n': 1}", "{'x': nan, 'n': 2}"], r
    # A retraction of a NaN row cancels the row written with the other NaN.
    one = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array([SIGNED_NAN]))
    c.do("write", table="d", batch=ipc(pa.table({"x": one, DIFF: pa.array([-2], pa.int64())})))
    assert peeks(c, "by_x") == {r: [{"x": 1.0, "n": 1}] for r in ("r1", "r2")}
    assert peeks(c, "d") == {r: [{"x": 1.0}] for r in ("r1", "r2")}
