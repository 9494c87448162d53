"""A led partition whose rows must be read again from its segments (the store opened at a restart, a major
fast-forwarded) is read in bounded steps, one per event of the role, never in one call: a query meanwhile
is told to wait (``SourcePending``), every query that asks shares the one read, and what it finally sees is
the store's rows now (every acknowledged write), never rows of a chain the store moved away from."""

from __future__ import annotations

import errno
import io
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import Action, Call, Event, LocalCall, Reply, SetTimer, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.query.catalog import SCANNER, SOURCES_READY, SourcePending, TableCatalog
from sparkbus.roles.replication import MemoryStorage, ServingReplication
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.serving import BUILD_TIMER
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, segment_file

P = "a/0"
LAYOUT = Layout.of([PartitionSpec(partition=P, replicas=(Replica(node="s", placement=1),))])
#: four rows per record batch: a chain of 70 rows is many batches, read one per step
STORE = StoreConfig(key=("id",), batch_rows=4, flush_rows=1000, compact_minors=1000)
TICK = TimerFired(key="replication/tick")
BUILD = TimerFired(key=BUILD_TIMER)
#: what the three writes of ``loaded`` leave: ids 0-29 'a', 30-49 'b', 50-69 'c'
EXPECTED = {i: "a" if i < 30 else "b" if i < 50 else "c" for i in range(70)}


class _Counted(io.BytesIO):
    def __init__(self, data: bytes, owner: Reads) -> None:
        super().__init__(data)
        self.owner = owner

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.owner.read_bytes += len(data)
        return data


class Reads(MemoryStorage):
    """Counts the bytes read from segment files opened for their rows; ``failing`` makes opening one
    raise the disk's EIO."""

    def __init__(self) -> None:
        super().__init__()
        self.read_bytes = 0
        self.failing = False

    def open(self, name: str) -> Any:
        if not name.startswith("seg-"):
            return super().open(name)
        if self.failing:
            raise OSError(errno.EIO, "disk says no", name)
        return _Counted(super().open(name).getvalue(), self)

    def segment_bytes(self) -> int:
        return sum(self.size(n) for n in self.names() if n.startswith("seg-"))


def node(storage: MemoryStorage) -> ServingReplication:
    return ServingReplication(
        "s",
        LAYOUT,
        {"a": ("id",)},
        lambda p: storage,
        catalog=TableCatalog(),
        config=ReplicationConfig(store=STORE),
        inline_rows=8,
        step_rows=4,
    )


def handle(role: ServingReplication, event: Event, now: float = 1.0) -> list[Action]:
    return list(role.handle(event, now))


def write(role: ServingReplication, ids: list[int], tag: str, now: float = 1.0) -> None:
    batch = pa.RecordBatch.from_pydict({"id": ids, "v": [tag] * len(ids)})
    call = LocalCall(call_id=7, name="write", args={"partition": P, "rows": bytes(encode_batch(batch))})
    replies = [a for a in handle(role, call, now) if isinstance(a, Reply)]
    assert replies and replies[0].error is None, replies  # acknowledged


def loaded(storage: MemoryStorage) -> ServingReplication:
    """A node whose partition's chain is a major and two minors, each write overwriting some rows."""
    role = node(storage)
    handle(role, TICK, 0.0)
    for ids, tag in ((range(0, 40), "a"), (range(30, 50), "b"), (range(50, 70), "c")):
        write(role, list(ids), tag)
        role.local[P].store.flush()
    return role


def restarted(storage: MemoryStorage) -> ServingReplication:
    """The node started again on the same files: its first event opens the store."""
    role = node(storage)
    handle(role, TICK, 2.0)
    return role


def rows(table: pa.Table | None) -> dict[int, str]:
    assert table is not None
    return dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def build_to_end(role: ServingReplication, limit: int = 1000) -> list[Action]:
    """Fire the step timer until no read is left; every action of those events."""
    out: list[Action] = []
    for _ in range(limit):
        if not role.serving.builds:
            return out
        out += handle(role, BUILD, 3.0)
    raise AssertionError("the read never ended")


def test_after_a_restart_no_call_reads_more_than_a_step_of_the_partition() -> None:
    storage = Reads()
    loaded(storage)
    total = storage.segment_bytes()
    storage.read_bytes = 0
    role = restarted(storage)
    per_call = [storage.read_bytes]
    catalog = role_catalog(role)
    for _ in range(3):  # queries while the rows are read wait; they read nothing themselves
        before = storage.read_bytes
        with pytest.raises(SourcePending, match="still being read"):
            catalog.read("a")
        assert storage.read_bytes == before
    calls = 0
    while role.serving.builds:
        before = storage.read_bytes
        actions = handle(role, BUILD, 3.0)
        per_call.append(storage.read_bytes - before)
        calls += 1
        assert calls < 1000
        timers = [a for a in actions if isinstance(a, SetTimer) and a.key == BUILD_TIMER]
        # after now, not at now: the bus fires a timer set at its own time again in the same tick
        assert all(t.at > 3.0 for t in timers)
        assert bool(timers) == bool(role.serving.builds)
    assert max(per_call) <= total // 8, (max(per_call), total)
    assert calls >= 18  # 70 rows in batches of 4, then laid one under the other, a slice per step
    assert rows(catalog.read("a")) == EXPECTED
    before = storage.read_bytes
    assert rows(catalog.read("a")) == EXPECTED
    assert storage.read_bytes == before and role.serving.started == 1


