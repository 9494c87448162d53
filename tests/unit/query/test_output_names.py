"""docs/QUERY.md's table of output names ("Output names") says what an unaliased select item is named here:
each of its rows is checked against the names the query's answer has."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import run_fragments, stores

DOC = Path(__file__).resolve().parents[3] / "docs" / "QUERY.md"
TABLE = pa.table({"k": pa.array(["a"]), "x": pa.array([1], pa.int64())})


def documented(column: int = 1) -> list[tuple[str, str]]:
    """(item, name) pairs of the table's rows: the name here (``column`` 1) or Spark's (2)."""
    text = DOC.read_text()
    section = text[text.index("### Output names") :]
    section = section[: section.index("\n\n", section.index("| item |"))]
    pairs = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `") or len(cells) != 3:
            continue
        items, names = (re.findall(r"`([^`]+)`", c) for c in (cells[0], cells[column]))
        pairs += list(zip(items, names if len(names) == len(items) else names * len(items), strict=True))
    return pairs


def test_the_documented_names_are_the_names_of_the_answers() -> None:
    pairs = documented()
    assert len(pairs) >= 25
    for item, name in pairs:
        sql = f"SELECT {item} FROM t GROUP BY x, k"
        fragments = plan_fragments(parse_sql(sql), initiator="i", participants=["p1"])
        got = run_fragments(fragments, stores([TABLE]), (7,))
        assert got is not None and got.column_names == [name], item
