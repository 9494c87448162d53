"""Bytes <-> messages, row batches and compressed frames. Imports no zmq and no role.

The row-batch names (``BatchCodec``, ``encode_batch``, ``decode_batch``) are imported on first use: they
need pyarrow, which the bus, the topology files and the command line do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkbus.codecs.compression import Buffer, Compression
from sparkbus.codecs.envelope import REGISTRY, Envelope, EnvelopeCodec, Header, Registry, message
from sparkbus.codecs.errors import DecodeError, EncodeError, LimitExceeded
from sparkbus.codecs.limits import DEFAULT_LIMITS, KiB, Limits, MiB
from sparkbus.codecs.schema import blob

if TYPE_CHECKING:
    from sparkbus.codecs.batches import BatchCodec, decode_batch, encode_batch

_BATCHES = ("BatchCodec", "decode_batch", "encode_batch")

__all__ = [
    "DEFAULT_LIMITS",
    "REGISTRY",
    "BatchCodec",
    "Buffer",
    "Compression",
    "DecodeError",
    "EncodeError",
    "Envelope",
    "EnvelopeCodec",
    "Header",
    "KiB",
    "LimitExceeded",
    "Limits",
    "MiB",
    "Registry",
    "blob",
    "decode_batch",
    "encode_batch",
    "message",
]


def __getattr__(name: str) -> Any:
    if name in _BATCHES:
        from sparkbus.codecs import batches  # noqa: PLC0415 (pyarrow)

        return getattr(batches, name)
    raise AttributeError(f"module 'sparkbus.codecs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_BATCHES))
