"""Strict conversion between frozen dataclasses and msgpack-ready values.

A message class is a frozen, keyword-only dataclass whose fields use a small set of types: ``int``,
``float``, ``str``, ``bytes``, ``bool``, ``None`` and unions with it, ``tuple[T, ...]``, fixed tuples,
``dict[K, V]``, ``IntEnum`` subclasses, nested dataclasses, and ``Any`` (plain msgpack values, used for
plan trees). The schema is compiled once per class; decoding checks every field and names the first
one that is wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import reprlib
import types
import typing
from collections.abc import Callable
from typing import Any, Union

from sparkbus.codecs.errors import DecodeError, EncodeError

#: Turns a plain msgpack value into the field's Python value, raising DecodeError.
Converter = Callable[[Any, str, str], Any]

_SCHEMAS: dict[type, _Schema] = {}


class _Schema:
    __slots__ = ("blob_fields", "cls", "converters", "field_names", "map_fields")

    def __init__(self, cls: type) -> None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.field_names: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        self.blob_fields: tuple[str, ...] = tuple(
            f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("blob")
        )
        for name in self.blob_fields:
            if hints[name] is not bytes:
                raise TypeError(f"{cls.__name__}.{name}: a blob field must be typed bytes")
        self.map_fields: tuple[str, ...] = tuple(n for n in self.field_names if n not in self.blob_fields)
        self.converters: dict[str, Converter] = {n: _converter(hints[n]) for n in self.field_names}


def schema_of(cls: type) -> _Schema:
    """The compiled schema of a message dataclass (cached)."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        schema = _SCHEMAS[cls] = _Schema(cls)
    return schema


def blob(**kwargs: Any) -> Any:
    """Declare a ``bytes`` field carried as its own frame instead of inside the msgpack body."""
    return dataclasses.field(metadata={"blob": True}, **kwargs)


# ---------------------------------------------------------------- encoding


