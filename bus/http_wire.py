"""The HTTP exchange's text and body formats: airlift DataSize and Duration strings (Presto's headers), and
the pages body (each page as a u32 little-endian length and its bytes; docs/EXCHANGE.md section 4), the
HTTP status of each BinX error code, and what one read of a buffer returns (``BufferRead``): what both the
server (``http_exchange``) and the client (``http_fetch``) speak."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from typing import Protocol

_LENGTH = struct.Struct("<I")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|kB|MB|GB|TB|PB)\s*$")
_SIZE_UNITS = {"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_data_size(text: str) -> int:
    """Bytes in an airlift DataSize string such as ``1048576B`` or ``32MB``.

    Raises:
        ValueError: the text is not a data size.
    """
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a data size: {text!r}")
    size = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if not math.isfinite(size):  # "9" * 400: infinity, which int() cannot take
        raise ValueError(f"not a data size: {text[:40]!r}... is too large")
    return int(size)


def parse_duration(text: str) -> float:
    """Seconds in an airlift Duration string such as ``2s``, ``500ms`` or ``1.5m``.

    Raises:
        ValueError: the text is not a duration.
    """
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def frame_pages(pages: Sequence[bytes]) -> bytes:
    """The HTTP body for ``pages``: each page as a u32 little-endian length and the bytes."""
    return b"".join(_LENGTH.pack(len(p)) + bytes(p) for p in pages)


def unframe_pages(body: bytes) -> list[bytes]:
    """Split a pages body back into pages.

    Raises:
        ValueError: the body is truncated or has trailing bytes.
    """
    pages: list[bytes] = []
    view = memoryview(body)
    at = 0
    while at < len(view):
        if at + 4 > len(view):
            raise ValueError(f"pages body truncated in a length at byte {at}")
        (n,) = _LENGTH.unpack_from(view, at)
        at += 4
        if at + n > len(view):
            raise ValueError(f"pages body truncated: page of {n} bytes at byte {at}, body has {len(view)}")
        pages.append(bytes(view[at : at + n]))
        at += n
    return pages


#: HTTP status for each BinX error code (``sparkbus.roles.exchange.ErrorCode`` values).
ERROR_STATUS = {1: 404, 2: 500, 3: 410, 4: 400, 5: 400, 6: 503}


class BufferRead(Protocol):
    """What one read of a buffer returns (``sparkbus.roles.exchange.PageResult`` satisfies it)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def next_token(self) -> int: ...
    @property
    def pages(self) -> Sequence[bytes]: ...
    @property
    def complete(self) -> bool: ...
    @property
    def remaining(self) -> bytes: ...
    @property
    def remaining_bytes(self) -> Sequence[int]: ...
    @property
    def error_code(self) -> int: ...
    @property
    def error_message(self) -> str: ...
