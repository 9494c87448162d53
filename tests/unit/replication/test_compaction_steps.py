"""The leader's automatic compaction runs in bounded steps over loop turns (``compacting.py``): each
``replication/compact`` timer writes at most ``STEP_BATCHES`` record batches of the new major; a flush due
meanwhile waits (the rows are in the log); a chain that changes otherwise, leadership lost or a crash
abandon it, leaving no file behind, and every acknowledged row is there exactly once."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from sparkbus.bus.contract import Action, Event, LocalCall, PeerUp, Reply, SetTimer, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.compacting import COMPACT_TIMER, STEP_BATCHES, ChainMoved, Compaction
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.segments import SegmentEntry, read_header
from sparkbus.roles.replication.storage import MemoryStorage, SimulatedCrash
from sparkbus.roles.replication.store import MANIFEST, PartitionStore, StoreConfig, listed_files

from .harness import Cluster
from .test_scenarios import NODES, assert_identical, config, spec, write_keys

P = "t/0"
#: two rows per record batch: a chain of a few dozen rows is many batches, many steps
STORE = StoreConfig(batch_rows=2, flush_rows=8, compact_minors=3, flush_age=1000.0)
TICK = TimerFired(key="replication/tick")
STEP = TimerFired(key=COMPACT_TIMER)


def role_on(storage: MemoryStorage, *nodes: str) -> ReplicationRole:
    """Node ``s``'s role, ``s`` the only live replica of ``P`` (placed after ``nodes``, which are down)."""
    replicas = tuple(Replica(node=n, placement=i + 1) for i, n in enumerate((*nodes, "s")))
    layout = Layout.of([PartitionSpec(partition=P, replicas=replicas)])
    role = ReplicationRole("s", layout, lambda p: storage, ReplicationConfig(store=STORE, start_wait=0.0))
    handle(role, TICK, 0.0)
    return role


def handle(role: ReplicationRole, event: Event, now: float = 1.0) -> list[Action]:
    return list(role.handle(event, now))


def write(role: ReplicationRole, keys: range, tag: str) -> list[Action]:
    batch = pa.RecordBatch.from_pydict({"key": list(keys), "v": [f"{tag}{k}" for k in keys]})
    call = LocalCall(call_id=1, name="write", args={"partition": P, "rows": bytes(encode_batch(batch))})
    actions = handle(role, call)
    assert [a.error for a in actions if isinstance(a, Reply)] == [None]  # acknowledged
    return actions


def started(role: ReplicationRole) -> list[Action]:
    """Four flushes of 8 rows (a major and three minors: keys 0-23, 'a', the third over keys 0-7 again,
    'b'): the write of the fourth starts a compaction. Returns that write's actions."""
    write(role, range(0, 8), "a")
    write(role, range(8, 16), "a")
    write(role, range(0, 8), "b")
    actions = write(role, range(16, 24), "a")
    assert P in role.compactions
    return actions


EXPECTED = {k: ("b" if k < 8 else "a") + str(k) for k in range(24)}


def root_entry(store: PartitionStore) -> SegmentEntry:
    assert store.root is not None
    entry = store.entry(store.root)
    assert entry is not None
    return entry


def rows_of(store: PartitionStore) -> dict[int, str]:
    table = store.rows()
    return dict(zip(table.column("key").to_pylist(), table.column("v").to_pylist(), strict=True))


def steps_to_end(role: ReplicationRole, limit: int = 1000) -> list[int]:
    """Fire the step timer until no compaction is left; the batches each step wrote."""
    per_step: list[int] = []
    for _ in range(limit):
        run = role.compactions.get(P)
        if run is None:
            return per_step
        writer = run.compaction.writer
        before = writer.batches if writer is not None else 0
        actions = handle(role, STEP)
        writer = run.compaction.writer
        per_step.append((writer.batches if writer is not None else 0) - before)
        timers = [a for a in actions if isinstance(a, SetTimer) and a.key == COMPACT_TIMER]
        assert all(t.at > 1.0 for t in timers)  # after now: the bus fires one set at now in the same tick
        assert bool(timers) == bool(role.compactions)
    raise AssertionError("the compaction never ended")


def into_writing(role: ReplicationRole) -> None:
    """Fire the step timer until the major's file is being written (two batches in)."""
    for _ in range(1000):
        writer = role.compactions[P].compaction.writer
        if writer is not None and writer.batches >= 2:
            assert role.local[P].store.storage._temps  # type: ignore[attr-defined]
            return
        handle(role, STEP)
    raise AssertionError("the compaction never got to write")


def no_partial_files(storage: MemoryStorage) -> None:
    assert not storage._temps
    assert {n for n in storage.names() if n.startswith("seg-")} == listed_files(storage)


