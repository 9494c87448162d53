"""The leader's automatic compaction in steps over loop turns (``compacting.py``), on SimBus with fixed
seeds: writes taken while it runs (their flush waits for it), leadership lost, the leader killed, or a
fork merged in the middle of one; every replica ends with exactly the acknowledged rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.replication import ServingReplication, factory
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig

from .cluster import NODES, Cluster, P, config, spec

#: one row per record batch: a compaction of a few dozen rows takes as many loop turns
CONFIG = config(batch_rows=1)
#: the same, with segments that travel in a few large chunks (for thousands of rows)
LARGE = replace(CONFIG, chunk_bytes=1 << 16, credit_bytes=1 << 18)
SEEDS = [1, 2, 3]


def until(c: Cluster, done: Callable[[], bool], limit: float = 5.0) -> None:
    """Run the cluster in small slices until ``done``."""
    end = c.sim.now + limit
    while not done():
        assert c.sim.now < end, "never happened"
        c.run(0.000002)


def compacting(c: Cluster, node: str, writing: bool = True) -> bool:
    """``node`` has a compaction under way (with ``writing``, one writing its major's file)."""
    run = c.role(node).compactions.get(P)
    return run is not None and (not writing or run.compaction.writer is not None)


def partial_files(storage: MemoryStorage) -> list[str]:
    """Temporaries being written: a compaction's major (flushes write theirs in one call). A segment being
    received is written in place under its own name, not counted."""
    return list(storage._temps)


@pytest.mark.parametrize("seed", SEEDS)
def test_writes_taken_while_the_leader_compacts_are_flushed_after_it_on_every_replica(seed: int) -> None:
    c = Cluster([spec(*NODES)], CONFIG, seed=seed)
    acked = c.write_keys("a", range(16))  # a major and three minors: the last write starts a compaction
    assert compacting(c, "a", writing=False)
    root = c.role("a").local[P].store.root
    acked += c.write_keys("a", range(16, 30), "w")  # at the same instant: no step runs in between
    store = c.role("a").local[P].store
    assert store.root == root and store.memtable_rows == 14  # the flushes wait for the compaction
    c.settle(30)
    assert c.counters("a")["compactions"] >= 1
    assert "compactions_abandoned" not in c.counters("a")
    c.assert_identical(NODES, acked)
    c.assert_clean()
    assert not partial_files(c.storages["a", P])


def write_many(c: Cluster, node: str, keys: range, tag: str = "v") -> list[int]:
    """``keys`` in one write (one flush: ``flush_rows`` is 4); the keys if acknowledged."""
    _, error = c.write(node, P, {"key": list(keys), "v": [f"{tag}{k}" for k in keys]})
    return list(keys) if error is None else []


@pytest.mark.parametrize("seed", SEEDS)
def test_leadership_lost_mid_compaction_abandons_it_and_the_new_leader_holds_every_row(seed: int) -> None:
    order = ("b", "a", "c")  # b leads while it is up
    c = Cluster([spec(*order)], LARGE, seed=seed)
    c.cut("a", "b")
    c.settle(10)
    assert c.leader("a") == "a"
    acked = [k for i in range(3) for k in write_many(c, "a", range(1000 * i, 1000 * i + 1000))]
    c.heal("a", "b")
    # The compaction starts while b's handshake is on its way to a: it runs for thousands of loop turns
    # (a row per record batch), longer than a message's trip.
    c.sim.run_until(lambda: any(d.src == "b" and d.dst == "a" for d in c.sim._queue), limit=30)
    assert c.leader("a") == "a"
    acked += write_many(c, "a", range(3000, 4000))
    assert compacting(c, "a", writing=False)
    acked += c.write_keys("a", range(4000, 4003), "w")
    c.sim.run_until(lambda: "b" in c.role("a").live, limit=30)
    assert c.leader("a") == "b"
    assert not compacting(c, "a", writing=False)
    assert c.counters("a")["compactions_abandoned"] == 1 and "compactions" not in c.counters("a")
    assert not partial_files(c.storages["a", P])
    acked += c.write_keys("b", range(4003, 4006), "b")
    c.settle(60)
    c.assert_identical(order, acked)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_leader_killed_mid_compaction_discards_its_partial_major_and_loses_no_row(seed: int) -> None:
    c = Cluster([spec(*NODES)], CONFIG, seed=seed)
    acked = c.write_keys("a", range(16))
    until(c, lambda: compacting(c, "a"))
    acked += c.write_keys("a", range(16, 19), "w")
    c.crash("a")
    assert partial_files(c.storages["a", P])  # the major being written, in its temporary
    c.restart("a")
    c.settle(1)
    status = c.status("a")["partitions"][P]["recovered"]
    assert status["partial_files"] >= 1 and status["log_records"] >= 1
    assert not partial_files(c.storages["a", P]) or compacting(c, "a", writing=False)
    c.settle(60)
    c.assert_identical(NODES, acked)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fork_merged_mid_compaction_abandons_it_and_the_next_one_holds_every_row(seed: int) -> None:
    c = Cluster([spec(*NODES)], LARGE, seed=seed)
    acked = c.write_keys("a", range(4))  # the major
    c.settle(10)
    for other in ("b", "c"):  # b leads b and c meanwhile, and writes a fork of its own
        c.cut("a", other)
    c.settle(2)
    acked += c.write_keys("b", range(100, 108), "b")
    acked += write_many(c, "a", range(1000, 2000)) + write_many(c, "a", range(2000, 3000))
    for other in ("b", "c"):  # b now follows a, and pushes its fork to it
        c.heal("a", other)
    c.sim.run_until(lambda: any(i.peer == "b" for i in c.role("a").incoming.values()), limit=30)
    # Minors until a compaction of thousands of turns runs (the third, or more if a compaction ran since).
    for start in range(3000, 10000, 1000):
        acked += write_many(c, "a", range(start, start + 1000))
        if compacting(c, "a", writing=False):
            break
    assert compacting(c, "a", writing=False)
    # The fork is merged as it arrives, and flushed (a new minor): the compaction's chain is gone.
    c.sim.run_until(lambda: c.counters("a").get("merges", 0) > 0, limit=30)
    c.sim.run_until(lambda: c.counters("a").get("compactions_abandoned", 0) > 0, limit=1)
    assert not partial_files(c.storages["a", P])
    c.settle(60)
    assert c.counters("a")["compactions"] >= 1
    c.assert_identical(NODES, acked)
    c.assert_clean()
    assert not partial_files(c.storages["a", P])


def test_a_node_loading_a_partition_compacts_it_once_its_chunks_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(factory, "LOAD_CHUNK_ROWS", 4)
    rows = pa.table({"id": list(range(40)), factory.PARTITION_COLUMN: ["a/0"] * 40})
    layout = Layout.of([PartitionSpec(partition="a/0", replicas=(Replica(node="s", placement=1),))])
    storage = MemoryStorage()
    config = ReplicationConfig(store=StoreConfig(key=("id",), flush_rows=4, compact_minors=3, batch_rows=1))
    role = ServingReplication(
        "s", layout, {"a": ("id",)}, lambda p: storage, local_data=tuple(rows.to_batches()), config=config
    )
    sim = SimBus(seed=1)
    sim.add_node("s", [role])
    sim.start()
    sim.call("s", "replication", "status")  # the role's first event: it opens its store, writes a chunk
    sim.run_until(lambda: role.loaded.get("a/0", 0) == 40 and not role.loading, limit=5)
    # Each chunk is flushed as it is written: a compaction started meanwhile would be abandoned by the next.
    assert "compactions" not in role.counters and "compactions_abandoned" not in role.counters
    sim.run_until(lambda: "compactions" in role.counters, limit=5)
    assert "compactions_abandoned" not in role.counters
    store = role.local["a/0"].store
    assert store.rows().column("id").to_pylist() == list(range(40))
    assert not partial_files(storage)
