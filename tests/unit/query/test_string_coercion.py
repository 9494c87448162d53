"""A STRING beside a number, date, timestamp or boolean is read as that type, as Spark SQL 4 (ANSI) reads it.

Every expected answer and refusal below is what Spark 4.0 answered for the same query over the same rows
(local mode, the default ANSI mode). Before, each of these failed with Arrow's "no kernel matching input
types": ``WHERE dt > '2020-01-05'`` could not be written at all.
"""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow as pa
import pytest

from sparkbus.roles.query import casts
from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, split

D = datetime.date
TS = datetime.datetime
DEC = decimal.Decimal

TABLE = pa.table(
    {
        "x": pa.array([1, 10, 20, None], pa.int64()),
        "i": pa.array([1, 10, 20, None], pa.int32()),
        "s": pa.array(["1", "10", "a", None]),
        "dt": pa.array([D(2020, 1, 1), D(2020, 1, 6), D(2021, 1, 1), None]),
        "ts": pa.array([TS(2020, 1, 1, 5), TS(2020, 1, 6), TS(2021, 1, 1), None], pa.timestamp("us")),
        "d": pa.array([DEC("1.50"), DEC("10.00"), None, DEC("3.25")], pa.decimal128(10, 2)),
        "f": pa.array([1.0, 10.0, 2.5, None]),
        "b": pa.array([True, False, None, True]),
    }
)


def values(text: str) -> list[object]:
    got = distributed(parse_sql(text), split(TABLE, [2]))
    assert got is not None and got.num_columns == 1
    return sorted(got.column(0).to_pylist(), key=repr)


