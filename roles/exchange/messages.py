"""BinX protocol data units (RFC-0009): one request type and one reply type, codes 0x0200-0x0201.

The RFC fixes the fields but not the bytes. Ours (``docs/EXCHANGE.md`` has them byte by byte): each PDU is
one sparkbus envelope; the body is one msgpack map holding the RFC's fields under the RFC's own names, plus
an explicit request sequence number (the RFC's client dispatcher keys its promises by one) and, on replies,
the task instance id and a structured error. Page data travels as one blob frame: the pages of a reply
concatenated, split again by ``pageSizes``. The field names are camelCase on purpose: they *are* the wire
names of the RFC.

The coded fields (``requestType``, ``replyType``, ``status``, ``errorCode``) are typed ``int`` and checked
against their enum's values by the constructor, and the size lists are packed u64s (``pack_sizes``):
enum members and tuples would be converted field by field by the envelope codec on every PDU, which was
about a sixth of the whole per-request cost of a small-page exchange (docs/EXCHANGE.md section 6). The
enums below name the codes; an ``IntEnum`` compares equal to its value, so ``reply.status ==
ReplyStatus.OK`` reads as before (``is`` does not: a decoded field holds a plain int).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkbus.codecs import blob, message
from sparkbus.codecs.schema import quote

U64_MAX = (1 << 64) - 1
#: The longest task id accepted (Presto's are ``queryId.stage.partition.attempt``, well under this).
MAX_TASK_ID_LENGTH = 1024
#: The most page sizes a reply lists in ``remainingBytes`` (bounds reply and header sizes).
MAX_REMAINING_ENTRIES = 1024
#: Bytes per entry of a packed ``remainingBytes`` (a little-endian u64, the RFC's ``uint64_t``).
SIZE_BYTES = 8


def pack_sizes(sizes: Iterable[int]) -> bytes:
    """Page sizes as ``remainingBytes`` carries them: little-endian u64s, back to back.

    Raises:
        ValueError: a size is not a u64.
    """
    values = tuple(sizes)
    try:
        return struct.pack(f"<{len(values)}Q", *values)
    except struct.error:
        raise ValueError(f"page sizes must be u64s, got {quote(values)}") from None


def unpack_sizes(packed: bytes) -> tuple[int, ...]:
    """The page sizes of a packed ``remainingBytes`` or ``pageSizes`` (``pack_sizes`` reversed)."""
    return struct.unpack(f"<{len(packed) // SIZE_BYTES}Q", packed)


#: ``pageSizes`` of a reply carrying one page, by size: replies carry one page each in the common case.
_ONE_SIZE = struct.Struct("<Q")


class RequestType(enum.IntEnum):
    """What a request asks for; the reply repeats it as ``replyType``."""

    DATA = 0
    ACK = 1
    DELETE = 2


class ReplyStatus(enum.IntEnum):
    """The outcome of a request (RFC-0009).

    OK: the reply carries pages, or page sizes for a size probe, or acknowledges an ACK or DELETE.
    NODATA: nothing to send and nothing to wait for (``maxWait`` 0, or the buffer is complete).
    SERVER_ERROR: the request failed; ``errorCode`` says why and whether a retry can help.
    TIMEOUT: the long-poll expired before any page arrived.
    """

    OK = 0
    NODATA = 1
    SERVER_ERROR = 2
    TIMEOUT = 3


class ErrorCode(enum.IntEnum):
    """Why a request failed (our addition: the RFC's SERVER_ERROR carries no reason).

    UNKNOWN_BUFFER and OVERLOADED are retryable (the producer may not have created its buffer yet; the
    server may free waiters); the others are final, because a retry would get the same answer.
    """

    NONE = 0
    UNKNOWN_BUFFER = 1
    ABORTED = 2
    TOKEN_GONE = 3
    TOKEN_AHEAD = 4
    BAD_REQUEST = 5
    OVERLOADED = 6

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later."""
        return self in (ErrorCode.UNKNOWN_BUFFER, ErrorCode.OVERLOADED)


_REQUEST_TYPES = frozenset(int(t) for t in RequestType)
_STATUSES = frozenset(int(t) for t in ReplyStatus)
_ERROR_CODES = frozenset(int(t) for t in ErrorCode)
_MAX_REMAINING_BYTES = MAX_REMAINING_ENTRIES * SIZE_BYTES


def _check_u64(prefix: str, **values: int) -> None:
    for name, value in values.items():
        if not 0 <= value <= U64_MAX:
            raise ValueError(f"{prefix}{name} must be a u64, got {value}")


def _check_task_id(name: str, task_id: str) -> None:
    if not task_id or len(task_id) > MAX_TASK_ID_LENGTH:
        raise ValueError(f"{name} must have 1..{MAX_TASK_ID_LENGTH} characters, got {len(task_id)}")
    # A msgpack str is UTF-8: a lone surrogate has no such form, and a request carrying one would fail later,
    # in the node's encoder, on every retry, and never be answered.
    try:
        task_id.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} must be UTF-8 text, got a lone surrogate at character {exc.start}"
        ) from None


