"""What ``versioned_rows`` returns and what it reads: the chain's rows are kept from one call to the next.

The rows must be those of the upsert of every write and merge the store took, whatever happened in
between (writes of keys written before, merges of older and newer versions, flushes, compactions,
fast-forwards, split copies, reopening); and a call that follows a call with nothing changed in the
chain reads no segment file.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.replication.segments import SegmentEntry, chain
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import (
    LSN,
    ORIGIN,
    PartitionStore,
    StoreConfig,
    overlay,
    segment_file,
    upsert,
)

from .counting import CountingStorage

P = "t/0"
#: A model of a partition: per key, the winning (lsn, origin, order taken, value).
Model = dict[tuple[Any, ...], tuple[int, int, int, str]]


def _table(key: tuple[str, ...], pairs: list[tuple[int, int]], tag: str) -> pa.Table:
    """Rows ``(key, part)`` with a value naming ``tag``; ``part`` is a second key column if the key has one."""
    columns: dict[str, Any] = {"key": pa.array([k for k, _ in pairs], pa.int64())}
    if "part" in key:
        columns["part"] = pa.array([p for _, p in pairs], pa.int64())
    columns["v"] = [f"{tag}-{k}.{p}" for k, p in pairs]
    return pa.table(columns)


def _take(model: Model, table: pa.Table, key: tuple[str, ...], order: list[int]) -> None:
    """Apply versioned rows to the model as an upsert does: highest (lsn, origin), then the last taken."""
    for row in table.to_pylist():
        order[0] += 1
        k = tuple(row[c] for c in key)
        mine = (row[LSN], row[ORIGIN], order[0], row["v"])
        if k not in model or mine[:3] > model[k][:3]:
            model[k] = mine


def _sorted(table: pa.Table, key: tuple[str, ...]) -> dict[str, list[Any]]:
    columns = [*key, "v", LSN, ORIGIN]
    return dict(table.select(columns).sort_by([(c, "ascending") for c in key]).to_pydict())


def _expected(
    model: Model, key: tuple[str, ...], low: int | None = None, high: int | None = None
) -> dict[str, Any]:
    out: dict[str, list[Any]] = {c: [] for c in [*key, "v", LSN, ORIGIN]}
    for k in sorted(model):
        if (low is not None and k[0] < low) or (high is not None and k[0] >= high):
            continue
        lsn, origin, _, value = model[k]
        for c, x in zip(key, k, strict=True):
            out[c].append(x)
        out["v"].append(value)
        out[LSN].append(lsn)
        out[ORIGIN].append(origin)
    return out


def _uncached(store: PartitionStore) -> pa.Table:
    """The rows as a store that has kept nothing reads them: a fresh open of a copy of its files."""
    assert isinstance(store.storage, MemoryStorage)
    return PartitionStore.open(
        store.storage.crashed(), store.partition, store.placement, store.config
    ).versioned_rows()


def _fast_forward(
    source: PartitionStore, target: PartitionStore, entry: SegmentEntry, file: str | None = None
) -> None:
    """Give ``target`` the segment ``entry`` of ``source`` (stored as ``file``, by default its own file)."""
    data = source.storage.read(file or segment_file(entry.segment_id))
    writer = target.storage.create(segment_file(entry.segment_id))
    writer.append(data)
    writer.commit()
    target.add_segment(entry)


def _split(source: PartitionStore, target: PartitionStore, low: int, high: int) -> None:
    """Give ``target`` the chain of ``source`` cut to ``low <= key < high``, as a split does, reading it
    after every segment (so what it keeps grows segment by segment)."""
    for entry in chain(source.entries, source.root):
        name, size, checksum, rows = source.rewrite_for_range(entry, target.partition, low, high, receiver=5)
        copy = dataclasses.replace(entry, rows=rows, size=size, checksum=checksum, acked=frozenset())
        _fast_forward(source, target, copy, name)
        source.storage.delete(name)
        target.versioned_rows()


@pytest.mark.parametrize("key", [("key",), ("key", "part")])
@pytest.mark.parametrize("seed", range(6))
def test_versioned_rows_equal_the_upsert_of_everything_taken_through_every_change(
    seed: int, key: tuple[str, ...]
) -> None:
    rng = random.Random(seed)
    config = StoreConfig(key=key)
    leader = PartitionStore.open(MemoryStorage(), P, 1, config)
    follower = PartitionStore.open(MemoryStorage(), P, 2, config)
    fork = PartitionStore.open(MemoryStorage(), P, 3, config)  # another leader's writes, merged
    model: Model = {}
    flushed: Model = {}  # the model as of the leader's last flush: what its segments hold
    followed: Model = {}  # what the follower was last brought up to
    order = [0]
    given: set[str] = set()  # the leader's segments the follower has
    parts = 2 if "part" in key else 1

    def pairs() -> list[tuple[int, int]]:
        n = rng.randint(1, 8)
        out = [(rng.randrange(40), rng.randrange(parts)) for _ in range(n)]
        if rng.random() < 0.3:
            out.append(out[0])  # a key twice in one write: its last row wins
        return out

    for step in range(70):
        op = rng.choice(["write", "write", "write", "merge", "flush", "flush", "compact", "follow", "reopen"])
        if op == "write":
            rows = _table(key, pairs(), f"w{step}")
            leader.write(rows, 0.0)
            stamped = rows.append_column(LSN, pa.repeat(pa.scalar(leader.lamport), rows.num_rows))
            _take(model, stamped.append_column(ORIGIN, pa.repeat(pa.scalar(1), rows.num_rows)), key, order)
        elif op == "merge":
            fork.write(_table(key, pairs(), f"f{step}"), 0.0)
            if rng.random() < 0.5:
                fork.raise_clock(leader.lamport + rng.randint(-3, 3))  # older or newer than the leader's
            merged = fork.versioned_rows()
            leader.merge(merged, 0.0)
            _take(model, merged, key, order)
        elif op == "flush" and leader.flush() is not None:
            flushed = dict(model)
        elif op == "compact" and leader.compact() is not None and rng.random() < 0.5:
            live = {e.segment_id for e in chain(leader.entries, leader.root)}
            for old in [e.segment_id for e in leader.entries if e.segment_id not in live]:
                leader.delete_segment(old)  # the list changes, not the chain
        elif op == "follow":
            for entry in [e for e in leader.entries if e.segment_id not in given]:
                _fast_forward(leader, follower, entry)
                given.add(entry.segment_id)
            followed = dict(flushed)
        elif op == "reopen":
            leader = PartitionStore.open(leader.storage, P, 1, config)
        if rng.random() < 0.6 and leader.schema is not None:
            assert _sorted(leader.versioned_rows(), key) == _expected(model, key), (step, op)
        if rng.random() < 0.4 and follower.schema is not None:
            assert _sorted(follower.versioned_rows(), key) == _expected(followed, key), (step, op)
    assert _sorted(leader.versioned_rows(), key) == _expected(model, key)
    assert _sorted(leader.versioned_rows(), key) == _sorted(_uncached(leader), key)
    if follower.schema is not None:
        assert _sorted(follower.versioned_rows(), key) == _sorted(_uncached(follower), key)
    leader.flush()
    target = PartitionStore.open(MemoryStorage(), "t/1", 5, config)
    _split(leader, target, 10, 30)
    assert _sorted(target.versioned_rows(), key) == _expected(model, key, 10, 30)


@pytest.mark.parametrize("seed", range(20))
def test_overlay_equals_the_upsert_of_both_tables(seed: int) -> None:
    rng = random.Random(seed)
    key = ("key", "part") if seed % 2 else ("key",)

    def side(n: int, tag: str) -> pa.Table:
        rows = [(rng.randrange(30), rng.randrange(2), rng.randrange(4), rng.randrange(3)) for _ in range(n)]
        columns: dict[str, Any] = {"key": [r[0] for r in rows], "part": [r[1] for r in rows]}
        columns["v"] = [f"{tag}{i}" if rng.random() < 0.7 else "same" for i in range(n)]
        columns[LSN] = [r[2] for r in rows]
        columns[ORIGIN] = [r[3] for r in rows]
        types = {"key": pa.int64(), "part": pa.int64(), "v": pa.string(), LSN: pa.int64(), ORIGIN: pa.int64()}
        return upsert(
            pa.table(columns, schema=pa.schema(types)), key
        )  # each side upserted, as the chain and the memtable are

    base, top = side(rng.randrange(0, 60), "b"), side(rng.randrange(0, 12), "t")
    both = upsert(pa.concat_tables([base, top]), key)
    assert _sorted(overlay(base, top, key), key) == _sorted(both, key)


def test_a_second_read_with_no_change_reads_no_segment_and_a_flush_reads_only_its_own() -> None:
    config = StoreConfig(key=("key",))
    storage = CountingStorage()
    store = PartitionStore.open(storage, P, 1, config)
    for tag in ("a", "b"):
        store.write(_table(config.key, [(k, 0) for k in range(50)], tag), 0.0)
        store.flush()
    store.versioned_rows()
    assert len(storage.segments_read) >= 2
    storage.segments_read.clear()
    store.versioned_rows()
    assert storage.segments_read == []  # nothing changed
    store.write(_table(config.key, [(3, 0), (77, 0)], "c"), 0.0)
    assert _sorted(store.versioned_rows(), config.key)["v"][3] == "c-3.0"
    assert storage.segments_read == []  # only the memtable changed
    entry = store.flush()
    assert entry is not None
    store.versioned_rows()
    assert set(storage.segments_read) == {segment_file(entry.segment_id)}  # the new one, not the chain
    storage.segments_read.clear()
    assert store.compact() is not None
    store.versioned_rows()
    assert storage.segments_read == []  # the new major holds the rows kept
    assert store.versioned_rows().num_rows == 51
