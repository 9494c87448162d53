"""The replication factory: a deterministic layout from the topology, local loads, the shared catalog."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from sparkbus.bus.contract import LocalCall, PeerUp, Reply
from sparkbus.bus.sim import SimBus
from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.query import QueryRole, sql
from sparkbus.roles.query.catalog import TableCatalog
from sparkbus.roles.replication import (
    PARTITION_COLUMN,
    REPLICAS_TABLE,
    MemoryStorage,
    ServingReplication,
    factory,
    layout_for,
    split_by_partition,
)
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.topologies.schema import load, loads, shipped

TOPO = """
[cluster]
name = "t"
[[nodes]]
name = "s"
placement = "host"
host = "127.0.0.1"
count = 3
roles = ["replication", "query"]
[tables.a]
partitions = 4
replication = 2
key = "id"
[tables.b]
partitions = 2
replication = 3
key = ["x", "y"]
"""


def test_layout_is_round_robin_with_unique_placements() -> None:
    layout = layout_for(loads(TOPO))
    got = {p: [(r.node, r.placement) for r in s.replicas] for p, s in layout.partitions.items()}
    assert got == {
        "a/0": [("s-0", 1), ("s-1", 2)],
        "a/1": [("s-1", 3), ("s-2", 4)],
        "a/2": [("s-2", 5), ("s-0", 6)],
        "a/3": [("s-0", 7), ("s-1", 8)],
        "b/0": [("s-0", 9), ("s-1", 10), ("s-2", 11)],
        "b/1": [("s-1", 12), ("s-2", 13), ("s-0", 14)],
    }


def test_layout_is_the_same_on_every_call_and_for_every_shipped_file() -> None:
    for name in ("local.toml", "processes.toml", "cluster.example.toml"):
        topo = load(shipped(name))
        assert layout_for(topo) == layout_for(topo)


def test_split_by_partition_drops_the_routing_column() -> None:
    rows = pa.table({"id": [1, 2, 3], PARTITION_COLUMN: ["a/1", "a/0", "a/1"]})
    parts = split_by_partition(rows)
    assert [(p, t.column("id").to_pylist()) for p, t in parts] == [("a/0", [2]), ("a/1", [1, 3])]
    assert parts[0][1].column_names == ["id"]
    with pytest.raises(ValueError, match="no _sb_partition column"):
        split_by_partition(pa.table({"id": [1]}))
    # rows keep their order within a partition; partitions come in name order
    many = pa.table({"id": [5, 1, 4, 2, 3], PARTITION_COLUMN: ["a/2", "a/10", "a/2", "a/10", "a/2"]})
    assert [(p, t.column("id").to_pylist()) for p, t in split_by_partition(many)] == [
        ("a/10", [1, 2]),
        ("a/2", [5, 4, 3]),
    ]
    assert split_by_partition(many.slice(0, 0)) == []
    with pytest.raises(ValueError, match="null _sb_partition"):
        split_by_partition(pa.table({"id": [1, 2], PARTITION_COLUMN: ["a/1", None]}))


class Target:
    def __init__(self, sim: SimBus, node: str) -> None:
        self.sim, self.node = sim, node

    def call(
        self, role: str, name: str, args: dict[str, object] | None = None, *, timeout: float = 30.0
    ) -> object:
        return self.sim.result(self.sim.call(self.node, role, name, args), limit=timeout)


def cluster(local: dict[str, pa.Table]) -> tuple[SimBus, dict[str, ServingReplication]]:
    topo = loads(TOPO.split("[tables.b]", maxsplit=1)[0])
    layout = layout_for(topo)
    stores: dict[str, MemoryStorage] = {}
    sim = SimBus(seed=3)
    roles = {}
    for node in ("s-0", "s-1", "s-2"):
        catalog = TableCatalog()
        batches = tuple(local[node].to_batches()) if node in local else ()
        rep = ServingReplication(
            node,
            layout_for(topo),
            {"a": ("id",)},
            lambda p, node=node: stores.setdefault(f"{node}:{p}", MemoryStorage()),
            local_data=batches,
            catalog=catalog,
        )
        roles[node] = rep
        sim.add_node(node, [rep, QueryRole(node, store=catalog, incarnation=node)])
    assert layout == layout_for(topo)
    sim.start()
    return sim, roles


def rows_for(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "v": [float(i) for i in ids], PARTITION_COLUMN: [f"a/{i % 4}" for i in ids]})


def test_local_rows_are_written_replicated_and_scanned_once() -> None:
    # a/0 and a/3 are led by s-0, a/1 by s-1, a/2 by s-2: give each node the rows of what it leads.
    ids = list(range(40))
    by_node = {
        "s-0": [i for i in ids if i % 4 in (0, 3)],
        "s-1": [i for i in ids if i % 4 == 1],
        "s-2": [i for i in ids if i % 4 == 2],
    }
    sim, roles = cluster({n: rows_for(v) for n, v in by_node.items()})
    sim.run_for(10.0)
    target = Target(sim, "s-0")
    status = sql(target, f"SELECT partition, leader, loaded, replicated, error FROM {REPLICAS_TABLE}")
    leaders = [r for r in status.to_pylist() if r["leader"] == 1]
    assert sorted(r["partition"] for r in leaders) == ["a/0", "a/1", "a/2", "a/3"]
    assert all(r["replicated"] == 1 and r["error"] == "" for r in leaders)
    assert sum(r["loaded"] for r in status.to_pylist()) == 40
    total = sql(target, "SELECT COUNT(*) AS n, SUM(v) AS s FROM a").to_pylist()
    assert total == [{"n": 40, "s": float(sum(ids))}]
    # the followers hold the rows too (replication), but only leaders serve them to queries
    follower = roles["s-1"].local["a/0"]
    assert not follower.leads and follower.store.rows().num_rows == len(by_node["s-0"]) // 2


def test_rows_on_a_node_that_does_not_lead_their_partition_are_reported() -> None:
    sim, _ = cluster({"s-1": rows_for([0, 4])})  # a/0 is s-0's
    sim.run_for(2.0)
    status = sql(
        Target(sim, "s-0"), f"SELECT node, error FROM {REPLICAS_TABLE} WHERE node = 's-1'"
    ).to_pylist()
    assert status and "whose designated leader is s-0, not s-1" in status[0]["error"]


def test_a_published_table_cannot_be_overwritten_by_load(tmp_path: Path) -> None:
    catalog = TableCatalog()
    catalog.publish("a", lambda: None)
    from sparkbus.roles.query import ExecutionError

    with pytest.raises(ExecutionError, match="published by another role"):
        catalog.load("a", pa.table({"x": [1]}))
    with pytest.raises(ExecutionError, match="already in this node's catalog"):
        catalog.publish("a", lambda: None)
    assert catalog.get("a") is None and catalog.get("zzz") is None


def feed(sim: SimBus, node: str, rows: pa.Table | None, *, last: bool) -> object:
    batches = tuple(rows.to_batches()) if rows is not None else ()
    return sim.result(sim.call(node, "replication", "local_rows", {"batches": batches, "last": last}))


def replicas(sim: SimBus) -> dict[str, dict[str, object]]:
    status = sql(Target(sim, "s-0"), f"SELECT * FROM {REPLICAS_TABLE} WHERE leader = 1").to_pylist()
    return {r["partition"]: r for r in status}


def test_rows_handed_over_after_the_start_are_gathered_into_whole_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(factory, "LOAD_CHUNK_ROWS", 4)
    sim, roles = cluster({})
    sim.run_for(1.0)
    assert feed(sim, "s-0", rows_for([0, 4, 8]), last=False) == {"rows": 3}
    sim.run_for(1.0)
    # three rows of a/0 make no chunk yet: nothing written, the partition is not done
    a0 = replicas(sim)["a/0"]
    assert (a0["loaded"], a0["pending"], a0["replicated"]) == (0, 3, 0)
    feed(sim, "s-0", rows_for([12, 16, 3]), last=False)
    sim.run_for(1.0)
    a0, a3 = replicas(sim)["a/0"], replicas(sim)["a/3"]
    # a/0 has five rows: one chunk of four is written (not flushed: more may come), one row waits
    assert (a0["loaded"], a0["pending"], a0["replicated"]) == (4, 1, 0)
    assert roles["s-0"].local["a/0"].store.memtable_rows == 4
    assert (a3["loaded"], a3["pending"]) == (0, 1)
    feed(sim, "s-0", None, last=True)
    sim.run_until(lambda: all(r["replicated"] == 1 for p, r in replicas(sim).items() if p in ("a/0", "a/3")))
    a0, a3 = replicas(sim)["a/0"], replicas(sim)["a/3"]
    assert (a0["loaded"], a0["pending"], a3["loaded"], a3["pending"]) == (5, 0, 1, 0)
    # the followers got the segments; queries see each row once
    assert roles["s-1"].local["a/0"].store.rows().num_rows == 5
    assert sql(Target(sim, "s-0"), "SELECT COUNT(*) AS n FROM a").to_pylist() == [{"n": 6}]


def test_rows_handed_over_for_a_partition_led_elsewhere_are_refused_and_so_is_the_rest() -> None:
    sim, _ = cluster({})
    sim.run_for(1.0)
    with pytest.raises(RuntimeError, match="whose designated leader is s-0, not s-1"):
        feed(sim, "s-1", rows_for([0]), last=False)
    with pytest.raises(RuntimeError, match="whose designated leader is s-0, not s-1"):
        feed(sim, "s-1", rows_for([1]), last=True)  # a/1 is s-1's, but the load has failed already
    status = sql(Target(sim, "s-0"), f"SELECT error FROM {REPLICAS_TABLE} WHERE node = 's-1'").to_pylist()
    assert all("not s-1" in r["error"] for r in status)


@pytest.mark.parametrize(
    ("args", "problem"),
    [({}, "needs batches and last"), ({"batches": 3, "last": True}, "needs batches and last")],
)
def test_a_malformed_local_rows_call_is_answered_with_an_error(args: dict[str, object], problem: str) -> None:
    sim, _ = cluster({})
    sim.run_for(1.0)
    with pytest.raises(RuntimeError, match=problem):
        sim.result(sim.call("s-0", "replication", "local_rows", args))
    with pytest.raises(RuntimeError, match="no _sb_partition column"):
        feed(sim, "s-2", pa.table({"id": [2]}), last=True)


ONE_NODE = """
[cluster]
name = "c1"
[[nodes]]
name = "s"
placement = "host"
host = "127.0.0.1"
roles = ["replication"]
[tables.a]
partitions = 2
replication = 1
key = "id"
"""


def _start(local: pa.Table | None = None) -> tuple[SimBus, ServingReplication]:
    ctx = SimpleNamespace(
        node_id="s", topology=loads(ONE_NODE), local_data=() if local is None else tuple(local.to_batches())
    )
    role = factory.make_role(ctx)
    sim = SimBus(seed=1)
    sim.add_node("s", [role])
    sim.start()
    sim.result(sim.call("s", "replication", "status", {}))  # a lone node's role starts on its first event
    sim.run_for(2.0)
    return sim, role


def _keys(sim: SimBus) -> list[int]:
    keys: list[int] = []
    for p in ("a/0", "a/1"):
        got = sim.result(sim.call("s", "replication", "read", {"partition": p}))
        batch = decode_batch(got)
        keys += batch.column("id").to_pylist() if batch.num_rows else []
    return sorted(keys)


def test_a_node_started_again_with_a_data_directory_opens_its_rows_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the user sees: with SPARKBUS_DATA_DIR set, a node's replicas live in <dir>/<cluster>/<node>,
    and the node started again (after a stop or a crash) serves the rows it had without being loaded
    again; while one node holds the directory, a second one for the same node is refused, clearly."""
    monkeypatch.setenv(factory.DATA_DIR_ENV, str(tmp_path))
    rows = pa.table({"id": list(range(10)), PARTITION_COLUMN: [f"a/{i % 2}" for i in range(10)]})
    sim, role = _start(rows)
    assert _keys(sim) == list(range(10))
    assert (tmp_path / "c1" / "s" / "a~0").is_dir() and (tmp_path / "c1" / "s" / "a~1").is_dir()
    with pytest.raises(factory.DataDirInUse, match=r"node s: its data directory .*c1/s is in use"):
        _start()
    role.close()
    role.close()  # idempotent
    sim, again = _start()
    try:
        assert _keys(sim) == list(range(10))
    finally:
        again.close()


