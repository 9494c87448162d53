"""A query of a replicated table while the nodes disagree on who leads a partition (a link between two of
them cut, so each sees the other lost): every node serves the partitions it leads in its own view, so the
query's participants could serve a partition twice, or not at all. The participants check their view
against the query's member list and fail the query (MEMBER_LEAVE) rather than answer it long or short."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.query import QueryError, QueryRole, sql
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.roles.replication import PARTITION_COLUMN, MemoryStorage, ServingReplication
from sparkbus.roles.replication.layout import Layout, Lifecycle, PartitionSpec, Replica, SplitTarget
from tests.unit.replication.test_factory import Target, cluster, rows_for

IDS = list(range(40))
# a/0 and a/3 are led by s-0, a/1 by s-1, a/2 by s-2 (test_factory's layout): each node loads what it leads.
BY_NODE = {
    "s-0": [i for i in IDS if i % 4 in (0, 3)],
    "s-1": [i for i in IDS if i % 4 == 1],
    "s-2": [i for i in IDS if i % 4 == 2],
}


def loaded() -> tuple[SimBus, Target]:
    sim, _ = cluster({n: rows_for(v) for n, v in BY_NODE.items()})
    sim.run_for(10.0)
    target = Target(sim, "s-2")
    assert sql(target, "SELECT COUNT(*) AS n FROM a").to_pylist() == [{"n": 40}]
    return sim, target


def count_or_error(target: Target) -> int | QueryError:
    try:
        table: pa.Table = sql(target, "SELECT COUNT(*) AS n FROM a")
    except QueryError as exc:
        return exc
    return int(table.column("n")[0].as_py())


@pytest.mark.parametrize(
    ("cut", "why"),
    [
        # s-1 loses s-0 and leads a/0 too, while the initiator s-2 still asks s-0: a/0 would count twice
        (("s-0", "s-1"), "may still lead it"),
        # the initiator s-2 loses s-0 and leaves it out, while s-1 still names s-0 a/0's leader: a/0 missing
        (("s-0", "s-2"), "which does not take part in this query"),
    ],
)
def test_a_partition_two_nodes_or_none_would_serve_fails_the_query(cut: tuple[str, str], why: str) -> None:
    sim, target = loaded()
    sim.cut(*cut)
    got = count_or_error(target)
    assert isinstance(got, QueryError), f"answered {got} rows, where 40 were loaded"
    assert got.code == ErrorCode.MEMBER_LEAVE and why in got.message, got
    sim.heal(*cut)
    sim.run_for(10.0)
    assert count_or_error(target) == 40  # once the views agree again, the answer is whole


# A split: its targets in LOAD hold the rows the source still serves, and after the finalize the source
# in UNLOAD holds those its targets serve; only SERVE replicas serve.


def split_layout() -> Layout:
    return Layout.of(
        [
            PartitionSpec(
                partition="a/0", replicas=(Replica(node="s-0", placement=1), Replica(node="s-1", placement=2))
            ),
            PartitionSpec(
                partition="a/1",
                replicas=(Replica(node="s-0", placement=3), Replica(node="s-1", placement=4)),
                lifecycle=Lifecycle.LOAD,
            ),
            PartitionSpec(
                partition="a/2",
                replicas=(Replica(node="s-1", placement=5), Replica(node="s-0", placement=6)),
                lifecycle=Lifecycle.LOAD,
            ),
        ]
    )


def split_count(target: Target) -> int | str:
    try:
        table: pa.Table = sql(target, "SELECT COUNT(*) AS n FROM a")
    except QueryError as exc:
        return f"{exc.code.name}"
    return int(table.column("n")[0].as_py())


def test_a_query_during_a_split_counts_each_row_once_or_fails() -> None:
    stores: dict[str, MemoryStorage] = {}
    sim = SimBus(seed=3)
    rows = pa.table({"id": IDS, "v": [float(i) for i in IDS], PARTITION_COLUMN: ["a/0"] * len(IDS)})
    for node in ("s-0", "s-1", "s-2"):
        catalog = TableCatalog()
        rep = ServingReplication(
            node,
            split_layout(),
            {"a": ("id",)},
            lambda p, node=node: stores.setdefault(f"{node}:{p}", MemoryStorage()),
            local_data=tuple(rows.to_batches()) if node == "s-0" else (),
            catalog=catalog,
        )
        sim.add_node(node, [rep, QueryRole(node, store=catalog, incarnation=node)])
    sim.start()
    sim.run_for(10.0)
    target = Target(sim, "s-2")
    assert split_count(target) == 40
    targets = (SplitTarget(partition="a/1", high=20), SplitTarget(partition="a/2", low=20))
    sim.result(sim.call("s-0", "replication", "split", {"partition": "a/0", "targets": targets}), limit=5)
    seen = []
    for _ in range(40):
        seen.append(split_count(target))
        sim.run_for(0.25)
    wrong = [n for n in seen if isinstance(n, int) and n != 40]
    assert wrong == [], f"answers during the split: {seen}"
