"""What a serving node publishes for a table: the rows of the partitions it leads, each partition's cached
by its version, so that a write to one partition recomputes that partition only."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import LocalCall, PeerLost, PeerUp, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication import MemoryStorage, ServingReplication
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.store import PartitionStore

PARTS = ("a/0", "a/1", "a/2")


def node(monkeypatch: pytest.MonkeyPatch) -> tuple[ServingReplication, Counter[str]]:
    """Node s leads a/0, a/1 and a/2 (t follows a/2, and leads it while s is its only peer down);
    the counter counts ``versioned_rows`` per partition."""
    specs = [
        PartitionSpec(partition=p, replicas=(Replica(node="s", placement=i + 1),))
        for i, p in enumerate(PARTS)
    ]
    specs.append(
        PartitionSpec(
            partition="a/3", replicas=(Replica(node="t", placement=9), Replica(node="s", placement=10))
        )
    )
    storages: dict[str, MemoryStorage] = {}
    role = ServingReplication(
        "s", Layout.of(specs), {"a": ("id",)}, lambda p: storages.setdefault(p, MemoryStorage())
    )
    list(role.handle(TimerFired(key="replication/tick"), 0.0))
    calls: Counter[str] = Counter()
    versioned_rows = PartitionStore.versioned_rows

    def counted(store: PartitionStore) -> Any:
        calls[store.partition] += 1
        return versioned_rows(store)

    monkeypatch.setattr(PartitionStore, "versioned_rows", counted)
    return role, calls


def write(role: ServingReplication, partition: str, ids: list[int], now: float = 1.0) -> None:
    batch = pa.RecordBatch.from_pydict({"id": ids, "v": [f"v{i}" for i in ids]})
    call = LocalCall(
        call_id=1, name="write", args={"partition": partition, "rows": bytes(encode_batch(batch))}
    )
    replies = list(role.handle(call, now))
    assert not any(getattr(r, "error", None) for r in replies), replies


def ids(table: pa.Table | None) -> list[int]:
    assert table is not None
    return sorted(table.column("id").to_pylist())


def test_a_write_to_one_led_partition_recomputes_that_partition_only(monkeypatch: pytest.MonkeyPatch) -> None:
    role, calls = node(monkeypatch)
    for i, p in enumerate(PARTS):
        write(role, p, [10 * i, 10 * i + 1])
    assert ids(role.serve("a")) == [0, 1, 10, 11, 20, 21]
    assert calls == Counter(dict.fromkeys(PARTS, 1))
    assert ids(role.serve("a")) == [0, 1, 10, 11, 20, 21]
    assert calls == Counter(dict.fromkeys(PARTS, 1)), "unchanged: nothing recomputed"
    write(role, "a/1", [12], now=2.0)
    assert ids(role.serve("a")) == [0, 1, 10, 11, 12, 20, 21]
    assert calls == Counter({"a/0": 1, "a/1": 2, "a/2": 1})
    write(role, "a/1", [10], now=3.0)  # an upsert: same row count, a new version
    assert ids(role.serve("a")) == [0, 1, 10, 11, 12, 20, 21]
    assert calls == Counter({"a/0": 1, "a/1": 3, "a/2": 1})


def test_a_partition_led_no_more_is_served_no_more_and_its_rows_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    role, calls = node(monkeypatch)
    write(role, "a/0", [1])
    assert role.local["a/3"].leads  # t is down: s leads a/3
    write(role, "a/3", [3])
    assert ids(role.serve("a")) == [1, 3]
    list(role.handle(PeerUp(peer="t"), 2.0))  # t comes first in a/3's placement order
    assert not role.local["a/3"].leads
    assert ids(role.serve("a")) == [1]
    assert "a/3" not in role._served
    list(role.handle(PeerLost(peer="t", reason="gone"), 3.0))
    assert ids(role.serve("a")) == [1, 3]
    assert calls == Counter({"a/0": 1, "a/3": 2})
    assert role.serve("b") is None


def test_a_replica_that_cannot_be_opened_has_a_row_saying_why() -> None:
    """``sparkbus load`` names the failing replica of a partition that has no leader: the replica placed
    here whose store cannot be opened is hosted nowhere, so it had no row in ``sparkbus_replicas``."""
    spec = PartitionSpec(partition="a/0", replicas=(Replica(node="s", placement=1),))
    good = PartitionSpec(partition="a/1", replicas=(Replica(node="s", placement=2),))

    class Broken(MemoryStorage):
        def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
            raise OSError(5, "Input/output error")

        def exists(self, name: str) -> bool:
            return True

    storages = {"a/0": Broken(), "a/1": MemoryStorage()}
    role = ServingReplication("s", Layout.of([spec, good]), {"a": ("id",)}, storages.__getitem__)
    list(role.handle(TimerFired(key="replication/tick"), 0.0))
    rows = {r["partition"]: r for r in role.replicas_table().to_pylist()}
    assert rows["a/0"]["leader"] == 0 and rows["a/0"]["rows"] == 0
    assert rows["a/0"]["failing"].startswith("cannot open: OSError"), rows["a/0"]
    assert "Input/output error" in rows["a/0"]["failing"]
    assert rows["a/1"]["leader"] == 1 and rows["a/1"]["failing"] == ""
