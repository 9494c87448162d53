"""Which partition of a replicated table a row belongs to: ``pmod(hash(key), partitions)`` as Spark SQL
computes it, so rows loaded through Spark (``sparkbus run``) and through the thin client (``sparkbus load``)
land in the same partitions.

Spark's ``hash(...)`` is Murmur3 x86_32 with seed 42 (``org.apache.spark.sql.catalyst.expressions.
Murmur3Hash``), applied column after column: each column's hash is the seed of the next; a null leaves
the running hash as it is. Per type, as Spark does it:

============================================  ===================================================
Arrow type (Spark type)                       hashed as
============================================  ===================================================
bool (BooleanType)                            ``hashInt(1 or 0)``
int8, int16, int32, uint8, uint16             ``hashInt(value)``
(ByteType, ShortType, IntegerType)
int64, uint32 (LongType)                      ``hashLong(value)``
date32 (DateType)                             ``hashInt(days since the epoch)``
timestamp (TimestampType)                     ``hashLong(microseconds since the epoch)``
float32 (FloatType)                           ``hashInt(floatToIntBits(v))``, -0.0 as 0.0
float64 (DoubleType)                          ``hashLong(doubleToLongBits(v))``, -0.0 as 0.0
string (StringType), binary (BinaryType)      ``hashUnsafeBytes`` of the UTF-8 / raw bytes
============================================  ===================================================

``hashUnsafeBytes`` mixes the bytes four at a time (little-endian words), then each of the last
``len % 4`` bytes on its own, sign-extended (Spark's historical tail handling, which differs from the
reference Murmur3), and finishes with the byte length. NaN hashes as Java's canonical NaN. The key
column's Arrow type decides: an int64 key is a Spark LongType key, as ``sparkbus run`` casts it; a Spark
job whose key column is an IntegerType would hash it as ``hashInt`` and route it elsewhere.

Everything is vectorised with NumPy over uint32 lanes (multiplication wraps modulo 2**32, as Java's
``int`` does); strings are processed a word position at a time over the rows still that long.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

#: the seed of Spark SQL's ``hash()``
SEED = 42

U32 = npt.NDArray[np.uint32]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_FIVE = np.uint32(5)
_CANONICAL_NAN64 = np.int64(0x7FF8000000000000)
_CANONICAL_NAN32 = np.int32(0x7FC00000)


class PartitionError(ValueError):
    """Rows that cannot be given a partition (a key column missing, a null key, a type Spark hashes
    differently); the message is one line."""


# ---------------------------------------------------------------- Murmur3 x86_32 over uint32 lanes


def _rotl(x: U32, r: int) -> U32:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: U32) -> U32:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: U32, k1: U32) -> U32:
    return _rotl(h1 ^ k1, 13) * _FIVE + _N


def _fmix(h1: U32, length: U32 | int) -> U32:
    h1 = h1 ^ np.asarray(length, dtype=np.uint32)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * _F1
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * _F2
    return h1 ^ (h1 >> np.uint32(16))


def hash_int(values: npt.ArrayLike, seeds: npt.ArrayLike) -> U32:
    """Spark's ``Murmur3_x86_32.hashInt`` of 32-bit ints (as uint32 bit patterns), element-wise."""
    k = np.asarray(values).astype(np.int32, copy=False).view(np.uint32)
    return _fmix(_mix_h1(np.asarray(seeds, dtype=np.uint32), _mix_k1(k)), 4)


def hash_long(values: npt.ArrayLike, seeds: npt.ArrayLike) -> U32:
    """Spark's ``Murmur3_x86_32.hashLong`` of 64-bit ints: the low word, then the high word."""
    v = np.ascontiguousarray(np.asarray(values).astype(np.int64, copy=False)).view(np.uint64)
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    h1 = _mix_h1(np.asarray(seeds, dtype=np.uint32), _mix_k1(low))
    return _fmix(_mix_h1(h1, _mix_k1(high)), 8)


