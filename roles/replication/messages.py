"""Replication messages (codes 0x0120..0x013f, docs/PROTOCOL.md section 3).

The spec's five opcodes (section 4.1) and the two metadata operations this family needs:

* SEGMENT_OFFER 0x0120: offer a segment (its list entry, size and checksum) to one replica placement.
* SEGMENT_ACCEPT 0x0121: start transmitting on ``stream`` with ``credit`` bytes of initial credit.
* SEGMENT_DECLINE 0x0122: not now, with one of the spec's reasons.
* SEGMENT_TRANSIT 0x0123: the sender's end-of-transit summary (bytes and chunks it sent). The chunks
  themselves travel as batches on the credit stream ``replication/{partition}/{segment_id}/{attempt}``; each
  chunk is confirmed by the credit the receiver returns (the spec's per-TRANSIT confirmation).
* SEGMENT_ACK 0x0124: the receiver stored the whole segment durably and fast-forwarded or merged it
  (``ok``), or failed to (``error``: the sender aborts and retries later).
* JOIN_FINALIZE 0x0125 and SPLIT_FINALIZE 0x0126: the metadata operations of spec 3.7 and 3.8, sent by
  a partition leader to every replica of the partition (there is no separate coordination service).
* REPLICA_HELLO 0x0127 and REPLICA_REJOIN 0x0128: a replica names its store's epoch to its peers; a peer
  that knew another epoch of that placement tells it that it joins again (spec 3.6, a store that starts
  empty under a placement its peers' acked lists still name; ``epochs.py``).
* REPLICA_ABSENT 0x0129 and REPLICA_CAUGHT_UP 0x012a: a replica whose store cannot be opened says so, and
  its peers elect another; once it opens again, the leader tells every replica when it holds what the
  leader holds, and only then may it lead again (``epochs.py``, "Replicas away").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sparkbus.bus.contract import RemoteProtocolError
from sparkbus.codecs import message
from sparkbus.codecs.schema import quote
from sparkbus.roles.replication.layout import SplitTarget
from sparkbus.roles.replication.store import EPOCH_BYTES, MAX_LSN

_MAX_ID = 256
#: Counts and versions travel as msgpack integers; everything above int64 is refused at decode.
_MAX_INT = (1 << 63) - 1
#: The longest reason a ``ReplicaAbsent`` carries (the sender cuts it to this).
MAX_ABSENT_ERROR = 1024


class DeclineReason(enum.IntEnum):
    """Why a receiver declined an offer (spec 4.1)."""

    SEGMENT_EXISTS = 1
    OVERLOADED = 2
    INVALID = 3
    INFLIGHT = 4
    OUT_OF_ORDER = 5


def _check_partition(value: str) -> None:
    if not value or len(value) > _MAX_ID:
        raise ValueError(f"partition must be 1..{_MAX_ID} characters, got {quote(value)}")


def _check_segment(value: str) -> None:
    if not value or len(value) > _MAX_ID or "/" in value:
        raise ValueError(f"segment_id must be 1..{_MAX_ID} characters without '/', got {quote(value)}")


@message(0x0120)
@dataclass(frozen=True, kw_only=True)
class SegmentOffered:
    """SEGMENT_OFFER: ``sender`` (placement) offers segment ``segment_id`` of ``partition`` to ``target``.

    ``target`` is the placement id the sender believes the receiver holds; a receiver whose placement
    differs declines INVALID (a re-assigned replica must not be taken for its previous placement).
    """

    partition: str
    segment_id: str
    base_id: str | None
    included: tuple[str, ...]
    major: bool
    rows: int
    max_lsn: int
    size: int
    checksum: bytes
    sender: int
    target: int

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_segment(self.segment_id)
        if self.base_id is None and not self.major:
            raise ValueError(f"segment {self.segment_id}: base_id None requires major")
        for name in ("rows", "max_lsn", "size", "sender", "target"):
            if not 0 <= getattr(self, name) <= _MAX_INT:
                raise ValueError(f"{name} must be in 0..2**63-1, got {getattr(self, name)}")
        if len(self.included) > 4096:
            raise ValueError(f"included lists {len(self.included)} ids, limit is 4096")


@message(0x0121)
@dataclass(frozen=True, kw_only=True)
class SegmentAccepted:
    """SEGMENT_ACCEPT: send the segment on ``stream``; ``credit`` is the initial credit in bytes."""

    partition: str
    segment_id: str
    stream: str
    credit: int

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_segment(self.segment_id)
        if self.credit < 1:
            raise ValueError(f"credit must be >= 1, got {self.credit}")
        prefix = stream_key(self.partition, self.segment_id, 0)[:-1]
        if not self.stream.startswith(prefix) or not self.stream[len(prefix) :].isdigit():
            raise ValueError(f"stream must be {prefix!r} and an attempt number, got {quote(self.stream)}")


@message(0x0122)
@dataclass(frozen=True, kw_only=True)
class SegmentDeclined:
    """SEGMENT_DECLINE with a reason."""

    partition: str
    segment_id: str
    reason: DeclineReason
    detail: str = ""

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_segment(self.segment_id)


@message(0x0123)
@dataclass(frozen=True, kw_only=True)
class SegmentTransited:
    """SEGMENT_TRANSIT summary: the sender sent ``size`` bytes in ``chunks`` batches on the stream."""

    partition: str
    segment_id: str
    size: int
    chunks: int

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_segment(self.segment_id)
        if self.size < 0 or self.chunks < 1:
            raise ValueError(f"size must be >= 0 and chunks >= 1, got {self.size}, {self.chunks}")


@message(0x0124)
@dataclass(frozen=True, kw_only=True)
class SegmentAcked:
    """SEGMENT_ACK: ``placement`` stored the segment (``ok``), or failed to (``error`` says why)."""

    partition: str
    segment_id: str
    placement: int
    ok: bool
    error: str = ""

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_segment(self.segment_id)
        if self.ok == bool(self.error):
            raise ValueError("an ACK has either ok=True and no error, or ok=False and an error")


@message(0x0125)
@dataclass(frozen=True, kw_only=True)
class JoinFinalized:
    """JOIN_FINALIZE: the joining replica ``placement`` of ``partition`` holds the latest segment.

    ``epoch`` is empty for a replica the layout placed as joining (spec 3.7), and names the store for a
    replica that joined again after it started empty (``ReplicaRejoin``).
    """

    partition: str
    placement: int
    epoch: bytes = b""

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        if self.epoch:
            _check_epoch(self.epoch)


def _check_epoch(value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) != EPOCH_BYTES:
        raise ValueError(f"epoch must be {EPOCH_BYTES} bytes, got {quote(value)}")


@message(0x0126)
@dataclass(frozen=True, kw_only=True)
class SplitFinalized:
    """SPLIT_FINALIZE: ``partition`` split into ``targets``; it moves to UNLOAD, the targets to SERVE.

    ``placement`` and ``epoch`` name the sender's store of ``partition`` (None and empty from a node that
    holds none): a node whose store heard that store's hello takes the finalize from it though its layout
    no longer places the sender (a leader an ``assign`` removed, finalizing an async split).

    ``lamport`` is the sender's clock (the split leader's when it finalized: at least every version it
    acknowledged, its memtable's included). A node that takes the finalize raises the clock of each of
    its stores of the partition and of the targets to it, so a write a target takes after the split
    gets a version above every row the split still brings it. 0 raises nothing. The spec names no such
    field; on the wire it is required like every field (a finalize without it is not taken as 0).
    """

    partition: str
    targets: tuple[SplitTarget, ...]
    async_split: bool = False
    placement: int | None = None
    epoch: bytes = b""
    lamport: int = 0

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        if not self.targets:
            raise ValueError("targets must not be empty")
        if not 0 <= self.lamport <= MAX_LSN:
            raise ValueError(f"lamport must be 0..{MAX_LSN}, got {self.lamport}")
        if (self.placement is None) != (not self.epoch):
            raise ValueError("placement and epoch come together, or neither")
        if self.epoch:
            _check_epoch(self.epoch)


HELLO_STATES = ("member", "rejoining", "joined")


@dataclass(frozen=True, kw_only=True)
class _StoreNamed:
    """A replica placement of a partition and the epoch of the store that holds it."""

    partition: str
    placement: int
    epoch: bytes

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        _check_epoch(self.epoch)


@message(0x0127)
@dataclass(frozen=True, kw_only=True)
class ReplicaHello(_StoreNamed):
    """REPLICA_HELLO: the sender's replica ``placement`` of ``partition`` holds the store ``epoch``.

    Sent to each peer that holds a replica of the partition when the link to it comes up, before anything
    else of the partition, so the peer learns of a store that started empty before it trusts its acks;
    and again when the replica is placed (``assign``) or its ``state`` changes. ``state`` is what the
    store knows of itself: ``member``, ``rejoining`` (a peer told it so) or ``joined`` (its rejoin was
    finalized). ``returning``: the replica could not be opened and now is, and the partition's leader has
    not yet said it holds what the leader holds (``ReplicaCaughtUp``); meanwhile it leads only when no other
    replica can.
    """

    state: str = "member"
    returning: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.state not in HELLO_STATES:
            raise ValueError(f"state must be one of {HELLO_STATES}, got {quote(self.state)}")


@message(0x0128)
@dataclass(frozen=True, kw_only=True)
class ReplicaRejoin(_StoreNamed):
    """REPLICA_REJOIN: the receiver's replica ``placement`` (store ``epoch``) is new to its peers.

    The sender knew another store under that placement and has struck it from its acked lists; the
    receiver takes no part in leader election until a leader finalizes its join (``JoinFinalized`` with
    the same ``epoch``).
    """


@message(0x0129)
@dataclass(frozen=True, kw_only=True)
class ReplicaAbsent:
    """REPLICA_ABSENT: the sender's replica ``placement`` of ``partition`` is not hosted: its store cannot
    be opened (``error`` says why). Sent to every live replica of the partition on each tick while so, and
    when a link comes up; the receivers elect another replica until the sender's hello names the store."""

    partition: str
    placement: int
    error: str

    def __post_init__(self) -> None:
        _check_partition(self.partition)
        if not 0 <= self.placement <= _MAX_INT:
            raise ValueError(f"placement must be in 0..2**63-1, got {self.placement}")
        if len(self.error) > MAX_ABSENT_ERROR:
            raise ValueError(f"error must be at most {MAX_ABSENT_ERROR} characters, got {len(self.error)}")


