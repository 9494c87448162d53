"""The controller refuses a name taken (``create_table`` or ``create_view``) saying what has it, and a
table's key: how that table takes rows, which ``sparkbus load`` compares with the replicated table's key."""

from __future__ import annotations

import ast
import re

import pyarrow as pa
import pytest

from sparkbus.roles.compute import Aggregate, ViewDef

from .harness import Cluster

SCHEMA = pa.schema([("k", pa.string()), ("part", pa.int64()), ("v", pa.int64())])


def _refusal(c: Cluster, call: str, **args: object) -> str:
    cid = c.call(call, **args)
    c.run()
    error = c.replies[cid].error
    assert error is not None
    return error


@pytest.mark.parametrize(
    ("key", "what"),
    [
        (None, "a table without a key"),
        (["k"], "a table keyed by ['k']"),
        (["part", "k"], "a table keyed by ['part', 'k']"),
    ],
)
def test_a_taken_table_name_is_refused_with_the_tables_key(key: list[str] | None, what: str) -> None:
    c = Cluster(["r1"])
    c.up("r1")
    c.do("create_table", name="t", schema=SCHEMA, key=key)
    sent = len(c.sent)
    for again in (None, ["v"]):  # whatever the second call asks for
        error = _refusal(c, "create_table", name="t", schema=SCHEMA, key=again)
        assert error.endswith(f"'t' already exists: {what}"), error
    view = ViewDef(source="t", aggregates=(Aggregate(func="count", column=None, name="n"),))
    assert _refusal(c, "create_view", name="t", view=view).endswith(f"'t' already exists: {what}")
    assert len(c.sent) == sent  # nothing reached the replicas
    if key is not None:  # the key reads back as the list of its columns
        named = re.search(r"keyed by (\[.*\])$", error)
        assert named is not None and ast.literal_eval(named.group(1)) == key


def test_a_taken_view_name_is_refused_as_a_view() -> None:
    c = Cluster(["r1"])
    c.up("r1")
    c.do("create_table", name="t", schema=SCHEMA)
    view = ViewDef(source="t", aggregates=(Aggregate(func="count", column=None, name="n"),))
    c.do("create_view", name="v", view=view)
    assert _refusal(c, "create_table", name="v", schema=SCHEMA).endswith("'v' already exists: a view")
    assert _refusal(c, "create_view", name="v", view=view).endswith("'v' already exists: a view")
