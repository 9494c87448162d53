"""``ChainBuild`` reads a chain's rows in steps and ends with what one upsert of all its segments gives; the
rows a store keeps stand for the start of a later chain (a flush, a fast-forward on top) or for the major
that compacted them, and for nothing else."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from sparkbus.roles.replication.segments import chain
from sparkbus.roles.replication.serving import ChainBuild
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import LSN, ORIGIN, PartitionStore, StoreConfig, chain_ids, covered

CONFIG = StoreConfig(key=("k",), batch_rows=3, flush_rows=10_000, compact_minors=10_000)


def sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: (r["k"], r[LSN], r[ORIGIN]))


def built(store: PartitionStore, step_rows: int) -> tuple[pa.Table, int]:
    build = ChainBuild(store, step_rows)
    for steps in range(1, 10_000):
        if build.step():
            assert build.rows is not None
            return build.rows, steps
    raise AssertionError("the build never ended")


def random_store(rng: random.Random) -> PartitionStore:
    """Writes over a small key space (so keys are written again), flushed at random points, with rows
    merged from another replica at lower and higher versions, and a compaction now and then."""
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    for _ in range(rng.randint(1, 8)):
        keys = rng.sample(range(40), rng.randint(1, 15))
        rows = pa.table({"k": keys, "v": [rng.random() for _ in keys]})
        if rng.random() < 0.3:
            lsn = rng.randint(max(1, store.lamport - 3), store.lamport + 3)
            rows = rows.append_column(LSN, pa.array([lsn] * len(keys), pa.int64()))
            rows = rows.append_column(ORIGIN, pa.array([2] * len(keys), pa.int64()))
            store.merge(rows, 0.0)
        else:
            store.write(rows, 0.0)
        if rng.random() < 0.7:
            store.flush()
        if rng.random() < 0.15:
            store.compact()
        if rng.random() < 0.2:
            store.versioned_rows()  # rows kept: a later build starts from them
    store.flush()
    return store


@pytest.mark.parametrize("seed", range(40))
def test_a_build_ends_with_the_upsert_of_its_chain(seed: int) -> None:
    rng = random.Random(seed)
    store = random_store(rng)
    live = chain(store.entries, store.root)
    expected = store._chain_table(live)  # every segment read and upserted at once
    rows, _ = built(store, rng.randint(1, 7))
    assert sorted_rows(rows) == sorted_rows(expected)
    assert len({r["k"] for r in rows.to_pylist()}) == rows.num_rows
    assert all(rows.column(i).num_chunks == 1 for i in range(rows.num_columns))
    assert rows.schema.equals(store.schema)


def test_a_build_takes_a_step_per_batch_read_and_per_slice_laid_under_a_newer_segment() -> None:
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    store.write(pa.table({"k": list(range(12)), "v": [0.0] * 12}), 0.0)
    store.flush()  # 12 rows: 4 batches of 3
    store.write(pa.table({"k": [0, 20], "v": [1.0, 1.0]}), 0.0)
    store.flush()  # 1 batch
    rows, steps = built(store, 4)
    # 5 batches, the major's 12 rows under the minor's in slices of 4, a step per column (4, the version
    # columns too), and the last one that puts them together
    assert steps == 5 + 3 + 4 + 1
    assert sorted(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist(), strict=True)) == sorted(
        [(k, 0.0) for k in range(1, 12)] + [(0, 1.0), (20, 1.0)]
    )


def test_the_minors_are_laid_one_over_the_other_and_the_major_under_them_in_one_pass() -> None:
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    store.write(pa.table({"k": list(range(24)), "v": [0.0] * 24}), 0.0)
    store.flush()  # the major: 24 rows, 8 batches of 3
    for i in range(3):
        store.write(pa.table({"k": [i, 100 + i], "v": [1.0, 1.0]}), 0.0)
        store.flush()  # three minors of one batch
    rows, steps = built(store, 4)
    # 11 batches; 2 steps laying the 3 minors one over the other; the major under them in one pass, in
    # slices of as many rows as they hold (6, more than a step's 4): 4; a step per column; the last
    assert steps == 11 + 2 + 4 + 4 + 1
    assert sorted(rows.column("k").to_pylist()) == [*range(24), 100, 101, 102]


def test_a_build_starts_from_the_rows_the_store_keeps() -> None:
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    store.write(pa.table({"k": list(range(30)), "v": [0.0] * 30}), 0.0)
    store.flush()
    store.versioned_rows()  # kept
    store.write(pa.table({"k": [3], "v": [1.0]}), 0.0)
    store.flush()
    assert store.pending_rows() == 1
    rows, steps = built(store, 100)
    assert steps == 1 + 1 + 4 + 1  # the minor's one batch, one slice of the kept rows, the columns, the end
    assert dict(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist(), strict=True))[3] == 1.0


def test_rows_of_a_chain_stand_for_its_extensions_and_its_compaction_only() -> None:
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    for i in range(3):
        store.write(pa.table({"k": [i], "v": [0.0]}), 0.0)
        store.flush()
    first = chain(store.entries, store.root)
    ids = chain_ids(first)
    assert covered(ids, first) == 3
    store.write(pa.table({"k": [9], "v": [0.0]}), 0.0)
    store.flush()
    assert covered(ids, chain(store.entries, store.root)) == 3  # a flush on top
    assert covered(ids, first[:2]) == 0  # a chain shorter than the one read
    major = store.compact()
    assert major is not None
    # compacted: the major holds the rows of the chain ending at its base (which is the one after the flush)
    assert covered(ids, chain(store.entries, store.root)) == 0
    assert covered(chain_ids([*first, store.entry(major.base_id)]), chain(store.entries, store.root)) == 1
    other = PartitionStore.open(MemoryStorage(), "t/0", 2, CONFIG)
    other.write(pa.table({"k": [1], "v": [2.0]}), 0.0)
    unrelated = other.flush()  # a major on no base: a chain of its own
    assert unrelated is not None
    assert covered(ids, [unrelated]) == 0
    assert covered((), first) == 0


def test_rows_read_of_a_chain_the_store_left_are_not_kept() -> None:
    store = PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG)
    store.write(pa.table({"k": [1, 2], "v": [0.0, 0.0]}), 0.0)
    store.flush()
    build = ChainBuild(store, 10)
    while not build.step():
        pass
    assert build.rows is not None
    store.reset()
    store.write(pa.table({"k": [5], "v": [0.0]}), 0.0)
    store.flush()
    assert not store.keep_chain_rows(build.ids, build.rows)
    assert store.rows().column("k").to_pylist() == [5]
    again = ChainBuild(store, 10)
    while not again.step():
        pass
    assert again.rows is not None
    assert store.keep_chain_rows(again.ids, again.rows)
    assert store.pending_rows() == 0