def test_the_automatic_compaction_writes_a_bounded_number_of_batches_per_loop_turn() -> None:
    storage = MemoryStorage()
    role = role_on(storage)
    actions = started(role)
    store = role.local[P].store
    minor = store.root
    assert not root_entry(store).major
    assert any(isinstance(a, SetTimer) and a.key == COMPACT_TIMER and a.at > 1.0 for a in actions)
    per_step = steps_to_end(role)
    assert max(per_step) <= STEP_BATCHES
    assert sum(per_step) == 12  # 24 rows in batches of 2
    assert len(per_step) >= 12 + 1  # the batches, then the end of the file and its install
    root = root_entry(store)
    assert root.major and root.base_id == minor and root.rows == 24
    assert role.counters["compactions"] == 1 and "compactions_abandoned" not in role.counters
    assert rows_of(store) == EXPECTED
    no_partial_files(storage)
    again = PartitionStore.open(storage.crashed(), P, 1, STORE)
    assert again.root == root.segment_id and rows_of(again) == EXPECTED


@pytest.mark.parametrize("step_batches", [1, 3])
def test_a_compaction_in_steps_writes_what_one_in_one_call_does(step_batches: int) -> None:
    stores = []
    for _ in range(2):
        store = PartitionStore.open(MemoryStorage(), P, 1, STORE)
        for keys, tag in ((range(0, 8), "a"), (range(8, 16), "a"), (range(4, 12), "b"), (range(20, 23), "c")):
            store.write(pa.table({"key": list(keys), "v": [f"{tag}{k}" for k in keys]}), 0.0)
            store.flush()
        stores.append(store)
    roots = [s.root for s in stores]
    at_once = stores[0].compact()
    compaction = Compaction(stores[1], step_batches=step_batches)
    written = []
    entry = None
    while entry is None:
        before = compaction.writer.batches if compaction.writer is not None else 0
        entry = compaction.step()
        written.append((compaction.writer.batches if compaction.writer is not None else 0) - before)
    assert max(written) <= step_batches and sum(written) == 10  # 19 rows in batches of 2
    assert at_once is not None
    for field in ("major", "rows", "max_lsn"):
        assert getattr(entry, field) == getattr(at_once, field), field
    assert (at_once.base_id, entry.base_id) == tuple(roots)
    assert len(entry.included) == len(at_once.included) == 4
    assert stores[1].root == entry.segment_id
    assert stores[1].rows().equals(stores[0].rows())
    assert read_header(stores[1].storage, f"seg-{entry.segment_id}")[0].rows == 19


def test_a_flush_due_while_compacting_waits_for_it_and_loses_nothing() -> None:
    storage = MemoryStorage()
    role = role_on(storage)
    started(role)
    store = role.local[P].store
    into_writing(role)
    root = store.root
    write(role, range(24, 32), "c")  # a full memtable: its flush waits for the compaction
    handle(role, TICK, 2.0)
    assert store.root == root and store.memtable_rows == 8
    assert storage.exists("WAL")  # the rows are in the log meanwhile
    # Killed here: the log gives the rows back, and the partial major is discarded.
    crashed = storage.crashed()
    assert crashed._temps
    reopened = PartitionStore.open(crashed, P, 1, STORE)
    assert reopened.recovered_partial >= 1 and not crashed._temps
    assert rows_of(reopened) == {**EXPECTED, **{k: f"c{k}" for k in range(24, 32)}}
    assert reopened.root == root and reopened.memtable_rows == 8
    steps_to_end(role)
    major = store.entry(store.entries[-2].segment_id)
    assert major is not None and major.major and major.base_id == root
    top = root_entry(store)
    assert not top.major and top.base_id == major.segment_id and top.rows == 8
    assert store.memtable_rows == 0 and rows_of(store) == {**EXPECTED, **{k: f"c{k}" for k in range(24, 32)}}
    no_partial_files(storage)


@pytest.mark.parametrize("change", ["flush call", "fast-forward", "compact call"])
def test_a_chain_changed_mid_compaction_abandons_it_and_the_next_one_holds_every_row(change: str) -> None:
    storage = MemoryStorage()
    role = role_on(storage)
    started(role)
    store = role.local[P].store
    into_writing(role)
    write(role, range(30, 33), "d")
    if change == "flush call":
        handle(role, LocalCall(call_id=2, name="flush", args={"partition": P}))
    elif change == "compact call":
        handle(role, LocalCall(call_id=2, name="compact", args={"partition": P}))
    else:  # a minor whose base is the root, as a follower's push is fast-forwarded
        other = PartitionStore.open(MemoryStorage(), P, 9, STORE)
        other.write(pa.table({"key": [40], "v": ["e40"]}), 0.0)
        other.flush()
        entry = other.entries[0]
        storage._files[f"seg-{entry.segment_id}"] = other.storage.read(f"seg-{entry.segment_id}")
        store.add_segment(replace(entry, base_id=store.root, major=False))
        handle(role, TICK, 2.0)
    assert role.counters["compactions_abandoned"] == 1
    steps_to_end(role)
    expected = {**EXPECTED, **{k: f"d{k}" for k in range(30, 33)}}
    if change == "fast-forward":
        expected[40] = "e40"
        handle(role, LocalCall(call_id=3, name="flush", args={"partition": P}))
    assert rows_of(store) == expected
    assert root_entry(store).major or change == "fast-forward"
    no_partial_files(storage)
    again = PartitionStore.open(storage.crashed(), P, 1, STORE)
    assert rows_of(again) == expected


