"""The message envelope: a msgpack header frame, a msgpack body frame, and blob frames.

Wire layout (``docs/PROTOCOL.md`` has it byte by byte)::

    frame 0  header  msgpack array [1, type, session, seq, stream, zmask]
    frame 1  body    msgpack map {field name: value} of the non-blob fields (possibly zstd)
    frame 2+ blobs   raw bytes of each blob field, in declaration order (each possibly zstd)

``zmask`` bit *i* set means payload frame *i* (frame *i + 1*) is zstd-compressed.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from sparkbus.codecs.compression import Buffer, Compression
from sparkbus.codecs.errors import DecodeError, EncodeError, LimitExceeded
from sparkbus.codecs.limits import DEFAULT_LIMITS, Limits, check_frames
from sparkbus.codecs.schema import Converter, from_plain, schema_of, to_plain

ENVELOPE_VERSION = 1
_SCALARS = frozenset({int, str, bytes, float, bool, type(None)})
_HEADER_LEN = 6
_MAX_HEADER_BYTES = 4096
#: Field types whose plain value is the field value itself when its type matches exactly.
_EXACT = frozenset({int, str, bytes, bool})

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Header:
    """What every message carries besides its body.

    Attributes:
        type: the registered message type code.
        session: the session id of the link the message travels on (0 during the handshake).
        seq: the sequence number of the message on its link and channel.
        stream: the stream key, for stream messages; None otherwise.
        zmask: bit i set when payload frame i is zstd-compressed.
    """

    type: int
    session: int = 0
    seq: int = 0
    stream: str | None = None
    zmask: int = 0


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded message with its header."""

    header: Header
    message: Any


class Registry:
    """Message type codes to frozen dataclasses, shared by every role family."""

    def __init__(self) -> None:
        self._by_code: dict[int, type] = {}
        self._by_cls: dict[type, int] = {}
        self._shapes: dict[int, _Shape] = {}
        self._shape_of_cls: dict[type, _Shape] = {}

    def register(self, code: int) -> Callable[[type[T]], type[T]]:
        """Class decorator: register ``cls`` under ``code`` (unique across the registry)."""

        def wrap(cls: type[T]) -> type[T]:
            if not 0 <= code <= 0xFFFF:
                raise ValueError(f"message code {code:#x} out of range 0..0xffff")
            if code in self._by_code and self._by_code[code] is not cls:
                raise ValueError(f"message code {code:#x} is taken by {self._by_code[code].__name__}")
            params = getattr(cls, "__dataclass_params__", None)
            if params is None or not params.frozen:
                raise TypeError(f"{cls.__name__} must be a frozen dataclass")
            schema_of(cls)  # fail at import time on an unsupported field type
            self._by_code[code] = cls
            self._by_cls[cls] = code
            self._shapes[code] = self._shape_of_cls[cls] = _Shape(cls, code)
            return cls

        return wrap

    def code_of(self, cls: type) -> int:
        try:
            return self._by_cls[cls]
        except KeyError:
            raise EncodeError(f"{cls.__name__} is not a registered message") from None

    def shape_of(self, cls: type) -> _Shape:
        try:
            return self._shape_of_cls[cls]
        except KeyError:
            raise EncodeError(f"{cls.__name__} is not a registered message") from None

    def shape(self, code: int) -> _Shape | None:
        return self._shapes.get(code)

    def class_of(self, code: int) -> type | None:
        return self._by_code.get(code)

    def name_of(self, code: int) -> str:
        cls = self._by_code.get(code)
        return cls.__name__ if cls is not None else f"<unknown {code:#x}>"

    def codes(self) -> dict[int, type]:
        return dict(self._by_code)


#: The registry every sparkbus message family registers into.
REGISTRY = Registry()
message = REGISTRY.register


