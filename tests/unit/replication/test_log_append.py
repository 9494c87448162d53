"""A log append that fails part-way (a full disk) leaves no torn record for later records to sit behind."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sparkbus.roles.replication import storage as storage_module
from sparkbus.roles.replication.storage import DiskStorage, MemoryStorage, Storage, TornAppend
from sparkbus.roles.replication.store import WAL, PartitionStore, StoreConfig

P = "t/0"
CFG = StoreConfig(key=("k",))


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table(
        {"k": pa.array(range(lo, hi), pa.int64()), "v": pa.array([f"v{i}" * 20 for i in range(lo, hi)])}
    )


def keys(store: PartitionStore) -> set[int]:
    return set(store.rows().column("k").to_pylist())


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Files of this process cannot grow past ``limit`` bytes: a write that crosses it writes what fits,
    the next one fails with EFBIG, as on a disk that fills up."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_an_acknowledged_write_after_a_log_append_that_filled_the_disk_survives_a_restart(
    tmp_path: Path,
) -> None:
    store = PartitionStore.open(DiskStorage(tmp_path), P, 1, CFG)
    store.write(rows(0, 100), 0.0)
    size = (tmp_path / WAL).stat().st_size
    # Only 100 more bytes of the log fit: part of the record is written, then EFBIG; the write is refused.
    with file_size_limit(size + 100), pytest.raises(OSError):
        store.write(rows(100, 200), 0.0)
    assert (tmp_path / WAL).stat().st_size == size  # what was written of it is taken back
    store.write(rows(200, 300), 0.0)  # room again: logged and acknowledged
    other = PartitionStore.open(MemoryStorage(), P, 2, CFG)
    other.write(rows(300, 310), 0.0)
    with file_size_limit((tmp_path / WAL).stat().st_size + 100), pytest.raises(OSError):
        store.merge(other.versioned_rows(), 0.0)  # a follower merging a segment: the same log
    store.merge(other.versioned_rows(), 0.0)
    assert keys(store) == set(range(100)) | set(range(200, 310))
    again = PartitionStore.open(DiskStorage(tmp_path), P, 1, CFG)
    assert not again.recovered_torn_tail
    assert keys(again) == set(range(100)) | set(range(200, 310))


def test_a_log_append_whose_fsync_fails_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = DiskStorage(tmp_path)
    disk.append_durable(WAL, b"acknowledged")

    def failing_fsync(fd: int) -> None:
        monkeypatch.setattr(os, "fsync", real_fsync)  # the first fsync fails, the one undoing the append not
        raise OSError(5, "Input/output error")

    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        disk.append_durable(WAL, b"refused")
    assert disk.read(WAL) == b"acknowledged"


def test_an_append_that_cannot_be_taken_back_is_raised_as_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = DiskStorage(tmp_path)
    disk.append_durable(WAL, b"acknowledged")

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(storage_module.os, "ftruncate", no_truncate)
    with file_size_limit(len(b"acknowledged") + 3), pytest.raises(TornAppend) as raised:
        disk.append_durable(WAL, b"refused record")
    assert isinstance(raised.value.__cause__, OSError)
    assert disk.read(WAL) == b"acknowledgedref"  # torn: the store must write the log whole again


class _TearingStorage(MemoryStorage):
    """Its next ``tear`` durable appends keep half their bytes and raise ``TornAppend``; ``whole_fails``
    makes the next whole-file writes fail (a disk still full)."""

    def __init__(self) -> None:
        super().__init__()
        self.tear = 0
        self.whole_fails = 0
        self.appends = 0

    def append_durable(self, name: str, data: bytes) -> None:
        self.appends += 1
        if self.tear:
            self.tear -= 1
            self._files[name] = self._files.get(name, b"") + data[: len(data) // 2]
            raise TornAppend(f"{name}: no room, and the bytes stayed")
        super().append_durable(name, data)

    def create(self, name: str) -> storage_module.FileWriter:
        if self.whole_fails:
            self.whole_fails -= 1
            raise OSError(28, "No space left on device")
        return super().create(name)


def _reopen(storage: Storage) -> PartitionStore:
    return PartitionStore.open(storage, P, 1, CFG)


def _torn() -> tuple[_TearingStorage, PartitionStore]:
    """A store with keys 0..9 acknowledged, whose append of keys 10..19 tore."""
    st = _TearingStorage()
    store = _reopen(st)
    store.write(rows(0, 10), 0.0)
    st.tear = 1
    with pytest.raises(TornAppend):
        store.write(rows(10, 20), 0.0)
    return st, store


def test_a_torn_log_is_written_whole_before_the_next_append_and_until_then_nothing_is_appended() -> None:
    st, store = _torn()
    st.whole_fails = 1
    appends = st.appends
    with pytest.raises(OSError, match="No space"):
        store.write(rows(20, 30), 0.0)  # the log cannot be written whole yet: refused, not appended
    assert st.appends == appends
    store.write(rows(30, 40), 0.0)
    assert not _reopen(st).recovered_torn_tail
    assert keys(_reopen(st)) == keys(store) == set(range(10)) | set(range(30, 40))


def test_a_torn_log_append_of_a_merge_and_of_the_first_record_lose_nothing_acknowledged() -> None:
    st = _TearingStorage()
    store = _reopen(st)
    st.tear = 1
    with pytest.raises(TornAppend):
        store.write(rows(0, 10), 0.0)  # the log's first record: nothing of it may stay
    store.write(rows(10, 20), 0.0)
    versioned = store.versioned_rows()
    st.tear = 1
    with pytest.raises(TornAppend):
        store.merge(versioned.slice(0, 5), 0.0)
    other = PartitionStore.open(MemoryStorage(), P, 2, CFG)
    other.write(rows(40, 45), 0.0)
    store.merge(other.versioned_rows(), 0.0)
    assert keys(_reopen(st)) == set(range(10, 20)) | set(range(40, 45))


def test_a_flush_after_a_torn_log_append_starts_a_clean_log() -> None:
    st, store = _torn()
    store.flush()
    assert not st.exists(WAL)
    store.write(rows(20, 30), 0.0)
    assert keys(_reopen(st)) == set(range(10)) | set(range(20, 30))