def test_leadership_lost_mid_compaction_abandons_it_and_leaves_no_file() -> None:
    storage = MemoryStorage()
    role = role_on(storage, "x")  # x comes first: it leads once it is up
    started(role)
    into_writing(role)
    write(role, range(30, 33), "d")
    handle(role, PeerUp(peer="x"))
    assert not role.local[P].leads and P not in role.compactions
    assert role.counters["compactions_abandoned"] == 1 and "compactions" not in role.counters
    store = role.local[P].store
    assert not root_entry(store).major
    assert store.memtable_rows == 0  # flushed on losing leadership, to be pushed to x
    assert rows_of(store) == {**EXPECTED, **{k: f"d{k}" for k in range(30, 33)}}
    no_partial_files(storage)
    for _ in range(3):  # a timer still set finds nothing to do
        handle(role, STEP)
    assert "compactions" not in role.counters


def test_a_crash_in_any_storage_mutation_of_a_compaction_loses_no_row() -> None:
    for at in range(1, 40):
        storage = MemoryStorage()
        role = role_on(storage)
        started(role)
        storage.arm_crash(at)
        try:
            steps_to_end(role)
        except SimulatedCrash:
            pass
        else:
            assert at > 12, at  # every mutation up to the install was struck at least once
            break
        reopened = PartitionStore.open(storage.crashed(), P, 1, STORE)
        assert rows_of(reopened) == EXPECTED, at
        assert {n for n in reopened.storage.names() if n.startswith("seg-")} == listed_files(reopened.storage)


def test_a_replica_re_placed_mid_compaction_abandons_it_before_its_store_opens_again() -> None:
    storage = MemoryStorage()
    role = role_on(storage)
    started(role)
    into_writing(role)
    spec = PartitionSpec(partition=P, replicas=(Replica(node="s", placement=7),))
    actions = handle(role, LocalCall(call_id=2, name="assign", args={"spec": spec}))
    assert [a.error for a in actions if isinstance(a, Reply)] == [None]
    assert role.counters["compactions_abandoned"] == 1
    assert role.local[P].me.placement == 7 and not storage._temps
    assert "handler_errors" not in role.counters and "procedure_errors" not in role.counters
    for _ in range(50):
        handle(role, STEP)
        handle(role, TICK, 3.0)
    assert rows_of(role.local[P].store) == EXPECTED
    assert storage.exists(MANIFEST)


def test_a_moved_chain_is_refused_by_the_compaction_itself() -> None:
    store = PartitionStore.open(MemoryStorage(), P, 1, STORE)
    for k in range(4):
        store.write(pa.table({"key": [k], "v": ["x"]}), 0.0)
        store.flush()
    compaction = Compaction(store)
    for _ in range(5):
        compaction.step()
    store.write(pa.table({"key": [9], "v": ["y"]}), 0.0)
    store.flush()
    with pytest.raises(ChainMoved):
        compaction.step()
    assert not store.storage._temps  # type: ignore[attr-defined]
    assert rows_of(store) == {0: "x", 1: "x", 2: "x", 3: "x", 9: "y"}


def test_the_compaction_an_out_of_order_decline_asks_for_runs_in_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spec 3.6, first case (test_scenarios.py): b declines a's stale minor OUT_OF_ORDER, and a compacts so
    # b gets a major. In one call (``PartitionStore.compact``, refused here) that held the loop too.
    def refused(self: PartitionStore) -> None:
        raise AssertionError("compacted in one call")

    monkeypatch.setattr(PartitionStore, "compact", refused)
    c = Cluster(NODES, [spec("a", "c", "b")], config(), seed=8)
    keys = write_keys(c, "a", range(8))
    c.settle(10)
    c.cut("a", "b")
    c.cut("a", "c")
    keys += write_keys(c, "c", range(300, 316), "c")
    c.settle(10)
    keys += write_keys(c, "a", range(100, 104), "a")
    c.settle(10)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(40)
    counters = c.status("a")["counters"]
    assert (
        counters.get("declined_OUT_OF_ORDER", 0) > 0 and counters.get("compactions_for_out_of_order", 0) > 0
    )
    for n in NODES:
        errors = c.status(n)["counters"]
        assert not any(errors.get(k) for k in ("handler_errors", "procedure_errors", "compaction_errors")), n
    assert_identical(c, NODES, keys)
