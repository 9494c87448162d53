"""Output buffers of pages, keyed by (task id, buffer id): the serving side of every exchange.

Pure data structures: no clock, no lock, no I/O. The BinX server role and the HTTP exchange
(``sparkbus.bus.http_exchange``, which adds its own lock) read the same buffers.

Token rules (Presto's ``ClientBuffer``, protocol-facts section 3.3):

* Page *i* of a buffer (counting from 0 since it was created) has token *i*.
* Reading token N acknowledges every page before N: they are freed and can never be read again.
* Reading the same token again returns the same pages (a lost reply is simply requested again).
* Reading a token below the acknowledged one is an error (TOKEN_GONE); a token past the last page
  produced is an error too (TOKEN_AHEAD).

Buffer states and producer/consumer events are one transition table (``_TRANSITIONS``); anything not in it
is a ``LocalProtocolError`` naming the state, the event and the buffer.

Choices where the spec is silent:

* ``bufferComplete`` is set on the reply that carries the last page, not on a later empty reply, which
  saves the consumer one round trip before its DELETE.
* Memory is bounded per buffer and per node. A producer that would exceed a bound gets ``BufferFullError``
  and should call ``room()`` and wait, as Presto's producers block on a full buffer. A single page larger
  than a bound is still admitted into an empty buffer (or a node holding nothing), or the producer could
  never progress. So is a producer's whole output added in one call (``whole``, what ``BinxServer.publish``
  adds): its producer cannot wait for room, so the bounds stop it only where pages are already held.
* A deleted buffer is remembered (a bounded tombstone list): producers may keep adding pages (dropped, as
  Presto does after a consumer has seen enough) and readers get an empty, complete answer.
* An aborted buffer answers every read with ABORTED and frees its pages: the consumer learns of the
  failure at once instead of retrying until its error budget runs out.
* A buffer that ended (deleted, aborted, or finished with every page acknowledged) leaves the live buffers
  for the same bounded list, so a long-running server does not keep an entry for every buffer it ever
  had; once the list forgets it, a read of it is UNKNOWN_BUFFER.
"""

from __future__ import annotations

import enum
import secrets
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from sparkbus.bus.contract import LocalProtocolError
from sparkbus.codecs import MiB
from sparkbus.roles.exchange.messages import (
    MAX_REMAINING_ENTRIES,
    SIZE_BYTES,
    ErrorCode,
    pack_sizes,
    unpack_sizes,
)

#: Bytes of ``remaining`` a read returns at most.
_MAX_REMAINING = MAX_REMAINING_ENTRIES * SIZE_BYTES

BufferKey = tuple[str, int]


class BufferState(enum.Enum):
    """Where a buffer is in its life."""

    OPEN = "open"
    NO_MORE_PAGES = "no_more_pages"
    ABORTED = "aborted"
    DESTROYED = "destroyed"


class BufferEvent(enum.Enum):
    """What can happen to a buffer (producer events and the consumer's DELETE)."""

    ADD_PAGES = "add_pages"
    NO_MORE_PAGES = "no_more_pages"
    ABORT = "abort"
    DELETE = "delete"


_S, _E = BufferState, BufferEvent
_TRANSITIONS: dict[tuple[BufferState, BufferEvent], BufferState] = {
    (_S.OPEN, _E.ADD_PAGES): _S.OPEN,
    (_S.OPEN, _E.NO_MORE_PAGES): _S.NO_MORE_PAGES,
    (_S.OPEN, _E.ABORT): _S.ABORTED,
    (_S.OPEN, _E.DELETE): _S.DESTROYED,
    (_S.NO_MORE_PAGES, _E.NO_MORE_PAGES): _S.NO_MORE_PAGES,
    (_S.NO_MORE_PAGES, _E.ABORT): _S.ABORTED,
    (_S.NO_MORE_PAGES, _E.DELETE): _S.DESTROYED,
    (_S.ABORTED, _E.ABORT): _S.ABORTED,
    (_S.ABORTED, _E.DELETE): _S.DESTROYED,
    # After the consumer deleted the buffer the producer may still be running: its pages are dropped.
    (_S.DESTROYED, _E.ADD_PAGES): _S.DESTROYED,
    (_S.DESTROYED, _E.NO_MORE_PAGES): _S.DESTROYED,
    (_S.DESTROYED, _E.ABORT): _S.DESTROYED,
    (_S.DESTROYED, _E.DELETE): _S.DESTROYED,
}


