"""docs/QUERY.md's ``load`` entry says what the role does with a table the topology declares: refused on
every node with ``DATA_EXCEPTION``, naming the command that loads it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.roles.query import QueryRole, table_to_ipc

DOC = Path(__file__).resolve().parents[3] / "docs" / "QUERY.md"


def _load_entry() -> str:
    text = DOC.read_text()
    start = text.index("- `load {table, batches, replace?}`")
    return " ".join(text[start : text.index("\n\n", start)].split())


def test_the_load_entry_says_a_declared_table_is_refused_as_the_role_refuses_it() -> None:
    role = QueryRole("n", incarnation="x", declared=["orders"])
    batches = [table_to_ipc(pa.table({"order_id": pa.array([1], pa.int64())}))]
    [reply] = role.handle(
        c.LocalCall(call_id=1, name="load", args={"table": "Orders", "batches": batches}), 0.0
    )
    assert isinstance(reply, c.Reply) and reply.error is not None
    assert reply.error.startswith("[2000 DATA_EXCEPTION] Orders is a replicated table of the topology")
    assert "(`sparkbus load orders FILE --topology FILE`)" in reply.error
    entry = _load_entry()
    assert "is refused on every node with `DATA_EXCEPTION`" in entry
    assert "any case of its letters" in entry and "`sparkbus load NAME FILE --topology FILE`" in entry
