"""The thin client against real NodeCores and the real gateway, in the simulator, with fixed seeds."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.bus import BusConfig
from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import (
    RETRY_NONE,
    ArrowParts,
    AuthenticationError,
    ClientConfig,
    ClusterMismatchError,
    ConnectionUnknownError,
    Gateway,
    Op,
)
from sparkbus.roles.query import QueryRole, table_to_ipc

from .harness import ClientSim, SimClient, error_of
from .roles import CountingWrites, SlowQuery

SEEDS = [1, 2, 3]


def cluster(
    seed: int, *, restore_timeout: float = 10.0, delay: float = 2.0, **client: object
) -> tuple[ClientSim, SimClient, SlowQuery, CountingWrites, Gateway]:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    query, writes = SlowQuery(delay=delay), CountingWrites(delay=delay)
    gateway = Gateway("n1", ["query", "replication"], restore_timeout=restore_timeout)
    sim.add_node("n1", [query, writes, gateway])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim", **client))  # type: ignore[arg-type]
    sim.run_until(lambda: c.core.connected, limit=5)
    return sim, c, query, writes, gateway


def table_of(result: object) -> pa.Table:
    assert isinstance(result, ArrowParts), result  # SQL results come as Arrow chunks
    return result.table()


def test_first_address_dead_second_alive() -> None:
    sim = ClientSim(1, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["ghost:1", "multi-ghost2+n1:1"], ClientConfig(cluster_tag="sim"), start=False)
    c.core.order = ["ghost:1", "multi-ghost2+n1:1"]
    c.core.start(sim.now)
    sim.flush_client(c)
    sim.run_until(lambda: c.core.connected, limit=10)
    assert c.opened[0] == "tcp://ghost:1"
    assert "tcp://n1:1" in c.opened
    assert "no connection" in c.core.attempts()
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"


def test_connect_gives_up_listing_every_address_and_why() -> None:
    sim = ClientSim(2, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")], BusConfig(cluster_tag="other"))
    sim.start()
    c = sim.add_client("c", ["ghost:1", "n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.gave_up, limit=10)
    text = c.core.attempts()
    assert "ghost:1: tcp://ghost:1: no connection" in text
    assert "n1:1: CLUSTER_ID_MISMATCH" in text
    assert isinstance(c.core.refusal(), ClusterMismatchError)  # what connect raises: not a timeout


def test_a_node_of_another_cluster_is_refused_and_never_retried() -> None:
    sim = ClientSim(3, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.add_node("x", [Gateway("x")], BusConfig(cluster_tag="elsewhere"))
    sim.start()
    c = sim.add_client("c", ["n1:1", "x:1"], ClientConfig(cluster_tag="sim", background_interval=1.0))
    sim.run_until(lambda: c.core.connected, limit=10)
    sim.run_for(30.0)
    assert c.core.links["x:1"].state == "refused"
    assert "CLUSTER_ID_MISMATCH" in c.core.links["x:1"].errors[0]
    assert c.opened.count("tcp://x:1") == 1  # never retried, background reconnects included
    assert c.core.cluster_tag == "sim"
    assert isinstance(ClusterMismatchError("m"), ClusterMismatchError)


def test_version_negotiation_falls_back_to_a_version_both_speak() -> None:
    sim = ClientSim(4, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")], BusConfig(cluster_tag="sim", versions=((1, 0, 0),)))
    sim.add_node("n2", [Gateway("n2")], BusConfig(cluster_tag="sim", versions=((3, 0, 0),)))
    sim.start()
    cfg = ClientConfig(cluster_tag="sim", versions=((1, 1, 0), (1, 0, 0)))
    c = sim.add_client("c", ["n1:1", "n2:1"], cfg, start=False)
    c.core.order = ["n2:1", "n1:1"]
    c.core.start(sim.now)
    sim.flush_client(c)
    sim.run_until(lambda: c.core.connected, limit=10)
    assert c.core.links["n1:1"].state == "up"
    assert "PROTOCOL_COMPATIBILITY" in c.core.links["n2:1"].errors[0]
    assert sim.node("n1").core.counters["sessions_accepted"] == 1
    assert c.core.links["n1:1"].offered == (1, 0, 0)  # after n1 refused 1.1.0 with its own version


def test_a_client_retries_with_an_older_version_of_its_own_the_node_speaks() -> None:
    sim = ClientSim(4, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")], BusConfig(cluster_tag="sim", versions=((2, 0, 0), (1, 0, 0))))
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim", versions=((3, 0, 0), (1, 0, 0))))
    sim.run_until(lambda: c.core.connected, limit=10)
    # n1 refused 3.0.0 offering 2.0.0, which the client does not speak; 1.0.0 both do.
    assert c.core.links["n1:1"].state == "up"
    assert c.core.links["n1:1"].offered == (1, 0, 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_mid_query_and_restored_before_the_timeout_delivers_once(seed: int) -> None:
    sim, c, query, _, gateway = cluster(seed)
    handle = c.submit(sim, Op.SQL, {"sql": "select 1"})
    sim.run_for(0.5)
    sim.block("c", "n1")
    sim.run_for(3.0)  # the query completes while the client is away
    assert handle not in c.done
    sim.unblock("c", "n1")
    table = table_of(sim.outcome(c, handle, limit=10))
    assert table.to_pylist() == [{"n": 1, "sql": "select 1"}]
    assert len(query.calls) == 1
    assert gateway.counters["restored"] == 1
    assert c.core.links["n1:1"].restores == 1
    sim.run_for(5.0)  # nothing arrives twice (the harness asserts it), and the held result is acked
    ctx = next(iter(gateway.contexts.values()))
    assert not ctx.held and len(gateway.contexts) == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_past_the_timeout_fails_with_connection_unknown(seed: int) -> None:
    sim, c, _, writes, gateway = cluster(seed, restore_timeout=3.0)
    handle = c.submit(sim, Op.WRITE, {"table": "t"})
    sim.run_for(0.2)
    sim.block("c", "n1")
    sim.run_for(8.0)
    sim.unblock("c", "n1")
    err = error_of(sim.wait(c, handle, limit=10))
    assert isinstance(err, ConnectionUnknownError)
    assert err.code == ErrorCode.RESOURCE_NOT_FOUND and "connection unknown" in str(err)
    assert writes.writes == 1  # a write is never sent twice
    assert gateway.counters["released"] == 1
    # The new session is a new logical connection and works.
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"


def test_a_read_lost_with_its_connection_is_retried_and_a_write_is_not() -> None:
    sim, c, query, writes, _ = cluster(5, restore_timeout=3.0)
    read = c.submit(sim, Op.SQL, {"sql": "select 2"})
    write = c.submit(sim, Op.WRITE, {"table": "t"})
    sim.run_for(0.2)
    sim.block("c", "n1")
    sim.run_for(8.0)
    sim.unblock("c", "n1")
    assert table_of(sim.outcome(c, read, limit=10)).column("n").to_pylist() == [2]
    assert isinstance(error_of(sim.wait(c, write)), ConnectionUnknownError)
    assert len(query.calls) == 2 and writes.writes == 1


def test_with_retries_off_a_read_fails_too() -> None:
    sim, c, query, _, _ = cluster(6, restore_timeout=3.0, retry=RETRY_NONE)
    read = c.submit(sim, Op.SQL, {"sql": "select 3"})
    sim.run_for(0.2)
    sim.block("c", "n1")
    sim.run_for(8.0)
    sim.unblock("c", "n1")
    assert "connection unknown" in str(error_of(sim.wait(c, read, limit=10)))
    assert len(query.calls) == 1


def test_an_idle_client_keeps_its_session_with_heartbeats() -> None:
    sim, c, _, _, gateway = cluster(7)
    peers = sim.node("n1").core.peers_up()
    sim.run_for(20.0)  # the node drops a session silent for 1.5 s
    assert sim.node("n1").core.peers_up() == peers
    assert c.core.links["n1:1"].keepalive.interval == 0.5  # min(30 s, 1.5 s / 3), at least 0.5 s
    assert gateway.counters["requests"] >= 30
    assert not [e for e in c.core.links["n1:1"].errors if "broken" in e]


def test_a_silent_node_is_found_by_heartbeat_timeout() -> None:
    sim, c, _, _, _ = cluster(8)
    sim.crash("n1", notify=False)  # SIGSTOP-like: the socket stays, nothing answers
    sim.run_for(8.0)
    assert any("heartbeat timeout" in e for e in c.core.links["n1:1"].errors)


def test_sql_through_the_real_query_role() -> None:
    sim = ClientSim(9, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [QueryRole("n1", incarnation="a"), Gateway("n1")])
    sim.add_node("n2", [QueryRole("n2", incarnation="b")])
    sim.start()
    sim.run_until(sim.all_up)
    data = pa.table({"x": list(range(10))})
    for node, part in (("n1", data.slice(0, 5)), ("n2", data.slice(5))):
        sim.result(sim.call(node, "query", "load", {"table": "t", "batches": [table_to_ipc(part)]}))
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.connected, limit=5)
    result = table_of(sim.outcome(c, c.submit(sim, Op.SQL, {"sql": "SELECT SUM(x) AS s FROM t"})))
    assert result.to_pylist() == [{"s": 45}]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), cut_at=st.floats(0.0, 2.5), away=st.floats(0.1, 6.0))
def test_property_restore_within_the_timeout_delivers_every_result_exactly_once(
    seed: int, cut_at: float, away: float
) -> None:
    sim, c, query, _, _ = cluster(seed, delay=1.0)
    handles = [c.submit(sim, Op.SQL, {"sql": f"select {i}"}) for i in range(3)]
    sim.run_for(cut_at)
    sim.block("c", "n1")
    sim.run_for(away)
    sim.unblock("c", "n1")
    for h in handles:
        table_of(sim.outcome(c, h, limit=20))
    assert len(query.calls) == 3  # none re-run: every result came back through the restore


def test_a_node_that_refuses_the_clients_key_is_never_retried() -> None:
    sim = ClientSim(10, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.add_node("x", [Gateway("x")])
    sim.start()
    c = sim.add_client(
        "c", ["x:1", "n1:1"], ClientConfig(cluster_tag="sim", background_interval=1.0), start=False
    )
    c.core.order = ["x:1", "n1:1"]
    c.core.start(sim.now)
    c.core.on_auth_failed(
        "x:1", "the node refused this client's CURVE key", sim.now
    )  # the socket monitor's report
    sim.flush_client(c)
    sim.run_until(lambda: c.core.connected, limit=10)
    sim.run_for(30.0)
    link = c.core.links["x:1"]
    assert link.state == "refused" and c.opened.count("tcp://x:1") == 1
    assert link.errors == [
        "authentication failed at x:1 (tcp://x:1): the node refused this client's CURVE key"
    ]
    assert isinstance(link.refusal, AuthenticationError) and c.core.refusal() is link.refusal
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"
