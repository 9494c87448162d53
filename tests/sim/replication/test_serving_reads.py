"""Leadership moves to a replica that never read its partition's rows (it only received segments), or a
node restarts and opens its stores again: its rows are read in steps, each in a tick of its own, so the
node's other timers, its heartbeats among them, run between any two steps. A query meanwhile answers every
row, after waiting for the rows being read (never a short or a long count, never an error), and once read
every query answers every row, writes acknowledged meanwhile included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from sparkbus.bus.contract import Action, Event, LocalCall, Reply, SetTimer, TimerFired
from sparkbus.bus.sim import SimBus
from sparkbus.codecs import encode_batch
from sparkbus.roles.query import QueryError, QueryRole, sql
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.replication import MemoryStorage, ServingReplication
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.store import StoreConfig
from tests.unit.replication.test_factory import Target

P = "a/0"
NODES = ("s-0", "s-1")
LAYOUT = Layout.of(
    [
        PartitionSpec(
            partition=P, replicas=(Replica(node="s-0", placement=1), Replica(node="s-1", placement=2))
        )
    ]
)
STORE = StoreConfig(key=("id",), batch_rows=4, flush_rows=1000, compact_minors=1000)


class Ticker:
    """Another role of the node: from its ``start`` call, a timer it sets again just after each time it
    fires, noting how far the rows being read were then, until it saw a read begin and end."""

    name = "ticker"
    messages: ClassVar[tuple[type, ...]] = ()

    def __init__(self, busy: Callable[[], int]) -> None:
        self.busy = busy
        self.during: list[int] = []
        self.fired = 0

    def handle(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, LocalCall):
            return [Reply(call_id=event.call_id, result=None), SetTimer(key="tick", at=now)]
        if not isinstance(event, TimerFired):
            return []
        self.fired += 1
        steps = self.busy()
        if steps:
            self.during.append(steps)
        if (steps or not self.during) and self.fired < 200_000:
            return [SetTimer(key="tick", at=now + 1e-6)]
        return []


class Nodes:
    def __init__(self, seed: int, layout: Layout = LAYOUT) -> None:
        self.layout = layout
        self.storages: dict[str, MemoryStorage] = {}
        self.sim = SimBus(seed=seed)
        self.roles: dict[str, ServingReplication] = {}
        self.tickers: dict[str, Ticker] = {}
        for node in NODES:
            self.sim.add_node(node, self.roles_of(node))
        self.sim.start()

    def roles_of(self, node: str) -> list[Any]:
        catalog = TableCatalog()
        rep = self.roles[node] = ServingReplication(
            node,
            self.layout,
            {"a": ("id",)},
            lambda p, node=node: self.storages.setdefault(f"{node}:{p}", MemoryStorage()),
            catalog=catalog,
            config=ReplicationConfig(store=STORE),
            inline_rows=8,
            step_rows=4,
        )
        ticker = self.tickers[node] = Ticker(lambda: sum(b.steps for b in rep.serving.builds.values()))
        return [rep, QueryRole(node, store=catalog, incarnation=node), ticker]

    def tick(self, node: str) -> None:
        self.sim.result(self.sim.call(node, "ticker", "start"))

    def restart(self, node: str) -> None:
        self.sim.crash(node)
        self.sim.restart(node, self.roles_of(node))
        self.tick(node)

    def write(self, node: str, ids: list[int], tag: str) -> None:
        batch = pa.RecordBatch.from_pydict({"id": ids, "v": [tag] * len(ids)})
        args = {"partition": P, "rows": bytes(encode_batch(batch))}
        self.sim.result(self.sim.call(node, "replication", "write", args))

    def count(self, node: str) -> int | QueryError:
        try:
            table: pa.Table = sql(Target(self.sim, node), "SELECT COUNT(*) AS n FROM a", participants=[node])
        except QueryError as exc:
            return exc
        return int(table.column("n")[0].as_py())


def loaded(seed: int) -> Nodes:
    nodes = Nodes(seed)
    for start in range(0, 60, 20):
        nodes.write("s-0", list(range(start, start + 20)), "a")
        nodes.sim.result(nodes.sim.call("s-0", "replication", "flush", {"partition": P}))
    nodes.sim.run_for(5.0)
    assert nodes.count("s-0") == 60
    assert nodes.roles["s-1"].local[P].store.pending_rows() == 60  # received, never read
    return nodes


def answered_after_waiting(nodes: Nodes, node: str, rows: int) -> None:
    """A query that meets the rows still being read waits for them (``SourcePending``, then the
    replication role's ``sources_ready``) and answers every row: never a short count, never an error."""
    query = nodes.sim.node(node).roles["query"]
    waits = query.counters["source_waits"]
    assert nodes.count(node) == rows
    assert query.counters["source_waits"] > waits, "the query did not meet the rows being read"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_new_leader_reads_its_rows_in_steps_between_its_other_timers(seed: int) -> None:
    nodes = loaded(seed)
    nodes.tick("s-1")
    nodes.sim.crash("s-0")
    rep = nodes.roles["s-1"]
    nodes.sim.run_until(lambda: rep.local[P].leads, limit=10)
    answered_after_waiting(nodes, "s-1", 60)
    nodes.write("s-1", [100, 0], "w")  # acknowledged while the rows may still be read
    nodes.sim.run_for(2.0)
    assert not rep.serving.builds and rep.serving.started >= 1
    during = nodes.tickers["s-1"].during
    # the other role's timer fired again and again while the rows were read, each time a step further on
    assert len(during) >= 10 and during == sorted(during) and len(set(during)) >= 10
    assert nodes.count("s-1") == 61


@pytest.mark.parametrize("seed", [4, 5])
def test_a_restarted_node_reads_its_rows_again_in_steps(seed: int) -> None:
    nodes = loaded(seed)
    nodes.restart("s-0")
    rep = nodes.roles["s-0"]
    nodes.sim.run_until(lambda: bool(rep.serving.builds) or rep.serving.started > 0, limit=10)
    answered_after_waiting(nodes, "s-0", 60)
    nodes.sim.run_for(3.0)
    assert rep.serving.started >= 1 and not rep.serving.builds
    assert len(nodes.tickers["s-0"].during) >= 10
    assert nodes.count("s-0") == 60