def test_a_node_without_a_data_directory_starts_empty_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(factory.DATA_DIR_ENV, raising=False)
    rows = pa.table({"id": [1, 2], PARTITION_COLUMN: ["a/0", "a/1"]})
    sim, first = _start(rows)
    sim2, second = _start()  # no lock: each start has a directory of its own
    roots = [first.storage_for.root, second.storage_for.root]
    try:
        assert _keys(sim) == [1, 2] and _keys(sim2) == []
        assert roots[0] != roots[1] and all(r.is_dir() for r in roots)
    finally:
        for role in (first, second):
            role.close()
            role.close()  # idempotent
    # No later start would find them: a stopped node removes its temporary directory.
    assert not any(r.exists() for r in roots)


def test_a_node_restarted_off_a_partition_drains_the_files_it_holds_with_the_tables_key(
    tmp_path: Path,
) -> None:
    """NodeData names the partitions with a replica's files without creating a directory for the
    others; a node restarted with a layout that no longer places it there opens them to drain, with
    the table's key (not the role's default)."""
    on_both = PartitionSpec(
        partition="a/0", replicas=(Replica(node="s-0", placement=1), Replica(node="s-1", placement=2))
    )
    elsewhere = PartitionSpec(partition="a/1", replicas=(Replica(node="s-1", placement=3),))
    first = ServingReplication(
        "s-0", Layout.of([on_both, elsewhere]), {"a": ("id",)}, factory.NodeData("s-0", "c", str(tmp_path))
    )
    rows = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "v": [1.0, 2.0, 3.0]})
    write = LocalCall(call_id=1, name="write", args={"partition": "a/0", "rows": bytes(encode_batch(rows))})
    replies = [a for a in first.handle(write, 1.0) if isinstance(a, Reply)]
    assert replies and replies[0].error is None, "acknowledged by s-0, the leader while s-1 is not up"
    first.close()
    data = factory.NodeData("s-0", "c", str(tmp_path))
    assert data.held(["a/0", "a/1", "z/9"]) == ["a/0"]
    assert not (data.root / "a~1").exists() and not (data.root / "z~9").exists()
    moved = PartitionSpec(partition="a/0", replicas=(Replica(node="s-1", placement=2),))
    again = ServingReplication("s-0", Layout.of([moved, elsewhere]), {"a": ("id",)}, data)
    try:
        list(again.handle(PeerUp(peer="s-1"), 2.0))
        draining = again.draining["a/0"]
        assert draining.store.config.key == ("id",) and draining.store.rows().num_rows == 3
        assert again.counters["drains_resumed"] == 1 and "a/0" not in again.local
    finally:
        again.close()