class _Shape:
    """What encoding and decoding one message class needs, compiled once per class (the hot path)."""

    __slots__ = (
        "blob_fields",
        "cls",
        "code",
        "exact",
        "fields",
        "keys",
        "map_fields",
        "n_frames",
        "name",
        "post_init",
        "vars_body",
    )

    def __init__(self, cls: type, code: int) -> None:
        schema = schema_of(cls)
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.code = code
        self.name = cls.__name__
        self.map_fields = schema.map_fields
        self.blob_fields = schema.blob_fields
        self.keys = frozenset(schema.map_fields)
        self.n_frames = 2 + len(schema.blob_fields)
        # (name, exact type or None, converter): a value of the exact type needs no conversion.
        self.fields: tuple[tuple[str, type | None, Converter], ...] = tuple(
            (n, hints[n] if hints[n] in _EXACT else None, schema.converters[n]) for n in schema.map_fields
        )
        # A message whose body fields are all plain (no conversion; most control messages, and a stream
        # batch): its body map, once every value has its field's exact type, is the constructor's keywords
        # as they are, with its blobs added.
        self.exact: tuple[tuple[str, type], ...] | None = (
            tuple((n, t) for n, t, _ in self.fields if t is not None)
            if all(t is not None for _, t, _ in self.fields)
            else None
        )
        # Such a message without blobs, built by the dataclass ``__init__`` (every field an init field, no
        # InitVar, an instance dict), is rebuilt the way ``copy`` and ``pickle`` rebuild an object: its
        # checked body map becomes the new instance's attributes, then its ``__post_init__`` (if any) runs
        # as ``__init__`` would run it, without the frozen ``object.__setattr__`` per field that made
        # ``__init__`` cost twice as much. Its instance dict, which then holds exactly its fields, is also
        # its body map when it is encoded (``vars_body``).
        self.vars_body = (
            self.exact is not None
            and not self.blob_fields
            and not hasattr(cls, "__slots__")
            and getattr(cls, "__dictoffset__", 0) != 0
            and cls.__dataclass_params__.init  # type: ignore[attr-defined]
            and all(f.init for f in dataclasses.fields(cls))
            and len(dataclasses.fields(cls)) == len(cls.__dataclass_fields__)  # type: ignore[attr-defined]
        )
        self.post_init: Callable[[Any], None] | None = getattr(cls, "__post_init__", None)


class _ExtensionRefused(Exception):
    pass


def _no_ext(code: int, data: bytes) -> Any:
    raise _ExtensionRefused(code)


_unpackb = msgpack.unpackb
_new = object.__new__


def _unpack(data: Buffer, message_type: str, part: str) -> Any:
    try:
        return _unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext, use_list=True)
    except _ExtensionRefused as exc:
        raise DecodeError(
            message_type, part, f"msgpack extension type {exc.args[0]} is not allowed"
        ) from None
    except msgpack.ExtraData:
        raise DecodeError(message_type, part, "trailing bytes after the msgpack value") from None
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        # msgpack raises ValueError for truncated data and several other malformed inputs.
        raise DecodeError(message_type, part, f"malformed msgpack ({type(exc).__name__}: {exc})") from None


