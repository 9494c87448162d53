"""Seeded simulations: a query's default participants are the peers that run the query role.

A topology may give a node other roles only (say, replication). Such a node refuses ``start`` on its bus
(it runs no role for ``QueryStarted``) and that refusal never reaches the initiator's role: a query that
took it as a participant would wait for its batches for ever.
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
import pytest

from sparkbus.bus import contract as c
from sparkbus.bus.sim import SimBus
from sparkbus.codecs import encode_batch
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.role import QueryRole

SEEDS = [1, 2, 3]
MEMBERS = QueryConfig(members=frozenset({"i", "p1"}))


class Other:
    """Any role other than query (a node that runs, say, only replication)."""

    name = "other"
    messages: ClassVar[tuple[type, ...]] = ()

    def handle(self, event: c.Event, now: float) -> list[c.Action]:
        return []


def _cluster(seed: int) -> tuple[SimBus, dict[str, QueryRole]]:
    """``i`` and ``p1`` run the query role, ``s`` another role only; ``p1`` holds 10 rows of ``t``."""
    sim = SimBus(seed=seed)
    roles = {n: QueryRole(n, config=MEMBERS, incarnation=f"{n}0") for n in ("i", "p1")}
    for n, r in roles.items():
        sim.add_node(n, roles=[r])
    sim.add_node("s", roles=[Other()])
    sim.start()
    sim.run_until(sim.all_up)
    batches = [bytes(encode_batch(b)) for b in pa.table({"x": pa.array(range(10), pa.int64())}).to_batches()]
    sim.result(sim.call("p1", "query", "load", {"table": "t", "batches": batches}))
    return sim, roles


@pytest.mark.parametrize("seed", SEEDS)
def test_a_peer_without_the_query_role_is_not_a_default_participant(seed: int) -> None:
    sim, roles = _cluster(seed)
    cid = sim.call("i", "query", "execute", {"sql": "SELECT count(*) AS n FROM t"})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=60.0)
    done = sim.reply(cid)
    assert done is not None and done.error is None, done.error
    assert pa.ipc.open_stream(done.result).read_all().to_pylist() == [{"n": 10}]
    sim.run_for(3.0)
    sim.run_until_idle()
    assert all(r.queries == {} and r.calls == {} for r in roles.values())


def test_a_participant_without_the_query_role_is_refused_before_anything_is_sent() -> None:
    sim, roles = _cluster(1)
    cid = sim.call("i", "query", "execute", {"sql": "SELECT x FROM t", "participants": ["p1", "s"]})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=1.0)
    done = sim.reply(cid)
    assert done is not None and done.error == "[1005 PARSING] member(s) s run no query role"
    assert roles["i"].counters["started"] == 0 and roles["i"].queries == {} and roles["i"].calls == {}
