"""The bus's own messages: the session handshake (IEP-76 style), heartbeats, errors, and credit streams."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sparkbus.codecs import blob, message
from sparkbus.codecs.schema import quote

MAGIC = b"SBUS"


class ErrorCode(enum.IntEnum):
    """Error codes, after Ignite's CLIENT group (``(3 << 16) | n``) plus sparkbus's own (n >= 100)."""

    CONNECTION = (3 << 16) | 1
    PROTOCOL = (3 << 16) | 2
    PROTOCOL_COMPATIBILITY = (3 << 16) | 3
    CLUSTER_ID_MISMATCH = (3 << 16) | 6
    HANDSHAKE_HEADER = (3 << 16) | 8
    RESOURCE_NOT_FOUND = (3 << 16) | 10
    MALFORMED = (3 << 16) | 100
    LIMIT_EXCEEDED = (3 << 16) | 101
    UNKNOWN_MESSAGE = (3 << 16) | 102
    OUT_OF_STATE = (3 << 16) | 103
    STALE_SESSION = (3 << 16) | 104
    SEQUENCE_GAP = (3 << 16) | 105
    NO_ROLE = (3 << 16) | 106
    STREAM_VIOLATION = (3 << 16) | 107
    TOO_MANY_PEERS = (3 << 16) | 108
    TOO_MANY_STREAMS = (3 << 16) | 109
    DUPLICATE_NODE = (3 << 16) | 110
    # CURVE refusals happen in ZeroMQ's ZAP handshake, before any sparkbus message; on the wire only as the
    # REJECT of a HELLO from a node id with a key of its own on a connection with another key.
    AUTHENTICATION = (3 << 16) | 150


#: Codes after which a link is never retried: the other side is not ours, or not our cluster.
FINAL_CODES = frozenset({ErrorCode.HANDSHAKE_HEADER, ErrorCode.CLUSTER_ID_MISMATCH})

#: Codes of a REJECT that ends the session named in its header (the link is broken and handshaken again).
SESSION_ENDING_CODES = frozenset({ErrorCode.STALE_SESSION, ErrorCode.SEQUENCE_GAP, ErrorCode.OUT_OF_STATE})

#: HELLO extension of a node: the ``attempt`` (decimal) of the peer's latest HELLO the sender welcomed, when
#: the sender has dropped that session since. A peer whose current attempt it names knows its direction
#: (open, or with its WELCOME on the way) is stale, and handshakes again; any other direction it keeps.
DROPPED_ATTEMPT = "dropped_attempt"

#: HELLO extension of a node: a random number (decimal, 1 to 2**63 - 1) the sender chose when it started.
#: A HELLO whose incarnation differs from the one this node last heard from that peer comes from a new
#: process: every direction of the old link is stale, ours too (the old process held its session).
INCARNATION = "incarnation"


def retry_version(
    ours: tuple[tuple[int, int, int], ...], offered: tuple[int, int, int], answered: tuple[int, int, int]
) -> tuple[int, int, int] | None:
    """The version to offer again after REJECT ``PROTOCOL_COMPATIBILITY`` answered ``offered`` with
    ``answered`` (None: give up). IEP-90: the server's version, if we speak it. Beyond IEP-90, which gives
    up there: else the newest we speak below both, since a server offers back its newest below what it
    was offered, and may speak older ones too. Each retry offers an older version than the last, or the
    server's own, so a handshake ends."""
    if answered in ours and answered != offered:
        return answered
    lower = [v for v in ours if v < offered and v <= answered]
    return max(lower) if lower else None


def check_version(version: tuple[int, int, int]) -> None:
    """Raises ValueError unless each part of ``version`` fits 2 bytes (IEP-90)."""
    if any(not 0 <= part <= 0xFFFF for part in version):
        raise ValueError(f"version parts must fit 2 bytes, got {version}")


def version_text(version: tuple[int, int, int]) -> str:
    """``(1, 0, 0)`` as ``"1.0.0"``."""
    return ".".join(map(str, version))


