"""The compute operations of the thin client (CREATE_TABLE, TABLE_WRITE, CREATE_VIEW, PEEK) through a real
gateway to a real compute controller and replica: two bus nodes on loopback, built from a topology."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

import sparkbus
from sparkbus.roles.client import Op, OperationError
from sparkbus.roles.compute import Aggregate, Predicate, ViewDef
from sparkbus.topologies import loads
from sparkbus.topologies.busnode import BusNodeFactory, bus_config
from sparkbus.topologies.client import Client
from sparkbus.topologies.runtime import NodeRequest

pytestmark = pytest.mark.integration

TOPOLOGY = """
[cluster]
name = "ops"
tag = "it"
[bus]
host = "127.0.0.1"
ports = "ephemeral"
heartbeat = "100ms"
peer_timeout = "2s"
[[nodes]]
name = "coordinator"
placement = "host"
host = "127.0.0.1"
roles = ["compute.controller", "client.gateway"]
[[nodes]]
name = "replica"
placement = "host"
host = "127.0.0.1"
roles = ["compute.replica"]
"""


@pytest.fixture
def client() -> Iterator[Client]:
    topo = loads(TOPOLOGY)
    factory = BusNodeFactory()
    nodes = {
        n: factory(NodeRequest(node_id=n, topology=topo, advertise_host="127.0.0.1"))
        for n in ("coordinator", "replica")
    }
    try:
        endpoints = {n: h.bind() for n, h in nodes.items()}
        for n, h in nodes.items():
            h.set_peers({k: v for k, v in endpoints.items() if k != n})
            h.start()
        for h in nodes.values():
            h.wait_ready(10)
        with sparkbus.connect(
            endpoints["coordinator"].control, cluster_tag=bus_config(topo).cluster_tag, connect_timeout=10
        ) as c:
            yield c
    finally:
        for h in nodes.values():
            h.stop()


def rows(kinds: list[str], values: list[float]) -> pa.Table:
    return pa.table({"kind": pa.array(kinds, pa.string()), "value": pa.array(values, pa.float64())})


def test_a_table_a_view_and_fresh_peeks_through_the_client(client: Client) -> None:
    schema = rows([], []).schema
    assert "upper" in client.create_table("t", schema)
    first = client.write_table("t", rows(["a", "b", "a"], [1.0, 2.0, 3.0]))
    view = ViewDef(
        source="t",
        filters=(Predicate(column="value", op="gt", value=1.5),),
        group_by=("kind",),
        aggregates=(
            Aggregate(func="count", column=None, name="n"),
            Aggregate(func="sum", column="value", name="s"),
        ),
    )
    created = client.create_view("big", view)
    assert {"as_of", "id"} <= set(created)
    peeked = client.peek("big").sort_by("kind").to_pylist()
    assert peeked == [{"kind": "a", "n": 1, "s": 3.0}, {"kind": "b", "n": 1, "s": 2.0}]
    second = client.write_table("t", rows(["b"], [5.0]))
    assert second > first
    assert client.peek("big").sort_by("kind").to_pylist()[1] == {"kind": "b", "n": 2, "s": 7.0}
    assert client.peek("t").num_rows == 4  # a table peeks as itself


def test_compute_errors_come_back_as_operation_errors(client: Client) -> None:
    with pytest.raises(OperationError, match="no table named 'missing'"):
        client.write_table("missing", rows(["a"], [1.0]))
    client.create_table("t", rows([], []).schema)
    with pytest.raises(OperationError, match="already exists"):
        client.create_table("t", rows([], []).schema)
    with pytest.raises(OperationError, match="CREATE_VIEW"):
        client.call(Op.CREATE_VIEW, {"name": "v", "view": {"source": "t", "nonsense": 1}})
    with pytest.raises(OperationError, match="schema"):
        client.write_table("t", pa.table({"kind": ["a"]}))
    assert client.status()["node"] == "coordinator"  # the session serves on after every error
