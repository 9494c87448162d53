"""QueryConfig refuses an edge credit its bus could not honour; the topology factory picks one it can."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sparkbus.bus import BusConfig
from sparkbus.roles.query import make_role
from sparkbus.roles.query.config import QueryConfig
from sparkbus.topologies import loads
from sparkbus.topologies.registry import RoleContext

MiB = 1 << 20


def test_an_edge_credit_above_the_bus_initial_credit_is_refused_at_construction() -> None:
    assert QueryConfig().bus_initial_credit == BusConfig().initial_credit == QueryConfig().edge_credit
    with pytest.raises(
        ValueError, match=r"edge_credit \(8388608 bytes\) exceeds the bus's initial credit \(1048576"
    ):
        QueryConfig(edge_credit=8 * MiB, batch_bytes=4 * MiB)
    with pytest.raises(ValueError, match="exceeds the bus's initial credit"):
        QueryConfig(bus_initial_credit=MiB // 2)
    ok = QueryConfig(edge_credit=8 * MiB, batch_bytes=4 * MiB, bus_initial_credit=8 * MiB)
    assert ok.edge_credit == 8 * MiB


@pytest.mark.parametrize(("bus", "edge"), [(4 * MiB, MiB), (MiB, MiB), (256 * 1024, 256 * 1024)])
def test_the_factory_fits_the_edge_credit_to_the_topology_bus(bus: int, edge: int) -> None:
    bus_settings = SimpleNamespace(initial_credit=bus, security=SimpleNamespace(mode="none"))
    topology = SimpleNamespace(bus=bus_settings, hosting=lambda name: ["n1"])
    ctx = SimpleNamespace(node_id="n1", topology=topology)
    role = make_role(ctx)
    assert role.member == "n1" and role.config.edge_credit == edge and role.config.bus_initial_credit == bus


def _nodes(**roles: list[str]) -> str:
    """``[[nodes]]`` entries of two host nodes each (``name-0``, ``name-1``), by name and roles."""
    entry = '[[nodes]]\nname = "{}"\nplacement = "host"\nhost = "127.0.0.1"\ncount = 2\nroles = {}\n'
    return "".join(entry.format(name, json.dumps(r)) for name, r in roles.items())


def test_the_factory_tells_the_role_which_nodes_run_query() -> None:
    topo = loads(
        '[cluster]\nname = "t"\n' + _nodes(c=["query"], store=["replication", "query"], log=["replication"])
    )
    role = make_role(RoleContext(node_id="store-1", spec=topo.spec_of("store-1"), topology=topo))
    assert role.config.members == frozenset({"c-0", "c-1", "store-0", "store-1"})


def test_members_must_be_a_frozenset_of_member_ids() -> None:
    with pytest.raises(ValueError, match=r"QueryConfig\.members: a frozenset of member ids or None"):
        QueryConfig(members=["a"])  # type: ignore[arg-type]
