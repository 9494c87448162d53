"""The segment store: files, checksums, upserts, compaction, and recovery after crashes at every step."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pytest

from sparkbus.roles.replication.segments import (
    SegmentCorrupt,
    SegmentEntry,
    is_reference_weak,
    is_referenced,
    verify_segment,
)
from sparkbus.roles.replication.storage import (
    DiskStorage,
    MemoryStorage,
    SimulatedCrash,
    Storage,
    write_whole,
)
from sparkbus.roles.replication.store import (
    LSN,
    MANIFEST,
    ORIGIN,
    PartitionStore,
    StoreConfig,
    StoreError,
    read_manifest,
    segment_file,
    upsert,
)

from .counting import CountingStorage
from .harness import flushed

P = "t/0"
CFG = StoreConfig(flush_rows=4, compact_minors=2)


def rows(*keys: int, tag: str = "v") -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "v": [f"{tag}{k}" for k in keys]})


def keys_of(store: PartitionStore) -> list[int]:
    return list(store.rows().column("key").to_pylist())


@pytest.fixture(params=["memory", "disk"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return MemoryStorage() if request.param == "memory" else DiskStorage(tmp_path / "replica")


def test_write_flush_compact_and_reopen(storage: Storage) -> None:
    s = PartitionStore.open(storage, P, 1, CFG)
    s.write(rows(1, 2), 0.0)
    s.write(rows(2, 3, tag="w"), 0.0)
    assert s.should_flush(0.0)
    first = s.flush()
    assert first is not None and first.major and first.base_id is None
    s.write(rows(4), 0.0)
    second = s.flush()
    assert second is not None and not second.major and second.base_id == first.segment_id
    major = s.compact()
    assert major is not None and major.major and major.base_id == second.segment_id
    assert set(major.included) == {first.segment_id, second.segment_id}
    assert s.rows().to_pydict() == {"key": [1, 2, 3, 4], "v": ["v1", "w2", "w3", "v4"]}
    again = PartitionStore.open(storage, P, 1, CFG)
    assert again.rows() == s.rows()
    assert again.root == major.segment_id


def test_age_threshold_uses_the_given_clock() -> None:
    s = PartitionStore.open(MemoryStorage(), P, 1, StoreConfig(flush_age=5.0))
    s.write(rows(1), 10.0)
    assert not s.should_flush(14.9)
    assert s.should_flush(15.0)


def test_merging_the_same_rows_twice_changes_nothing() -> None:
    source = PartitionStore.open(MemoryStorage(), P, 1, CFG)
    source.write(rows(1, 2, 3), 0.0)
    versioned = source.versioned_rows()
    target = PartitionStore.open(MemoryStorage(), P, 2, CFG)
    target.merge(versioned, 0.0)
    once = target.rows()
    target.merge(versioned, 0.0)
    target.flush()
    target.merge(versioned, 0.0)
    assert target.rows() == once


def test_an_old_version_merged_late_does_not_overwrite_a_write_that_saw_it() -> None:
    a = PartitionStore.open(MemoryStorage(), P, 1, CFG)
    a.write(rows(1, tag="old"), 0.0)
    old = a.versioned_rows()
    a.write(rows(1, tag="new"), 0.0)
    a.merge(old, 0.0)
    assert a.rows().column("v").to_pylist() == ["new1"]


def test_a_segment_file_detects_truncation_and_bit_flips() -> None:
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(1, 2, 3, 4))
    name = segment_file(entry.segment_id)
    assert verify_segment(st, name) == entry.checksum
    data = st.read(name)
    for bad in (data[:-1], data[: len(data) // 2], data[:40] + bytes([data[40] ^ 1]) + data[41:]):
        st._files[name] = bad
        with pytest.raises(SegmentCorrupt):
            verify_segment(st, name)


def test_open_refuses_a_listed_segment_that_lost_bytes() -> None:
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(1, 2, 3, 4))
    st._files[segment_file(entry.segment_id)] = st.read(segment_file(entry.segment_id))[:-3]
    with pytest.raises(SegmentCorrupt, match=entry.segment_id):
        PartitionStore.open(st, P, 1, CFG)


def test_a_new_placement_starts_empty() -> None:
    st = MemoryStorage()
    s = PartitionStore.open(st, P, 1, CFG)
    s.write(rows(1, 2, 3, 4), 0.0)
    s.flush()
    s.write(rows(5), 0.0)
    fresh = PartitionStore.open(st, P, 2, CFG)
    assert fresh.entries == [] and fresh.memtable_rows == 0
    assert [n for n in st.names() if n.startswith("seg-")] == []


def _acknowledged_run(st: MemoryStorage) -> list[int]:
    """Writes, flushes and a compaction; returns the keys whose write returned (was acknowledged)."""
    acked: list[int] = []
    s = PartitionStore.open(st, P, 1, CFG)
    for k in range(12):
        s.write(rows(k), 0.0)
        acked.append(k)
        if s.should_flush(0.0):
            s.flush()
        if s.minors_since_major() >= CFG.compact_minors:
            s.compact()
    return acked


def test_total_mutations_of_the_reference_run() -> None:
    st = MemoryStorage()
    _acknowledged_run(st)
    assert st.mutations > 20


@pytest.mark.parametrize("crash_at", range(1, 60))
def test_a_crash_at_any_mutation_loses_no_acknowledged_write(crash_at: int) -> None:
    # Covers crashes mid-log-append (torn record), mid-flush (segment written, manifest not) and
    # mid-compaction (major written, manifest not), wherever the n-th mutation falls.
    st = MemoryStorage()
    st.arm_crash(crash_at)
    acked: list[int] = []
    try:
        s = PartitionStore.open(st, P, 1, CFG)  # its first mutation: the manifest with the new epoch
        for k in range(12):
            s.write(rows(k), 0.0)
            acked.append(k)
            if s.should_flush(0.0):
                s.flush()
            if s.minors_since_major() >= CFG.compact_minors:
                s.compact()
    except SimulatedCrash:
        pass
    after = PartitionStore.open(st.crashed(), P, 1, CFG)
    got = keys_of(after) if after.schema is not None else []
    assert set(acked) <= set(got)
    assert set(got) <= set(acked) | {len(acked)}  # at most the write that was in flight
    # And the recovered store keeps working.
    after.write(rows(100), 1.0)
    after.flush()
    assert 100 in keys_of(PartitionStore.open(after.storage, P, 1, CFG))


def test_recovery_discards_partial_files(tmp_path: Path) -> None:
    disk = DiskStorage(tmp_path)
    s = PartitionStore.open(disk, P, 1, CFG)
    s.write(rows(1, 2, 3, 4), 0.0)
    s.flush()
    (tmp_path / "seg-1.9.tmp").write_bytes(b"half a segment")
    (tmp_path / "seg-1.8").write_bytes(b"an orphan the manifest never listed")
    (tmp_path / "in-7.7").write_bytes(b"an incoming transfer")
    again = PartitionStore.open(disk, P, 1, CFG)
    assert again.recovered_partial == 3  # the temporary and the two files the manifest does not list
    assert sorted(again.recovered_files) == ["in-7.7", "seg-1.8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MANIFEST", segment_file(s.entries[0].segment_id)]


def test_a_whole_segment_written_in_place_but_never_listed_is_not_taken(tmp_path: Path) -> None:
    # An incoming segment is written under its final name and committed (fsync) before the manifest lists
    # it. A crash in between leaves a file that looks whole and verifies: it must still be discarded.
    src, entry = flushed(DiskStorage(tmp_path / "src"), P, CFG, rows(1, 2, 3))
    disk = DiskStorage(tmp_path / "dst")
    dst = PartitionStore.open(disk, P, 2, CFG)
    dst.write(rows(9), 0.0)
    dst.flush()
    writer = disk.create_in_place(segment_file(entry.segment_id))
    writer.append(src.storage.read(segment_file(entry.segment_id)))
    writer.commit()
    assert verify_segment(disk, segment_file(entry.segment_id)) == entry.checksum
    again = PartitionStore.open(disk, P, 2, CFG)
    assert again.recovered_files == [segment_file(entry.segment_id)]
    assert not disk.exists(segment_file(entry.segment_id))
    assert keys_of(again) == [9]


def test_a_file_written_in_place_never_replaces_an_existing_one(tmp_path: Path) -> None:
    disk = DiskStorage(tmp_path)
    write_whole(disk, "seg-1.1", [b"listed bytes"])
    with pytest.raises(FileExistsError):
        disk.create_in_place("seg-1.1")
    mem = MemoryStorage()
    write_whole(mem, "seg-1.1", [b"listed bytes"])
    with pytest.raises(FileExistsError):
        mem.create_in_place("seg-1.1")
    assert disk.read("seg-1.1") == mem.read("seg-1.1") == b"listed bytes"


def test_memory_storage_keeps_an_unfinished_in_place_file_through_a_crash() -> None:
    st = MemoryStorage()
    writer = st.create_in_place("seg-2.1")
    writer.append(b"first half")
    assert st.names() == ["seg-2.1"]
    assert st.crashed().read("seg-2.1") == b"first half"
    writer.abort()
    assert not st.exists("seg-2.1")


def test_acked_additions_are_saved_lazily_and_removals_at_once() -> None:
    st = MemoryStorage()
    s, entry = flushed(st, P, CFG, rows(1))
    s.set_acked(entry.segment_id, frozenset({2, 3}))
    lost = PartitionStore.open(st.crashed(), P, 1, CFG).entry(entry.segment_id)
    assert lost is not None and lost.acked == frozenset()  # lost in a crash before the tick
    assert s.save_acked() and not s.save_acked()
    kept = PartitionStore.open(st.crashed(), P, 1, CFG).entry(entry.segment_id)
    assert kept is not None and kept.acked == frozenset({2, 3})
    s.set_acked(entry.segment_id, frozenset({3}))
    removed = PartitionStore.open(st.crashed(), P, 1, CFG).entry(entry.segment_id)
    assert removed is not None and removed.acked == frozenset({3})


def test_chain_walks_follow_the_spec() -> None:
    m1 = SegmentEntry(segment_id="m1", base_id=None, major=True)
    a = SegmentEntry(segment_id="a", base_id="m1")
    b = SegmentEntry(segment_id="b", base_id="a")
    m2 = SegmentEntry(segment_id="m2", base_id="b", included=("b", "a"), major=True)
    c = SegmentEntry(segment_id="c", base_id="m2")
    entries = [m1, a, b, m2, c]
    assert is_referenced(entries, "c", "a") and is_reference_weak(entries, "c", "a")
    assert is_referenced(entries, "c", "m1")  # reached through the chain: b's base is a, a's is m1
    assert is_reference_weak(entries, "c", "m1")  # a major (m2) is passed before m1
    assert is_referenced(entries, "c", "c") and not is_reference_weak(entries, "c", "c")
    assert not is_referenced(entries, "c", "zz")
    forked = [m1, a, SegmentEntry(segment_id="x", base_id="m1")]
    assert not is_referenced(forked, "x", "a")  # the walk breaks at a: not x's base
    assert is_reference_weak(forked, "x", "a")  # a broken chain counts as weak
    with pytest.raises(ValueError, match="must be major"):
        SegmentEntry(segment_id="y", base_id=None)


def test_writes_after_a_torn_log_record_survive_the_next_crash() -> None:
    # Found by the property test: without cutting the torn tail, later appends sat behind it.
    st = MemoryStorage()
    s = PartitionStore.open(st, P, 1, StoreConfig())
    s.write(rows(1), 0.0)
    st.arm_crash(1)
    with pytest.raises(SimulatedCrash):
        s.write(rows(2), 0.0)
    again = PartitionStore.open(st.crashed(), P, 1, StoreConfig())
    assert again.recovered_torn_tail
    again.write(rows(3), 0.0)
    third = PartitionStore.open(again.storage, P, 1, StoreConfig())
    assert keys_of(third) == [1, 3]


def test_block_digest_depends_on_the_bytes_not_on_how_they_were_chunked() -> None:
    import random

    from sparkbus.roles.replication.segments import BlockDigest

    data = random.Random(5).randbytes(10_000)
    whole = BlockDigest(block=1024)
    whole.update(data)
    pieces = BlockDigest(block=1024)
    rng = random.Random(6)
    at = 0
    while at < len(data):
        n = rng.randint(1, 2500)
        pieces.update(memoryview(data)[at : at + n])
        at += n
    assert pieces.digest() == whole.digest()
    flipped = BlockDigest(block=1024)
    flipped.update(data[:4321] + bytes([data[4321] ^ 1]) + data[4322:])
    shorter = BlockDigest(block=1024)
    shorter.update(data[:-1])
    assert len({whole.digest(), flipped.digest(), shorter.digest()}) == 3


def test_an_in_place_disk_writer_writes_and_taps_every_chunk_in_order(tmp_path: Path) -> None:
    disk = DiskStorage(tmp_path)
    seen: list[bytes] = []
    writer = disk.create_in_place("seg-3.1", tap=lambda data: seen.append(bytes(data)))
    chunks = [bytes([i]) * (1000 + i) for i in range(20)]
    for chunk in chunks:
        writer.append(chunk)
    writer.drain()
    assert seen == chunks
    writer.commit()
    assert disk.read("seg-3.1") == b"".join(chunks)
    with pytest.raises(ValueError, match="after commit"):
        writer.append(b"more")
    aborted = disk.create_in_place("seg-3.2")
    aborted.append(memoryview(b"partial"))
    aborted.abort()
    assert disk.names() == ["seg-3.1"]


def test_an_in_place_disk_writer_reserves_the_announced_size_and_keeps_only_what_was_appended(
    tmp_path: Path,
) -> None:
    disk = DiskStorage(tmp_path)
    data = bytes(range(256)) * 40
    whole = disk.create_in_place("seg-5.1", size=len(data))
    half = disk.create_in_place("seg-5.2", size=len(data))
    # On a file system that can allocate (ext4, xfs, tmpfs), the reservation is the file's length at once,
    # before a byte is appended: a partial file can look whole by its size (only the manifest tells).
    if os.stat(tmp_path / "seg-5.1").st_size:
        assert os.stat(tmp_path / "seg-5.2").st_size == len(data)
    whole.append(data[:5000])
    whole.append(memoryview(data)[5000:])
    half.append(data[:3000])
    whole.commit()
    half.commit()  # fewer bytes came than announced: the reserved zeros are cut off
    assert disk.read("seg-5.1") == data and disk.size("seg-5.1") == len(data)
    assert disk.read("seg-5.2") == data[:3000] and disk.size("seg-5.2") == 3000
    gone = disk.create_in_place("seg-5.3", size=1 << 20)
    gone.abort()
    assert disk.names() == ["seg-5.1", "seg-5.2"]


def test_an_in_place_disk_writer_raises_a_failed_tap_from_append(tmp_path: Path) -> None:
    def tap(data: bytes) -> None:
        raise RuntimeError("tap failed")

    writer = DiskStorage(tmp_path).create_in_place("seg-4.1", tap=tap)
    with pytest.raises(RuntimeError, match="tap failed"):
        writer.append(b"x")
    writer.abort()
    assert not (tmp_path / "seg-4.1").exists()


def test_block_digest_catches_what_a_word_sum_would_miss() -> None:
    import random

    from sparkbus.roles.replication.segments import BlockDigest

    def digest(data: bytes) -> bytes:
        d = BlockDigest(block=1 << 12)
        d.update(data)
        return d.digest()

    data = random.Random(7).randbytes(20_000)
    ref = digest(data)
    top = bytearray(data)  # the top bit of two words: cancels in one 64-bit multilinear sum
    top[7] ^= 0x80
    top[15] ^= 0x80
    torn = bytearray(data)  # a torn page: zeros where data was
    torn[4096:8192] = bytes(4096)
    swapped = bytearray(data)  # two words trade places
    swapped[0:8], swapped[8:16] = data[8:16], data[0:8]
    padded = data[:-1] + b"\0"  # the zero padding of the last word is not confused with a zero byte
    assert len({ref, *(digest(bytes(d)) for d in (top, torn, swapped, padded, data[:-1]))}) == 6
    with pytest.raises(ValueError, match="multiple of 8"):
        BlockDigest(block=1004)


def test_a_view_is_the_committed_bytes_on_disk_and_in_memory(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000
    for storage in (DiskStorage(tmp_path), MemoryStorage()):
        write_whole(storage, "seg-1.1", [data])
        view = storage.view("seg-1.1")
        assert bytes(view[1000:70_000]) == data[1000:70_000] and len(view) == len(data)
        write_whole(storage, "empty", [])
        assert len(storage.view("empty")) == 0


def test_write_flushed_is_durable_as_a_segment_without_a_log_record() -> None:
    st = MemoryStorage()
    s = PartitionStore.open(st, P, 1, StoreConfig(flush_rows=100))
    s.write(rows(1, 2), 0.0)  # logged, in the memtable
    entry = s.write_flushed(rows(2, 3, tag="w"), 0.0)
    assert entry is not None and entry.rows == 3 and s.memtable_rows == 0
    assert not st.exists("WAL")  # the flush dropped the log; the new rows never went into it
    again = PartitionStore.open(st, P, 1, CFG)
    assert again.rows().sort_by("key").to_pydict() == {"key": [1, 2, 3], "v": ["v1", "w2", "w3"]}
    assert s.write_flushed(rows(4).slice(0, 0), 0.0) is None  # nothing to flush


@pytest.mark.parametrize("crash_at", range(1, 30))
def test_a_crash_during_write_flushed_loses_no_acknowledged_row(crash_at: int) -> None:
    st = MemoryStorage()
    st.arm_crash(crash_at)
    acked: list[int] = []
    try:
        s = PartitionStore.open(st, P, 1, CFG)
        for k in range(0, 12, 3):
            s.write_flushed(rows(k, k + 1, k + 2), 0.0)
            acked += [k, k + 1, k + 2]
    except SimulatedCrash:
        pass
    after = PartitionStore.open(st.crashed(), P, 1, CFG)
    got = keys_of(after) if after.schema is not None else []
    assert set(acked) <= set(got) <= set(acked) | {len(acked), len(acked) + 1, len(acked) + 2}


def test_upsert_keeps_distinct_keys_as_they_are_and_resolves_duplicates_by_version() -> None:
    distinct = pa.table({"key": [3, 1, 2], LSN: [1, 1, 1], ORIGIN: [1, 1, 1]})
    assert upsert(distinct, ("key",)) is distinct
    dup = pa.table({"key": [2, 1, 2], "v": ["old", "a", "new"], LSN: [1, 1, 2], ORIGIN: [1, 1, 1]})
    assert upsert(dup, ("key",)).select(["key", "v"]).to_pydict() == {"key": [1, 2], "v": ["a", "new"]}


def test_upsert_keeps_the_last_row_of_a_key_within_one_write() -> None:
    # One write's rows share a version: the last of a key wins, as a later write would replace it (and as
    # the compute controller's upsert tables do). A lower version never wins, wherever it sits.
    same = pa.table(
        {"key": [2, 1, 2, 1, 2], "v": ["a", "b", "c", "d", "e"], LSN: [5, 5, 5, 5, 4], ORIGIN: [1] * 5}
    )
    assert upsert(same, ("key",)).select(["key", "v"]).to_pydict() == {"key": [1, 2], "v": ["d", "c"]}
    two = pa.table({"k1": [1, 1, 1], "k2": ["x", "x", "y"], "v": [1, 2, 3], LSN: [7] * 3, ORIGIN: [2] * 3})
    assert upsert(two, ("k1", "k2")).to_pydict()["v"] == [2, 3]


def test_a_fast_forward_reads_no_segment_and_the_schema_comes_when_needed() -> None:
    source, entry = flushed(MemoryStorage(), P, CFG, rows(1, 2, 3))
    target_storage = CountingStorage()
    target = PartitionStore.open(target_storage, P, 2, CFG)  # (an unlisted file would be removed)
    write_whole(
        target_storage, segment_file(entry.segment_id), [source.storage.read(segment_file(entry.segment_id))]
    )
    target.add_segment(entry)
    assert target_storage.segment_reads == 0  # one manifest write, the file untouched
    assert target.schema == source.schema  # read from the segment now, once
    assert target_storage.segment_reads > 0
    reads = target_storage.segment_reads
    assert target.schema == source.schema and target_storage.segment_reads == reads
    assert keys_of(target) == [1, 2, 3]
    # A write into the fast-forwarded store checks its rows against the segment's schema.
    with pytest.raises(StoreError, match="schema"):
        target.write(pa.table({"key": pa.array([9], pa.int64()), "w": [1.0]}), 0.0)
    reopened = PartitionStore.open(target_storage, P, 2, CFG)
    assert reopened.schema == source.schema and keys_of(reopened) == [1, 2, 3]


def _carried_keys(store: PartitionStore) -> list[int]:
    """Keys of ``store`` after merging what an old placement carried over (as the role does)."""
    for name in store.carried():
        store.merge_segment_file(name, 0.0)
        store.storage.delete(name)
    return keys_of(store) if store.schema is not None else []


def test_a_new_placement_takes_over_the_segments_its_old_one_marked() -> None:
    old = PartitionStore.open(MemoryStorage(), P, 1, CFG)
    old.write(rows(1, 2, 3, 4), 0.0)
    old.flush()  # acked by nobody
    old.write(rows(5), 0.0)
    old.flush()
    old.mark_carry([e.segment_id for e in old.entries])
    new = PartitionStore.open(old.storage, P, 2, CFG)
    assert new.entries == [] and new.root is None, "a new placement starts empty (spec 3.6)"
    assert len(new.carried()) == 2
    assert _carried_keys(new) == [1, 2, 3, 4, 5]
    assert PartitionStore.open(new.storage, P, 2, CFG).carried() == []


def _reopen(storage: Storage, placement: int) -> list[int]:
    """Open the replica at ``placement`` as the role does (``Placement._host``); its keys."""
    if storage.exists(MANIFEST):
        before = read_manifest(storage)["placement"]
        if before != placement:  # the old placement flushes and marks what nobody else holds
            old = PartitionStore.open(storage, P, before, CFG)
            old.flush()
            old.mark_carry([e.segment_id for e in old.entries])
    return _carried_keys(PartitionStore.open(storage, P, placement, CFG))


def test_a_crash_at_any_step_of_a_re_placement_loses_no_row() -> None:
    """Wherever a crash strikes while a replica moves to placement 2, reopening it at either placement
    (a restart may bring the old one back: the layout comes from the topology) finds every row."""
    struck = 0
    for strike in range(1, 100):
        storage = MemoryStorage()
        old = PartitionStore.open(storage, P, 1, CFG)
        old.write(rows(1, 2, 3, 4), 0.0)
        old.flush()  # a segment
        old.write(rows(5, 6), 0.0)  # and the log
        storage.arm_crash(strike)
        try:
            assert _reopen(storage, 2) == [1, 2, 3, 4, 5, 6]
        except SimulatedCrash:
            struck += 1
        else:
            break
        for placement in (1, 2):
            assert _reopen(storage.crashed(), placement) == [1, 2, 3, 4, 5, 6], (strike, placement)
    assert struck > 10, "the crash struck at every mutation of the re-placement"


@pytest.mark.parametrize("crash_at", range(1, 6))
def test_a_crash_inside_reset_leaves_a_store_that_opens(crash_at: int) -> None:
    """reset (UNLOAD_FINAL after a split, the end of a drain) deleted the segment files before it saved
    the manifest that stops listing them: a crash in between left a manifest naming files that were gone,
    and the store, and with it every partition of the node's role, never opened again."""
    st = MemoryStorage()
    store = PartitionStore.open(st, P, 1, StoreConfig(flush_rows=2))
    for k in (1, 3):
        store.write(rows(k, k + 1), 0.0)
        store.flush()
    assert len(store.entries) == 2
    st.arm_crash(crash_at)
    with contextlib.suppress(SimulatedCrash):
        store.reset()
    after = PartitionStore.open(st.crashed(), P, 1, StoreConfig(flush_rows=2))
    got = keys_of(after) if after.schema is not None else []
    assert got in ([], [1, 2, 3, 4])
    assert not [n for n in after.storage.names() if n.startswith("seg-")] or after.entries
