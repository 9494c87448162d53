"""A partition keyed by a float column: every way the store finds a key's rows (the hash pass of a write
of new keys, the sorted pass of a write with a key twice, the overlay of a small table on a large one,
the stepped overlay of a read) takes the key the same way, the compute controller's: NaN is one key, 0.0
and -0.0 are two. The hash paths took floats by their bits and the sorted pass by IEEE comparison, so a
NaN key written twice (a file loaded twice) stayed two rows, which views counted once, and 0.0 and -0.0
were two rows until a write of some other key twice dropped one of them."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from sparkbus.roles.replication.segments import read_table
from sparkbus.roles.replication.serving import ChainBuild
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import LSN, ORIGIN, PartitionStore, StoreConfig, overlay, upsert

CONFIG = StoreConfig(key=("k",), flush_rows=1000, compact_minors=1000)
NAN = float("nan")


def store() -> PartitionStore:
    return PartitionStore.open(MemoryStorage(), "t/0", 1, CONFIG, now=0.0)


DOUBLE = pa.float64()


def write(s: PartitionStore, keys: list[float], v: str, type_: pa.DataType = DOUBLE) -> None:
    s.write(pa.table({"k": pa.array(keys, type_), "v": [v] * len(keys)}), 0.0)


def rows(s: PartitionStore) -> list[tuple[str, str]]:
    return sorted((repr(r["k"]), r["v"]) for r in s.rows().to_pylist())


@pytest.mark.parametrize("type_", [pa.float64(), pa.float32()])
def test_a_nan_key_written_again_is_replaced(type_: pa.DataType) -> None:
    s = store()
    write(s, [NAN, 1.0], "a", type_)
    write(s, [NAN], "b", type_)
    assert rows(s) == [("1.0", "a"), ("nan", "b")]
    s.flush()
    write(s, [NAN], "c", type_)
    assert rows(s) == [("1.0", "a"), ("nan", "c")]


def test_a_nan_key_twice_in_one_write_is_one_row() -> None:
    s = store()
    write(s, [NAN, 1.0, NAN], "a")
    s.flush()
    assert rows(s) == [("1.0", "a"), ("nan", "a")]


def test_zero_and_negative_zero_stay_two_keys_whatever_is_written_next() -> None:
    s = store()
    write(s, [0.0], "a")
    write(s, [-0.0], "b")
    assert rows(s) == [("-0.0", "b"), ("0.0", "a")]
    write(s, [5.0, 5.0], "c")  # a new key twice in one write: the sorted pass
    assert rows(s) == [("-0.0", "b"), ("0.0", "a"), ("5.0", "c")]
    write(s, [-0.0, 0.0, -0.0], "d")
    s.flush()
    assert rows(s) == [("-0.0", "d"), ("0.0", "d"), ("5.0", "c")]


def test_overlay_and_upsert_take_nan_payloads_as_one_key() -> None:
    """NaNs with other bit patterns (a payload, the sign) are the same key."""
    other_nan = pa.array([0x7FF8_0000_0000_0001, 0xFFF8_0000_0000_0000], pa.uint64()).view(pa.float64())
    assert all(math.isnan(x) for x in other_nan.to_pylist())

    def table(keys: pa.Array, lsn: int) -> pa.Table:
        n = len(keys)
        return pa.table({"k": keys, "v": [f"l{lsn}"] * n, LSN: [lsn] * n, ORIGIN: [1] * n})

    base = table(pa.array([NAN, 2.0]), 1)
    got = overlay(base, table(other_nan.slice(0, 1), 2), ("k",))
    assert sorted(got.column("v").to_pylist()) == ["l1", "l2"] and got.num_rows == 2
    assert upsert(table(other_nan, 3), ("k",)).num_rows == 1


def test_the_stepped_read_of_a_chain_takes_a_nan_key_once() -> None:
    """A chain read in steps (after a restart or a leadership move) lays its minors over its major a
    slice at a time with a lookup of its own."""
    s = store()
    write(s, [NAN, *range(20)], "a")
    s.flush()  # the major
    keys = pa.array([0x7FF8_0000_0000_0001, 1 << 63], pa.uint64()).view(pa.float64())  # a NaN, -0.0
    s.write(pa.table({"k": keys, "v": ["b", "b"]}), 0.0)
    s.flush()  # a minor: NaN replaced (another NaN), -0.0 a key of its own beside 0.0
    build = ChainBuild(s, step_rows=4)
    while not build.step():
        pass
    assert build.rows is not None
    got = sorted(
        (repr(k), v) for k, v in zip(build.rows["k"].to_pylist(), build.rows["v"].to_pylist(), strict=True)
    )
    assert got == sorted([*((repr(float(i)), "a") for i in range(20)), ("nan", "b"), ("-0.0", "b")])


def test_a_split_sends_a_nan_key_to_the_range_with_no_upper_bound() -> None:
    """Split targets take ``low <= key < high``; compared as IEEE values a NaN key was in no range, and
    the source, unloaded after the split, dropped its row. NaN sorts above every number, as in Spark."""
    s = store()
    write(s, [1.0, NAN, 9.0, -0.0], "a")
    entry = s.flush()
    assert entry is not None
    got: dict[str, list[str]] = {}
    for target, low, high in (("t/1", None, 0), ("t/2", 0, 5), ("t/3", 5, None)):
        name, _, _, rows = s.rewrite_for_range(entry, target, low, high, receiver=1)
        got[target] = sorted(repr(k) for k in read_table(s.storage, name).column("k").to_pylist())
        assert rows == len(got[target])
    assert got == {"t/1": [], "t/2": ["-0.0", "1.0"], "t/3": ["9.0", "nan"]}