def check_buffer_key(task_id: str, buffer_id: int) -> None:
    """Refuse a task id or buffer id that no ``BinRequest`` can carry, naming it as a caller does.

    A client checks the buffer its caller names before it opens anything for it: a name no request can
    carry is then the caller's error at once, not a request that fails to build later, when the source
    exists and other sources' requests are being sent with it.

    Raises:
        ValueError: ``task_id`` is not 1..``MAX_TASK_ID_LENGTH`` characters or has no UTF-8 form (a lone
            surrogate), or ``buffer_id`` is not a u64.
    """
    _check_task_id("task_id", task_id)
    _check_u64("", buffer_id=buffer_id)


@message(0x0200)
@dataclass(frozen=True, kw_only=True, slots=True)
class BinRequest:
    """A BinX request (DATA, ACK or DELETE), RFC-0009 ``BinRequest``.

    Attributes:
        sequence: the client's request sequence number; the reply carries it back.
        requestType: DATA, ACK or DELETE (a ``RequestType`` value).
        getDataSize: DATA only: ask for the sizes of the available pages instead of the pages.
        maxSizeOctets: DATA only: the most page bytes wanted (the first page is sent even if larger).
        maxWaitMicroSeconds: DATA only: how long the server may hold the request when no page is ready.
        taskId: the producing task.
        bufferId: the output buffer within the task.
        pageToken: DATA: the first page wanted (acknowledges every page before it); ACK: acknowledge
            every page before it; DELETE: ignored, 0 by convention.
    """

    sequence: int
    requestType: int
    getDataSize: bool
    maxSizeOctets: int
    maxWaitMicroSeconds: int
    taskId: str
    bufferId: int
    pageToken: int

    def __post_init__(self) -> None:
        if not (
            0 <= self.sequence <= U64_MAX
            and 0 <= self.maxSizeOctets <= U64_MAX
            and 0 <= self.maxWaitMicroSeconds <= U64_MAX
            and 0 <= self.bufferId <= U64_MAX
            and 0 <= self.pageToken <= U64_MAX
        ):  # one chained test on the hot path; the call below names the field
            _check_u64(
                "BinRequest.",
                sequence=self.sequence,
                maxSizeOctets=self.maxSizeOctets,
                maxWaitMicroSeconds=self.maxWaitMicroSeconds,
                bufferId=self.bufferId,
                pageToken=self.pageToken,
            )
        if not self.taskId or len(self.taskId) > MAX_TASK_ID_LENGTH or not self.taskId.isascii():
            _check_task_id("BinRequest.taskId", self.taskId)  # isascii is O(1): an ASCII id is UTF-8
        if self.requestType == RequestType.DATA:
            if not self.getDataSize and self.maxSizeOctets == 0:
                raise ValueError(
                    "BinRequest.maxSizeOctets must be > 0 for a DATA request (or set getDataSize)"
                )
        elif self.requestType not in _REQUEST_TYPES:
            raise ValueError(
                f"BinRequest.requestType must be one of {sorted(_REQUEST_TYPES)}, got {self.requestType}"
            )
        elif self.getDataSize or self.maxSizeOctets or self.maxWaitMicroSeconds:
            # The RFC: ACK and DELETE set getDataSize false and both limits 0.
            raise ValueError(
                f"BinRequest.getDataSize/maxSizeOctets/maxWaitMicroSeconds must be false/0 "
                f"for {RequestType(self.requestType).name}"
            )