#: (query, its values in any order) as Spark 4 answers them
ANSWERED: list[tuple[str, list[object]]] = [
    ("SELECT x FROM t WHERE x = '10'", [10]),
    ("SELECT x FROM t WHERE '10' = x", [10]),
    ("SELECT x FROM t WHERE x = ' 10 '", [10]),
    ("SELECT x FROM t WHERE x = '+10'", [10]),
    ("SELECT x FROM t WHERE x < '15'", [1, 10]),
    ("SELECT x FROM t WHERE x BETWEEN '5' AND '15'", [10]),
    ("SELECT x FROM t WHERE x IN ('1', '20')", [1, 20]),
    ("SELECT x FROM t WHERE x IN ('10', NULL)", [10]),
    ("SELECT i FROM t WHERE i = '10'", [10]),
    ("SELECT i FROM t WHERE i = '3000000000'", []),  # read as a BIGINT: no INT equals it
    ("SELECT dt FROM t WHERE dt > '2020-01-05'", [D(2020, 1, 6), D(2021, 1, 1)]),
    ("SELECT dt FROM t WHERE dt > '2020-01-05 10:00:00'", [D(2020, 1, 6), D(2021, 1, 1)]),
    ("SELECT dt FROM t WHERE dt = '2020-1-6'", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt = ' 2020-01-06 '", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt = '2020-01-06T23:00'", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt > '2020'", [D(2020, 1, 6), D(2021, 1, 1)]),
    ("SELECT dt FROM t WHERE dt > '2020-01'", [D(2020, 1, 6), D(2021, 1, 1)]),
    ("SELECT dt FROM t WHERE '2020-01-06' = dt", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt IN ('2020-01-06')", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt BETWEEN '2020-01-01' AND '2020-12-31'", [D(2020, 1, 1), D(2020, 1, 6)]),
    ("SELECT ts FROM t WHERE ts >= '2020-01-06'", [TS(2020, 1, 6), TS(2021, 1, 1)]),
    (
        "SELECT ts FROM t WHERE ts > '2020-01-01 04:00:00'",
        [TS(2020, 1, 1, 5), TS(2020, 1, 6), TS(2021, 1, 1)],
    ),
    (
        "SELECT ts FROM t WHERE ts > '2020-01-01T04:00:00'",
        [TS(2020, 1, 1, 5), TS(2020, 1, 6), TS(2021, 1, 1)],
    ),
    ("SELECT ts FROM t WHERE ts = '2020-01-06 00:00'", [TS(2020, 1, 6)]),
    ("SELECT ts FROM t WHERE ts = '2020-01-06 00'", [TS(2020, 1, 6)]),
    ("SELECT ts FROM t WHERE ts = '2020-01-06 0:0:0'", [TS(2020, 1, 6)]),
    ("SELECT ts FROM t WHERE ts = '2020-01-06 00:00:00.000000'", [TS(2020, 1, 6)]),
    ("SELECT d FROM t WHERE d = '10'", [DEC("10.00")]),
    ("SELECT d FROM t WHERE d = '1e1'", [DEC("10.00")]),
    ("SELECT d FROM t WHERE d > '1.505'", [DEC("10.00"), DEC("3.25")]),
    ("SELECT d FROM t WHERE d IN ('10', '3.25')", [DEC("10.00"), DEC("3.25")]),
    ("SELECT f FROM t WHERE f > '2'", [10.0, 2.5]),
    ("SELECT f FROM t WHERE f = ' 2.5 '", [2.5]),
    ("SELECT f FROM t WHERE f = '1e1'", [10.0]),
    ("SELECT f FROM t WHERE f = '1.5d'", []),  # Java reads the suffix
    ("SELECT f FROM t WHERE f < 'Infinity'", [1.0, 10.0, 2.5]),
    ("SELECT f FROM t WHERE f < 'inf'", [1.0, 10.0, 2.5]),
    ("SELECT b FROM t WHERE b = 'true'", [True, True]),
    ("SELECT b FROM t WHERE b = 'yes'", [True, True]),
    ("SELECT x FROM t WHERE '10' = '10'", [1, 10, 20, None]),
    ("SELECT x + '1' AS y FROM t", [2, 11, 21, None]),
    ("SELECT i + '3000000000' AS y FROM t", [3000000001, 3000000010, 3000000020, None]),
    ("SELECT x / '2' AS y FROM t", [0.5, 10.0, 5.0, None]),
    ("SELECT d + '1' AS y FROM t", [11.0, 2.5, 4.25, None]),
    ("SELECT f + '1' AS y FROM t", [11.0, 2.0, 3.5, None]),
    ("SELECT -'5' AS y FROM t", [-5.0] * 4),
    ("SELECT abs('-5') AS y FROM t", [5.0] * 4),
    ("SELECT length(x) AS y FROM t", [1, 2, 2, None]),
    ("SELECT length(dt) AS y FROM t", [10, 10, 10, None]),
    ("SELECT length(f) AS y FROM t", [3, 3, 4, None]),
    ("SELECT length(d) AS y FROM t", [4, 4, 5, None]),
    ("SELECT upper(b) AS y FROM t", ["FALSE", "TRUE", "TRUE", None]),
    ("SELECT upper(x) AS y FROM t", ["1", "10", "20", None]),
    (
        "SELECT lower(ts) AS y FROM t",
        ["2020-01-01 05:00:00", "2020-01-06 00:00:00", "2021-01-01 00:00:00", None],
    ),
    ("SELECT x FROM t WHERE x LIKE '1%'", [1, 10]),
]
#: (query, the string Spark 4 refuses to read, the type it would read it as)
REFUSED: list[tuple[str, str, str]] = [
    ("SELECT x FROM t WHERE x = '10.0'", "10.0", "BIGINT"),
    ("SELECT x FROM t WHERE x = 'abc'", "abc", "BIGINT"),
    ("SELECT x FROM t WHERE x = ''", "", "BIGINT"),
    ("SELECT x FROM t WHERE x = '1e1'", "1e1", "BIGINT"),
    ("SELECT x FROM t WHERE x = '99999999999999999999'", "99999999999999999999", "BIGINT"),
    ("SELECT x FROM t WHERE x IN (1, 'a')", "a", "BIGINT"),
    ("SELECT x FROM t WHERE x IN ('1', 'zz')", "zz", "BIGINT"),
    ("SELECT x * '2.5' AS y FROM t", "2.5", "BIGINT"),
    ("SELECT s FROM t WHERE s = 10", "a", "BIGINT"),  # the column is read: its 'a' is malformed
    ("SELECT s FROM t WHERE s > 5", "a", "BIGINT"),
    ("SELECT s FROM t WHERE s IN (1, 10)", "a", "BIGINT"),
    ("SELECT dt FROM t WHERE dt = 'nope'", "nope", "DATE"),
    ("SELECT dt FROM t WHERE dt = '2020-02-30'", "2020-02-30", "DATE"),
    ("SELECT ts FROM t WHERE ts < '2020-01-06Z'", "2020-01-06Z", "TIMESTAMP_NTZ"),
    ("SELECT b FROM t WHERE b = 'maybe'", "maybe", "BOOLEAN"),
]


@pytest.mark.parametrize(("sql", "want"), ANSWERED)
def test_a_string_is_read_as_the_type_beside_it_as_spark_reads_it(sql: str, want: list[object]) -> None:
    assert values(sql) == sorted(want, key=repr)


def test_the_types_of_the_answers_are_spark_s() -> None:
    def typed(sql: str) -> pa.DataType:
        got = distributed(parse_sql(sql), split(TABLE, [2]))
        assert got is not None
        return got.schema.field(0).type

    assert typed("SELECT x + '1' AS y FROM t") == pa.int64()
    assert typed("SELECT i + '1' AS y FROM t") == pa.int64()
    assert typed("SELECT d + '1' AS y FROM t") == pa.float64()
    assert typed("SELECT length(x) AS y FROM t") == pa.int32()
    assert typed("SELECT upper(dt) AS y FROM t") == pa.string()


@pytest.mark.parametrize(("sql", "value", "target"), REFUSED)
def test_a_string_that_does_not_read_as_the_type_is_spark_s_cast_invalid_input(
    sql: str, value: str, target: str
) -> None:
    with pytest.raises(ExecutionError) as caught:
        values(sql)
    assert (
        f"the value {value!r} of the type STRING cannot be cast to {target} because it is malformed"
        in str(caught.value)
    )


def test_a_string_beside_a_timestamp_with_a_zone_is_read_in_utc_or_its_own_zone() -> None:
    zoned = pa.array([TS(2020, 1, 6, tzinfo=datetime.UTC)], pa.timestamp("us", "UTC"))
    read = casts.cast_text(
        pa.array(["2020-01-06", "2020-01-06 01:00+01:00", "2020-01-06T00:00:00Z"]), zoned.type
    )
    assert read.to_pylist() == [TS(2020, 1, 6, tzinfo=datetime.UTC)] * 3
    with pytest.raises(ExecutionError, match="cannot be cast to TIMESTAMP "):
        casts.cast_text(pa.scalar("2020-01-06 +19:00"), zoned.type)


def test_reading_keeps_nulls_reads_each_distinct_string_once_and_chunked_columns() -> None:
    column = pa.chunked_array([["1", None], ["1", " 2"]])
    assert casts.cast_text(column, pa.int32()).to_pylist() == [1, None, 1, 2]
    assert casts.cast_text(pa.scalar(None, pa.string()), pa.date32()).as_py() is None
    assert casts.cast_text(pa.array(["1.5", "-0.25"]), pa.decimal128(5, 1)).type == pa.decimal128(3, 2)
    assert math.isnan(casts.read_text("-NaN", pa.float64()))  # type: ignore[arg-type]
    assert casts.read_text("-Infinity", pa.float32()) == -math.inf
    assert casts.read_text("2020-01-06 12:34:56.1234567", pa.timestamp("ns")) == TS(
        2020, 1, 6, 12, 34, 56, 123456
    )
    for text, target in [
        ("1_000", pa.int64()),
        ("1_0.5", pa.float64()),
        ("0x10", pa.float64()),
        ("1" * 39, pa.decimal128(38, 0)),
    ]:
        with pytest.raises(ExecutionError, match="malformed"):
            casts.read_text(text, target)


@pytest.mark.parametrize(
    ("value", "java"),
    [
        (1.0, "1.0"),
        (2.5, "2.5"),
        (-0.0, "-0.0"),
        (0.001, "0.001"),
        (1e-4, "1.0E-4"),
        (1.5e-5, "1.5E-5"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (-1.2345e20, "-1.2345E20"),
        (0.1 + 0.2, "0.30000000000000004"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
    ],
)
def test_a_double_is_written_as_java_writes_it(value: float, java: str) -> None:
    assert casts.to_text(pa.array([value])).to_pylist() == [java]


def test_writing_a_timestamp_drops_the_fraction_s_trailing_zeros() -> None:
    got = casts.to_text(pa.array([TS(2020, 1, 6, 1, 2, 3, 450000), TS(2020, 1, 6), None], pa.timestamp("us")))
    assert got.to_pylist() == ["2020-01-06 01:02:03.45", "2020-01-06 00:00:00", None]
    with pytest.raises(ExecutionError, match="cannot cast"):
        casts.to_text(pa.array([b"x"]))
