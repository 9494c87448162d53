"""Spark SQL's casts (ANSI mode, Spark 4's default) over Arrow values, and the implicit ones it applies where a
STRING meets a value of another type.

Implicit casts (``coerced``), as Spark 4 answers them (each checked against Spark 4.0 in local mode):

- A comparison (``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``, so BETWEEN too) or an IN list with a STRING on one
  side and an integer, DOUBLE/FLOAT, DECIMAL, DATE, TIMESTAMP or BOOLEAN on the other reads the STRING as
  that type: ``x = '10'``, ``dt > '2020-01-05'``, ``ts >= '2020-01-06 12:00'``, ``b = 'yes'``. Integers read
  as BIGINT (``i = '3000000000'`` of an INT column is false, not an error), decimals exactly.
- Arithmetic (``+ - * / %``) with a STRING reads it as BIGINT beside an integer, else as DOUBLE
  (``x + '1'`` is a BIGINT, ``d + '1'`` of a DECIMAL a DOUBLE); ``-'5'`` and ``abs('-5')`` are DOUBLEs.
- COALESCE with a STRING reads it as a comparison does, but beside a DECIMAL as a DOUBLE (and the DECIMAL
  too): ``coalesce(x, '5')`` is a BIGINT, ``coalesce(d, '1')`` a DOUBLE.
- The string functions (LENGTH, UPPER, LOWER, LIKE) read a number, DATE, TIMESTAMP or BOOLEAN as the text
  Spark's cast to STRING writes (``length(1.0)`` is 3: ``'1.0'``).

A STRING that does not read as the type is an error naming it, as Spark's CAST_INVALID_INPUT: ``x = 'abc'``
or ``x = '10.0'`` of a BIGINT ``x``. What reads (``read_text``): surrounding whitespace and control
characters are trimmed; an integer is ``[+-]digits`` within BIGINT; a DOUBLE is a decimal number with an
optional exponent and an optional ``d``/``f`` suffix (as Java reads it), or ``inf``, ``infinity``, ``nan``
in any case and sign; a DECIMAL is a decimal number with an optional exponent; a DATE is ``yyyy``,
``yyyy-[m]m``, ``yyyy-[m]m-[d]d``, or that followed by a space or ``T`` and anything; a TIMESTAMP is a date
as above optionally followed by a space or ``T`` and ``[h]h[:[m]m[:[s]s[.fraction]]]``, the fraction
truncated to microseconds. A zone suffix (``Z``, ``+hh:mm``) is refused for a timestamp without a time zone,
as Spark refuses it for TIMESTAMP_NTZ; beside a timestamp with a time zone a time without a zone is read in
UTC (Spark reads it in the session's time zone; sparkbus has no session time zone). Java's hexadecimal
floating-point form is not read.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.query.errors import ExecutionError

#: A pyarrow array, chunked array or scalar (pyarrow ships no type hints).
Value = Any

_BOOL = pa.bool_()

#: what Spark SQL's casts of a string trim first (``UTF8String.trimAll``: bytes up to the space, and DEL)
TRIMMED = "".join(map(chr, range(33))) + chr(127)
#: the values Spark's CAST of a (trimmed) string to BOOLEAN takes, in any case; any other is an error
_TRUE_TEXT = pa.array(["t", "true", "y", "yes", "1"])
_FALSE_TEXT = pa.array(["f", "false", "n", "no", "0"])

_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "in"})
_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "mod"})
_UNARY_NUMERIC = frozenset({"neg", "abs"})
_STRING_FUNCTIONS = frozenset({"length", "upper", "lower", "like"})

_INT = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_FLOAT = re.compile(r"(" + _DECIMAL.pattern + r")[dDfF]?")
_FLOAT_SPECIAL = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
_DATE = re.compile(r"(\d{4})(?:-(\d{1,2})(?:-(\d{1,2})(?:[ T].*)?)?)?", re.DOTALL)
_TIMESTAMP = re.compile(
    r"(\d{4})(?:-(\d{1,2})(?:-(\d{1,2})"
    r"(?:[ T](\d{1,2})(?::(\d{1,2})(?::(\d{1,2})(?:\.(\d*))?)?)?)?"
    r"\s*(Z|UTC|[+-]\d{1,2}(?::?\d{2})?)?)?)?"
)


_is_bool = pa.types.is_boolean


def is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def spark_type(t: pa.DataType) -> str:
    """The name Spark SQL gives the type of Arrow type ``t`` (Arrow's null type is Spark's VOID)."""
    names = {
        pa.null(): "VOID",
        pa.bool_(): "BOOLEAN",
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.string(): "STRING",
        pa.large_string(): "STRING",
        pa.date32(): "DATE",
    }
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    return names.get(t, str(t).upper())


def malformed(value: object, target: str) -> ExecutionError:
    """Spark's CAST_INVALID_INPUT, for ``value`` (a string) that does not read as the type ``target``."""
    return ExecutionError(
        f"the value {value!r} of the type STRING cannot be cast to {target} because it is malformed "
        "(as Spark SQL's CAST_INVALID_INPUT)"
    )


