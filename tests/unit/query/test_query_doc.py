"""docs/QUERY.md's example of a plain plan's error path is what the decoder reports: the fragment's index in
``fragments``, then its id, then the path inside its root."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbus.roles.query.messages import QueryId, QueryStarted
from sparkbus.roles.query.plan import fragment_to_plain
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

DOC = Path(__file__).resolve().parents[3] / "docs" / "QUERY.md"


def test_the_documented_error_path_is_the_decoders() -> None:
    fragments = plan_fragments(
        parse_sql("SELECT x FROM t ORDER BY x LIMIT 3"), initiator="i", participants=["p1"]
    )
    plain = [fragment_to_plain(f) for f in fragments]
    assert plain[1]["id"] == 1 and plain[1]["root"]["input"]["op"] == "top_k"
    plain[1]["root"]["input"]["count"] = "3"
    path = "fragments[1][1].root<send>.input<top_k>.count: expected int, got str"
    with pytest.raises(ValueError, match=path.replace("[", r"\[").replace("]", r"\]")):
        QueryStarted(
            query_id=QueryId(member="i", local="x.1"),
            fragments=tuple(plain),
            parameters=(),
            participants=("i", "p1"),
            edge_credits={1: 1 << 20},
            timeout=0.0,
        )
    assert f"`{path}`" in " ".join(DOC.read_text().split())
