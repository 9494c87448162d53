"""The thin client's core when a call, a node or a reply goes wrong: each failure ends the calls it concerns
with a clear error, in time, and the client serves on (simulator, fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.messages import ErrorCode, Reject
from sparkbus.codecs import REGISTRY, EnvelopeCodec, Limits, MiB
from sparkbus.roles.client import ArrowParts, ClientConfig, ClientConnectionError, Gateway, Op
from sparkbus.roles.client.core import MAX_LINK_ERRORS

from .harness import ClientSim, error_of
from .roles import BigQuery, CountingWrites, SlowQuery

SEEDS = [1, 2, 3]
CODEC = EnvelopeCodec(REGISTRY)
#: what ``Client.sql`` waits for a query by default: its 30 s timeout + 5 s
SQL_CALL_TIMEOUT = 35.0


@pytest.mark.parametrize("seed", SEEDS)
def test_an_argument_msgpack_cannot_carry_fails_that_call_and_the_next_one_runs(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    queued = c.submit(sim, Op.SQL, {"sql": "SELECT ?", "parameters": [object()]})  # before the link is up
    sim.run_until(lambda: c.core.connected, limit=5)
    bad = c.submit(sim, Op.SQL, {"sql": "SELECT ?", "parameters": [np.int64(3)]})  # what pandas hands out
    for handle in (queued, bad):
        err = error_of(sim.wait(c, handle, limit=1))
        assert err.code == ErrorCode.MALFORMED and "request SQL: an argument cannot be sent" in err.message
    assert not c.core.ops and not c.core.links["n1:1"].requests
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_read_on_a_node_that_died_is_served_by_the_live_node_and_a_write_is_never_sent_again(
    seed: int,
) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    roles = {n: (SlowQuery(delay=2.0), CountingWrites(delay=2.0)) for n in ("n1", "n2")}
    for n, (query, writes) in roles.items():
        sim.add_node(n, [query, writes, Gateway(n, ["query", "replication"])])
    sim.start()
    c = sim.add_client("c", ["n1:1", "n2:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: all(x.state == "up" for x in c.core.links.values()), limit=10)
    ops = [
        c.submit(sim, op, {"sql": "select 1", "table": "t"}) for op in (Op.SQL, Op.SQL, Op.WRITE, Op.WRITE)
    ]
    (read,) = [h for h in ops[:2] if c.core.ops[h].link == "n1:1"]  # round-robin: one of each per node
    (write,) = [h for h in ops[2:] if c.core.ops[h].link == "n1:1"]
    sim.run_for(0.5)
    sim.block("c", "n1")  # the client sees the disconnect at once
    sim.crash("n1")  # and the process is gone: nothing answers at its address any more
    # The read is sent to n2 once a reconnect to n1 failed: well within what Client.sql waits.
    sim.run_until(lambda: read in c.done, limit=SQL_CALL_TIMEOUT)
    assert isinstance(c.done[read].result, ArrowParts)
    assert len(roles["n2"][0].calls) == 2
    # The write may have been applied on n1: it waits for n1's restore and is never sent to n2.
    err = error_of(sim.wait(c, write, limit=70.0))
    assert isinstance(err, ClientConnectionError)
    assert roles["n2"][1].writes == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_node_silent_after_welcome_does_not_hold_the_restore_for_ever(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [SlowQuery(delay=2.0), Gateway("n1", ["query"])])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.connected, limit=5)
    read = c.submit(sim, Op.SQL, {"sql": "select 1"})
    sim.run_for(0.2)
    sim.block("c", "n1")
    sim.unblock("c", "n1")
    link = c.core.links["n1:1"]
    sim.run_until(lambda: link.state == "restoring", limit=5)  # WELCOME came, RESTORE sent
    sim.crash("n1", notify=False)  # host gone, or a partition: no RESTORED ever, nor a disconnect
    # Like hello_sent (handshake_timeout) and up (heartbeat_timeout), restoring has a deadline.
    sim.run_until(lambda: link.state != "restoring", limit=10)
    assert any("no answer to RESTORE within 5 s" in e for e in link.errors)
    sim.restart("n1", [SlowQuery(delay=2.0), Gateway("n1", ["query"])])
    # The new process knows no logical connection: RESTORE_REFUSED, and the read runs again there.
    assert isinstance(sim.outcome(c, read, limit=SQL_CALL_TIMEOUT), ArrowParts)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_reply_over_the_clients_frame_limit_fails_its_call_after_one_restore(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    # chunks of up to 4 MiB from this gateway; the client accepts frames of 1 MiB
    sim.add_node("n1", [BigQuery(rows=400_000, delay=0.5), Gateway("n1", ["query"], chunk_bytes=4 * MiB)])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim", limits=Limits(max_frame_bytes=1 * MiB)))
    sim.run_until(lambda: c.core.connected, limit=5)
    link = c.core.links["n1:1"]
    first = link.connection_id
    big = c.submit(sim, Op.SQL, {"sql": "select"})
    err = error_of(sim.wait(c, big, limit=10))
    assert err.code == ErrorCode.LIMIT_EXCEEDED and "limit is 1048576" in err.message
    assert link.restores == 1  # the first failure may be a session's accident; the second is not
    # The next session is a new logical connection (the old one would send the chunk again) and serves.
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"
    assert link.connection_id not in ("", first) and link.restores == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_an_argument_name_that_is_not_a_str_fails_that_call_at_once(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    query = SlowQuery(delay=0.1)
    sim.add_node("n1", [query, Gateway("n1", ["query"])])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.connected, limit=5)
    seq = c.core.links["n1:1"].seq
    handle = c.submit(sim, Op.SQL, {1: "select 1"})  # type: ignore[dict-item]  # msgpack carries it
    err = error_of(sim.wait(c, handle, limit=1))
    assert err.code == ErrorCode.MALFORMED and "argument names are str, got 1" in err.message
    assert c.core.links["n1:1"].seq == seq and not query.calls  # nothing was sent
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_request_over_the_nodes_limits_fails_with_the_nodes_reason_and_the_session_serves_on(
    seed: int,
) -> None:
    # The node's limits are below the client's, which are all the client checks before sending.
    node_limits = Limits(max_frame_bytes=1 * MiB, max_message_bytes=4 * MiB)
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim", limits=node_limits))
    writes = CountingWrites(delay=0.1)
    sim.add_node("n1", [writes, Gateway("n1", ["replication"])])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.connected, limit=5)
    link = c.core.links["n1:1"]
    session = link.session
    handle = c.submit(sim, Op.WRITE, {"partition": "p/0", "rows": b"x" * (2 * MiB)})
    err = error_of(sim.wait(c, handle, limit=5))
    assert err.code == ErrorCode.LIMIT_EXCEEDED and "limit is 1048576" in err.message, link.errors
    assert writes.writes == 0
    small = c.submit(sim, Op.WRITE, {"partition": "p/0", "rows": b"x"})
    assert sim.outcome(c, small) == {"rows": 1}
    assert link.session == session and link.restores == 0  # one session throughout


def test_a_reject_that_ends_no_session_of_this_connection_leaves_it_up() -> None:
    sim = ClientSim(1, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    sim.run_until(lambda: c.core.connected, limit=5)
    link = c.core.links["n1:1"]
    for code, session in (
        (ErrorCode.LIMIT_EXCEEDED, 0),  # a message refused, not the session
        (ErrorCode.SEQUENCE_GAP, link.session + 1),  # another session's end
    ):
        reject = Reject(code=code, message="refused", version=(1, 0, 0))
        c.core.on_frames("n1:1", CODEC.encode(reject, session=session), sim.now)
        sim.flush_client(c)
        assert link.state == "up" and link.errors[-1] == f"refused: {code.name}: refused"
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1" and link.restores == 0
    gap = Reject(code=ErrorCode.SEQUENCE_GAP, message="gap", version=(1, 0, 0))
    c.core.on_frames("n1:1", CODEC.encode(gap, session=link.session), sim.now)  # this session's end
    sim.flush_client(c)
    assert link.state != "up"


def test_a_handshake_answer_that_does_not_decode_fails_the_node() -> None:
    sim = ClientSim(1, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    c.core.on_frames("n1:1", [b"not a sparkbus message"], sim.now)  # what answered HELLO is no node of ours
    sim.flush_client(c)
    assert c.core.gave_up and "malformed message from n1:1" in c.core.attempts()


def test_a_node_connection_keeps_its_last_errors_only() -> None:
    sim = ClientSim(1, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    link = c.core.links["n1:1"]
    for _ in range(MAX_LINK_ERRORS + 5):
        sim.run_until(lambda: link.state == "up", limit=5)
        sim.block("c", "n1")
        sim.unblock("c", "n1")
    assert len(link.errors) == MAX_LINK_ERRORS and link.restores == MAX_LINK_ERRORS + 4