def per_value(kernel: Callable[[Value], Value]) -> Callable[[Value], Value]:
    """``kernel`` (over arrays) applied to a scalar too, as a one-value array."""

    def run(x: Value) -> Value:
        if isinstance(x, pa.Scalar):
            return kernel(pa.array([x.as_py()], x.type))[0]
        return kernel(x)

    return run


@per_value
def to_boolean(x: Value) -> Value:
    """``CAST(x AS BOOLEAN)`` as Spark SQL (ANSI) casts: a number is TRUE unless it is 0 (NaN is TRUE), a
    string is trimmed and read case-insensitively as t, true, y, yes, 1 or f, false, n, no, 0, NULL stays
    NULL.

    Raises:
        ExecutionError: any other string (Spark's CAST_INVALID_INPUT), any other type.
    """
    t = x.type
    if pa.types.is_boolean(t):
        return x
    if pa.types.is_null(t):
        return x.cast(_BOOL)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return pc.not_equal(x, pa.scalar(decimal.Decimal(0) if pa.types.is_decimal(t) else 0, t))
    if is_text(t):
        read = pc.utf8_lower(pc.utf8_trim(x, characters=TRIMMED))
        true, false = pc.is_in(read, value_set=_TRUE_TEXT), pc.is_in(read, value_set=_FALSE_TEXT)
        bad = pc.and_(pc.is_valid(x), pc.invert(pc.or_(true, false)))
        if pc.any(bad).as_py():
            raise malformed(pc.filter(x, bad)[0].as_py(), "BOOLEAN")
        return pc.if_else(pc.is_valid(x), true, pa.scalar(None, _BOOL))
    raise ExecutionError(f"cannot cast {spark_type(t)} to BOOLEAN")


# ---------------------------------------------------------------- reading strings


def _read_int(text: str) -> int:
    if not _INT.fullmatch(text):
        raise ValueError
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError
    return value


def _read_float(text: str) -> float:
    special = _FLOAT_SPECIAL.get(text.lstrip("+-").lower())
    if special is not None:
        return -special if text.startswith("-") else special
    found = _FLOAT.fullmatch(text)
    if not found:
        raise ValueError
    return float(found.group(1))


def _read_decimal(text: str) -> decimal.Decimal:
    if not _DECIMAL.fullmatch(text):
        raise ValueError
    value = decimal.Decimal(text)
    digits, exponent = len(value.as_tuple().digits), int(value.as_tuple().exponent)
    if max(digits, digits - exponent, -exponent) > 38:  # no DECIMAL holds it
        raise ValueError
    return value


def _read_date(text: str) -> datetime.date:
    found = _DATE.fullmatch(text)
    if not found:
        raise ValueError
    year, month, day = found.groups()
    return datetime.date(int(year), int(month or 1), int(day or 1))


