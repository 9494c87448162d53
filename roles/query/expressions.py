"""Scalar expressions as small trees, their msgpack-able form, and their vectorised evaluation.

Plain form (msgpack arrays): ``["col", name]``, ``["lit", value]``, ``["param", index]``,
``["call", op, [args...]]``. Evaluation maps each operator to a ``pyarrow.compute`` kernel over whole
columns (``%`` of doubles to NumPy's ``fmod``); nothing loops over rows.

Semantics where SQL engines differ (chosen to match Spark SQL with ANSI mode, the engine sparkbus sits
next to): ``/`` always divides as float64 and division (or modulo) by zero is an error; ``%`` is Java's
remainder; ``AND``/``OR`` use three-valued (Kleene) logic; comparisons with NULL are NULL; NaN equals NaN
and is above every other double, and IN takes -0.0 for 0.0 (``_nan_aware``, ``normalised``); an untyped
NULL takes its type from its context, and a BIGINT beside a DOUBLE is cast to DOUBLE (``_typed``); a STRING
beside a number, date, timestamp or boolean is read as that type (``casts.coerced``).
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.query.casts import cast, coerced, spark_type, to_boolean
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, PlanError, QueryError

Scalar = int | float | str | bool | None
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: the most terms an AND or OR takes (a chain ``a OR b OR c ...`` is one call), and the most values of an IN
#: list: generous for generated SQL, while parsing such a text still takes under a second (sqlglot)
MAX_TERMS = 16_384
#: the deepest an expression nests (a chain of AND or OR terms is one level)
MAX_DEPTH = 64
#: A pyarrow array, chunked array or scalar (pyarrow ships no type hints).
Value: TypeAlias = Any


def is_literal_value(value: object) -> bool:
    """What a literal or a query parameter can hold (``Scalar``): None, a bool, an int, a float or a str."""
    return value is None or isinstance(value, bool | int | float | str)


def fold(name: str) -> str:
    """A name as SQL compares names: case-insensitively, as Spark SQL does by default
    (``spark.sql.caseSensitive=false``)."""
    return name.lower()


def resolve(name: str, names: Sequence[str], what: str = "column") -> str | None:
    """The one of ``names`` that ``name`` means, compared case-insensitively (``fold``); None if none.

    As in Spark SQL, a name that several of ``names`` match (they differ only in case) is ambiguous, even
    when one of them is spelt as ``name`` is.

    Raises:
        ExecutionError: the name is ambiguous.
    """
    key = fold(name)
    found = [n for n in names if n == name or fold(n) == key]
    if len(found) > 1:
        raise ExecutionError(f"{what} name {name!r} is ambiguous: it could be any of {found}")
    return found[0] if found else None


def fits_int32(value: object) -> bool:
    """An integer (not a bool) that int32 (SQL's INT) holds."""
    return type(value) is int and -(1 << 31) <= value < (1 << 31)


def scalar(value: Scalar) -> Value:
    """A literal's (or a parameter's) value as Arrow evaluates it: an integer is an INT (int32) when it fits,
    else a BIGINT, as Spark SQL types integer literals, so ``i + 1`` over an INT column stays INT and
    overflows as Spark's does (Arrow widens the INT against a BIGINT column as before)."""
    return pa.scalar(value, pa.int32()) if fits_int32(value) else pa.scalar(value)


def outside_int64(value: object) -> bool:
    """An integer that int64 (SQL's BIGINT) cannot hold."""
    return isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """A column of the operator's input, by name."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError("col", f"column name must be a non-empty str, got {self.name!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Literal:
    """A constant."""

    value: Scalar

    def __post_init__(self) -> None:
        if not is_literal_value(self.value):
            raise PlanError(
                "lit", f"literal must be int, float, str, bool or None, got {type(self.value).__name__}"
            )
        if type(self.value) is int and outside_int64(self.value):
            raise PlanError("lit", f"integer literal {self.value} is outside int64")


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    """The query parameter at ``index`` (``?`` in SQL, numbered from 0 left to right)."""

    index: int

    def __post_init__(self) -> None:
        if type(self.index) is not int or self.index < 0:
            raise PlanError("param", f"parameter index must be an int >= 0, got {self.index!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """An operator or function applied to arguments."""

    op: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        spec = OPS.get(self.op)
        if spec is None:
            raise PlanError(f"call[{self.op!r}]", f"unknown operator; known: {', '.join(sorted(OPS))}")
        low, high = spec.arity
        if not low <= len(self.args) <= high:
            want = str(low) if low == high else f"{low}..{high}"
            raise PlanError(f"call[{self.op!r}]", f"takes {want} arguments, got {len(self.args)}")


Expr = Column | Literal | Param | Call


def _double(v: Value) -> Value:
    """``v`` as float64, as Spark casts a BIGINT to DOUBLE: rounded beyond 2**53, never an error (Arrow's
    safe cast refuses such integers)."""
    return pc.cast(v, pa.float64(), safe=False)


def _div(a: Value, b: Value) -> Value:
    return pc.divide_checked(_double(a), _double(b))


def _mod(a: Value, b: Value) -> Value:
    """SQL's ``%`` as Java's (and so Spark's): the remainder of truncating division, with the dividend's sign.

    Older pyarrow (the project takes 14 and later) has no remainder kernel. Integers: ``a - (a / b) * b``,
    where ``x % -1`` divides by 1 instead (the same remainder, 0), as ``INT64_MIN / -1`` overflows.
    Doubles: C's ``fmod``, which is exact; ``a - trunc(a / b) * b`` rounds the quotient (``1e20 % 3`` gave
    0.0, not 1.0). Exact costs: NumPy's ``fmod`` takes about 20 ns a value, ten times that formula.
    """
    if pa.types.is_integer(a.type) and pa.types.is_integer(b.type):
        if pa.types.is_signed_integer(b.type):
            b = pc.if_else(pc.equal(b, -1), pa.scalar(1, b.type), b)
        return pc.subtract(a, pc.multiply(pc.divide_checked(a, b), b))
    if _exact(a.type) and _exact(b.type) and (pa.types.is_decimal(a.type) or pa.types.is_decimal(b.type)):
        return _decimal_mod(a, b)
    (x, x_null), (y, y_null) = _numpy_float64(a), _numpy_float64(b)
    nulls = x_null | y_null  # arrays or NumPy scalars, broadcast against each other
    if bool(np.any((y == 0.0) & ~nulls)):
        raise ExecutionError("mod: divide by zero")
    with np.errstate(invalid="ignore"):  # fmod(inf, y), fmod(x, nan) and the NULLs' fmod(0, 0) are NaN
        out = np.fmod(x, y)
    if isinstance(a, pa.Scalar) and isinstance(b, pa.Scalar):
        return pa.scalar(None if nulls else float(out), pa.float64())
    mask = np.broadcast_to(nulls, out.shape) if bool(np.any(nulls)) else None
    return pa.array(out, pa.float64(), mask=mask)


#: the decimal digits of each integer type, as Spark SQL widens it to a DECIMAL (``DecimalType.forType``)
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}


def _exact(t: pa.DataType) -> bool:
    return bool(pa.types.is_decimal(t) or pa.types.is_integer(t))


def _digits(t: pa.DataType) -> tuple[int, int]:
    """(precision, scale) of a decimal type, or of the DECIMAL Spark SQL widens an integer type to."""
    if pa.types.is_decimal(t):
        return t.precision, t.scale
    return _INT_DIGITS[t.bit_width], 0


def _decimal_mod(a: Value, b: Value) -> Value:
    """``%`` of decimals (or a decimal and an integer), exact, as Spark SQL answers it: typed
    ``DECIMAL(min(p1 - s1, p2 - s2) + max(s1, s2), max(s1, s2))``, the remainder with the dividend's sign.
    Computed in float64 before, it answered wrong digits (``12345678901234567890123.4567890123 % 7`` gave
    0.0, not 3.4567890123)."""
    (p1, s1), (p2, s2) = _digits(a.type), _digits(b.type)
    scale = max(s1, s2)
    out_type = pa.decimal128(max(1, min(38, min(p1 - s1, p2 - s2) + scale)), scale)

    def mod(x: decimal.Decimal, y: decimal.Decimal) -> decimal.Decimal:
        if y == 0:
            raise ExecutionError("mod: divide by zero")
        return x % y

    return _per_decimal(a, b, mod, "mod", out_type)


_PY_OPS: dict[str, Callable[[decimal.Decimal, decimal.Decimal], decimal.Decimal]] = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
}


def _spark_decimal(kernel: Callable[[Value, Value], Value], op: str) -> Callable[[Value, Value], Value]:
    """``kernel`` over decimals (or a decimal and an integer) whose result type passes 38 digits, typed as
    Spark SQL types it (``DecimalPrecision``, precision loss allowed): 38 digits, the scale cut to leave
    room for the integer digits but kept at ``min(scale, 6)`` at least, rounded half up; a value that does
    not fit then is an overflow. Arrow refused the result type ("Decimal precision out of range [1, 38]:
    39": ``c + c`` of a DECIMAL(38, 10)), where Spark answers. Other operands go to ``kernel``."""

    def run(a: Value, b: Value) -> Value:
        if not (_exact(a.type) and _exact(b.type)) or not (
            pa.types.is_decimal(a.type) or pa.types.is_decimal(b.type)
        ):
            return kernel(a, b)
        (p1, s1), (p2, s2) = _digits(a.type), _digits(b.type)
        if op == "mul":
            precision, scale = p1 + p2 + 1, s1 + s2
        else:
            scale = max(s1, s2)
            precision = max(p1 - s1, p2 - s2) + scale + 1
        if precision <= 38:
            try:
                return kernel(a, b)  # Arrow types it as Spark does (an integer as 19 or 20 digits)
            except pa.ArrowInvalid as exc:
                if "precision out of range" not in str(exc):
                    raise
        else:
            scale = max(38 - (precision - scale), min(scale, 6))
        return _per_decimal(a, b, _PY_OPS[op], op, pa.decimal128(min(38, precision), scale))

    return run


def _per_decimal(
    a: Value, b: Value, f: Callable[[Any, Any], Any], op: str, out_type: pa.Decimal128Type
) -> Value:
    """``f`` over the values of ``a`` and ``b`` (arrays or scalars) in Python's decimals, rounded half up to
    ``out_type``'s scale; a value past its precision is ``op``'s overflow."""
    scalars = isinstance(a, pa.Scalar) and isinstance(b, pa.Scalar)
    n = 1 if scalars else len(b if isinstance(a, pa.Scalar) else a)

    def values(v: Value) -> list[Any]:
        return [v.as_py()] * n if isinstance(v, pa.Scalar) else v.to_pylist()

    quantum = decimal.Decimal(1).scaleb(-out_type.scale)
    limit = decimal.Decimal(10) ** (out_type.precision - out_type.scale)
    out: list[decimal.Decimal | None] = []
    with decimal.localcontext() as ctx:
        ctx.prec = 200  # beyond any product of two DECIMAL(38) values: exact before the rounding
        for x, y in zip(values(a), values(b), strict=True):
            if x is None or y is None:
                out.append(None)
                continue
            v = f(decimal.Decimal(x), decimal.Decimal(y))
            if isinstance(v, decimal.Decimal) and not v.is_nan():
                v = v.quantize(quantum, decimal.ROUND_HALF_UP)
                if abs(v) >= limit:
                    raise ExecutionError(f"{op}: overflow (past {out_type})")
            out.append(v)
    return pa.scalar(out[0], out_type) if scalars else pa.array(out, out_type)


def _numpy_float64(v: Value) -> tuple[Any, Any]:
    """The values of ``v`` as float64 (NULLs as 0.0) and where it is NULL: NumPy arrays for an array, NumPy
    scalars for a scalar."""
    v = _double(v)
    if isinstance(v, pa.Scalar):
        return np.float64(v.as_py() or 0.0), np.bool_(not v.is_valid)
    if isinstance(v, pa.ChunkedArray):
        v = v.combine_chunks()
    nulls = v.is_null().to_numpy(zero_copy_only=False) if v.null_count else np.bool_(False)
    return v.fill_null(0.0).to_numpy(), nulls


def normalised(values: Value) -> Value:
    """Float values as Spark SQL groups, counts distinct and matches them in IN (``NormalizeFloatingNumbers``):
    -0.0 is 0.0 and every NaN is the one NaN. Other types are returned as they are."""
    if values.type not in (pa.float32(), pa.float64()):
        return values
    zeroed = pc.add(values, pa.scalar(0.0, values.type))  # -0.0 + 0.0 is 0.0
    return pc.if_else(pc.is_nan(zeroed), pa.scalar(float("nan"), values.type), zeroed)


def _nan_aware(kernel: Callable[[Value, Value], Value], op: str) -> Callable[[Value, Value], Value]:
    """A comparison of doubles as Spark SQL compares them: NaN equals NaN and is above every other double.

    Over other types, ``kernel`` itself. Over floats, ``kernel``'s IEEE answer (where NaN equals nothing and
    orders against nothing) amended where an argument is NaN, with kernels that keep a NULL argument's
    answer NULL (``or_``/``and_``, not Kleene's), whole columns at a time.
    """

    def compare(a: Value, b: Value) -> Value:
        ieee = kernel(a, b)
        if not (pa.types.is_floating(a.type) or pa.types.is_floating(b.type)):
            return ieee
        nan_a, nan_b = pc.is_nan(a), pc.is_nan(b)
        if op == "eq":
            return pc.or_(ieee, pc.and_(nan_a, nan_b))
        if op == "ne":
            return pc.and_(ieee, pc.invert(pc.and_(nan_a, nan_b)))
        if op == "gt":
            return pc.or_(ieee, pc.and_(nan_a, pc.invert(nan_b)))
        if op == "lt":
            return pc.or_(ieee, pc.and_(pc.invert(nan_a), nan_b))
        return pc.or_(ieee, nan_a if op == "ge" else nan_b)  # NaN >= anything, anything <= NaN

    return compare


def _in(x: Value, *items: Value) -> Value:
    values = pa.array([i.as_py() if isinstance(i, pa.Scalar) else i for i in items if _is_scalar(i)])
    if len(values) != len(items):
        raise ExecutionError("IN takes a list of constants")
    x, values = (normalised(v) for v in _typed([x, values]))  # Spark: -0.0 IN (0.0), NaN IN (NaN)
    found = pc.is_in(x, value_set=pc.drop_null(values)) if len(values) else pc.is_in(x, value_set=values)
    # SQL: x IN (...) is NULL when x is NULL, or when not found and the list holds a NULL.
    result = pc.if_else(pc.is_null(x), pa.scalar(None, pa.bool_()), found)
    if values.null_count:
        result = pc.if_else(result, True, pa.scalar(None, pa.bool_()))
    return result


def _is_scalar(v: Any) -> bool:
    return isinstance(v, pa.Scalar)


#: what a regular expression (RE2, Arrow's) reads as other than itself; every other character is literal
_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def like_regex(pattern: str) -> str:
    """The anchored regular expression of a LIKE pattern, as Spark SQL's ``StringUtils.escapeLikeRegex``
    translates it: ``%`` is any text, ``_`` any one character (newlines too), a backslash makes the ``_``,
    ``%`` or backslash after it literal, every other character is itself.

    Raises:
        QueryError: ``PARSING`` for a backslash before any other character or at the end of the pattern,
            which Spark refuses (INVALID_FORMAT.ESC_IN_THE_MIDDLE, ESC_AT_THE_END).
    """
    out, i = ["(?s)^"], 0
    while i < len(pattern):
        c = pattern[i]
        i += 1
        if c == "\\":
            if i == len(pattern):
                raise QueryError(
                    ErrorCode.PARSING,
                    f"LIKE pattern '{pattern}' is invalid: the escape character \\ is not allowed at its end",
                )
            c = pattern[i]
            i += 1
            if c not in "_%\\":
                raise QueryError(
                    ErrorCode.PARSING,
                    f"LIKE pattern '{pattern}' is invalid: the escape character \\ is not allowed to precede "
                    f"'{c}' (only _, % and \\)",
                )
            out.append("\\" + c if c in _REGEX_SPECIAL else c)
        elif c == "%":
            out.append(".*")
        elif c == "_":
            out.append(".")
        else:
            out.append("\\" + c if c in _REGEX_SPECIAL else c)
    out.append("$")
    return "".join(out)


def _like(x: Value, pattern: Value) -> Value:
    """``x LIKE pattern``. A pattern without a backslash goes to Arrow's ``match_like``; one with a backslash
    is translated (``like_regex``) and matched as a regular expression, because ``match_like``'s shortcut
    for ``%text`` keeps the escape (``'%\\\\'``, ending with one backslash, matched nothing)."""
    text = pattern.as_py() if isinstance(pattern, pa.Scalar) else pattern
    if text is None:
        return pa.scalar(None, pa.bool_())  # x LIKE NULL is NULL
    if not isinstance(text, str):
        raise ExecutionError("LIKE needs a constant string pattern")
    if "\\" not in text:
        return pc.match_like(x, text)
    return pc.match_substring_regex(x, like_regex(text))


def _cased(kernel: Callable[[Value], Value], python: Callable[[str], str]) -> Callable[[Value], Value]:
    """UPPER or LOWER as Spark SQL maps case: Java's full mapping (upper('ß') is 'SS', lower('İ') is 'i' and
    U+0307, a final sigma lowers to 'ς'), which Python's ``str.upper``/``str.lower`` apply too.

    Arrow's kernel (utf8proc's one-to-one mapping, exact on ASCII) maps the whole column; only where a
    value holds other characters is it replaced by Python's mapping of that value, so an all-ASCII column
    costs one ``string_is_ascii`` pass more and nothing loops over its rows.
    """

    def mapped(x: Value) -> Value:
        out = kernel(x)
        if isinstance(x, pa.Scalar):
            text = x.as_py()
            return out if text is None or text.isascii() else pa.scalar(python(text), out.type)
        wide = pc.fill_null(pc.invert(pc.string_is_ascii(x)), False)
        if not pc.any(wide).as_py():
            return out
        if isinstance(x, pa.ChunkedArray):
            x, out, wide = x.combine_chunks(), out.combine_chunks(), wide.combine_chunks()
        values = pa.array([python(v) for v in pc.filter(x, wide).to_pylist()], out.type)
        return pc.replace_with_mask(out, wide, values)

    return mapped


def _coalesce(*args: Value) -> Value:
    return pc.coalesce(*args)


def _all(*args: Value) -> Value:
    """AND of any number of terms (Kleene logic)."""
    return functools.reduce(pc.and_kleene, args)


def _any(*args: Value) -> Value:
    """OR of any number of terms (Kleene logic)."""
    return functools.reduce(pc.or_kleene, args)


def _condition(x: Value) -> Value:
    """A WHERE condition whose type only its evaluation tells (a ``?``): it must be BOOLEAN, as Spark SQL
    requires of a filter (a ``?`` bound to None is an untyped NULL, Spark's VOID, which it refuses too).

    Raises:
        QueryError: ``PARSING``, naming the type.
    """
    if pa.types.is_boolean(x.type):
        return x
    raise QueryError(
        ErrorCode.PARSING,
        f"the WHERE condition is of type {spark_type(x.type)}, not BOOLEAN, as Spark SQL refuses it "
        "(DATATYPE_MISMATCH.FILTER_NOT_BOOLEAN)",
    )


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How an operator evaluates: an arity range, a kernel over evaluated arguments, and the type an untyped
    NULL argument takes where no other argument has a type (``_typed``; None: it stays untyped)."""

    arity: tuple[int, int]
    kernel: Callable[..., Value]
    null_as: pa.DataType | None = None


_BOOL, _TEXT, _DOUBLE = pa.bool_(), pa.string(), pa.float64()

# null_as follows Spark SQL: a NULL alone is DOUBLE in arithmetic, BOOLEAN in logic, STRING in string functions
# (comparisons of two NULLs are NULL whatever the type; Arrow needs one).
OPS: dict[str, OpSpec] = {
    "add": OpSpec((2, 2), _spark_decimal(pc.add_checked, "add"), _DOUBLE),
    "sub": OpSpec((2, 2), _spark_decimal(pc.subtract_checked, "sub"), _DOUBLE),
    "mul": OpSpec((2, 2), _spark_decimal(pc.multiply_checked, "mul"), _DOUBLE),
    "div": OpSpec((2, 2), _div, _DOUBLE),
    "mod": OpSpec((2, 2), _mod, _DOUBLE),
    "neg": OpSpec((1, 1), pc.negate_checked, _DOUBLE),
    "eq": OpSpec((2, 2), _nan_aware(pc.equal, "eq"), _BOOL),
    "ne": OpSpec((2, 2), _nan_aware(pc.not_equal, "ne"), _BOOL),
    "lt": OpSpec((2, 2), _nan_aware(pc.less, "lt"), _BOOL),
    "le": OpSpec((2, 2), _nan_aware(pc.less_equal, "le"), _BOOL),
    "gt": OpSpec((2, 2), _nan_aware(pc.greater, "gt"), _BOOL),
    "ge": OpSpec((2, 2), _nan_aware(pc.greater_equal, "ge"), _BOOL),
    "and": OpSpec((2, MAX_TERMS), _all, _BOOL),
    "or": OpSpec((2, MAX_TERMS), _any, _BOOL),
    "not": OpSpec((1, 1), pc.invert, _BOOL),
    "is_null": OpSpec((1, 1), pc.is_null),
    "is_not_null": OpSpec((1, 1), pc.is_valid),
    "in": OpSpec((1, 1 + MAX_TERMS), _in),
    "like": OpSpec((2, 2), _like, _TEXT),
    "abs": OpSpec((1, 1), pc.abs_checked, _DOUBLE),
    "lower": OpSpec((1, 1), _cased(pc.utf8_lower, str.lower), _TEXT),
    "upper": OpSpec((1, 1), _cased(pc.utf8_upper, str.upper), _TEXT),
    "length": OpSpec((1, 1), pc.utf8_length, _TEXT),
    "coalesce": OpSpec((1, 100), _coalesce),
    "to_boolean": OpSpec((1, 1), to_boolean),
    "cast": OpSpec((2, 2), cast),
    "condition": OpSpec((1, 1), _condition),
}


def _typed(args: Sequence[Value], null_as: pa.DataType | None = None) -> list[Value]:
    """``args`` as an operator's kernel takes them, typed as Spark SQL types them.

    Each untyped NULL (Arrow's null type: the literal NULL, a ``?`` bound to None, a column loaded all
    NULL) is cast to the type of the first typed argument, else to ``null_as``: SQL types a NULL by its
    context, and Arrow's kernels have no overloads for the null type. Then integers beside a float are
    cast to float64 (``_double``), where Arrow's implicit cast fails on integers beyond 2**53, and a FLOAT
    (float32) beside a DOUBLE is widened to DOUBLE as Spark widens it: in IN, Arrow's ``is_in`` would cast
    the DOUBLE values down instead, so ``CAST(0.1 AS FLOAT) IN (0.1)`` held where ``=`` (and Spark) says no.
    """
    target = next((a.type for a in args if not pa.types.is_null(a.type)), null_as)
    out = [a.cast(target) if target is not None and pa.types.is_null(a.type) else a for a in args]
    if any(pa.types.is_floating(a.type) for a in out):
        wide = any(a.type == pa.float64() for a in out)
        out = [
            _double(a) if pa.types.is_integer(a.type) or (wide and a.type == pa.float32()) else a for a in out
        ]
    return out


def apply(op: str, args: Sequence[Value]) -> Value:
    """``op``'s kernel over evaluated arguments, their strings read as the types beside them first
    (``casts.coerced``), then typed (``_typed``).

    Raises:
        ExecutionError: a type mismatch, an overflow, a division by zero.
    """
    spec = OPS[op]
    try:
        return spec.kernel(*_typed(coerced(op, args), spec.null_as))
    except ExecutionError:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ExecutionError(f"{op}: {exc}") from None


# ---------------------------------------------------------------- plain form


def expr_to_plain(expr: Expr) -> list[Any]:
    """The msgpack-able form of ``expr``."""
    if isinstance(expr, Column):
        return ["col", expr.name]
    if isinstance(expr, Literal):
        return ["lit", expr.value]
    if isinstance(expr, Param):
        return ["param", expr.index]
    return ["call", expr.op, [expr_to_plain(a) for a in expr.args]]


def expr_from_plain(plain: Any, path: str = "expr", depth: int = 0) -> Expr:
    """Decode and validate an expression; errors name the path of the bad part.

    Raises:
        PlanError: for anything that is not a well-formed expression.
    """
    if depth > MAX_DEPTH:
        raise PlanError(path, f"expression nested deeper than {MAX_DEPTH}")
    if type(plain) is not list or not plain or type(plain[0]) is not str:
        raise PlanError(path, f"expected an array starting with a tag, got {type(plain).__name__}")
    tag = plain[0]
    if tag == "col" and len(plain) == 2 and type(plain[1]) is str:
        return Column(name=plain[1])
    if tag == "lit" and len(plain) == 2:
        return Literal(value=plain[1])
    if tag == "param" and len(plain) == 2:
        return Param(index=plain[1])
    if tag == "call" and len(plain) == 3 and type(plain[1]) is str and type(plain[2]) is list:
        args = tuple(expr_from_plain(a, f"{path}.{plain[1]}[{i}]", depth + 1) for i, a in enumerate(plain[2]))
        return Call(op=plain[1], args=args)
    raise PlanError(path, f"malformed {tag!r} expression: {plain!r:.80}")


# ---------------------------------------------------------------- evaluation


def depth_of(expr: Expr) -> int:
    """How deep ``expr`` nests: 0 for a column, literal or parameter, 1 + its deepest argument's for a call
    (as ``expr_from_plain`` counts)."""
    deepest, stack = 0, [(expr, 0)]
    while stack:
        e, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(e, Call):
            stack.extend((a, depth + 1) for a in e.args)
    return deepest


def columns_of(expr: Expr) -> set[str]:
    """The input columns ``expr`` reads."""
    if isinstance(expr, Column):
        return {expr.name}
    if isinstance(expr, Call):
        out: set[str] = set()
        for a in expr.args:
            out |= columns_of(a)
        return out
    return set()


def evaluate(expr: Expr, table: pa.Table, params: Sequence[Scalar] = ()) -> Value:
    """Evaluate ``expr`` over every row of ``table`` at once.

    Returns:
        An array (or chunked array) with one value per row, or a scalar for constant expressions.

    Raises:
        ExecutionError: a missing column or parameter, a type mismatch, an overflow, a division by zero.
    """
    if isinstance(expr, Column):
        found = resolve(expr.name, table.column_names)
        if found is None:
            raise ExecutionError(f"column {expr.name!r} does not exist; columns are {table.column_names}")
        return table.column(found)
    if isinstance(expr, Literal):
        return scalar(expr.value)
    if isinstance(expr, Param):
        if expr.index >= len(params):
            raise ExecutionError(f"parameter {expr.index} is not given ({len(params)} parameters)")
        return scalar(params[expr.index])
    return apply(expr.op, [evaluate(a, table, params) for a in expr.args])


def evaluate_column(expr: Expr, table: pa.Table, params: Sequence[Scalar] = ()) -> Value:
    """Like ``evaluate`` but always one value per row (constants are repeated)."""
    value = evaluate(expr, table, params)
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, table.num_rows)
    return value
