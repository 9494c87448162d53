"""``sparkbus.topologies.partitioning`` agrees with Spark SQL's ``hash()`` and ``pmod(hash(key), n)`` on
generated keys of every supported type, multi-column keys with nulls included."""

from __future__ import annotations

import datetime as dt
import math
import random
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparkbus.topologies.partitioning import partition_of, spark_hash

pytestmark = pytest.mark.spark
N = 300
PARTITIONS = 6


def _text(rng: random.Random) -> str:
    alphabet = "abcdefgxyz0123456789 _-éüßλ中文🙂"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 23)))


def generated(seed: int = 11) -> pa.Table:
    """N rows: one column per type, edge values first, then random ones."""
    rng = random.Random(seed)
    i32 = [0, 1, -1, 2**31 - 1, -(2**31)] + [rng.randrange(-(2**31), 2**31) for _ in range(N - 5)]
    i64 = [0, 1, -1, 2**63 - 1, -(2**63)] + [rng.randrange(-(2**63), 2**63) for _ in range(N - 5)]
    f64 = [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan] + [rng.uniform(-1e9, 1e9) for _ in range(N - 6)]
    f32 = [struct.unpack("f", struct.pack("f", v))[0] if math.isfinite(v) else v for v in f64]
    strings = ["", "a", "ab", "abc", "abcd", "abcde", "é", "中文🙂"] + [_text(rng) for _ in range(N - 8)]
    days = [rng.randrange(-30_000, 30_000) for _ in range(N)]
    micros = [rng.randrange(-(2**50), 2**50) for _ in range(N)]
    return pa.table(
        {
            "i8": pa.array([rng.randrange(-128, 128) for _ in range(N)], pa.int8()),
            "i16": pa.array([rng.randrange(-(2**15), 2**15) for _ in range(N)], pa.int16()),
            "i32": pa.array(i32, pa.int32()),
            "i64": pa.array(i64, pa.int64()),
            "f32": pa.array(f32, pa.float32()),
            "f64": pa.array(f64, pa.float64()),
            "s": pa.array(strings, pa.string()),
            "b": pa.array([s.encode() for s in strings], pa.binary()),
            "flag": pa.array([rng.random() < 0.5 for _ in range(N)], pa.bool_()),
            "day": pa.array([dt.date(1970, 1, 1) + dt.timedelta(days=d) for d in days], pa.date32()),
            "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
            # sparse nulls: a null column keeps the running hash
            "ns": pa.array([None if rng.random() < 0.3 else _text(rng) for _ in range(N)], pa.string()),
            "ni": pa.array(
                [None if rng.random() < 0.3 else rng.randrange(-99, 99) for _ in range(N)], pa.int64()
            ),
        }
    )


KEYS: list[tuple[str, ...]] = [
    ("i8",),
    ("i16",),
    ("i32",),
    ("i64",),
    ("f32",),
    ("f64",),
    ("s",),
    ("b",),
    ("flag",),
    ("day",),
    ("ts",),
    ("ns",),
    ("ni",),
    ("i64", "s"),
    ("s", "i32", "f64"),
    ("ns", "ni", "i64"),
]


def test_hash_and_partition_match_spark_for_every_type(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = generated()
    frame = spark.createDataFrame(rows)
    assert [f.dataType.simpleString() for f in frame.schema.fields] == [
        "tinyint",
        "smallint",
        "int",
        "bigint",
        "float",
        "double",
        "string",
        "binary",
        "boolean",
        "date",
        "timestamp",
        "string",
        "bigint",
    ]
    exprs = []
    for i, key in enumerate(KEYS):
        h = F.hash(*[F.col(k) for k in key])
        exprs += [h.alias(f"h{i}"), F.pmod(h, F.lit(PARTITIONS)).alias(f"p{i}")]
    theirs = frame.select(*exprs).toArrow()
    for i, key in enumerate(KEYS):
        ours = spark_hash([rows.column(k) for k in key])
        expected = np.asarray(theirs.column(f"h{i}").to_pylist(), dtype=np.int32)
        bad = np.nonzero(ours != expected)[0]
        assert len(bad) == 0, (key, [(rows.slice(j, 1).to_pylist(), ours[j], expected[j]) for j in bad[:3]])
        if all(rows.column(k).null_count == 0 for k in key):
            parts = partition_of(rows, key, PARTITIONS)
            assert parts.tolist() == theirs.column(f"p{i}").to_pylist(), key
