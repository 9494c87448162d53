"""QUERY_CANCEL cancels only a request of the client's own connection, named by its request id: call ids are
a counter of the node's and query ids show in error texts, so naming either let any client cancel any
other's query. A connection released after its restore timeout cancels the queries it still runs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.bus import BusConfig
from sparkbus.roles.client import ClientConfig, Gateway, Op
from sparkbus.roles.query import QueryRole, table_to_ipc
from sparkbus.roles.query.errors import ErrorCode

from .harness import ClientSim, SimClient, error_of
from .roles import Endless

SQL = {"sql": "SELECT count(*) AS n FROM t"}


def cluster(initiator: QueryRole | None = None) -> tuple[ClientSim, SimClient, SimClient]:
    sim = ClientSim(4, config=BusConfig(cluster_tag="sim"))
    sim.add_node("i", [initiator or QueryRole("i", incarnation="i0"), Gateway("i", ["query"])])
    sim.add_node("p1", [QueryRole("p1", incarnation="p0")])
    sim.start()
    sim.run_until(sim.all_up)
    part = pa.table({"x": pa.array(range(100), pa.int64())})
    for node in ("i", "p1"):
        sim.result(sim.call(node, "query", "load", {"table": "t", "batches": [table_to_ipc(part)]}))
    alice = sim.add_client("alice", ["i:1"], ClientConfig(cluster_tag="sim"))
    bob = sim.add_client("bob", ["i:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: alice.core.connected and bob.core.connected, limit=5)
    sim.stall("p1", "i", 1.0)  # the query runs on while the clients act
    return sim, alice, bob


def test_a_client_cannot_cancel_another_clients_query() -> None:
    sim, alice, bob = cluster()
    query = alice.submit(sim, Op.SQL, SQL)
    sim.run_for(0.01)
    rid = alice.core.ops[query].request_id
    tries = [{"request_id": rid}, *({"call_id": n} for n in range(1, 6)), {"query_id": "i@i0.1"}]
    answers = [sim.wait(bob, bob.submit(sim, Op.QUERY_CANCEL, args), limit=0.5) for args in tries]
    done = sim.wait(alice, query, limit=30)
    assert done.error is None, f"alice's query was cancelled: {done.error}"
    assert done.result.table().to_pylist() == [{"n": 200}]
    assert answers[0].error is None and answers[0].result is False  # bob's own request rid: none running
    for refused in answers[1:]:
        assert refused.error is not None and "QUERY_CANCEL: takes request_id (int)" in str(refused.error)


def test_a_client_cancels_its_own_query_by_its_request_id() -> None:
    sim, alice, _ = cluster()
    query = alice.submit(sim, Op.SQL, SQL)
    sim.run_for(0.01)
    rid = alice.core.ops[query].request_id
    assert sim.outcome(alice, alice.submit(sim, Op.QUERY_CANCEL, {"request_id": rid})) is True
    error = error_of(sim.wait(alice, query, limit=30))
    assert error.code == ErrorCode.CANCELLED_BY_USER and "cancelled by the user" in str(error)
    assert sim.outcome(alice, alice.submit(sim, Op.QUERY_CANCEL, {"request_id": rid})) is False  # over


def test_a_query_whose_caller_gave_up_is_cancelled_on_its_node() -> None:
    role = QueryRole("i", incarnation="i0")
    sim, alice, _ = cluster(role)
    query = alice.submit(sim, Op.SQL, SQL)
    sim.run_for(0.01)
    assert len(role.queries) == 1
    alice.cancel(sim, query)  # as ``Client.call`` does when its timeout passes
    sim.run_for(0.1)  # well before the stalled participant answers
    assert not role.queries and role.counters["failed"] == 1
    assert query not in alice.done  # nobody waits for it: no answer is reported
    assert sim.outcome(alice, alice.submit(sim, Op.SQL, SQL)).table().to_pylist() == [{"n": 200}]
    assert not alice.core.links["i:1"].requests  # the cancel's own answer was taken and dropped


def test_an_operation_given_up_before_any_connection_is_never_sent() -> None:
    sim = ClientSim(5, config=BusConfig(cluster_tag="sim"))
    role = QueryRole("i", incarnation="i0")
    sim.add_node("i", [role, Gateway("i", ["query"])])
    sim.start()
    part = pa.table({"x": pa.array(range(100), pa.int64())})
    sim.result(sim.call("i", "query", "load", {"table": "t", "batches": [table_to_ipc(part)]}))
    alice = sim.add_client("alice", ["i:1"], ClientConfig(cluster_tag="sim"))
    query = alice.submit(sim, Op.SQL, SQL)  # queued: the handshake has not finished
    assert not alice.core.connected
    alice.cancel(sim, query)
    sim.run_until(lambda: alice.core.connected, limit=5)
    assert sim.outcome(alice, alice.submit(sim, Op.SQL, SQL)).table().to_pylist() == [{"n": 100}]
    assert role.counters["started"] == 1 and query not in alice.done


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_released_logical_connection_cancels_the_queries_it_still_runs(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    query = Endless()
    gateway = Gateway("n1", ["query"], restore_timeout=10.0)
    sim.add_node("n1", [query, gateway])
    sim.start()
    gone = sim.add_client("gone", ["n1:1"], ClientConfig(cluster_tag="sim"))
    stays = sim.add_client("stays", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: gone.core.connected and stays.core.connected, limit=5)
    gone.submit(sim, Op.SQL, {"sql": "select * from big"})
    kept = stays.submit(sim, Op.SQL, {"sql": "select * from big"})
    sim.run_until(lambda: len(query.running) == 2, limit=5)
    sim.block("gone", "n1")  # a host gone, a process killed: the client never comes back
    sim.run_until(lambda: gateway.counters["released"] == 1, limit=60)
    sim.run_for(1.0)
    (cid,) = gateway.contexts  # the other client's connection
    # The released connection's query was cancelled; the other client's runs on.
    assert list(query.running) == [f"{cid}/{stays.core.ops[kept].request_id}"], query.running
    assert kept not in stays.done and sim.node("n1").core.counters["role_errors"] == 0