def hash_bytes(data: bytes, seed: int = SEED) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` of one byte string, as a signed 32-bit int."""
    out = _hash_binary(pa.array([data], pa.binary()), np.array([seed & 0xFFFFFFFF], np.uint32))
    return int(out.view(np.int32)[0])


def _hash_binary(array: pa.Array, seeds: U32) -> U32:
    """``hashUnsafeBytes`` of every value of a (large_)binary array without nulls."""
    offsets_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    buffers = array.buffers()
    offsets: npt.NDArray[np.int64] = np.frombuffer(buffers[1], dtype=offsets_type)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - offsets[:-1]
    # Longest first: the rows still that long at word position j are a prefix of this order.
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    h1 = np.asarray(seeds, dtype=np.uint32)[order].copy()
    words = lengths // 4
    # Pad so that reading four bytes past any start stays in range.
    padded = np.concatenate([data, np.zeros(4, np.uint8)])
    descending = -words  # ascending
    for j in range(int(words[0]) if len(words) else 0):
        n = int(np.searchsorted(descending, -j, side="left"))  # the rows with more than j words
        at = starts[:n] + 4 * j
        k1 = (
            padded[at].astype(np.uint32)
            | (padded[at + 1].astype(np.uint32) << np.uint32(8))
            | (padded[at + 2].astype(np.uint32) << np.uint32(16))
            | (padded[at + 3].astype(np.uint32) << np.uint32(24))
        )
        h1[:n] = _mix_h1(h1[:n], _mix_k1(k1))
    # The tail: each remaining byte alone, sign-extended (Java's byte), in order.
    tails = lengths - 4 * words
    for t in range(3):
        rows = np.nonzero(tails > t)[0]
        if len(rows) == 0:
            break
        byte = padded[starts[rows] + 4 * words[rows] + t].view(np.int8).astype(np.int32).view(np.uint32)
        h1[rows] = _mix_h1(h1[rows], _mix_k1(byte))
    h1 = _fmix(h1, lengths.astype(np.uint32))
    out = np.empty_like(h1)
    out[order] = h1
    return out


# ---------------------------------------------------------------- Arrow columns


def _values(column: pa.Array) -> npt.NDArray[np.generic]:
    """The column's values as NumPy (nulls filled with zero; the caller keeps their seeds)."""
    if column.null_count:
        column = pc.fill_null(
            column, pa.scalar(0, column.type) if not pa.types.is_boolean(column.type) else False
        )
    values: npt.NDArray[np.generic] = column.to_numpy(zero_copy_only=False)
    return values


def hash_column(column: pa.Array | pa.ChunkedArray, seeds: U32) -> U32:
    """One column's Spark hash with per-row ``seeds`` (the running hash of the columns before it).

    Raises:
        PartitionError: a type whose Spark hash this module does not compute.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    t = column.type
    if pa.types.is_dictionary(t):
        return hash_column(column.dictionary_decode(), seeds)
    seeds = np.asarray(seeds, dtype=np.uint32)
    if len(column) == 0:
        return seeds.copy()
    if pa.types.is_boolean(t) or t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()):
        out = hash_int(_values(column).astype(np.int32), seeds)
    elif t in (pa.int64(), pa.uint32()):
        out = hash_long(_values(column).astype(np.int64), seeds)
    elif pa.types.is_date32(t):
        out = hash_int(_values(column.cast(pa.int32())), seeds)
    elif pa.types.is_timestamp(t):
        micros = column.cast(pa.timestamp("us", tz=t.tz), safe=False).cast(pa.int64())
        out = hash_long(_values(micros), seeds)
    elif pa.types.is_float64(t):
        v = _values(column).astype(np.float64)
        v = np.where(v == 0.0, 0.0, v)  # -0.0 hashes as 0.0
        bits = v.view(np.int64).copy()
        bits[np.isnan(v)] = _CANONICAL_NAN64
        out = hash_long(bits, seeds)
    elif pa.types.is_float32(t):
        f = _values(column).astype(np.float32)
        f = np.where(f == 0.0, np.float32(0.0), f).astype(np.float32)
        ibits = f.view(np.int32).copy()
        ibits[np.isnan(f)] = _CANONICAL_NAN32
        out = hash_int(ibits, seeds)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        binary = pa.large_binary() if pa.types.is_large_string(t) else pa.binary()
        return hash_column(column.view(binary), seeds)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        valid = column.is_valid()
        filled = pc.fill_null(column, b"") if column.null_count else column
        out = _hash_binary(filled, seeds)
        if column.null_count:
            out = np.where(valid.to_numpy(zero_copy_only=False), out, seeds)
        return out
    else:
        raise PartitionError(
            f"a key column of type {t} cannot be hashed as Spark does here (supported: integers up to "
            "int64, bool, date32, timestamp, float32, float64, string, binary)"
        )
    if column.null_count:
        out = np.where(column.is_valid().to_numpy(zero_copy_only=False), out, seeds)
    return out


def spark_hash(columns: Sequence[pa.Array | pa.ChunkedArray], seed: int = SEED) -> npt.NDArray[np.int32]:
    """Spark SQL's ``hash(c1, c2, ...)`` of every row, as int32."""
    if not columns:
        raise PartitionError("hash needs at least one column")
    h = np.full(len(columns[0]), seed & 0xFFFFFFFF, dtype=np.uint32)
    for column in columns:
        if len(column) != len(h):
            raise PartitionError("hash columns differ in length")
        h = hash_column(column, h)
    return h.view(np.int32)


def partition_of(rows: pa.Table, key: Sequence[str], partitions: int) -> npt.NDArray[np.int64]:
    """Each row's partition index ``pmod(hash(key...), partitions)``.

    Raises:
        PartitionError: a key column missing, a null key value, or a key type not supported.
    """
    if partitions < 1:
        raise PartitionError(f"partitions must be >= 1, got {partitions}")
    missing = [k for k in key if k not in rows.column_names]
    if missing:
        raise PartitionError(
            f"the rows have no key column {', '.join(missing)} (columns: {', '.join(rows.column_names)})"
        )
    for k in key:
        nulls = rows.column(k).null_count
        if nulls:
            raise PartitionError(f"key column {k} has {nulls:,} null value{'s' if nulls != 1 else ''}")
    h = spark_hash([rows.column(k) for k in key]).astype(np.int64)
    return np.mod(h, partitions)  # NumPy's mod takes the divisor's sign: Spark's pmod


def split(rows: pa.Table, key: Sequence[str], partitions: int) -> dict[int, pa.Table]:
    """``rows`` grouped by partition index (only the partitions that get rows), each in input order."""
    index = partition_of(rows, key, partitions)
    out: dict[int, pa.Table] = {}
    for p in np.unique(index).tolist():
        out[int(p)] = rows.take(pa.array(np.nonzero(index == p)[0]))
    return out
