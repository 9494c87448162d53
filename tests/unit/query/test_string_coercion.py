"""A STRING beside a number, date, timestamp or boolean is read as that type, as Spark SQL 4 (ANSI) reads it,
and CAST(x AS type) (with the DATE '...' and TIMESTAMP '...' literals) casts as Spark's ANSI cast.

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
from sparkbus.roles.query.expressions import apply
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
    ("SELECT coalesce(x, '5') AS c FROM t", [1, 10, 20, 5]),
    ("SELECT coalesce('5', x) AS c FROM t", [5] * 4),
    (
        "SELECT coalesce(dt, '2020-02-02') AS c FROM t",
        [D(2020, 1, 1), D(2020, 1, 6), D(2020, 2, 2), D(2021, 1, 1)],
    ),
    ("SELECT coalesce(f, '2.5') AS c FROM t", [1.0, 10.0, 2.5, 2.5]),
    ("SELECT coalesce(s, 5) AS c FROM t WHERE s <> 'a' OR s IS NULL", [1, 10, 5]),
    ("SELECT coalesce(d, '1') AS c FROM t", [1.0, 1.5, 10.0, 3.25]),
    ("SELECT coalesce(b, 'yes') AS c FROM t", [False, True, True, True]),
    (
        "SELECT coalesce(ts, '2020-01-01') AS c FROM t",
        [TS(2020, 1, 1), TS(2020, 1, 1, 5), TS(2020, 1, 6), TS(2021, 1, 1)],
    ),
]
#: explicit casts: (query, its values in any order) as Spark 4 answers them
CASTS: list[tuple[str, list[object]]] = [
    ("SELECT CAST(x AS INT) AS y FROM t", [1, 10, 20, None]),
    ("SELECT CAST(x AS TINYINT) AS y FROM t", [1, 10, 20, None]),
    ("SELECT CAST(f AS BIGINT) AS y FROM t", [1, 10, 2, None]),
    ("SELECT CAST(-f AS INT) AS y FROM t", [-1, -10, -2, None]),
    ("SELECT CAST(d AS INT) AS y FROM t", [1, 10, 3, None]),
    ("SELECT CAST(s AS INT) AS y FROM t WHERE s <> 'a'", [1, 10]),
    ("SELECT CAST(' 42 ' AS SMALLINT) AS y FROM t", [42] * 4),
    ("SELECT CAST(b AS INT) AS y FROM t", [0, 1, 1, None]),
    ("SELECT CAST(x AS DOUBLE) AS y FROM t", [1.0, 10.0, 20.0, None]),
    ("SELECT CAST(x AS FLOAT) AS y FROM t", [1.0, 10.0, 20.0, None]),
    ("SELECT CAST(d AS DOUBLE) AS y FROM t", [1.5, 10.0, 3.25, None]),
    ("SELECT CAST('1e3' AS DOUBLE) AS y FROM t", [1000.0] * 4),
    ("SELECT CAST(x AS DECIMAL(5,1)) AS y FROM t", [DEC("1.0"), DEC("10.0"), DEC("20.0"), None]),
    ("SELECT CAST(f AS DECIMAL(4,2)) AS y FROM t", [DEC("1.00"), DEC("10.00"), DEC("2.50"), None]),
    ("SELECT CAST(d AS DECIMAL(3,1)) AS y FROM t", [DEC("1.5"), DEC("10.0"), DEC("3.3"), None]),
    ("SELECT CAST('-1.255' AS DECIMAL(4,2)) AS y FROM t", [DEC("-1.26")] * 4),
    ("SELECT CAST(x AS DECIMAL) AS y FROM t", [DEC(1), DEC(10), DEC(20), None]),
    ("SELECT CAST(x AS STRING) AS y FROM t", ["1", "10", "20", None]),
    ("SELECT CAST(x AS VARCHAR(3)) AS y FROM t", ["1", "10", "20", None]),
    ("SELECT CAST(f AS STRING) AS y FROM t", ["1.0", "10.0", "2.5", None]),
    ("SELECT CAST(d AS STRING) AS y FROM t", ["1.50", "10.00", "3.25", None]),
    ("SELECT CAST(dt AS STRING) AS y FROM t", ["2020-01-01", "2020-01-06", "2021-01-01", None]),
    (
        "SELECT CAST(ts AS STRING) AS y FROM t",
        ["2020-01-01 05:00:00", "2020-01-06 00:00:00", "2021-01-01 00:00:00", None],
    ),
    ("SELECT CAST(b AS STRING) AS y FROM t", ["false", "true", "true", None]),
    ("SELECT CAST(ts AS DATE) AS y FROM t", [D(2020, 1, 1), D(2020, 1, 6), D(2021, 1, 1), None]),
    ("SELECT CAST('2020-01-06' AS DATE) AS y FROM t", [D(2020, 1, 6)] * 4),
    ("SELECT CAST(dt AS TIMESTAMP_NTZ) AS y FROM t", [TS(2020, 1, 1), TS(2020, 1, 6), TS(2021, 1, 1), None]),
    (
        "SELECT CAST('2020-01-06 10:11:12.5' AS TIMESTAMP_NTZ) AS y FROM t",
        [TS(2020, 1, 6, 10, 11, 12, 500000)] * 4,
    ),
    ("SELECT dt FROM t WHERE dt = DATE '2020-01-06'", [D(2020, 1, 6)]),
    ("SELECT dt FROM t WHERE dt < DATE '2020-06-01'", [D(2020, 1, 1), D(2020, 1, 6)]),
    ("SELECT ts FROM t WHERE ts < TIMESTAMP_NTZ '2020-01-02 00:00:00'", [TS(2020, 1, 1, 5)]),
    (
        "SELECT ts FROM t WHERE ts >= CAST(dt AS TIMESTAMP_NTZ)",
        [TS(2020, 1, 1, 5), TS(2020, 1, 6), TS(2021, 1, 1)],
    ),
    ("SELECT dt FROM t WHERE dt < ts", [D(2020, 1, 1)]),
    ("SELECT x FROM t WHERE x = CAST('10' AS BIGINT)", [10]),
    ("SELECT CAST(NULL AS INT) AS y FROM t", [None] * 4),
    ("SELECT sum(CAST(s AS INT)) AS y FROM t WHERE s <> 'a'", [11]),
]
#: explicit casts Spark 4 refuses, and the start of the refusal here
CASTS_REFUSED: list[tuple[str, str]] = [
    (
        "SELECT CAST(x * 10 AS TINYINT) AS y FROM t",
        "the value 200 of the type BIGINT cannot be cast to TINYINT due to an overflow",
    ),
    (
        "SELECT CAST(s AS INT) AS y FROM t",
        "the value 'a' of the type STRING cannot be cast to INT because it is malformed",
    ),
    (
        "SELECT CAST('3000000000' AS INT) AS y FROM t",
        "the value '3000000000' of the type STRING cannot be cast to INT because",
    ),
    ("SELECT CAST(f AS DECIMAL(2,1)) AS y FROM t", "the value 10.0 cannot be represented as DECIMAL(2,1)"),
    ("SELECT CAST(x AS DECIMAL(1,0)) AS y FROM t", "the value 10 cannot be represented as DECIMAL(1,0)"),
    (
        "SELECT CAST(s AS DATE) AS y FROM t WHERE s = '1'",
        "the value '1' of the type STRING cannot be cast to DATE because",
    ),
    (
        "SELECT CAST(1e10 AS INT) AS y FROM t",
        "the value 10000000000.0 of the type DOUBLE cannot be cast to INT due to an overflow",
    ),
    ("SELECT CAST(dt AS INT) AS y FROM t", "cannot cast DATE to INT"),
    ("SELECT CAST(x AS DATE) AS y FROM t", "cannot cast BIGINT to DATE"),
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
    ("SELECT coalesce(s, 5) AS c FROM t", "a", "BIGINT"),
    ("SELECT coalesce(x, 'z') AS c FROM t", "z", "BIGINT"),
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


@pytest.mark.parametrize(("sql", "want"), CASTS)
def test_cast_casts_as_spark_s_ansi_cast(sql: str, want: list[object]) -> None:
    assert values(sql) == sorted(want, key=repr)


@pytest.mark.parametrize(("sql", "refusal"), CASTS_REFUSED)
def test_a_cast_spark_refuses_is_refused(sql: str, refusal: str) -> None:
    with pytest.raises(ExecutionError) as caught:
        values(sql)
    assert refusal in str(caught.value)


def test_the_types_of_casts_are_their_targets() -> None:
    for text, name, arrow in [
        ("1", "TINYINT", pa.int8()),
        ("1", "SMALLINT", pa.int16()),
        ("1", "DECIMAL(7,3)", pa.decimal128(7, 3)),
        ("1", "FLOAT", pa.float32()),
        ("2020-01-01", "TIMESTAMP", pa.timestamp("us", "UTC")),
    ]:
        got = distributed(parse_sql(f"SELECT CAST('{text}' AS {name}) AS y FROM t"), split(TABLE, [2]))
        assert got is not None and got.schema.field(0).type == arrow, name


def test_a_zoned_timestamp_compares_with_one_without_a_zone_read_in_utc() -> None:
    got = distributed(
        parse_sql("SELECT ts FROM t WHERE ts < TIMESTAMP '2020-01-01 05:00:01'"), split(TABLE, [2])
    )
    assert got is not None and got.column(0).to_pylist() == [TS(2020, 1, 1, 5)]


def test_a_plan_s_cast_to_an_unknown_type_is_refused() -> None:
    with pytest.raises(ExecutionError, match="CAST to 'INTERVAL': no such type"):
        casts.cast(pa.array([1]), pa.scalar("INTERVAL"))
    with pytest.raises(ExecutionError, match="the name of a type"):
        casts.cast(pa.array([1]), pa.array(["INT"]))


def test_timestamps_of_other_units_and_dates_compare_without_losing_nanoseconds() -> None:
    # Pandas gives nanosecond timestamps: one nanosecond past midnight is after a microsecond midnight, and a
    # cast to one kind of timestamp must not refuse the nanoseconds it cannot keep.
    ns = pa.array([1_577_836_800_000_000_001, None], pa.timestamp("ns"))
    midnight = TS(2020, 1, 1)
    assert apply("gt", [ns, pa.scalar(midnight, pa.timestamp("us"))]).to_pylist() == [True, None]
    zoned = pa.scalar(midnight.replace(tzinfo=datetime.UTC), pa.timestamp("us", "UTC"))
    assert apply("gt", [ns, zoned]).to_pylist() == [True, None]
    assert apply("gt", [ns, pa.scalar("2020-01-01")]).to_pylist() == [True, None]
    assert apply("eq", [pa.array([D(2020, 1, 1)]), pa.scalar(midnight, pa.timestamp("ns"))]).to_pylist() == [
        True
    ]
    paris = pa.scalar(midnight.replace(tzinfo=datetime.UTC), pa.timestamp("us", "Europe/Paris"))
    assert apply("eq", [pa.array([D(2020, 1, 1)]), paris]).to_pylist() == [True]  # the date's midnight in UTC
    assert apply("cast", [ns, pa.scalar("TIMESTAMP_NTZ")]).to_pylist() == [midnight, None]
    assert apply("cast", [ns, pa.scalar("DATE")]).to_pylist() == [D(2020, 1, 1), None]
