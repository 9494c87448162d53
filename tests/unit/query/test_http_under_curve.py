"""Under CURVE no node serves the HTTP exchange (plain HTTP), so a query asking for ``http`` is refused at
once, saying why, rather than failing when its receivers find no address to pull from."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.bus import contract as c
from sparkbus.roles.query import make_role
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.exchange import ExchangeChosen
from sparkbus.roles.query.role import QueryRole
from sparkbus.topologies import loads
from sparkbus.topologies.registry import RoleContext


def _role(*, curve: bool) -> QueryRole:
    role = QueryRole("i", config=QueryConfig(curve=curve), incarnation="x")
    role.handle(c.PeerUp(peer="p1"), 0.0)
    return role


def _execute(role: QueryRole, **args: Any) -> list[c.Action]:
    return role.handle(c.LocalCall(call_id=1, name="execute", args={"sql": "SELECT x FROM t", **args}), 0.0)


def _chosen(acts: list[c.Action]) -> list[str]:
    return [
        a.message.exchange for a in acts if isinstance(a, c.Send) and isinstance(a.message, ExchangeChosen)
    ]


def test_http_is_refused_under_curve_with_the_reason_and_nothing_is_sent() -> None:
    role = _role(curve=True)
    acts = _execute(role, exchange="http")
    assert len(acts) == 1 and isinstance(acts[0], c.Reply) and acts[0].error is not None
    assert acts[0].error.startswith("[1005 PARSING]")
    assert "exchange 'http' is refused" in acts[0].error and "CURVE" in acts[0].error
    assert "use 'binx' or 'push'" in acts[0].error
    assert role.queries == {} and role.calls == {}


@pytest.mark.parametrize("kind", ["binx", "push"])
def test_the_bus_exchanges_still_run_under_curve(kind: str) -> None:
    role = _role(curve=True)
    acts = _execute(role, exchange=kind)
    assert not any(isinstance(a, c.Reply) and a.error for a in acts)
    assert _chosen(acts) == ([kind] if kind == "binx" else [])
    assert len(role.queries) == 1


def test_without_curve_http_runs_as_before() -> None:
    role = _role(curve=False)
    acts = _execute(role, exchange="http")
    assert _chosen(acts) == ["http"] and len(role.queries) == 1


def test_a_role_configured_for_http_by_default_under_curve_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="exchange 'http' is refused: this cluster's bus uses CURVE"):
        QueryConfig(curve=True, exchange="http")


@pytest.mark.parametrize(("security", "curve"), [("", False), ('mode = "curve"\nkey_dir = "keys"\n', True)])
def test_the_factory_tells_the_role_whether_the_bus_uses_curve(security: str, curve: bool) -> None:
    topo = loads(
        f'[cluster]\nname = "t"\n[bus.security]\n{security}'
        '[[nodes]]\nname = "q"\nplacement = "host"\nhost = "127.0.0.1"\nroles = ["query", "binx.server"]\n'
    )
    role = make_role(RoleContext(node_id="q", spec=topo.spec_of("q"), topology=topo))
    assert role.config.curve is curve
    acts = _execute(role, exchange="http", participants=["q"])
    refused = [a for a in acts if isinstance(a, c.Reply) and a.error and "refused" in a.error]
    assert bool(refused) is curve
