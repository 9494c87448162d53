"""ORDER BY resolves a name against the select list's outputs first, also inside an expression, as Spark SQL
does: ``SELECT -x AS x FROM t ORDER BY x + 0`` sorts by ``-x``, and an alias that is no input column can be
sorted on through an expression."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, split, stores

TABLE = pa.table({"k": pa.array(["a", "b", "c", None] * 3), "x": pa.array(range(12), pa.int64())})


def rows(sql: str, *params: object) -> list[tuple[object, ...]]:
    fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1", "p2"])
    got = run_fragments(fragments, stores(split(TABLE, [7])), params)
    assert got is not None
    return [tuple(r.values()) for r in got.to_pylist()]


@pytest.mark.parametrize(
    ("sql", "params", "expected"),
    [
        ("SELECT -x AS x FROM t ORDER BY x + 0 LIMIT 3", (), [(-11,), (-10,), (-9,)]),
        ("SELECT x AS z FROM t ORDER BY z + 1 DESC LIMIT 2", (), [(11,), (10,)]),
        ("SELECT -x AS x FROM t ORDER BY -x LIMIT 2", (), [(0,), (-1,)]),
        ("SELECT x * ? AS z FROM t ORDER BY z + 0 LIMIT 2", (-1,), [(-11,), (-10,)]),
        ("SELECT -x AS x FROM t ORDER BY t.x + 0 LIMIT 2", (), [(0,), (-1,)]),  # qualified: the input
        (
            "SELECT k, max(x) AS x FROM t GROUP BY k ORDER BY x + 0",
            (),
            [("a", 8), ("b", 9), ("c", 10), (None, 11)],
        ),
        ("SELECT k, max(x) AS m FROM t GROUP BY k ORDER BY -m LIMIT 2", (), [(None, 11), ("c", 10)]),
        (
            "SELECT k AS g, count(*) AS n FROM t GROUP BY k ORDER BY g IS NULL, g DESC",
            (),
            [("c", 3), ("b", 3), ("a", 3), (None, 3)],
        ),
    ],
)
def test_order_by_an_expression_over_an_output_name_sorts_by_that_output(
    sql: str, params: tuple[object, ...], expected: list[tuple[object, ...]]
) -> None:
    assert rows(sql, *params) == expected