def test_files_of_a_partition_the_layout_does_not_have_are_kept_warned_about_and_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table dropped from the topology (or a mistake in it) leaves its replicas' files: the node keeps
    them (the table may come back), logs them at start and lists them under ``strays`` in status."""
    spec = PartitionSpec(partition="a/0", replicas=(Replica(node="s-0", placement=1),))
    other = PartitionSpec(partition="b/0", replicas=(Replica(node="s-0", placement=2),))
    first = ServingReplication(
        "s-0",
        Layout.of([spec, other]),
        {"a": ("id",), "b": ("id",)},
        factory.NodeData("s-0", "c", str(tmp_path)),
    )
    list(first.handle(PeerUp(peer="nobody"), 1.0))
    first.close()
    data = factory.NodeData("s-0", "c", str(tmp_path))
    (data.root / "junk").mkdir()  # a directory without a manifest is nobody's replica
    again = ServingReplication("s-0", Layout.of([spec]), {"a": ("id",)}, data)
    try:
        with caplog.at_level("WARNING"):
            list(again.handle(PeerUp(peer="nobody"), 2.0))
        stray = str(data.root / "b~0")
        assert again.strays == [stray] and again._call_status({})["strays"] == [stray]
        assert any(stray in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        assert (data.root / "b~0" / "MANIFEST").is_file(), "kept"
        assert "b/0" not in again.draining and "b/0" not in again.local
    finally:
        again.close()


def test_a_leader_names_the_replicas_that_have_not_acked_its_rows() -> None:
    """``unacked`` on a leader's row of ``sparkbus_replicas``: what ``sparkbus load`` names when it times out
    waiting for replication (s-1, the follower of a/0 and a/3, is down)."""
    ids = [i for i in range(40) if i % 4 in (0, 3)]  # a/0 and a/3, led by s-0
    sim, _ = cluster({"s-0": rows_for(ids)})
    sim.crash("s-1")
    sim.run_for(10.0)
    status = sql(Target(sim, "s-0"), f"SELECT partition, replicated, unacked FROM {REPLICAS_TABLE}")
    got = {r["partition"]: (r["replicated"], r["unacked"]) for r in status.to_pylist()}
    assert got["a/0"] == got["a/3"] == (0, "s-1")
    assert got["a/2"] == (1, "")  # led by s-2, followed by s-0: both up
