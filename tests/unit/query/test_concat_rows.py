"""Where members' rows or partial states meet, a column that one member has as Arrow's null type (its
partition holds only NULLs there) takes the type the others have (``exchange.concat_rows``), and the states
of a SUM and a COUNT(DISTINCT) of such a column keep the null type, so that they merge with another member's
BIGINT (or STRING) states into that type; types with no common type stay an error naming the column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query import aggregate
from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.exchange import concat_rows
from sparkbus.roles.query.plan import AggCall

TYPED = pa.table({"k": pa.array(["a", "b", "a"]), "x": pa.array([1, 2, 5], pa.int64())})
UNTYPED = pa.table({"k": pa.array(["a", "c"]), "x": pa.nulls(2)})


def test_partial_states_of_an_untyped_sum_keep_no_type_until_merged() -> None:
    aggs = [AggCall(name="s", func="sum", column="x"), AggCall(name="d", func="count_distinct", column="x")]
    untyped = aggregate.partial(UNTYPED, ["k"], aggs)
    assert pa.types.is_null(untyped.schema.field("s").type)
    assert pa.types.is_null(untyped.schema.field("d").type)
    merged = concat_rows([untyped, aggregate.partial(TYPED, ["k"], aggs)])
    got = aggregate.finalize(aggregate.combine(merged, ["k"], aggs), ["k"], aggs)
    assert sorted(got.to_pylist(), key=repr) == sorted(
        [{"k": "a", "s": 6, "d": 2}, {"k": "b", "s": 2, "d": 1}, {"k": "c", "s": None, "d": 0}], key=repr
    )
    assert got.schema.field("s").type == pa.int64()


def test_concat_rows_widens_numbers_and_refuses_types_with_no_common_type() -> None:
    ints = pa.table({"x": pa.array([1], pa.int32())})
    longs = pa.table({"x": pa.array([2], pa.int64())})
    got = concat_rows([ints, pa.table({"x": pa.nulls(1)}), longs])
    assert got.schema.field("x").type == pa.int64() and got.column("x").to_pylist() == [1, None, 2]
    with pytest.raises(ExecutionError, match="column x with types that have no common type: string, int64"):
        concat_rows([pa.table({"x": ["a"]}), longs])
    with pytest.raises(ExecutionError, match="different columns"):
        concat_rows([longs, pa.table({"y": [1]})])


def test_count_distinct_states_of_an_untyped_column_merge_with_strings() -> None:
    aggs = [AggCall(name="d", func="count_distinct", column="s")]
    untyped = aggregate.partial(pa.table({"s": pa.nulls(3)}), [], aggs)
    typed = aggregate.partial(pa.table({"s": pa.array(["u", "v", "u"])}), [], aggs)
    assert aggregate.final(concat_rows([untyped, typed]), [], aggs).to_pylist() == [{"d": 2}]


def test_a_sum_of_untyped_states_only_is_a_double_null() -> None:
    aggs = [AggCall(name="s", func="sum", column="x")]
    got = aggregate.final(concat_rows([aggregate.partial(UNTYPED, [], aggs)] * 2), [], aggs)
    assert got.to_pylist() == [{"s": None}] and got.schema.field("s").type == pa.float64()