class EnvelopeCodec:
    """Encodes registered messages to frames and decodes frames back, strictly.

    Args:
        registry: where message types are looked up.
        limits: bounds applied before anything is allocated.
        compression: how payload frames are compressed; None sends them raw. Decoding honours the zmask
            either way, and a compressed frame inflates to at most ``limits.max_decompressed_bytes`` (and
            to no more than ``compression.max_decompressed`` when that is smaller).
    """

    name = "envelope"

    def __init__(
        self,
        registry: Registry = REGISTRY,
        *,
        limits: Limits = DEFAULT_LIMITS,
        compression: Compression | None = None,
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.compression = compression
        # A compressed frame inflates to no more than the limits allow, nor than the compression settings do.
        bound = limits.max_decompressed_bytes
        if compression is not None:
            bound = min(bound, compression.max_decompressed)
        self._inflate = Compression(enabled=False, max_decompressed=bound)
        # One Packer per codec, reused: ``msgpack.packb`` builds (and allocates a buffer for) a new one
        # per call. ``pack`` runs without releasing the GIL on the plain values it is given here.
        self._pack = msgpack.Packer(use_bin_type=True).pack
        # The registry's own tables (live: classes registered later are seen), read without a method call.
        self._shape_of_cls = registry._shape_of_cls
        self._shapes = registry._shapes
        # Below both limits, no frame and no message can exceed either: one comparison for most messages.
        self._small = min(limits.max_frame_bytes, limits.max_message_bytes)

    # -- encoding

    def encode(self, msg: Any, *, session: int = 0, seq: int = 0, stream: str | None = None) -> list[Buffer]:
        """Frames for ``msg``: header, body, then one frame per blob field."""
        shape = self._shape_of_cls.get(type(msg)) or self.registry.shape_of(type(msg))
        pack = self._pack
        body: Buffer | None = None
        if shape.vars_body:
            fields = msg.__dict__
            if len(fields) == len(shape.map_fields):
                try:
                    body = pack(fields)
                except (TypeError, ValueError):
                    body = None  # a value msgpack cannot pack as it is: to_plain converts or names it
        if body is None:
            plain: dict[str, Any] = {}
            for n in shape.map_fields:
                value = getattr(msg, n)
                plain[n] = value if type(value) in _SCALARS else to_plain(value)
            body = pack(plain)
        payload: list[Buffer] = [body]
        for n in shape.blob_fields:
            blob = getattr(msg, n)
            if type(blob) is not bytes and not isinstance(blob, memoryview):
                _check_blob(shape.name, n, blob)
            payload.append(blob)
        zmask = 0
        if self.compression is not None:
            for i, frame in enumerate(payload):
                packed, compressed = self.compression.compress(frame)
                if compressed:
                    payload[i] = packed
                    zmask |= 1 << i
        payload.insert(0, pack([ENVELOPE_VERSION, shape.code, session, seq, stream, zmask]))
        return payload

    def encoded_size(self, frames: Sequence[Buffer]) -> int:
        """Bytes on the wire for ``frames`` (what credit accounting counts)."""
        return sum(len(f) for f in frames)

    # -- decoding

    def decode_header(self, frames: Sequence[Buffer]) -> Header:
        """Check frame counts and sizes, then parse and validate frame 0."""
        code, session, seq, stream, zmask, _ = self.read_header(frames)
        return Header(type=code, session=session, seq=seq, stream=stream, zmask=zmask)

    def read_header(self, frames: Sequence[Buffer]) -> tuple[int, int, int, str | None, int, int]:
        """``decode_header`` as a tuple: ``(type, session, seq, stream, zmask, bytes in all frames)``.

        The same checks as ``decode_header``, without building a ``Header`` (the bus's receive path).
        """
        if not frames:
            raise DecodeError("?", "<frames>", "empty message")
        total = sum(map(len, frames))
        if total > self._small or len(frames) > self.limits.max_frames:
            check_frames(frames, self.limits)  # raises, naming the limit, unless all is within them
        header = frames[0]
        if len(header) > _MAX_HEADER_BYTES:
            raise LimitExceeded("?", "<header>", f"{len(header)} bytes, limit is {_MAX_HEADER_BYTES}")
        try:
            raw = _unpackb(header, raw=False, strict_map_key=False, ext_hook=_no_ext, use_list=True)
        except Exception:
            raw = _unpack(header, "?", "<header>")  # raises the DecodeError that says why
        if type(raw) is not list or len(raw) != _HEADER_LEN:
            raise DecodeError("?", "<header>", f"expected an array of {_HEADER_LEN}")
        version, code, session, seq, stream, zmask = raw
        if type(version) is not int or version != ENVELOPE_VERSION:
            raise DecodeError("?", "<header>.version", f"unsupported envelope version {version!r}")
        if not (
            type(code) is int
            and type(session) is int
            and type(seq) is int
            and type(zmask) is int
            and code >= 0
            and session >= 0
            and seq >= 0
            and zmask >= 0
        ):
            for label, value in (("type", code), ("session", session), ("seq", seq), ("zmask", zmask)):
                if type(value) is not int or value < 0:
                    raise DecodeError("?", f"<header>.{label}", f"expected a non-negative int, got {value!r}")
        if stream is not None and type(stream) is not str:
            raise DecodeError("?", "<header>.stream", f"expected str or nil, got {type(stream).__name__}")
        return code, session, seq, stream, zmask, total

    def decode(
        self, frames: Sequence[Buffer], *, copy_blobs: bool = True, header: Header | None = None
    ) -> Envelope:
        """Decode a whole message.

        Args:
            frames: the frames as received.
            copy_blobs: when false, blob fields hold the received buffers as they are (zero-copy;
                they may be memoryviews).
            header: the result of ``decode_header(frames)`` if the caller already has it.

        Raises:
            DecodeError: for an unknown type, a missing, extra or mistyped field, trailing bytes, a
                wrong frame count, or any limit exceeded; it names the message type and the field.
        """
        if header is None:
            header = self.decode_header(frames)
        return Envelope(header, self.read_body(frames, header.type, header.zmask, copy_blobs=copy_blobs))

    def read_body(self, frames: Sequence[Buffer], code: int, zmask: int, *, copy_blobs: bool = True) -> Any:
        """The message of ``frames`` whose header ``read_header`` returned (``decode`` without the envelope).

        Raises:
            DecodeError: as ``decode``.
        """
        shape = self._shapes.get(code)
        if shape is None:
            raise DecodeError(f"<type {code:#x}>", "<header>.type", "unknown message type")
        name = shape.name
        expected = shape.n_frames
        if len(frames) != expected:
            raise DecodeError(name, "<frames>", f"expected {expected} frames, got {len(frames)}")
        if zmask:
            if zmask >> (expected - 1):
                raise DecodeError(name, "<header>.zmask", f"marks frames that do not exist ({zmask:#x})")
            payload: Sequence[Buffer] = [
                self._payload(frames[i + 1], zmask, i, name) for i in range(expected - 1)
            ]
        else:
            payload = frames[1:]
        try:
            plain = _unpackb(payload[0], raw=False, strict_map_key=False, ext_hook=_no_ext, use_list=True)
        except Exception:
            plain = _unpack(payload[0], name, "<body>")  # raises the DecodeError that says why
        plain_fields = shape.exact
        if plain_fields is not None and type(plain) is dict and len(plain) == len(plain_fields):
            for n, t in plain_fields:
                if type(plain.get(n)) is not t:
                    break
            else:
                if shape.vars_body:
                    msg: Any = _new(shape.cls)
                    msg.__dict__.update(plain)
                    if shape.post_init is None:
                        return msg
                    try:
                        shape.post_init(msg)
                        return msg
                    except (TypeError, ValueError):
                        pass  # from_plain raises the DecodeError that names the field
                blob_fields = shape.blob_fields
                for n, frame in zip(blob_fields, payload[1:], strict=True):
                    plain[n] = bytes(frame) if copy_blobs and type(frame) is not bytes else frame
                try:
                    return shape.cls(**plain)
                except (TypeError, ValueError):
                    for n in blob_fields:
                        del plain[n]  # from_plain raises the DecodeError that names the field
        blobs: dict[str, Any] = {}
        for n, frame in zip(shape.blob_fields, payload[1:], strict=True):
            blobs[n] = bytes(frame) if copy_blobs and type(frame) is not bytes else frame
        if type(plain) is dict and len(plain) == len(shape.keys) and plain.keys() == shape.keys:
            # The common case, checked field by field like ``from_plain``, which handles everything else
            # (and so names the first wrong field, with the same words).
            kwargs: dict[str, Any] = {}
            for n, exact, convert in shape.fields:
                value = plain[n]
                if exact is None:
                    try:
                        value = convert(value, name, n)
                    except DecodeError:
                        return from_plain(shape.cls, plain, name, blobs)
                elif type(value) is not exact:
                    return from_plain(shape.cls, plain, name, blobs)
                kwargs[n] = value
            if blobs:
                kwargs.update(blobs)
            try:
                return shape.cls(**kwargs)
            except (TypeError, ValueError):
                pass  # from_plain raises the DecodeError that names the field
        return from_plain(shape.cls, plain, name, blobs)

    def _payload(self, frame: Buffer, zmask: int, i: int, name: str) -> Buffer:
        if zmask >> i & 1:
            return self._inflate.decompress(frame, message_type=name, part=f"<frame {i + 1}>")
        return frame


def _check_blob(name: str, field: str, blob: Any) -> None:
    """Raise ``EncodeError`` unless ``blob`` is a buffer ZeroMQ can send as a frame (a str is not)."""
    try:
        memoryview(blob)
    except TypeError:
        raise EncodeError(f"{name}.{field}: a blob must be bytes-like, not {type(blob).__name__}") from None