def _read_timestamp(text: str, zoned: bool) -> datetime.datetime:
    found = _TIMESTAMP.fullmatch(text)
    if not found:
        raise ValueError
    year, month, day, hour, minute, second, fraction, zone = found.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    value = datetime.datetime(
        int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0), int(second or 0), micros
    )
    if zone is None:
        return value.replace(tzinfo=datetime.UTC) if zoned else value
    if not zoned:
        raise ValueError  # as Spark's cast to TIMESTAMP_NTZ: a zone is malformed there
    if zone in ("Z", "UTC"):
        return value.replace(tzinfo=datetime.UTC)
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    hours, minutes = (int(digits), 0) if len(digits) <= 2 else (int(digits[:-2]), int(digits[-2:]))
    offset = datetime.timedelta(hours=hours, minutes=minutes)
    if offset > datetime.timedelta(hours=18):
        raise ValueError
    return value.replace(tzinfo=datetime.timezone(sign * offset))


def read_text(text: str, target: pa.DataType) -> object:
    """The value the string ``text`` reads as in Arrow type ``target`` (an integer type reads as int64, a
    float type as float64, a decimal type exactly), as Spark's ANSI cast of a STRING reads it (the module's
    docstring says what reads).

    Raises:
        ExecutionError: ``text`` does not read as ``target`` (CAST_INVALID_INPUT).
    """
    trimmed = text.strip(TRIMMED)
    try:
        if pa.types.is_integer(target):
            return _read_int(trimmed)
        if pa.types.is_floating(target):
            return _read_float(trimmed)
        if pa.types.is_decimal(target):
            return _read_decimal(trimmed)
        if pa.types.is_date(target):
            return _read_date(trimmed)
        if pa.types.is_timestamp(target):
            return _read_timestamp(trimmed, target.tz is not None)
    except (ValueError, OverflowError, decimal.InvalidOperation):
        pass
    raise malformed(text, spark_type(_read_type(target)))


def _read_type(target: pa.DataType) -> pa.DataType:
    """The Arrow type a string read as ``target`` is held in: BIGINT for an integer type, DOUBLE for a float
    one, a timestamp of microseconds in ``target``'s zone; a decimal type is the value's own (``_decimals``)."""
    if pa.types.is_integer(target):
        return pa.int64()
    if pa.types.is_floating(target):
        return pa.float64()
    if pa.types.is_timestamp(target):
        return pa.timestamp("us", target.tz)
    return target


def _decimals(values: Sequence[decimal.Decimal | None]) -> pa.DataType:
    """The narrowest decimal type that holds every one of ``values`` exactly."""
    whole, scale = 1, 0
    for v in values:
        if v is not None:
            digits, exponent = len(v.as_tuple().digits), int(v.as_tuple().exponent)
            whole, scale = max(whole, digits + exponent), max(scale, -exponent)
    if whole + scale > 38:
        raise ExecutionError(f"the values {list(values)[:3]} need more than 38 digits as one DECIMAL")
    return pa.decimal128(max(1, whole + scale), scale)


def cast_text(x: Value, target: pa.DataType) -> Value:
    """The strings of ``x`` (a scalar, an array or a chunked array) read as ``target`` (``read_text``), NULL
    staying NULL: each distinct string is read once.

    Raises:
        ExecutionError: a string that does not read as ``target``.
    """
    if isinstance(x, pa.Scalar):
        value = None if not x.is_valid else read_text(x.as_py(), target)
        out = _decimals([value]) if pa.types.is_decimal(target) else _read_type(target)  # type: ignore[list-item]
        return pa.scalar(value, out)
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    distinct = pc.unique(x)
    read = [None if v is None else read_text(v, target) for v in distinct.to_pylist()]
    out = _decimals(read) if pa.types.is_decimal(target) else _read_type(target)  # type: ignore[arg-type]
    return pc.take(pa.array(read, out), pc.index_in(x, value_set=distinct))


# ---------------------------------------------------------------- writing strings


