"""A group key of Arrow's null type (``SELECT NULL ... GROUP BY 1``, a ``?`` bound to None, a column loaded
all NULL) is one group, NULL, as in Spark SQL: also when the groups are hash-partitioned between the
participants and when the merge of COUNT(DISTINCT) lists numbers the groups."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query import engine
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, split, stores

TABLE = pa.table({"k": pa.array(["a", "b", None, "a"] * 3), "x": pa.array(range(12)), "n": pa.nulls(12)})


def rows(sql: str, *, repartition: bool, params: tuple[object, ...] = ()) -> list[dict[str, object]]:
    fragments = plan_fragments(
        parse_sql(sql), initiator="i", participants=["p1", "p2"], repartition=repartition
    )
    got = run_fragments(fragments, stores(split(TABLE, [5])), params)
    assert got is not None
    return sorted(got.to_pylist(), key=repr)


@pytest.mark.parametrize("repartition", [False, True])
@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT NULL AS n, count(*) AS c, count(DISTINCT x) AS d FROM t GROUP BY 1", ()),
        ("SELECT ? AS n, count(*) AS c, count(DISTINCT x) AS d FROM t GROUP BY 1", (None,)),
        ("SELECT n, count(*) AS c, count(DISTINCT x) AS d FROM t GROUP BY n", ()),
    ],
)
def test_a_null_type_key_is_one_null_group(sql: str, params: tuple[object, ...], repartition: bool) -> None:
    assert rows(sql, repartition=repartition, params=params) == [{"n": None, "c": 12, "d": 12}]


@pytest.mark.parametrize("repartition", [False, True])
def test_a_null_type_key_beside_another_key(repartition: bool) -> None:
    got = rows("SELECT k, n, count(DISTINCT x) AS d FROM t GROUP BY k, n", repartition=repartition)
    assert got == sorted(
        [{"k": "a", "n": None, "d": 6}, {"k": "b", "n": None, "d": 3}, {"k": None, "n": None, "d": 3}],
        key=repr,
    )


def test_a_null_type_column_hashes_as_null_does_in_any_type() -> None:
    table = pa.table({"n": pa.nulls(5), "s": pa.array([None] * 5, pa.string())})
    by_null = [p.num_rows for p in engine.hash_partition(table, ["n"], 3)]
    by_string = [p.num_rows for p in engine.hash_partition(table, ["s"], 3)]
    assert by_null == by_string and sorted(by_null) == [0, 0, 5]