@message(0x0001)
@dataclass(frozen=True, kw_only=True)
class Hello:
    """Opens a session on one direction of a link (client -> server).

    Attributes:
        magic: always ``b"SBUS"``.
        version: protocol version offered (major, minor, patch).
        features: feature bitset, little-endian: bit n is bit n % 8 of byte n // 8.
        cluster_tag: the sender's cluster; a mismatch is refused and never retried.
        node_id: the sender's node id (it must equal its ZeroMQ routing id).
        kind: ``"node"`` for a bus peer (which binds its own ROUTER), ``"client"`` for a thin client (which
            gets everything back on this same pipe).
        attempt: echoed in the answer, so a late answer to an earlier HELLO is recognised.
        extensions: string -> string; unknown keys are ignored.
    """

    magic: bytes
    version: tuple[int, int, int]
    features: bytes
    cluster_tag: str
    node_id: str
    kind: str = "node"
    attempt: int = 0
    extensions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_version(self.version)
        if not self.node_id or len(self.node_id) > 255:
            raise ValueError("node_id must be 1..255 characters")
        if self.kind not in ("node", "client"):
            raise ValueError(f"kind must be 'node' or 'client', got {quote(self.kind)}")
        if len(self.features) > 64:
            raise ValueError("features bitset longer than 64 bytes")


@message(0x0002)
@dataclass(frozen=True, kw_only=True)
class Welcome:
    """Accepts a HELLO: the negotiated version and features, and the new session."""

    version: tuple[int, int, int]
    features: bytes
    session: int
    connection_id: str
    idle_timeout_ms: int
    node_id: str
    cluster_tag: str
    attempt: int = 0
    incarnation: int = 0  # the answering process (its HELLOs' ``INCARNATION``); 0: not named

    def __post_init__(self) -> None:
        check_version(self.version)
        if self.session <= 0:
            raise ValueError("session must be positive")
        if not 0 <= self.incarnation < 2**63:
            raise ValueError(f"incarnation must be in [0, 2**63), got {self.incarnation}")


@message(0x0003)
@dataclass(frozen=True, kw_only=True)
class Reject:
    """Refuses a HELLO, or a message on a session (then the session is gone).

    ``version`` is the server's own, so a client can re-offer it (IEP-90 version negotiation).
    """

    code: ErrorCode
    message: str
    version: tuple[int, int, int]
    attempt: int = 0


@message(0x0004)
@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """Sent on a direction idle for the heartbeat interval; any message counts as a heartbeat."""


@message(0x0005)
@dataclass(frozen=True, kw_only=True)
class Error:
    """A message was refused, but the session lives on (for example an unknown type or a bad field)."""

    code: ErrorCode
    message: str
    ref_type: int = 0


@message(0x0006)
@dataclass(frozen=True, kw_only=True)
class Bye:
    """Orderly close of one direction: the receiver reports the peer lost without waiting for a timeout."""

    reason: str = ""


@message(0x0010)
@dataclass(frozen=True, kw_only=True)
class StreamBatch:
    """A batch on a credit stream (the stream key travels in the header). Mustang's ``batch``."""

    ordinal: int
    last: bool
    remaining: int
    data: bytes = blob()

    def __post_init__(self) -> None:
        if self.ordinal < 0 or self.remaining < 0:
            raise ValueError("ordinal and remaining must be >= 0")


@message(0x0011)
@dataclass(frozen=True, kw_only=True)
class FlowControl:
    """Sets the sender's credit on a stream. Mustang's ``flow_control``, plus ``acked``: the last batch the
    receiver had seen, so the sender can subtract what was in flight."""

    ordinal: int
    credit: int
    acked: int

    def __post_init__(self) -> None:
        if self.ordinal < 0 or self.credit < 0 or self.acked < -1:
            raise ValueError("ordinal and credit must be >= 0, acked >= -1")


def features_to_bits(features: tuple[int, ...] | list[int]) -> bytes:
    """A feature bitset (little-endian: bit n is bit n % 8 of byte n // 8)."""
    if not features:
        return b""
    out = bytearray(max(features) // 8 + 1)
    for bit in features:
        out[bit // 8] |= 1 << (bit % 8)
    return bytes(out)


def bits_to_features(bits: bytes) -> tuple[int, ...]:
    return tuple(i * 8 + b for i, byte in enumerate(bits) for b in range(8) if byte >> b & 1)


def and_features(a: bytes, b: bytes) -> bytes:
    """The features both sides support."""
    out = bytes(x & y for x, y in zip(a, b, strict=False))
    return out.rstrip(b"\x00")