def _java_double(v: float) -> str:
    """``v`` as Java's ``Double.toString`` writes it (and so Spark's cast of a DOUBLE to STRING): the shortest
    digits that read back as ``v``, plain from 10**-3 up to 10**7 (always with a fraction: ``1.0``), else
    ``d.dddE[-]n``; ``NaN``, ``Infinity``, ``-Infinity``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0 or 1e-3 <= abs(v) < 1e7:
        text = repr(v)
        if "e" in text:  # Python writes 1e-03 and the like in exponent form where Java does not
            text = f"{decimal.Decimal(text):f}"
        return text if "." in text else text + ".0"
    sign, digits, exponent = decimal.Decimal(repr(v)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    power = len(digits) + int(exponent) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def _timestamp_text(v: datetime.datetime) -> str:
    """A timestamp as Spark's cast to STRING writes it: ``yyyy-MM-dd HH:mm:ss``, then the fraction of a
    second without its trailing zeros (a zoned one in UTC, sparkbus's session time zone)."""
    if v.tzinfo is not None:
        v = v.astimezone(datetime.UTC)
    text = v.strftime("%Y-%m-%d %H:%M:%S")
    return text + f".{v.microsecond:06d}".rstrip("0") if v.microsecond else text


def _per_distinct(x: Value, f: Callable[[Any], Any], out: pa.DataType) -> Value:
    """``f`` over each distinct non-NULL value of ``x`` (as Python values), NULL staying NULL."""
    if isinstance(x, pa.Scalar):
        return pa.scalar(None if not x.is_valid else f(x.as_py()), out)
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    distinct = pc.unique(x)
    mapped = pa.array([None if v is None else f(v) for v in distinct.to_pylist()], out)
    return pc.take(mapped, pc.index_in(x, value_set=distinct))


def to_text(x: Value) -> Value:
    """``x`` as Spark SQL's cast to STRING writes it: Arrow's cast for integers, decimals, dates and booleans
    (which write as Spark does), Java's form for floats, ``yyyy-MM-dd HH:mm:ss[.f]`` for timestamps.

    Raises:
        ExecutionError: a type with no text here (binary, nested, durations, times).
    """
    t = x.type
    if is_text(t):
        return x
    if any(
        f(t)
        for f in (pa.types.is_null, pa.types.is_integer, pa.types.is_decimal, _is_bool, pa.types.is_date32)
    ):
        return pc.cast(x, pa.string())  # Arrow writes these as Spark does
    if pa.types.is_floating(t):
        return _per_distinct(x, _java_double, pa.string())
    if pa.types.is_timestamp(t):
        return _per_distinct(x, _timestamp_text, pa.string())
    raise ExecutionError(f"cannot cast {spark_type(t)} to STRING")


# ---------------------------------------------------------------- implicit casts


def _readable(t: pa.DataType) -> bool:
    """A type a STRING beside it in a comparison is read as."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_boolean(t)
    )


_UNITS = ["s", "ms", "us", "ns"]


def _temporal(args: Sequence[Value]) -> Sequence[Value]:
    """Compared DATEs and TIMESTAMPs in one type, as Spark compares them: a DATE beside a TIMESTAMP is its
    midnight, a TIMESTAMP without a zone beside one with a zone is read in UTC (sparkbus's session time
    zone), where Arrow compares neither."""
    stamps = [a.type for a in args if pa.types.is_timestamp(a.type)]
    dates = any(pa.types.is_date32(a.type) for a in args)
    if not stamps or (not dates and len({t.tz is None for t in stamps}) == 1):
        return args  # Arrow compares timestamps of one kind in any units
    zone = next((t.tz for t in stamps if t.tz is not None), None)
    target = pa.timestamp(max((t.unit for t in stamps), key=_UNITS.index), zone)  # the finest: no value cut
    return [
        _to_timestamp(a, target) if pa.types.is_date32(a.type) or pa.types.is_timestamp(a.type) else a
        for a in args
    ]


def coerced(op: str, args: Sequence[Value]) -> Sequence[Value]:
    """``args`` of operator ``op`` with the implicit casts Spark SQL applies where a STRING meets another type
    (the module's docstring lists them); ``args`` itself when there is none to apply.

    Raises:
        ExecutionError: a STRING that does not read as the type it is cast to (CAST_INVALID_INPUT).
    """
    if op in _STRING_FUNCTIONS:
        first = args[0]
        if is_text(first.type) or pa.types.is_null(first.type):
            return args
        return [to_text(first), *args[1:]]
    if op in _COMPARISONS:
        args = _temporal(args)
    texts = [is_text(a.type) for a in args]
    if not any(texts):
        return args
    if op in _COMPARISONS:
        other = next((a.type for a in args if _readable(a.type)), None)
        if other is None:
            return args
        return _read_as(args, texts, other)
    if op == "coalesce":  # as a comparison, but a DECIMAL beside a STRING is a DOUBLE, as in arithmetic
        other = next((a.type for a in args if _readable(a.type)), None)
        if other is None:
            return args
        read = _read_as(args, texts, other)
        return [pc.cast(a, pa.float64()) for a in read] if pa.types.is_decimal(other) else read
    if op in _ARITHMETIC or op in _UNARY_NUMERIC:
        integer = op in _ARITHMETIC and any(pa.types.is_integer(a.type) for a in args)
        return _read_as(args, texts, pa.int64() if integer else pa.float64())
    return args


def _read_as(args: Sequence[Value], texts: Sequence[bool], other: pa.DataType) -> list[Value]:
    """``args`` with those that are STRINGs (``texts``) read as ``other`` (a BOOLEAN as CAST reads it)."""
    read: Callable[[Value], Value] = (
        to_boolean if pa.types.is_boolean(other) else lambda a: cast_text(a, other)
    )
    return [read(a) if text else a for a, text in zip(args, texts, strict=True)]


# ---------------------------------------------------------------- explicit casts

#: the names a CAST's target is written as in a plan (``["call", "cast", [x, ["lit", name]]]``), and their
#: Arrow types; a DECIMAL is written ``DECIMAL(p,s)``
CAST_TYPES: dict[str, pa.DataType] = {
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INT": pa.int32(),
    "BIGINT": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us", "UTC"),
    "TIMESTAMP_NTZ": pa.timestamp("us"),
}
_DECIMAL_NAME = re.compile(r"DECIMAL\((\d{1,2}),(\d{1,2})\)")


def cast_type(name: str) -> pa.DataType:
    """The Arrow type of the CAST target ``name`` (a key of ``CAST_TYPES`` or ``DECIMAL(p,s)``).

    Raises:
        ExecutionError: no such target.
    """
    found = CAST_TYPES.get(name)
    if found is not None:
        return found
    decimal_name = _DECIMAL_NAME.fullmatch(name)
    if decimal_name:
        precision, scale = int(decimal_name.group(1)), int(decimal_name.group(2))
        if 1 <= precision <= 38 and scale <= precision:
            return pa.decimal128(precision, scale)
    raise ExecutionError(f"CAST to {name!r}: no such type (known: {', '.join(CAST_TYPES)}, DECIMAL(p,s))")


def _overflow(value: object, source: pa.DataType, target: pa.DataType) -> ExecutionError:
    return ExecutionError(
        f"the value {value!r} of the type {spark_type(source)} cannot be cast to {spark_type(target)} due to an "
        "overflow (as Spark SQL's CAST_OVERFLOW)"
    )


def _to_integer(x: Value, target: pa.DataType) -> Value:
    t = x.type
    bits = target.bit_width - 1
    low, high = -(1 << bits), (1 << bits) - 1

    def whole(v: Any) -> int:
        if isinstance(v, str):
            try:
                n = read_text(v, pa.int64())
            except ExecutionError:
                n = None
            if not isinstance(n, int) or not low <= n <= high:
                raise malformed(v, spark_type(target)) from None
            return n
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            raise _overflow(v, t, target)
        n = int(v)  # toward zero, as Spark truncates a DOUBLE or a DECIMAL
        if not low <= n <= high:
            raise _overflow(v, t, target)
        return n

    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        try:
            return pc.cast(x, target)  # a safe cast: one that does not fit is refused
        except pa.ArrowInvalid:
            return _per_distinct(x, whole, target)  # names the value that overflows
    if pa.types.is_floating(t) or pa.types.is_decimal(t) or is_text(t):
        return _per_distinct(x, whole, target)
    raise ExecutionError(f"cannot cast {spark_type(t)} to {spark_type(target)}")


def _to_decimal(x: Value, target: pa.Decimal128Type) -> Value:
    t = x.type
    quantum = decimal.Decimal(1).scaleb(-target.scale)
    limit = decimal.Decimal(10) ** (target.precision - target.scale)

    def exact(v: Any) -> decimal.Decimal:
        if isinstance(v, str):
            d = read_text(v, target)
        elif isinstance(v, float):
            if math.isnan(v) or math.isinf(v):
                raise _overflow(v, t, target)
            d = decimal.Decimal(repr(v))
        else:
            d = decimal.Decimal(int(v) if isinstance(v, bool) else v)
        assert isinstance(d, decimal.Decimal)
        with decimal.localcontext() as ctx:
            ctx.prec = 100
            rounded = d.quantize(quantum, decimal.ROUND_HALF_UP)
        if abs(rounded) >= limit:
            raise ExecutionError(
                f"the value {v!r} cannot be represented as {spark_type(target)} (as Spark SQL's "
                "NUMERIC_VALUE_OUT_OF_RANGE)"
            )
        return rounded

    if is_text(t) or any(
        f(t) for f in (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, _is_bool)
    ):
        return _per_distinct(x, exact, target)
    raise ExecutionError(f"cannot cast {spark_type(t)} to {spark_type(target)}")


def _to_float(x: Value, target: pa.DataType) -> Value:
    t = x.type
    if is_text(t):
        return pc.cast(cast_text(x, pa.float64()), target, safe=False)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t):
        return pc.cast(x, target, safe=False)  # rounded as Spark rounds, never refused
    raise ExecutionError(f"cannot cast {spark_type(t)} to {spark_type(target)}")


def _to_date(x: Value) -> Value:
    t = x.type
    if is_text(t):
        return cast_text(x, pa.date32())
    if pa.types.is_date32(t):
        return x
    if pa.types.is_timestamp(t):
        if t.tz is not None:  # the day in UTC, sparkbus's session time zone
            x = pc.cast(x, pa.timestamp(t.unit))
        return pc.cast(x, pa.date32())
    raise ExecutionError(f"cannot cast {spark_type(t)} to DATE")


def _to_timestamp(x: Value, target: pa.TimestampType) -> Value:
    """``x`` (a STRING, DATE or TIMESTAMP) as a timestamp of ``target``'s type: a DATE is its midnight, a
    zoneless TIMESTAMP given a zone is read in UTC, a zoned one losing its zone is its UTC wall clock (UTC
    being sparkbus's session time zone); a finer unit is truncated."""
    t = x.type
    if is_text(t):
        return cast_text(x, target)
    if pa.types.is_date32(t):
        x, t = pc.cast(x, pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(t):
        if t.tz is None and target.tz is not None:
            x = pc.assume_timezone(x, "UTC")
        elif t.tz is not None and target.tz is None:
            x = pc.cast(x, pa.timestamp(t.unit))  # Arrow keeps the instant: its UTC wall clock
        return pc.cast(x, target, safe=False)
    raise ExecutionError(f"cannot cast {spark_type(t)} to {spark_type(target)}")


def cast(x: Value, name: Value) -> Value:
    """``CAST(x AS name)`` as Spark SQL's ANSI cast (``name`` a string scalar: ``cast_type``): a STRING is read
    as ``read_text`` reads it; a DOUBLE or DECIMAL to an integer type is truncated toward zero; to a DECIMAL a
    value is rounded half up at its scale; a value that does not fit is an error (CAST_OVERFLOW,
    NUMERIC_VALUE_OUT_OF_RANGE); to STRING as ``to_text`` writes it; a TIMESTAMP to DATE is its day (in UTC
    for a zoned one). NULL stays NULL.

    Raises:
        ExecutionError: a value that does not read or fit, a cast Spark refuses (a DATE to an integer).
    """
    target_name = name.as_py() if isinstance(name, pa.Scalar) else None
    if not isinstance(target_name, str):
        raise ExecutionError("CAST takes the name of a type as its second argument")
    target = cast_type(target_name)
    if pa.types.is_null(x.type):
        return x.cast(target)
    if pa.types.is_integer(target):
        return _to_integer(x, target)
    if pa.types.is_floating(target):
        return _to_float(x, target)
    if pa.types.is_decimal(target):
        return _to_decimal(x, target)
    if is_text(target):
        return to_text(x)
    if pa.types.is_date32(target):
        return _to_date(x)
    return _to_timestamp(x, target)
