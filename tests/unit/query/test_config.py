"""QueryConfig refuses an edge credit its bus could not honour; the topology factory picks one it can."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkbus.bus import BusConfig
from sparkbus.roles.query import make_role
from sparkbus.roles.query.config import QueryConfig

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
    ctx = SimpleNamespace(node_id="n1", topology=SimpleNamespace(bus=SimpleNamespace(initial_credit=bus)))
    role = make_role(ctx)
    assert role.member == "n1" and role.config.edge_credit == edge and role.config.bus_initial_credit == bus
