"""Seeded simulations: members outside a query, or inside it but not its initiator, cannot end it by
what they send where it does not belong."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pytest

from sparkbus.bus import contract as c
from sparkbus.codecs import encode_batch
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.roles.query.messages import QueryCancelled, QueryId

from .cluster import Cluster

SEEDS = [1, 2, 3]
SMALL = QueryConfig(edge_credit=4096, batch_bytes=1024)
QUERY = "i@i0.1"  # the first query of i (incarnation i0)


class Rogue:
    """A role that pushes one batch on a query's stream (``push``: ``peer``, ``stream``)."""

    name = "rogue"
    messages: ClassVar[tuple[type, ...]] = ()

    def handle(self, event: c.Event, now: float) -> list[c.Action]:
        if isinstance(event, c.LocalCall) and event.name == "push":
            peer, stream = event.args["peer"], event.args["stream"]
            data = bytes(encode_batch(pa.RecordBatch.from_pylist([{"x": -1}])))
            return [
                c.OpenStream(peer=peer, stream=stream, credit=1 << 20),
                c.SendBatch(peer=peer, stream=stream, data=data, last=True),
                c.Reply(call_id=event.call_id, result=True),
            ]
        return []


class Canceller:
    """A role beside p2's query role that sends a query's cancel, naming p2 as its origin, to the member
    ``go`` names (``to``): p1, not through the query's initiator, or the initiator ``i``."""

    name = "canceller"
    messages: ClassVar[tuple[type, ...]] = ()

    def handle(self, event: c.Event, now: float) -> list[c.Action]:
        if not isinstance(event, c.LocalCall):
            return []
        cancel = QueryCancelled(
            query_id=QueryId.parse(QUERY), code=ErrorCode.GENERIC, message="x", origin="p2"
        )
        return [c.Send(peer=event.args["to"], message=cancel), c.Reply(call_id=event.call_id, result=True)]


def _push(cl: Cluster, target: str, edge: int = 1) -> None:
    cl.sim.result(cl.sim.call("p9", "rogue", "push", {"peer": target, "stream": f"query/{QUERY}/{edge}"}))


def _cancel_from_p2(seed: int, to: str) -> tuple[Cluster, tuple[pa.Table | None, str | None]]:
    """Run ``SELECT x FROM t``; once ``to`` and p2 hold it, p2's canceller sends its cancel to ``to``."""
    cl = Cluster(seed, rows=6000, config=SMALL, others={"p2": [Canceller()]})
    cid = cl.execute("SELECT x FROM t")
    qid = QueryId.parse(QUERY)
    cl.sim.run_until(lambda: qid in cl.roles[to].queries and qid in cl.roles["p2"].queries)
    cl.sim.result(cl.sim.call("p2", "canceller", "go", {"to": to}))
    return cl, cl.outcome(cid)


def _ends_well(cl: Cluster, cid: Any, target: str) -> pa.Table:
    got, err = cl.outcome(cid)
    assert err is None and got is not None, err
    assert cl.roles[target].counters["batches_refused"] == 1
    cl.settle()
    assert cl.leaks() == {"i": 0, "p1": 0, "p2": 0}
    return got


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", ["i", "p1"])
def test_a_batch_from_outside_the_query_is_refused_and_the_query_runs_on(seed: int, target: str) -> None:
    # At the initiator: the edge its receive waits on. At p1: edge 1 of a repartitioned aggregate, which
    # p1 receives from p1 and p2 only.
    cl = Cluster(seed, rows=3000, config=SMALL, others={"p9": [Rogue()]})
    sql = "SELECT x FROM t" if target == "i" else "SELECT x, count(*) AS n FROM t GROUP BY x"
    cid = cl.execute(sql, participants=["p1", "p2"], repartition=target != "i")
    cl.sim.run_until(lambda: QueryId.parse(QUERY) in cl.roles[target].queries)
    _push(cl, target)
    got = _ends_well(cl, cid, target)
    assert sorted(got.column("x").to_pylist()) == list(range(3000))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_batch_from_outside_the_query_kept_before_start_is_refused_at_start(seed: int) -> None:
    cl = Cluster(seed, rows=3000, config=SMALL, others={"p9": [Rogue()]})
    _push(cl, "p1")
    cl.sim.run_until(lambda: QueryId.parse(QUERY) in cl.roles["p1"].queries)  # PENDING, the batch kept
    cid = cl.execute("SELECT x, count(*) AS n FROM t GROUP BY x", participants=["p1", "p2"], repartition=True)
    got = _ends_well(cl, cid, "p1")
    assert cl.roles["p1"].counters["created_by_batch"] >= 1
    assert sorted(got.column("x").to_pylist()) == list(range(3000))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cancel_a_participant_gets_from_another_participant_is_refused_and_the_query_runs_on(
    seed: int,
) -> None:
    cl, (got, err) = _cancel_from_p2(seed, "p1")
    assert err is None and got is not None, err
    assert sorted(got.column("x").to_pylist()) == list(range(6000))
    assert cl.roles["p1"].counters["handler_failed"] == 1  # the cancel was refused
    cl.settle()
    assert cl.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cancel_another_role_of_a_participant_sends_the_initiator_reaches_that_participant(
    seed: int,
) -> None:
    # The initiator takes the cancel (p2 is a participant) and ends the query. The message came from p2,
    # but not from p2's query role: the bus does not say which role sent it, so the initiator cannot skip
    # p2 as a member that has released the query. p2, still streaming under a small credit, must hear.
    cl, (got, err) = _cancel_from_p2(seed, "i")
    assert got is None and err is not None and err.startswith("[-1 GENERIC] x"), err
    cl.settle()
    assert cl.leaks() == {"i": 0, "p1": 0, "p2": 0}
    assert cl.roles["p1"].counters["cancelled_remote"] == 1
    assert cl.roles["p2"].counters["cancelled_remote"] == 1
