"""Bytes <-> messages, row batches and compressed frames. Imports no zmq and no role."""

from sparkbus.codecs.batches import BatchCodec, decode_batch, encode_batch
from sparkbus.codecs.compression import Buffer, Compression
from sparkbus.codecs.envelope import REGISTRY, Envelope, EnvelopeCodec, Header, Registry, message
from sparkbus.codecs.errors import DecodeError, EncodeError, LimitExceeded
from sparkbus.codecs.limits import DEFAULT_LIMITS, KiB, Limits, MiB
from sparkbus.codecs.schema import blob

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
