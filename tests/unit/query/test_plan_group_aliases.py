"""A scan's ``group_aliases`` (GROUP BY names a plan reads as select-list aliases without the table's columns)
travel in the plain form of plans and fragments: written only when there are some, read as none when the
field is missing (a plan from before the field reads as it did), refused when malformed."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from sparkbus.roles.query.errors import PlanError
from sparkbus.roles.query.expressions import Call, Column, Literal
from sparkbus.roles.query.plan import (
    AggCall,
    Aggregate,
    Project,
    Scan,
    chain,
    fragment_from_plain,
    fragment_to_plain,
    plan_from_plain,
    plan_to_plain,
)
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

SCAN = Scan(
    table="t", predicate=Call(op="gt", args=(Column(name="x"), Literal(value=1))), group_aliases=("p", "q")
)


def wire(plain: Any) -> Any:
    """``plain`` as a peer reads it: through msgpack, as messages carry plans."""
    return msgpack.unpackb(msgpack.packb(plain, use_bin_type=True), raw=False)


def test_a_scan_keeps_its_group_aliases_through_the_plain_form() -> None:
    plain = plan_to_plain(SCAN)
    assert plain["group_aliases"] == ["p", "q"]
    assert plan_from_plain(wire(plain)) == SCAN


@pytest.mark.parametrize("repartition", [False, True])
def test_the_fragments_participants_run_carry_them(repartition: bool) -> None:
    logical = parse_sql("SELECT x % 2 AS p, count(*) AS n FROM t GROUP BY p")
    fragments = plan_fragments(logical, initiator="i", participants=["p1", "p2"], repartition=repartition)
    decoded = tuple(fragment_from_plain(wire(fragment_to_plain(f))) for f in fragments)
    assert decoded == fragments
    scans = [leaf for f in decoded if isinstance(leaf := chain(f.root)[0], Scan)]
    assert [s.group_aliases for s in scans] == [("p",)]


def test_a_scan_without_them_is_written_and_read_as_before() -> None:
    plain = plan_to_plain(Scan(table="t"))
    assert plain == {"op": "scan", "table": "t", "columns": None, "predicate": None}
    assert plan_from_plain(plain) == Scan(table="t")
    # a plan written before the field existed, under an aggregate
    older = {
        "op": "aggregate",
        "input": {"op": "project", "input": plain, "items": [["k", ["col", "x"]]]},
        "keys": ["k"],
        "aggs": [{"name": "n", "func": "count", "column": None}],
        "phase": "single",
    }
    expected = Aggregate(
        input=Project(input=Scan(table="t"), items=(("k", Column(name="x")),)),
        keys=("k",),
        aggs=(AggCall(name="n", func="count", column=None),),
    )
    assert plan_from_plain(older) == expected


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ("p", "plan<scan>.group_aliases", "expected an array of names"),
        ([1], "plan<scan>.group_aliases[0]", "expected str"),
        ([""], "plan<scan>.scan.group_aliases[0]", "expected a non-empty name"),
        (["p", "p"], "plan<scan>.scan.group_aliases", "duplicate names"),
        (None, "plan<scan>.group_aliases", "expected an array of names"),
    ],
)
def test_malformed_group_aliases_are_refused_with_their_path(value: Any, path: str, reason: str) -> None:
    plain = {**plan_to_plain(Scan(table="t")), "group_aliases": value}
    with pytest.raises(PlanError) as caught:
        plan_from_plain(plain)
    assert caught.value.path == path and reason in caught.value.reason, (
        caught.value.path,
        caught.value.reason,
    )


def test_only_a_scan_takes_them() -> None:
    plain = {"op": "receive", "edge": 1, "group_aliases": ["p"]}
    with pytest.raises(PlanError, match="unexpected field 'group_aliases'"):
        plan_from_plain(plain)
