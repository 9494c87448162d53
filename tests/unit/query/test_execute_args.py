"""``execute`` refuses arguments that could not cross the wire before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.bus import contract as c
from sparkbus.roles.query.messages import QueryStarted
from sparkbus.roles.query.role import QueryRole

from .test_role import start_msg


def execute(role: QueryRole, **args: Any) -> list[c.Action]:
    return role.handle(c.LocalCall(call_id=1, name="execute", args={"sql": "SELECT x FROM t", **args}), 0.0)


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ([[1, 2]], "parameters[0]: expected null, a bool, an int, a float or a str, got list"),
        ([1, {"a": 1}], "parameters[1]: expected null, a bool, an int, a float or a str, got dict"),
        ([2**64], "parameters[0]: 18446744073709551616 is outside int64"),
        ([-(2**63) - 1], "is outside int64"),
        ("abc", "parameters must be a list, got str"),
        ({"a": 1}, "parameters must be a list, got dict"),
    ],
)
def test_bad_parameters_are_answered_with_parsing_and_nothing_is_sent(parameters: Any, says: str) -> None:
    role = QueryRole("i", incarnation="x")
    role.handle(c.PeerUp(peer="p1"), 0.0)
    acts = execute(role, parameters=parameters)
    assert len(acts) == 1 and isinstance(acts[0], c.Reply) and acts[0].error is not None
    assert acts[0].error.startswith("[1005 PARSING]") and says in acts[0].error
    assert role.queries == {} and role.calls == {}


def test_parameters_within_range_are_taken() -> None:
    role = QueryRole("i", incarnation="x")
    role.handle(c.PeerUp(peer="p1"), 0.0)
    values = [None, True, -(2**63), 2**63 - 1, 1.5, float("nan"), "text"]
    acts = execute(role, sql="SELECT x FROM t WHERE x < ?", parameters=values)
    (start,) = [a.message for a in acts if isinstance(a, c.Send) and isinstance(a.message, QueryStarted)]
    assert start.parameters[:4] == (None, True, -(2**63), 2**63 - 1) and start.parameters[-1] == "text"


def test_start_with_a_parameter_that_is_not_a_scalar_is_malformed() -> None:
    good = start_msg()
    with pytest.raises(ValueError, match=r"parameters\[1\]: expected null"):
        QueryStarted(
            query_id=good.query_id,
            fragments=good.fragments,
            parameters=(1, [2]),  # type: ignore[arg-type]
            participants=good.participants,
            edge_credits=good.edge_credits,
            timeout=0.0,
        )
