"""The compute operations of the thin client (CREATE_TABLE, TABLE_WRITE, CREATE_VIEW, DROP_VIEW, PEEK) through
a real gateway to a real compute controller and replica: two bus nodes on loopback, built from a topology.
The replica's node runs a gateway too, which has no controller to send the compute operations to."""

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
roles = ["compute.replica", "client.gateway"]
"""


@pytest.fixture
def cluster() -> Iterator[dict[str, str]]:
    """The two nodes running; each node's control endpoint (where its gateway serves)."""
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
        yield {n: e.control for n, e in endpoints.items()}
    finally:
        for h in nodes.values():
            h.stop()


def connect(cluster: dict[str, str], node: str = "coordinator") -> Client:
    return sparkbus.connect(
        cluster[node], cluster_tag=bus_config(loads(TOPOLOGY)).cluster_tag, connect_timeout=10, op_timeout=30
    )


@pytest.fixture
def client(cluster: dict[str, str]) -> Iterator[Client]:
    with connect(cluster) as c:
        yield c


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


def test_a_view_that_failed_on_its_data_is_dropped_and_created_again(client: Client) -> None:
    client.create_table("ov", pa.schema([("x", pa.int64())]))
    view = ViewDef(source="ov", aggregates=(Aggregate(func="sum", column="x", name="s"),))
    client.create_view("ovs", view)
    client.write_table("ov", pa.table({"x": pa.array([2**62, 2**62], pa.int64())}))  # a sum beyond int64
    with pytest.raises(OperationError, match=r"failed on its data.*drop and create it again"):
        client.peek("ovs")
    with pytest.raises(OperationError, match="'ovs' already exists"):
        client.create_view("ovs", view)
    retract = pa.table({"x": pa.array([2**62], pa.int64()), "__diff": pa.array([-1], pa.int64())})
    client.write_table("ov", retract)
    with pytest.raises(OperationError, match="failed on its data"):
        client.peek("ovs")  # failed for good, even once the offending row is gone

    assert client.drop_view("ovs") is None
    with pytest.raises(OperationError, match="no view named 'ovs'"):
        client.drop_view("ovs")
    assert {"as_of", "id"} <= set(client.create_view("ovs", view))
    assert client.peek("ovs").to_pylist() == [{"s": 2**62}]  # computed from the data as it is now


def test_drop_view_refusals_come_back_as_operation_errors(cluster: dict[str, str]) -> None:
    with connect(cluster) as client:
        client.create_table("t", rows([], []).schema)
        with pytest.raises(OperationError, match="no view named 't' \\(a table"):
            client.drop_view("t")
        with pytest.raises(OperationError, match="a view name must be a non-empty str, got ''"):
            client.drop_view("")
        with pytest.raises(OperationError, match="a view name must be a non-empty str, got 7"):
            client.call(Op.DROP_VIEW, {"name": 7})
        client.create_view("v", ViewDef(source="t"))
        client.create_view("w", ViewDef(source="v"))
        with pytest.raises(OperationError, match="view 'v' is read by \\['w'\\]; drop those first"):
            client.drop_view("v")
        client.drop_view("w")
        client.drop_view("v")
    with connect(cluster, "replica") as elsewhere:  # a gateway on a node without the controller
        with pytest.raises(OperationError, match=r"node replica runs no role 'compute\.controller'"):
            elsewhere.drop_view("v")
        assert elsewhere.status()["node"] == "replica"  # the session serves on