@message(0x0201)
@dataclass(frozen=True, kw_only=True, slots=True)
class BinReply:
    """A BinX reply, RFC-0009 ``BinReply``.

    Attributes:
        sequence: the ``sequence`` of the request this answers.
        replyType: the request's type (a ``RequestType`` value).
        status: OK, NODATA, SERVER_ERROR or TIMEOUT (a ``ReplyStatus`` value).
        bufferComplete: every page of the buffer has now been sent (no page follows ``pageNextToken``).
        pageToken: the token of the first page in the reply (the requested token).
        pageNextToken: the token to ask for next (``pageToken`` plus the number of pages sent).
        remainingBytes: sizes of the pages available after the ones sent (for a size probe: from
            ``pageToken``), at most ``MAX_REMAINING_ENTRIES`` of them, packed as little-endian u64s
            (``pack_sizes``; ``remaining()`` unpacks them). One msgpack bin instead of an array: a full
            128-page buffer lists 127 sizes on every reply, and this keeps that cost flat.
        pageSizes: the size of each page in ``data``, in order, packed like ``remainingBytes`` (ours:
            splits the blob; ``page_sizes()`` unpacks them, ``page_sizes_of`` packs a reply's pages).
        instanceId: the incarnation of the producing task; a change means the tokens restarted.
        errorCode: why a SERVER_ERROR happened, an ``ErrorCode`` value (NONE otherwise).
        errorMessage: a human-readable reason naming the task and buffer ("" unless SERVER_ERROR).
        data: the pages, concatenated (one blob frame).
    """

    sequence: int
    replyType: int
    status: int
    bufferComplete: bool
    pageToken: int
    pageNextToken: int
    remainingBytes: bytes
    pageSizes: bytes
    instanceId: str
    errorCode: int = ErrorCode.NONE
    errorMessage: str = ""
    data: bytes = blob(default=b"")

    def __post_init__(self) -> None:
        n_pages = self.pageNextToken - self.pageToken
        if (
            0 <= self.sequence <= U64_MAX
            and 0 <= self.pageToken <= self.pageNextToken <= U64_MAX
            and self.status in _STATUSES
            and self.replyType in _REQUEST_TYPES
            and len(self.remainingBytes) % SIZE_BYTES == 0
            and len(self.remainingBytes) <= _MAX_REMAINING_BYTES
            and (self.status == ReplyStatus.SERVER_ERROR) is (self.errorCode != ErrorCode.NONE)
            and self.errorCode in _ERROR_CODES
        ):
            # The hot path: a reply with no page, or one page (what every small-page request gets back).
            if n_pages == 0 and not self.pageSizes and not self.data:
                return
            if (
                n_pages == 1
                and len(self.pageSizes) == SIZE_BYTES
                and self.status == ReplyStatus.OK
                and self.replyType == RequestType.DATA
                and _ONE_SIZE.unpack(self.pageSizes)[0] == len(self.data)
            ):
                return
        self._check()

    def _check(self) -> None:
        """Every rule, each failure named (the slow path of ``__post_init__``)."""
        if not (0 <= self.sequence <= U64_MAX and 0 <= self.pageToken <= self.pageNextToken <= U64_MAX):
            _check_u64(
                "BinReply.",
                sequence=self.sequence,
                pageToken=self.pageToken,
                pageNextToken=self.pageNextToken,
            )
        if self.pageNextToken < self.pageToken:
            raise ValueError(
                f"BinReply.pageNextToken {self.pageNextToken} is below pageToken {self.pageToken}"
            )
        if self.replyType not in _REQUEST_TYPES:
            raise ValueError(
                f"BinReply.replyType must be one of {sorted(_REQUEST_TYPES)}, got {self.replyType}"
            )
        if self.status not in _STATUSES:
            raise ValueError(f"BinReply.status must be one of {sorted(_STATUSES)}, got {self.status}")
        if self.errorCode not in _ERROR_CODES:
            raise ValueError(
                f"BinReply.errorCode must be one of {sorted(_ERROR_CODES)}, got {self.errorCode}"
            )
        sizes = self.pageSizes
        n_sizes = len(sizes)
        if n_sizes % SIZE_BYTES:
            raise ValueError(f"BinReply.pageSizes must be packed u64 sizes, got {n_sizes} bytes")
        n_pages = n_sizes // SIZE_BYTES
        if self.pageNextToken - self.pageToken != n_pages:
            raise ValueError(
                f"BinReply.pageSizes lists {n_pages} pages but the tokens span "
                f"{self.pageNextToken - self.pageToken}"
            )
        total = sum(unpack_sizes(sizes))
        if total != len(self.data):
            raise ValueError(f"BinReply.pageSizes must sum to len(data) = {len(self.data)}, got {total}")
        n_bytes = len(self.remainingBytes)
        if n_bytes % SIZE_BYTES or n_bytes > _MAX_REMAINING_BYTES:
            raise ValueError(
                f"BinReply.remainingBytes must be at most {MAX_REMAINING_ENTRIES} packed u64 sizes "
                f"({SIZE_BYTES} bytes each), got {n_bytes} bytes"
            )
        if (self.status == ReplyStatus.SERVER_ERROR) != (self.errorCode != ErrorCode.NONE):
            raise ValueError("BinReply.errorCode must be set exactly when status is SERVER_ERROR")
        if n_pages and self.status != ReplyStatus.OK:
            raise ValueError(
                f"BinReply.status must be OK when pages are sent, got {ReplyStatus(self.status).name}"
            )
        if n_pages and self.replyType != RequestType.DATA:
            raise ValueError(
                f"BinReply.pageSizes must be empty for a {RequestType(self.replyType).name} reply"
            )

    def remaining(self) -> tuple[int, ...]:
        """The sizes in ``remainingBytes``, unpacked."""
        return unpack_sizes(self.remainingBytes)

    def page_sizes(self) -> tuple[int, ...]:
        """The sizes in ``pageSizes``, unpacked."""
        return unpack_sizes(self.pageSizes)

    @property
    def page_count(self) -> int:
        """How many pages ``data`` holds."""
        return len(self.pageSizes) // SIZE_BYTES

    def pages(self) -> list[memoryview]:
        """The pages of ``data``, as views (no copy)."""
        view = memoryview(self.data)
        out: list[memoryview] = []
        at = 0
        for size in self.page_sizes():
            out.append(view[at : at + size])
            at += size
        return out


def page_sizes_of(pages: Sequence[bytes]) -> bytes:
    """``pageSizes`` for ``pages`` (one page, the common case, without building a tuple)."""
    return _ONE_SIZE.pack(len(pages[0])) if len(pages) == 1 else pack_sizes(map(len, pages))