def to_plain(value: Any) -> Any:
    """A dataclass (or nested value) as msgpack-ready lists, maps and scalars."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        schema = schema_of(type(value))
        return {n: to_plain(getattr(value, n)) for n in schema.field_names}
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise EncodeError(f"cannot encode a value of type {type(value).__name__}")


# ---------------------------------------------------------------- decoding


def from_plain(cls: type, plain: Any, message_type: str, blobs: dict[str, bytes] | None = None) -> Any:
    """Build ``cls`` from its plain form, checking every field.

    Raises:
        DecodeError: naming the message type and the first wrong field.
    """
    schema = schema_of(cls)
    if not isinstance(plain, dict):
        raise DecodeError(message_type, "<body>", f"expected a map, got {_kind(plain)}")
    for key in plain:
        if key not in schema.converters or key in schema.blob_fields:
            raise DecodeError(message_type, key if type(key) is str else quote(key), "unexpected field")
    kwargs: dict[str, Any] = {}
    for name in schema.map_fields:
        if name not in plain:
            raise DecodeError(message_type, name, "missing field")
        kwargs[name] = schema.converters[name](plain[name], message_type, name)
    if blobs is not None:
        kwargs.update(blobs)
    try:
        return cls(**kwargs)
    except DecodeError:
        raise
    except (TypeError, ValueError) as exc:
        # The constructor's own validation (ranges, invariants) speaks for the whole message.
        raise DecodeError(message_type, _field_in(str(exc), schema.field_names), str(exc)) from None


#: How much of a peer's value (a map key, a field name) a ``DecodeError`` quotes.
QUOTED = 64
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = QUOTED


def quote(value: Any) -> str:
    """``repr(value)``, bounded: a str or bytes is quoted by the repr of its first ``QUOTED`` characters or
    bytes, and when that is not all of it or its repr is long (escapes) by ``QUOTED`` characters of that
    repr and its length (``"... (1048576 bytes)"``); never repr'd whole. Anything else as ``reprlib`` cuts
    it."""
    if type(value) is str or type(value) is bytes:
        text = repr(value[:QUOTED])
        if len(value) <= QUOTED and len(text) <= 2 * QUOTED:
            return text
        unit = "chars" if type(value) is str else "bytes"
        return f"{text[:QUOTED]}... ({len(value)} {unit})"
    return _REPR.repr(value)


def _field_in(text: str, names: tuple[str, ...]) -> str:
    for name in names:
        if name in text:
            return name
    return "<value>"


def _kind(value: Any) -> str:
    return type(value).__name__


def _converter(tp: Any) -> Converter:
    if tp is Any:
        return _check_any
    if tp is type(None):
        return _check_exact(type(None), "nil")
    if tp is bool:
        return _check_exact(bool, "bool")
    if tp is int:
        return _check_int
    if tp is float:
        return _check_float
    if tp is str:
        return _check_exact(str, "str")
    if tp is bytes:
        return _check_bytes
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        return _enum_converter(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return lambda v, m, f: from_plain(tp, v, f"{m}.{f}") if isinstance(v, dict) else _fail(m, f, "map", v)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _union_converter(tuple(_converter(a) for a in args), args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _tuple_var_converter(_converter(args[0]))
        return _tuple_fixed_converter(tuple(_converter(a) for a in args))
    if origin is dict:
        return _dict_converter(_converter(args[0]), _converter(args[1]))
    if origin is typing.Literal:
        return _literal_converter(args)
    raise TypeError(f"unsupported field type {tp!r}")


def _fail(message_type: str, field: str, expected: str, value: Any) -> Any:
    raise DecodeError(message_type, field, f"expected {expected}, got {_kind(value)}")


def _check_any(value: Any, message_type: str, field: str) -> Any:
    return value


def _check_exact(tp: type, label: str) -> Converter:
    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) is not tp:
            _fail(message_type, field, label, value)
        return value

    return check


def _check_int(value: Any, message_type: str, field: str) -> Any:
    if type(value) is not int:
        _fail(message_type, field, "int", value)
    return value


def _check_float(value: Any, message_type: str, field: str) -> Any:
    if type(value) is int:
        return float(value)
    if type(value) is not float:
        _fail(message_type, field, "float", value)
    return value


def _check_bytes(value: Any, message_type: str, field: str) -> Any:
    if type(value) is not bytes:
        _fail(message_type, field, "bytes", value)
    return value


def _enum_converter(tp: type[enum.IntEnum]) -> Converter:
    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) is not int:
            _fail(message_type, field, tp.__name__, value)
        try:
            return tp(value)
        except ValueError:
            raise DecodeError(message_type, field, f"{value} is not a valid {tp.__name__}") from None

    return check


def _literal_converter(args: tuple[Any, ...]) -> Converter:
    # The type first: an array or a map is not hashable (a set lookup would raise TypeError), and True or
    # 1.0 equal a literal 1 without being it.
    kinds = frozenset(type(a) for a in args)
    allowed = frozenset(args)
    expected = f"one of {sorted(map(repr, allowed))}"

    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) not in kinds or value not in allowed:
            _fail(message_type, field, expected, value)
        return value

    return check


def _union_converter(convs: tuple[Converter, ...], args: tuple[Any, ...]) -> Converter:
    label = " | ".join(getattr(a, "__name__", repr(a)) for a in args)

    def check(value: Any, message_type: str, field: str) -> Any:
        for conv in convs:
            try:
                return conv(value, message_type, field)
            except DecodeError:
                continue
        return _fail(message_type, field, label, value)

    return check


def _tuple_var_converter(item: Converter) -> Converter:
    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) is not list:
            _fail(message_type, field, "array", value)
        return tuple(item(v, message_type, f"{field}[{i}]") for i, v in enumerate(value))

    return check


def _tuple_fixed_converter(items: tuple[Converter, ...]) -> Converter:
    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) is not list or len(value) != len(items):
            _fail(message_type, field, f"array of {len(items)}", value)
        return tuple(
            conv(v, message_type, f"{field}[{i}]")
            for i, (conv, v) in enumerate(zip(items, value, strict=True))
        )

    return check


def _dict_converter(key: Converter, val: Converter) -> Converter:
    def check(value: Any, message_type: str, field: str) -> Any:
        if type(value) is not dict:
            _fail(message_type, field, "map", value)
        return {
            key(k, message_type, f"{field}.<key>"): val(v, message_type, f"{field}[{quote(k)}]")
            for k, v in value.items()
        }

    return check