@message(0x012A)
@dataclass(frozen=True, kw_only=True)
class ReplicaCaughtUp(_StoreNamed):
    """REPLICA_CAUGHT_UP: the leader's word that the returning replica ``placement`` (store ``epoch``) has
    acknowledged every segment from the leader's latest major; it may lead again. Sent to every live
    replica of the partition."""


@message(0x012B)
@dataclass(frozen=True, kw_only=True)
class ReplicaReturns(_StoreNamed):
    """REPLICA_RETURNS: the receiver's replica ``placement`` (store ``epoch``) returns.

    The sender recorded it absent (``ReplicaAbsent``) and its hello did not say it returns: the store
    opened at a restart, before the node heard that it was away. The sender takes it for returning, and
    the receiver takes itself so too (until ``ReplicaCaughtUp``), or it would lead at once in its own
    view while the sender names another replica."""


def stream_key(partition: str, segment_id: str, attempt: int) -> str:
    """The credit stream a segment travels on (routed to the receiving ``replication`` role).

    ``attempt`` is the receiver's count of accepted offers: a retried transfer of the same segment gets a
    new key, because a key must not be reopened right after its stream's last batch (a flow-control
    grant for the old stream may still be in flight; ``sparkbus.bus.contract``).
    """
    return f"replication/{partition}/{segment_id}/{attempt}"


def parse_stream(stream: str) -> tuple[str, str, int]:
    """(partition, segment id, attempt) of a stream key made by ``stream_key``.

    Raises:
        RemoteProtocolError: not a replication stream key.
    """
    parts = stream.split("/")
    if len(parts) < 4 or parts[0] != "replication" or not parts[-1].isdigit() or not parts[-2]:
        raise RemoteProtocolError(f"stream {quote(stream)} is not a replication stream")
    return "/".join(parts[1:-2]), parts[-2], int(parts[-1])


MESSAGES: tuple[type, ...] = (
    SegmentOffered,
    SegmentAccepted,
    SegmentDeclined,
    SegmentTransited,
    SegmentAcked,
    JoinFinalized,
    SplitFinalized,
    ReplicaHello,
    ReplicaRejoin,
    ReplicaAbsent,
    ReplicaCaughtUp,
    ReplicaReturns,
)