class BufferFullError(LocalProtocolError):
    """The producer added pages beyond a memory bound; it should wait for ``room()``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PageResult:
    """The answer to one read of a buffer.

    Attributes:
        task_id: the producing task.
        buffer_id: the buffer within the task.
        instance_id: the buffer's incarnation ("" for an unknown buffer).
        token: the token of the first page (the token that was read).
        next_token: the token to read next.
        pages: the pages sent (empty for a size probe).
        complete: no page will ever follow ``next_token``.
        remaining: sizes of available pages after the ones sent (a probe: from ``token``), at most
            ``MAX_REMAINING_ENTRIES``, packed as BinX's ``remainingBytes`` carries them (``pack_sizes``);
            ``remaining_bytes`` unpacks them.
        error_code: why the read failed, or ``ErrorCode.NONE``.
        error_message: the reason, naming the task and buffer ("" when fine).
    """

    task_id: str
    buffer_id: int
    instance_id: str
    token: int
    next_token: int
    pages: tuple[bytes, ...] = ()
    complete: bool = False
    remaining: bytes = b""
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""

    def __post_init__(self) -> None:
        if self.next_token - self.token != len(self.pages):
            raise ValueError(
                f"PageResult: tokens {self.token}..{self.next_token} but {len(self.pages)} pages"
            )

    @property
    def remaining_bytes(self) -> tuple[int, ...]:
        """The sizes in ``remaining``, unpacked."""
        return unpack_sizes(self.remaining)

    @property
    def answerable(self) -> bool:
        """True when the result ends a long-poll: pages or sizes, completion, or an error."""
        return bool(self.pages or self.remaining or self.complete or self.error_code)


@dataclass(frozen=True, kw_only=True, slots=True)
class Waiter:
    """A parked long-poll read.

    Attributes:
        key: who waits (the server uses ``(peer, request sequence)``).
        token: the token it reads.
        max_bytes: the most page bytes it wants.
        size_only: a size probe.
        deadline: when to answer it empty (same clock as ``now``).
    """

    key: Hashable
    token: int
    max_bytes: int
    size_only: bool
    deadline: float


def may_exceed(pages: Sequence[bytes], whole: bool) -> bool:
    """Whether ``pages`` may pass a memory bound when they go where nothing is held (an empty buffer, or a
    node whose buffers hold no page): a single page, or else the producer could never progress, or a whole
    output (``whole``, ``BinxServer.publish``), whose producer cannot wait for room."""
    return whole or len(pages) == 1


def new_instance_id() -> str:
    """A fresh incarnation for a node's output buffers: 16 random hex digits, new in every process."""
    return secrets.token_hex(8)


def _error(key: BufferKey, instance_id: str, token: int, code: ErrorCode, text: str) -> PageResult:
    task_id, buffer_id = key
    return PageResult(
        task_id=task_id,
        buffer_id=buffer_id,
        instance_id=instance_id,
        token=token,
        next_token=token,
        error_code=code,
        error_message=f"task {task_id} buffer {buffer_id}: {text}",
    )


