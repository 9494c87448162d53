"""Steady state: writes on the leader, flushes, fast-forward on followers; errors the role catches."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from sparkbus.bus.contract import Action, LocalCall, Reply, SetTimer, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.role import TICK, ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig

from .harness import Cluster

P = "t/0"
SPEC = PartitionSpec(
    partition=P,
    replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2), Replica(node="c", placement=3)),
)


def config(**store: object) -> ReplicationConfig:
    return ReplicationConfig(
        store=StoreConfig(flush_rows=4, compact_minors=3, **store), chunk_bytes=256, credit_bytes=1024
    )  # type: ignore[arg-type]


def test_steady_state_fast_forward() -> None:
    c = Cluster(["a", "b", "c"], [SPEC], config(), seed=1)
    assert c.leader("a", P) == "a"
    for i in range(10):
        r = c.write("a", P, {"key": [i * 2, i * 2 + 1], "v": [f"x{i}", f"y{i}"]})
        assert r.error is None, r.error
    c.settle(10)
    expect = c.read("a", P)
    assert len(expect["key"]) == 20
    for n in "bc":
        assert c.read(n, P) == expect
    counters = c.status("b")["counters"]
    assert counters.get("fast_forwards", 0) > 0
    assert c.status("a")["counters"].get("merges", 0) == 0


def _role(*partitions: str) -> ReplicationRole:
    specs = [PartitionSpec(partition=p, replicas=(Replica(node="a", placement=1),)) for p in partitions]
    storages: dict[str, MemoryStorage] = {}
    return ReplicationRole("a", Layout.of(specs), lambda p: storages.setdefault(p, MemoryStorage()), config())


def _write(role: ReplicationRole, partition: str, keys: list[int], call_id: int) -> list[Action]:
    rows = bytes(encode_batch(pa.RecordBatch.from_pydict({"key": keys, "v": [str(k) for k in keys]})))
    return list(
        role.handle(
            LocalCall(call_id=call_id, name="write", args={"partition": partition, "rows": rows}), 0.0
        )
    )


def test_a_failing_partition_keeps_the_tick_and_stops_no_other(caplog: pytest.LogCaptureFixture) -> None:
    role = _role("t/0", "t/1")
    list(role.handle(TimerFired(key="boot"), 0.0))
    for i, p in enumerate(("t/0", "t/1")):
        (reply,) = _write(role, p, [1, 2], i)
        assert isinstance(reply, Reply) and reply.error is None
    broken = role.local["t/0"].store

    def flush() -> None:
        raise RuntimeError("disk on fire")

    broken.flush = flush  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        for now in (100.0, 101.0):  # both replicas are past flush_age
            actions = list(role.handle(TimerFired(key=TICK), now))
            assert SetTimer(key=TICK, at=now + role.config.tick) in actions  # re-armed whatever fails
    assert role.local["t/1"].store.memtable_rows == 0  # the other partition flushed
    assert role.local["t/0"].store.memtable_rows == 2
    assert role.counters["procedure_errors"] == 2
    assert role.failing == {"t/0": "RuntimeError: disk on fire"}
    assert len([r for r in caplog.records if "disk on fire" in r.getMessage()]) == 1  # logged once
    del broken.flush  # the next run succeeds: no longer failing
    list(role.handle(TimerFired(key=TICK), 102.0))
    assert role.failing == {} and role.local["t/0"].store.memtable_rows == 0


def test_a_call_that_fails_unexpectedly_is_answered_with_the_error(caplog: pytest.LogCaptureFixture) -> None:
    role = _role("t/0")
    list(role.handle(TimerFired(key="boot"), 0.0))

    def compact(args: dict[str, object]) -> None:
        raise RuntimeError("no kernel")

    role._call_compact = compact  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        actions = list(role.handle(LocalCall(call_id=7, name="compact", args={"partition": "t/0"}), 1.0))
    assert actions == [Reply(call_id=7, error="compact failed: RuntimeError: no kernel")]
    assert role.counters["handler_errors"] == 1
    assert len([r for r in caplog.records if "no kernel" in r.getMessage()]) == 1


def test_a_replica_that_failed_and_is_no_longer_hosted_is_not_listed_as_failing() -> None:
    role = _role("t/0")
    list(role.handle(TimerFired(key="boot"), 0.0))
    _write(role, "t/0", [1], 1)
    store = role.local["t/0"].store

    def flush() -> None:
        raise RuntimeError("disk on fire")

    store.flush = flush  # type: ignore[method-assign]
    list(role.handle(TimerFired(key=TICK), 100.0))
    assert role.failing == {"t/0": "RuntimeError: disk on fire"}
    elsewhere = PartitionSpec(partition="t/0", replicas=(Replica(node="b", placement=2),))
    list(role.handle(LocalCall(call_id=2, name="assign", args={"spec": elsewhere}), 101.0))
    assert "t/0" not in role.local and "t/0" in role.draining
    assert role.failing == {"t/0 (draining)": "RuntimeError: disk on fire"}
