"""``sparkbus.topologies.partitioning``: Spark's ``hash()`` on known values (taken from Spark SQL 4.1:
``SELECT hash(1), hash(CAST(1 AS BIGINT)), hash('abc'), ...``) and the routing of rows to partitions.
The comparison with Spark itself on generated keys is tests/spark/test_partitioning.py."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest

from sparkbus.topologies.partitioning import (
    PartitionError,
    hash_bytes,
    partition_of,
    spark_hash,
    split,
)


def h(*columns: pa.Array) -> list[int]:
    return [int(x) for x in spark_hash(list(columns))]


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        (pa.array([1, -1], pa.int32()), [-559580957, -1604776387]),
        (pa.array([1], pa.int8()), [-559580957]),
        (pa.array([1, 42], pa.int64()), [-1712319331, 1316951768]),
        (
            pa.array(["a", "abc", "abcd", "", "héllo"]),
            [1485273170, 1322437556, -396302900, 142593372, 1212979866],
        ),
        (pa.array(["abc"], pa.large_string()), [1322437556]),
        (pa.array([b"abc"], pa.binary()), [1322437556]),
        (pa.array([0.0, -0.0, 1.5, math.nan]), [-1670924195, -1670924195, 1290763749, -1281358385]),
        (pa.array([1.5], pa.float32()), [-221251528]),
        (pa.array([True]), [-559580957]),
        (pa.array([dt.date(2024, 1, 2)]), [-21057580]),
        (pa.array([None], pa.int32()), [42]),
    ],
)
def test_known_spark_values(column: pa.Array, expected: list[int]) -> None:
    assert h(column) == expected


def test_columns_chain_the_hash_and_a_null_keeps_it() -> None:
    assert h(pa.array([1], pa.int64()), pa.array(["a"])) == [573093329]
    # hash(1L, NULL) == hash(1L): the null column leaves the running hash alone
    assert h(pa.array([1], pa.int64()), pa.array([None], pa.string())) == [-1712319331]
    assert hash_bytes(b"abc") == 1322437556
    assert hash_bytes(b"abc", seed=7) != 1322437556


def test_sliced_chunked_and_dictionary_columns_hash_like_plain_ones() -> None:
    words = pa.array(["x", "abc", "abcd", "é", "some longer text"])
    whole = h(words)
    assert h(words.slice(1, 3)) == whole[1:4]  # the array's offset is honoured
    assert h(pa.chunked_array([words.slice(0, 2), words.slice(2)])) == whole  # type: ignore[arg-type]
    assert h(words.dictionary_encode()) == whole
    ints = pa.array(range(-5, 5), pa.int64())
    assert h(ints.slice(3, 4)) == h(ints)[3:7]


def test_timestamps_hash_as_microseconds_whatever_their_unit() -> None:
    us = pa.array([1_700_000_000_000_000], pa.timestamp("us"))
    assert (
        h(us)
        == h(pa.array([1_700_000_000_000], pa.timestamp("ms")))
        == h(pa.array([1_700_000_000_000_000], pa.int64()))
    )


def test_partition_is_pmod_and_never_negative() -> None:
    rows = pa.table({"k": pa.array(range(-1000, 1000), pa.int64())})
    parts = partition_of(rows, ["k"], 6)
    hashes = spark_hash([rows.column("k")]).astype(np.int64)
    assert parts.min() >= 0 and parts.max() <= 5
    assert parts.tolist() == [((x % 6) + 6) % 6 for x in hashes.tolist()]
    assert partition_of(pa.table({"k": pa.array([42], pa.int64())}), ["k"], 6).tolist() == [2]  # Spark: 2


def test_split_groups_rows_by_partition_in_input_order() -> None:
    rows = pa.table(
        {"order_id": pa.array(range(100), pa.int64()), "v": pa.array([str(i) for i in range(100)])}
    )
    parts = split(rows, ["order_id"], 6)
    assert sum(t.num_rows for t in parts.values()) == 100
    assert set(parts) == set(range(6))
    for p, table in parts.items():
        ids = table.column("order_id").to_pylist()
        assert ids == sorted(ids)
        assert set(partition_of(table, ["order_id"], 6).tolist()) == {p}


def test_bad_rows_are_one_line_errors() -> None:
    rows = pa.table({"a": [1, 2], "b": ["x", None]})
    with pytest.raises(PartitionError, match=r"no key column order_id \(columns: a, b\)"):
        partition_of(rows, ["order_id"], 6)
    with pytest.raises(PartitionError, match=r"key column b has 1 null value$"):
        partition_of(rows, ["a", "b"], 6)
    with pytest.raises(PartitionError, match="type decimal128"):
        partition_of(pa.table({"a": pa.array([1], pa.decimal128(5, 2))}), ["a"], 6)
    with pytest.raises(PartitionError, match="partitions must be >= 1"):
        partition_of(rows, ["a"], 0)


def test_empty_rows_get_no_partition() -> None:
    assert split(pa.table({"k": pa.array([], pa.int64())}), ["k"], 6) == {}