def role_catalog(role: ServingReplication) -> TableCatalog:
    catalog = TableCatalog()
    catalog.publish("a", lambda: role.serve("a"))
    return catalog


def test_planning_sees_the_columns_of_a_table_whose_rows_are_being_read() -> None:
    storage = MemoryStorage()
    loaded(storage)
    catalog = role_catalog(restarted(storage))
    table = catalog.get("a")
    assert table is not None and table.num_rows == 0 and table.column_names == ["id", "v"]
    with pytest.raises(SourcePending) as raised:
        catalog.source("a")  # what a scan reads: it waits
    assert raised.value.table == "a" and "a/0" in raised.value.message


def test_queries_that_ask_meanwhile_share_one_read_and_are_told_once_when_it_ends() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    assert role.serving.started == 1  # started at once, before any query asked
    for _ in range(2):
        with pytest.raises(SourcePending):
            role.serve("a")
        handle(role, BUILD, 3.0)
    assert role.serving.started == 1
    calls = [a for a in build_to_end(role) if isinstance(a, Call)]
    assert calls == [Call(role=SCANNER, name=SOURCES_READY)]
    assert rows(role.serve("a")) == EXPECTED


def test_nobody_is_told_of_a_read_no_query_waited_for() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    assert not [a for a in build_to_end(role) if isinstance(a, Call)]
    assert rows(role.serve("a")) == EXPECTED


def test_a_write_acknowledged_while_the_rows_are_read_is_seen_by_the_next_query() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    write(role, [0, 200], "w")  # acknowledged before the first query
    handle(role, BUILD, 3.0)
    with pytest.raises(SourcePending):
        role.serve("a")
    write(role, [1, 201], "x")  # acknowledged while the query waits
    build_to_end(role)
    assert rows(role.serve("a")) == EXPECTED | {0: "w", 200: "w", 1: "x", 201: "x"}
    write(role, [2], "y")
    assert rows(role.serve("a"))[2] == "y"


def peer_major(rows_: dict[int, str]) -> tuple[MemoryStorage, Any]:
    """A major segment another replica of the partition wrote, with ``rows_``."""
    storage = MemoryStorage()
    store = PartitionStore.open(storage, P, 2, STORE)
    store.write(pa.table({"id": list(rows_), "v": list(rows_.values())}), 0.0)
    entry = store.flush()
    assert entry is not None and entry.major
    return storage, entry


def test_rows_of_a_chain_the_store_left_while_they_were_read_are_never_served() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    for _ in range(5):
        handle(role, BUILD, 3.0)
    # a major of the peer's (a chain of its own, on no base of ours) is fast-forwarded mid-read
    new = {i: "n" for i in range(100, 140)}
    peer, entry = peer_major(new)
    name = segment_file(entry.segment_id)
    _copy(peer, storage, name)
    store = role.local[P].store
    store.add_segment(entry)
    with pytest.raises(SourcePending):
        role.serve("a")
    build_to_end(role)
    assert role.serving.started == 2  # the first read was dropped, the new chain read
    assert rows(role.serve("a")) == new
    kept = store._chain_rows
    assert kept is not None and kept[0] == ((entry.segment_id, entry.checksum),)


def _copy(source: MemoryStorage, target: MemoryStorage, name: str) -> None:
    writer = target.create(name)
    writer.append(source.read(name))
    writer.commit()


def test_a_compaction_while_the_rows_are_read_keeps_the_read_and_its_files_gone_start_it_again() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    handle(role, BUILD, 3.0)
    store = role.local[P].store
    entry = store.compact()  # the same rows in one major whose base is the chain's root: still of use
    assert entry is not None
    build_to_end(role)
    assert role.serving.started == 1 and store.pending_rows() == 0
    assert rows(role.serve("a")) == EXPECTED
    # again, and this time the compacted segments' files are deleted before the read gets to them
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    handle(role, BUILD, 3.0)
    store = role.local[P].store
    old = [e.segment_id for e in store.entries]
    assert store.compact() is not None
    for segment_id in old:
        store.delete_segment(segment_id)
    build_to_end(role)
    assert not role.serving.failed
    assert role.serving.started == 2  # the new chain, its major, was read instead
    assert rows(role.serve("a")) == EXPECTED


def test_a_segment_that_cannot_be_read_fails_the_next_query_which_a_later_one_retries() -> None:
    storage = Reads()
    loaded(storage)
    role = restarted(storage)
    storage.failing = True
    build_to_end(role)
    with pytest.raises(OSError, match="disk says no"):
        role.serve("a")
    storage.failing = False
    with pytest.raises(SourcePending):
        role.serve("a")
    handle(role, TICK, 4.0)
    build_to_end(role)
    assert rows(role.serve("a")) == EXPECTED


def test_a_partition_led_no_more_stops_its_read_and_wakes_the_waiting_queries() -> None:
    storage = MemoryStorage()
    loaded(storage)
    role = restarted(storage)
    with pytest.raises(SourcePending):
        role.serve("a")
    role.local[P].leader = None  # as after a leadership move
    out = handle(role, BUILD, 3.0)
    assert not role.serving.builds
    assert Call(role=SCANNER, name=SOURCES_READY) in out
    assert role.serve("a") is None