class OutputBuffer:
    """The pages one task produced for one consumer, from the oldest unacknowledged one.

    Args:
        task_id: the producing task.
        buffer_id: the buffer within the task.
        instance_id: the task's incarnation, reported with every read.
        max_bytes: the most page bytes held at once (see ``BufferFullError``).
    """

    def __init__(self, task_id: str, buffer_id: int, *, instance_id: str, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.key: BufferKey = (task_id, buffer_id)
        self.instance_id = instance_id
        self.max_bytes = max_bytes
        self.state = BufferState.OPEN
        self.abort_reason = ""
        self._pages: deque[bytes] = deque()
        # The held pages' sizes, packed as ``remainingBytes`` carries them: every read sends the sizes of
        # the pages after it (up to 1024), and a slice of this costs the same for 1 or 1024 of them.
        self._sizes = bytearray()
        self._ack_token = 0
        self._bytes = 0
        self._waiters: dict[Hashable, Waiter] = {}

    # ------------------------------------------------------------ accounting

    @property
    def ack_token(self) -> int:
        """Every page before this token was acknowledged and freed."""
        return self._ack_token

    @property
    def next_token(self) -> int:
        """The token the next added page will get."""
        return self._ack_token + len(self._pages)

    @property
    def bytes_held(self) -> int:
        """Page bytes held (added, not yet acknowledged)."""
        return self._bytes

    @property
    def pages_held(self) -> int:
        """Pages held (added, not yet acknowledged)."""
        return len(self._pages)

    @property
    def ended(self) -> bool:
        """Nothing more can happen to the buffer's pages: deleted, aborted, or finished with every page
        acknowledged."""
        state = self.state
        return state is not BufferState.OPEN and (state is not BufferState.NO_MORE_PAGES or not self._pages)

    @property
    def waiters(self) -> tuple[Waiter, ...]:
        """The parked reads, oldest first."""
        return tuple(self._waiters.values())

    def room(self) -> int:
        """Bytes the producer may add now without exceeding ``max_bytes``."""
        return max(0, self.max_bytes - self._bytes)

    # ------------------------------------------------------------ transitions

    def _step(self, event: BufferEvent) -> None:
        target = _TRANSITIONS.get((self.state, event))
        if target is None:
            raise LocalProtocolError(
                f"task {self.key[0]} buffer {self.key[1]}: {event.value} is not allowed in state "
                f"{self.state.value}"
            )
        self.state = target

    def add_pages(self, pages: Sequence[bytes], *, whole: bool = False) -> int:
        """Append pages (producer). Returns the bytes accepted (0 when the buffer was deleted).

        Args:
            pages: the pages, in order.
            whole: the producer's whole output at once (see ``may_exceed``).

        Raises:
            BufferFullError: the pages would exceed ``max_bytes`` (nothing is added), unless ``may_exceed``
                admits them into the empty buffer.
            LocalProtocolError: after ``no_more_pages`` or ``abort``.
        """
        size = sum(len(p) for p in pages)
        if (
            self.state is BufferState.OPEN
            and self._bytes + size > self.max_bytes
            and not (not self._pages and may_exceed(pages, whole))
        ):
            raise BufferFullError(
                f"task {self.key[0]} buffer {self.key[1]}: adding {size} bytes to {self._bytes} held "
                f"exceeds the bound of {self.max_bytes}"
            )
        self._step(BufferEvent.ADD_PAGES)
        if self.state is BufferState.DESTROYED:
            return 0
        held = [bytes(p) for p in pages]
        self._pages.extend(held)
        self._sizes += pack_sizes(map(len, held))
        self._bytes += size
        return size

    def no_more_pages(self) -> None:
        """The producer is done: once every page is read the buffer is complete."""
        self._step(BufferEvent.NO_MORE_PAGES)

    def abort(self, reason: str) -> int:
        """The producer failed: free every page; reads answer ABORTED. Returns the bytes freed."""
        self._step(BufferEvent.ABORT)
        if self.state is BufferState.ABORTED and not self.abort_reason:
            self.abort_reason = reason or "aborted by the producer"
        return self._free_all()

    def destroy(self) -> int:
        """The consumer deleted the buffer: free every page. Returns the bytes freed."""
        self._step(BufferEvent.DELETE)
        return self._free_all()

    def _free_all(self) -> int:
        freed = self._bytes
        self._ack_token = self.next_token
        self._pages.clear()
        self._sizes.clear()
        self._bytes = 0
        return freed

    # ------------------------------------------------------------ reads

    def acknowledge(self, token: int) -> tuple[int, ErrorCode]:
        """Free every page before ``token``. Returns (bytes freed, error code).

        An acknowledgement below the current one is a no-op (acks are best-effort and may arrive late);
        one past the last page produced is TOKEN_AHEAD.
        """
        if self.state in (BufferState.ABORTED, BufferState.DESTROYED):
            return 0, ErrorCode.NONE
        if token > self.next_token:
            return 0, ErrorCode.TOKEN_AHEAD
        freed = 0
        n = token - self._ack_token
        if n > 0:
            pop = self._pages.popleft
            for _ in range(n):
                freed += len(pop())
            del self._sizes[: n * SIZE_BYTES]
            self._ack_token = token
            self._bytes -= freed
        return freed, ErrorCode.NONE

    def read(self, token: int, max_bytes: int, *, size_only: bool = False) -> tuple[PageResult, int]:
        """Read from ``token`` (acknowledging every page before it). Returns (result, bytes freed).

        Args:
            token: the first page wanted.
            max_bytes: the most page bytes to return; the first available page is returned even if
                larger, so that a large page cannot stall the exchange.
            size_only: return the sizes of the available pages instead of the pages.
        """
        if self.state is BufferState.ABORTED:
            return _error(self.key, self.instance_id, token, ErrorCode.ABORTED, self.abort_reason), 0
        if self.state is BufferState.DESTROYED:
            return self._result(token, token, complete=True), 0
        if token < self._ack_token:
            text = f"token {token} is below the acknowledged token {self._ack_token}; its pages are gone"
            return _error(self.key, self.instance_id, token, ErrorCode.TOKEN_GONE, text), 0
        if token > self.next_token:
            text = f"token {token} is past the last page produced (next token {self.next_token})"
            return _error(self.key, self.instance_id, token, ErrorCode.TOKEN_AHEAD, text), 0
        freed = self.acknowledge(token)[0] if token > self._ack_token else 0
        finished = self.state is BufferState.NO_MORE_PAGES
        pages = self._pages
        if size_only:
            sizes = bytes(self._sizes[:_MAX_REMAINING])
            return self._result(token, token, complete=finished and not pages, remaining=sizes), freed
        if not pages:
            return self._result(token, token, complete=finished), freed
        first = pages[0]
        if len(pages) == 1 or len(first) + len(pages[1]) > max_bytes:
            taken: tuple[bytes, ...] = (first,)  # one page per request, the common case (and the RFC's)
        else:
            chosen = [first]
            total = len(first)
            later = iter(pages)
            next(later)
            for page in later:
                if total + len(page) > max_bytes:
                    break
                chosen.append(page)
                total += len(page)
            taken = tuple(chosen)
        n = len(taken)
        nxt = token + n
        rest = bytes(self._sizes[n * SIZE_BYTES : (n + MAX_REMAINING_ENTRIES) * SIZE_BYTES])
        result = self._result(
            token, nxt, pages=taken, complete=finished and nxt == self.next_token, remaining=rest
        )
        return result, freed

    def _result(
        self,
        token: int,
        nxt: int,
        *,
        pages: tuple[bytes, ...] = (),
        complete: bool = False,
        remaining: bytes = b"",
    ) -> PageResult:
        return PageResult(
            task_id=self.key[0],
            buffer_id=self.key[1],
            instance_id=self.instance_id,
            token=token,
            next_token=nxt,
            pages=pages,
            complete=complete,
            remaining=remaining,
        )

    # ------------------------------------------------------------ long-poll waiters

    def wait(self, waiter: Waiter) -> None:
        """Park a read until data, completion, an error, or its deadline.

        Raises:
            LocalProtocolError: a waiter with the same key is already parked here.
        """
        if waiter.key in self._waiters:
            raise LocalProtocolError(f"task {self.key[0]} buffer {self.key[1]}: {waiter.key!r} already waits")
        self._waiters[waiter.key] = waiter

    def cancel_wait(self, key: Hashable) -> Waiter | None:
        """Forget a parked read (its peer went away). Returns it, or None if it was not parked."""
        return self._waiters.pop(key, None)

    def take_ready(self, now: float) -> tuple[list[tuple[Waiter, PageResult, bool]], int]:
        """Answer every parked read that can be answered at ``now``, and forget them.

        Returns:
            ((waiter, result, timed_out) for each answered waiter, oldest first; bytes freed).
        """
        ready: list[tuple[Waiter, PageResult, bool]] = []
        freed = 0
        for key, waiter in list(self._waiters.items()):
            result, n = self.read(waiter.token, waiter.max_bytes, size_only=waiter.size_only)
            freed += n
            if result.answerable or waiter.deadline <= now:
                del self._waiters[key]
                ready.append((waiter, result, not result.answerable))
        return ready, freed


class OutputBuffers:
    """Every output buffer of a node, with a node-wide memory bound.

    Args:
        instance_id: the node's incarnation, stamped on buffers created without their own; by default a
            fresh random one (``new_instance_id``), so a restarted process never reuses its predecessor's
            and a consumer resuming from an old token fails with "task instance changed" instead of
            reading the new incarnation's pages under the old tokens.
        max_buffer_bytes: default per-buffer bound (Presto's ``sink.max-buffer-size`` is 32 MB).
        max_total_bytes: bound on the page bytes held by all buffers together.
        max_tombstones: how many ended buffers are remembered, the most recently ended first: deleted,
            aborted, or finished with every page acknowledged (at least 1: a DELETE or an abort answers
            the reads parked on its buffer through it). Ended buffers leave the live ones, so this bounds
            what a long-running server keeps of the buffers it had. A DELETE of a buffer not created yet
            leaves one too, so the producer's later ``create`` gets the deleted buffer and its pages are
            dropped. A forgotten buffer reads as UNKNOWN_BUFFER.
    """

    def __init__(
        self,
        *,
        instance_id: str | None = None,
        max_buffer_bytes: int = 32 * MiB,
        max_total_bytes: int = 512 * MiB,
        max_tombstones: int = 4096,
    ) -> None:
        if max_total_bytes <= 0 or max_tombstones < 1:
            raise ValueError("max_total_bytes must be positive and max_tombstones >= 1")
        self.instance_id = new_instance_id() if instance_id is None else instance_id
        self.max_buffer_bytes = max_buffer_bytes
        self.max_total_bytes = max_total_bytes
        self.max_tombstones = max_tombstones
        self._buffers: dict[BufferKey, OutputBuffer] = {}  # live: open, or finished with pages unread
        self._ended: OrderedDict[BufferKey, OutputBuffer] = OrderedDict()  # the latest ended, oldest first
        self._bytes = 0

    @property
    def bytes_held(self) -> int:
        """Page bytes held by all live buffers."""
        return self._bytes

    def __contains__(self, key: object) -> bool:
        return key in self._buffers

    def get(self, task_id: str, buffer_id: int) -> OutputBuffer | None:
        """The live buffer under this key, or the ended one while it is remembered, or None."""
        key = (task_id, buffer_id)
        return self._buffers.get(key) or self._ended.get(key)

    def keys(self) -> list[BufferKey]:
        """Keys of the live buffers."""
        return list(self._buffers)

    def _end(self, buf: OutputBuffer) -> None:
        """Move an ended buffer from the live ones to the newest end of the remembered ones, forgetting
        the oldest beyond ``max_tombstones``. None of those has a parked read: every read of an ended
        buffer is answerable (an error, or complete), so its waiters were answered when it ended."""
        key = buf.key
        self._buffers.pop(key, None)
        ended = self._ended
        ended[key] = buf
        ended.move_to_end(key)
        while len(ended) > self.max_tombstones:
            ended.popitem(last=False)

    # ------------------------------------------------------------ producer API

    def create(
        self, task_id: str, buffer_id: int, *, instance_id: str | None = None, max_bytes: int | None = None
    ) -> OutputBuffer:
        """Create an empty buffer; if its consumer already deleted it (a DELETE may come first: spec 002's
        race with setup), the deleted buffer, which drops every page added to it.

        Raises:
            LocalProtocolError: a buffer with this key exists, live or ended but not deleted.
        """
        key = (task_id, buffer_id)
        ended = self._ended.get(key)
        if key in self._buffers or (ended is not None and ended.state is not BufferState.DESTROYED):
            raise LocalProtocolError(f"task {task_id} buffer {buffer_id} already exists")
        if ended is not None:
            return ended
        buf = OutputBuffer(
            task_id,
            buffer_id,
            instance_id=self.instance_id if instance_id is None else instance_id,
            max_bytes=max_bytes or self.max_buffer_bytes,
        )
        self._buffers[key] = buf
        return buf

    def _producer_target(self, task_id: str, buffer_id: int) -> OutputBuffer:
        buf = self.get(task_id, buffer_id)
        if buf is None:
            raise LocalProtocolError(f"task {task_id} buffer {buffer_id} does not exist")
        return buf

    def room(self, task_id: str, buffer_id: int) -> int:
        """Bytes the producer may add to this buffer now."""
        buf = self._producer_target(task_id, buffer_id)
        return min(buf.room(), max(0, self.max_total_bytes - self._bytes))

    def add_pages(self, task_id: str, buffer_id: int, pages: Sequence[bytes], *, whole: bool = False) -> int:
        """Append pages to a buffer. Returns the bytes accepted (0 after the consumer deleted it).

        A producer that streams its output adds what ``room()`` allows and waits for more room; past a
        bound only one page enters an empty buffer, or a node holding nothing. With ``whole`` the pages are
        the producer's whole output (``BinxServer.publish``): they enter an empty buffer, or a node holding
        nothing, whatever their size (``may_exceed``).

        Raises:
            BufferFullError: the buffer's or the node's bound would be exceeded (nothing is added).
            LocalProtocolError: unknown buffer, or pages after ``no_more_pages`` / ``abort``.
        """
        buf = self._producer_target(task_id, buffer_id)
        size = sum(len(p) for p in pages)
        if (
            buf.state is BufferState.OPEN
            and self._bytes + size > self.max_total_bytes
            and not (not self._bytes and may_exceed(pages, whole))
        ):
            raise BufferFullError(
                f"task {task_id} buffer {buffer_id}: adding {size} bytes exceeds the node bound of "
                f"{self.max_total_bytes} ({self._bytes} held)"
            )
        added = buf.add_pages(pages, whole=whole)
        self._bytes += added
        return added

    def no_more_pages(self, task_id: str, buffer_id: int) -> None:
        """The producer finished this buffer."""
        buf = self._producer_target(task_id, buffer_id)
        buf.no_more_pages()
        if buf.ended:
            self._end(buf)

    def abort(self, task_id: str, buffer_id: int, reason: str) -> None:
        """The producer failed: readers get ABORTED with ``reason``."""
        buf = self._producer_target(task_id, buffer_id)
        self._bytes -= buf.abort(reason)
        self._end(buf)

    # ------------------------------------------------------------ consumer API

    def read(
        self, task_id: str, buffer_id: int, token: int, max_bytes: int, *, size_only: bool = False
    ) -> PageResult:
        """Read a buffer (see ``OutputBuffer.read``); an unknown buffer answers UNKNOWN_BUFFER."""
        buf = self.get(task_id, buffer_id)
        if buf is None:
            return _error((task_id, buffer_id), "", token, ErrorCode.UNKNOWN_BUFFER, "no such buffer")
        result, freed = buf.read(token, max_bytes, size_only=size_only)
        if freed:
            self._bytes -= freed
            if result.complete and buf.state is BufferState.NO_MORE_PAGES and not buf.pages_held:
                self._end(buf)  # a finished buffer whose every page is acknowledged
        return result

    def _freed(self, buf: OutputBuffer, freed: int) -> None:
        """Pages were acknowledged: account for them, and end a finished buffer with none left."""
        self._bytes -= freed
        if buf.state is BufferState.NO_MORE_PAGES and not buf.pages_held:
            self._end(buf)

    def acknowledge(self, task_id: str, buffer_id: int, token: int) -> ErrorCode:
        """Free the pages before ``token``; unknown buffers are ignored (acks are best-effort)."""
        buf = self.get(task_id, buffer_id)
        if buf is None:
            return ErrorCode.NONE
        freed, code = buf.acknowledge(token)
        if freed:
            self._freed(buf, freed)
        return code

    def delete(self, task_id: str, buffer_id: int) -> None:
        """Destroy a buffer and free its pages; deleting twice, or an unknown buffer, is fine."""
        buf = self.get(task_id, buffer_id)
        if buf is None:
            # Not created yet (or forgotten): remember the delete, so the producer's create gets a deleted
            # buffer.
            buf = OutputBuffer(
                task_id, buffer_id, instance_id=self.instance_id, max_bytes=self.max_buffer_bytes
            )
        elif buf.state is BufferState.DESTROYED:
            return
        self._bytes -= buf.destroy()
        self._end(buf)

    def take_ready(self, task_id: str, buffer_id: int, now: float) -> list[tuple[Waiter, PageResult, bool]]:
        """Answer the parked reads of one buffer that can be answered at ``now``."""
        buf = self.get(task_id, buffer_id)
        if buf is None:
            return []
        ready, freed = buf.take_ready(now)
        if freed:
            self._freed(buf, freed)
        return ready
