"""A node's query role refuses to ``load`` a table the topology declares: its rows live in the table's
replicated partitions, and a node's own copy would be scanned beside them, so every query would count
each row twice."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.bus.sim import SimBus
from sparkbus.roles.query import QueryError, QueryRole, make_role, sql, table_to_ipc
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.topologies import load, shipped
from sparkbus.topologies.registry import RoleContext
from tests.unit.replication.test_factory import Target

#: the coordinator runs no replication; `orders` is declared (key order_id), `events` is not
TOPOLOGY = shipped("processes.toml")

ROWS = pa.table({"order_id": pa.array([1, 2, 3], pa.int64()), "amount": [1.0, 2.0, 3.0]})


def _role(node: str) -> tuple[QueryRole, TableCatalog]:
    topo = load(TOPOLOGY)
    catalog = TableCatalog()
    ctx = RoleContext(node_id=node, spec=topo.spec_of(node), topology=topo, catalog=catalog)
    return make_role(ctx), catalog


def _load(role: QueryRole, table: str) -> c.Reply:
    call = c.LocalCall(call_id=7, name="load", args={"table": table, "batches": [table_to_ipc(ROWS)]})
    [reply] = role.handle(call, 0.0)
    assert isinstance(reply, c.Reply) and reply.call_id == 7
    return reply


def test_a_declared_table_is_refused_in_one_line_on_a_node_that_stores_none_of_it() -> None:
    role, catalog = _role("coordinator")  # runs no replication: nothing is published under the name
    for name in ("orders", "ORDERS"):  # SQL names are compared case-insensitively
        reply = _load(role, name)
        assert reply.error == (
            f"[2000 DATA_EXCEPTION] {name} is a replicated table of the topology ([tables.orders]): load it "
            "through its partitions' leaders (`sparkbus load orders FILE --topology FILE`), not into one "
            "node's catalog"
        )
        assert "\n" not in reply.error
    assert catalog.names() == []  # nothing was loaded


def test_a_declared_table_is_refused_the_same_way_on_a_node_that_stores_it() -> None:
    role, catalog = _role("store-0")
    catalog.publish("orders", lambda: ROWS)  # as the replication role does
    reply = _load(role, "orders")
    assert (
        reply.error is not None
        and "([tables.orders]): load it through its partitions' leaders" in reply.error
    )


def test_a_table_the_topology_does_not_declare_is_loaded_into_the_node_catalog() -> None:
    role, catalog = _role("coordinator")
    assert _load(role, "events").result == 3
    assert catalog.names() == ["events"]
    plain = QueryRole("n")  # built without a topology: nothing is declared
    assert _load(plain, "orders").result == 3


def _count(role: QueryRole, table: str) -> QueryError | pa.Table:
    sim = SimBus(seed=1)
    sim.add_node("coordinator", [role])
    sim.start()
    try:
        return sql(
            Target(sim, "coordinator"), f"SELECT COUNT(*) AS n FROM {table}", participants=["coordinator"]
        )
    except QueryError as exc:
        return exc


def test_a_declared_table_no_participant_serves_is_a_transient_error_not_a_missing_table() -> None:
    """Its stores down or not connected yet (the coordinator alone takes part): the user retries, where
    PARSING said the table did not exist and stopped the client's read retries."""
    got = _count(_role("coordinator")[0], "orders")
    assert isinstance(got, QueryError) and got.code == ErrorCode.MEMBER_LEAVE, got
    assert "declared by the topology" in got.message and "no node that serves its partitions" in got.message
    other = _count(_role("coordinator")[0], "nothing")  # neither declared nor loaded anywhere
    assert isinstance(other, QueryError) and other.code == ErrorCode.PARSING, other


def test_a_declared_table_its_stores_serve_no_rows_of_is_not_loaded() -> None:
    """Its stores take part and hold none of its rows yet: not loaded (PARSING), which `sparkbus view
    create` turns into "holds no rows on any node yet"."""
    role = QueryRole("coordinator", declared=["orders"], replicating=["coordinator"])
    got = _count(role, "orders")
    assert isinstance(got, QueryError) and got.code == ErrorCode.PARSING, got
