"""The BinX client role ("binx.client"): exchange sources that pull a remote buffer's pages.

A source is one (peer, task id, buffer id). The caller pulls with the ``LocalCall`` "fetch" (args
``peer``, ``task_id``, ``buffer_id``): each call answers with the pages received since the previous call
(``{"pages": [...], "token": first token, "complete": bool}``), parking until at least one page, the end,
or an error arrives. A page is ``bytes``, or a ``memoryview`` when its reply's data frame was large enough
for the node to keep it without a copy (``BusConfig.zero_copy_threshold``): compare, ``len``, join or
decode it as bytes; ``bytes(page)`` where bytes are needed (a view is not hashable and has no ``+``).
A call naming a ``task_id`` or ``buffer_id`` that no ``BinRequest`` can carry (it carries task ids of
1..1024 characters and buffer ids in 0..2**64-1) is refused at once with "bad arguments" and opens nothing.
The first "fetch" opens the source; "close" (same args) deletes the remote buffer and answers once the
server acknowledged the DELETE. A "close" of a source that already ended (the
caller has its end or its failure) answers at once, with None or the failure, and opens nothing: the
client remembers the last ``MAX_ENDED`` ended sources. "abandon" (same args) ends a source at once in
any state: a parked fetch fails, a DELETE goes out only if the peer is up and nobody waits for its
answer (a query that failed, for instance because the peer left, has nothing to wait for).

Per RFC-0009 and Prestissimo's exchange source:

* Lazy connect: nothing is sent to a peer before its ``PeerUp``; requests wait in their source until then
  (a DELETE issued before the link is up is sent once it is).
* One DATA request outstanding per source; its reply's ``pageNextToken`` is the next token, so every
  request acknowledges the pages before it.
* An empty reply that is not the end asks again at once if it took ``policy.min_delay`` or longer (a
  long-poll expired); sooner than that no long-poll took place (the request asked for none, or the server
  caps the wait at 0), and the next request goes out ``min_delay`` after the previous one, so that an
  open buffer with nothing yet is not polled in a tight loop (the source waits in POLL_WAIT).
* When the buffer is complete the source sends DELETE (retried like data requests).
* Failures (SERVER_ERROR with a retryable code, a request timeout, a lost peer) back off exponentially
  with jitter; after ``max_error_duration`` without a successful reply the source fails with an error
  naming the peer, task, buffer and last error. Final errors (ABORTED, a gone token, a changed task
  instance, a reply that breaks the rules) fail the source at once.

Choices where the spec is silent: the client holds at most ``max_queued_bytes`` of received pages per
source; when the caller falls behind it stops requesting and sends an ACK so the server frees what was
received. A source whose DATA request is still waiting for its peer when the caller closes it drops that
request and sends only the DELETE (the data is no longer wanted).

The source state machine is the table ``_TRANSITIONS``; anything not in it raises ``LocalProtocolError``
(caller events) or ``RemoteProtocolError`` (peer events) naming the source, its state and the event.
"""

from __future__ import annotations

import enum
import random
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkbus.bus.contract import (
    Action,
    CancelTimer,
    Event,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import MiB
from sparkbus.roles.exchange.backoff import BackoffPolicy, RetryState
from sparkbus.roles.exchange.messages import (
    BinReply,
    BinRequest,
    ErrorCode,
    ReplyStatus,
    RequestType,
    check_buffer_key,
)

#: Name of the role on a node.
CLIENT_ROLE = "binx.client"
SourceKey = tuple[str, str, int]


def source_key(args: dict[str, Any]) -> SourceKey:
    """The (peer, task id, buffer id) a "fetch", "close" or "abandon" call names.

    Raises:
        KeyError, TypeError, ValueError: an argument is missing or of the wrong kind, or names a buffer no
            ``BinRequest`` can carry (``check_buffer_key``).
    """
    peer, task_id, buffer_id = str(args["peer"]), str(args["task_id"]), int(args["buffer_id"])
    check_buffer_key(task_id, buffer_id)
    return (peer, task_id, buffer_id)


class SourceState(enum.Enum):
    """Where an exchange source is."""

    NEW = "new"
    WAITING_PEER = "waiting_peer"
    REQUESTING = "requesting"
    BACKING_OFF = "backing_off"
    POLL_WAIT = "poll_wait"
    PAUSED = "paused"
    DELETE_WAITING_PEER = "delete_waiting_peer"
    DELETING = "deleting"
    DELETE_BACKING_OFF = "delete_backing_off"
    DONE = "done"
    FAILED = "failed"


class SourceEvent(enum.Enum):
    """What can happen to a source. ``_DOWN`` variants happen while the peer's link is not up."""

    OPEN = "open"
    OPEN_DOWN = "open_down"
    CLOSE = "close"
    CLOSE_DOWN = "close_down"
    DRAINED = "drained"
    DRAINED_DOWN = "drained_down"
    PEER_UP = "peer_up"
    PEER_LOST = "peer_lost"
    PAGES = "pages"
    PAGES_FULL = "pages_full"
    EMPTY = "empty"
    EMPTY_AT_ONCE = "empty_at_once"
    COMPLETE = "complete"
    DELETE_ACKED = "delete_acked"
    RETRYABLE_ERROR = "retryable_error"
    FATAL_ERROR = "fatal_error"
    REQUEST_TIMEOUT = "request_timeout"
    RETRY_DUE = "retry_due"
    RETRY_DUE_DOWN = "retry_due_down"
    GIVE_UP = "give_up"
    ABANDON = "abandon"


_LOCAL_EVENTS = frozenset(
    {
        SourceEvent.OPEN,
        SourceEvent.OPEN_DOWN,
        SourceEvent.CLOSE,
        SourceEvent.CLOSE_DOWN,
        SourceEvent.DRAINED,
        SourceEvent.DRAINED_DOWN,
        SourceEvent.ABANDON,
    }
)

S, E = SourceState, SourceEvent
# (state, event) -> (next state, run the next state's entry actions). A False flag means "nothing to do".
_TRANSITIONS: dict[tuple[SourceState, SourceEvent], tuple[SourceState, bool]] = {
    (S.NEW, E.OPEN): (S.REQUESTING, True),
    (S.NEW, E.OPEN_DOWN): (S.WAITING_PEER, True),
    (S.NEW, E.CLOSE): (S.DELETING, True),
    (S.NEW, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.WAITING_PEER, E.PEER_UP): (S.REQUESTING, True),
    (S.WAITING_PEER, E.PEER_LOST): (S.WAITING_PEER, False),
    (S.WAITING_PEER, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.WAITING_PEER, E.GIVE_UP): (S.FAILED, True),
    (S.REQUESTING, E.PAGES): (S.REQUESTING, True),
    (S.REQUESTING, E.EMPTY): (S.REQUESTING, True),
    (S.REQUESTING, E.EMPTY_AT_ONCE): (S.POLL_WAIT, True),
    (S.REQUESTING, E.PAGES_FULL): (S.PAUSED, True),
    (S.REQUESTING, E.COMPLETE): (S.DELETING, True),
    (S.REQUESTING, E.RETRYABLE_ERROR): (S.BACKING_OFF, True),
    (S.REQUESTING, E.REQUEST_TIMEOUT): (S.BACKING_OFF, True),
    (S.REQUESTING, E.PEER_LOST): (S.BACKING_OFF, True),
    (S.REQUESTING, E.PEER_UP): (S.REQUESTING, False),
    (S.REQUESTING, E.FATAL_ERROR): (S.FAILED, True),
    (S.REQUESTING, E.GIVE_UP): (S.FAILED, True),
    (S.REQUESTING, E.CLOSE): (S.DELETING, True),
    (S.BACKING_OFF, E.RETRY_DUE): (S.REQUESTING, True),
    (S.BACKING_OFF, E.RETRY_DUE_DOWN): (S.WAITING_PEER, True),
    (S.BACKING_OFF, E.PEER_UP): (S.BACKING_OFF, False),
    (S.BACKING_OFF, E.PEER_LOST): (S.BACKING_OFF, False),
    (S.BACKING_OFF, E.CLOSE): (S.DELETING, True),
    (S.BACKING_OFF, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.BACKING_OFF, E.GIVE_UP): (S.FAILED, True),
    (S.POLL_WAIT, E.RETRY_DUE): (S.REQUESTING, True),
    (S.POLL_WAIT, E.RETRY_DUE_DOWN): (S.WAITING_PEER, True),
    (S.POLL_WAIT, E.PEER_UP): (S.POLL_WAIT, False),
    (S.POLL_WAIT, E.PEER_LOST): (S.POLL_WAIT, False),
    (S.POLL_WAIT, E.CLOSE): (S.DELETING, True),
    (S.POLL_WAIT, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.PAUSED, E.DRAINED): (S.REQUESTING, True),
    (S.PAUSED, E.DRAINED_DOWN): (S.WAITING_PEER, True),
    (S.PAUSED, E.PEER_UP): (S.PAUSED, False),
    (S.PAUSED, E.PEER_LOST): (S.PAUSED, False),
    (S.PAUSED, E.CLOSE): (S.DELETING, True),
    (S.PAUSED, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.DELETE_WAITING_PEER, E.PEER_UP): (S.DELETING, True),
    (S.DELETE_WAITING_PEER, E.PEER_LOST): (S.DELETE_WAITING_PEER, False),
    (S.DELETE_WAITING_PEER, E.CLOSE_DOWN): (S.DELETE_WAITING_PEER, False),
    (S.DELETE_WAITING_PEER, E.GIVE_UP): (S.FAILED, True),
    (S.DELETING, E.DELETE_ACKED): (S.DONE, True),
    (S.DELETING, E.RETRYABLE_ERROR): (S.DELETE_BACKING_OFF, True),
    (S.DELETING, E.REQUEST_TIMEOUT): (S.DELETE_BACKING_OFF, True),
    (S.DELETING, E.PEER_LOST): (S.DELETE_BACKING_OFF, True),
    (S.DELETING, E.PEER_UP): (S.DELETING, False),
    (S.DELETING, E.FATAL_ERROR): (S.FAILED, True),
    (S.DELETING, E.GIVE_UP): (S.FAILED, True),
    (S.DELETING, E.CLOSE): (S.DELETING, False),
    (S.DELETE_BACKING_OFF, E.RETRY_DUE): (S.DELETING, True),
    (S.DELETE_BACKING_OFF, E.RETRY_DUE_DOWN): (S.DELETE_WAITING_PEER, True),
    (S.DELETE_BACKING_OFF, E.PEER_UP): (S.DELETE_BACKING_OFF, False),
    (S.DELETE_BACKING_OFF, E.PEER_LOST): (S.DELETE_BACKING_OFF, False),
    (S.DELETE_BACKING_OFF, E.CLOSE): (S.DELETE_BACKING_OFF, False),
    (S.DELETE_BACKING_OFF, E.CLOSE_DOWN): (S.DELETE_BACKING_OFF, False),
    (S.DELETE_BACKING_OFF, E.GIVE_UP): (S.FAILED, True),
    (S.DONE, E.PEER_UP): (S.DONE, False),
    (S.DONE, E.PEER_LOST): (S.DONE, False),
    (S.DONE, E.CLOSE): (S.DONE, True),
    (S.DONE, E.CLOSE_DOWN): (S.DONE, True),
    (S.FAILED, E.PEER_UP): (S.FAILED, False),
    (S.FAILED, E.PEER_LOST): (S.FAILED, False),
    (S.FAILED, E.CLOSE): (S.FAILED, True),
    (S.FAILED, E.CLOSE_DOWN): (S.FAILED, True),
}
# The caller no longer wants the source in any state: it ends here, with no DELETE to wait for.
_TRANSITIONS.update({(state, E.ABANDON): (S.DONE, True) for state in S})
del S, E

#: How many ended sources a client remembers, so that a late "close" of one opens nothing.
MAX_ENDED = 4096

_SENDING = (SourceState.REQUESTING, SourceState.DELETING)
# States whose "retry/{sid}" timer sends the next request.
_TIMED_RETRY = (SourceState.BACKING_OFF, SourceState.POLL_WAIT, SourceState.DELETE_BACKING_OFF)
# States in which the server may still hold pages this source asked for and no DELETE is in flight.
_UNDELETED = (
    SourceState.REQUESTING,
    SourceState.BACKING_OFF,
    SourceState.POLL_WAIT,
    SourceState.PAUSED,
    SourceState.DELETE_BACKING_OFF,
)


@dataclass(kw_only=True)
class Source:
    """The client-side state of one exchange source (mutable; owned by ``BinxClient``)."""

    sid: int
    peer: str
    task_id: str
    buffer_id: int
    retry: RetryState
    state: SourceState = SourceState.NEW
    token: int = 0
    instance_id: str = ""
    complete: bool = False
    end_delivered: bool = False
    closing: bool = False
    queue: deque[bytes | memoryview] = field(default_factory=deque)  # views: large pages (``_classify``)
    queue_token: int = 0
    queued_bytes: int = 0
    outstanding: int | None = None
    sent_at: float = 0.0  # when the last DATA request went out
    deadline: float = 0.0
    timer_at: float | None = None
    fetch_call: int | None = None
    close_calls: list[int] = field(default_factory=list)
    last_error: str = ""
    error: str = ""

    @property
    def label(self) -> str:
        """How logs and errors name this source."""
        return f"binx source task {self.task_id} buffer {self.buffer_id} at peer {self.peer}"


#: ``RequestType.DATA`` as a plain int: the codec sends an int as it is, an IntEnum through a conversion.
_DATA = int(RequestType.DATA)


def _control(src: Source, kind: RequestType, sequence: int) -> BinRequest:
    """An ACK (of everything before the source's token) or a DELETE of the source's buffer."""
    return BinRequest(
        sequence=sequence,
        requestType=int(kind),
        getDataSize=False,
        maxSizeOctets=0,
        maxWaitMicroSeconds=0,
        taskId=src.task_id,
        bufferId=src.buffer_id,
        pageToken=src.token if kind is RequestType.ACK else 0,
    )


class BinxClient:
    """Exchange sources over BinX, pulled by ``LocalCall`` "fetch" and ended by "close".

    Args:
        rng: the source of back-off jitter (seed it; never the global random).
        policy: back-off and give-up settings.
        max_request_bytes: ``maxSizeOctets`` of each DATA request (the first page is sent even if larger).
        max_wait: ``maxWaitMicroSeconds`` of each DATA request, in seconds (the long-poll).
        request_timeout: how long past ``max_wait`` a reply may take before the request counts as failed.
        max_queued_bytes: received bytes held per source before it pauses until the caller fetches.
        max_sources: the most sources at once; more "fetch" calls are refused.
    """

    name = CLIENT_ROLE
    messages: ClassVar[tuple[type, ...]] = (BinReply,)

    def __init__(
        self,
        *,
        rng: random.Random | None = None,
        policy: BackoffPolicy | None = None,
        max_request_bytes: int = 1 * MiB,
        max_wait: float = 2.0,
        request_timeout: float = 20.0,
        max_queued_bytes: int = 32 * MiB,
        max_sources: int = 10_000,
    ) -> None:
        if max_request_bytes <= 0 or max_queued_bytes <= 0 or max_wait < 0 or request_timeout <= 0:
            raise ValueError("max_request_bytes, max_queued_bytes, request_timeout > 0 and max_wait >= 0")
        self.rng = rng if rng is not None else random.Random(0)
        self.policy = policy or BackoffPolicy()
        self.max_request_bytes = max_request_bytes
        self.max_wait = max_wait
        self.request_timeout = request_timeout
        self.max_queued_bytes = max_queued_bytes
        self.max_sources = max_sources
        self.up: set[str] = set()
        self._sources: dict[SourceKey, Source] = {}
        self._by_sid: dict[int, Source] = {}
        self._requests: dict[int, int] = {}  # request sequence -> source id
        # Ended sources, oldest first: key -> the failure's text, or None when it ended cleanly.
        self._ended: OrderedDict[SourceKey, str | None] = OrderedDict()
        self._next_sid = 0
        self._next_seq = 0
        self.counters: dict[str, int] = {
            "requests": 0,
            "retries": 0,
            "poll_waits": 0,
            "stale_replies": 0,
            "acks": 0,
        }

    def source(self, peer: str, task_id: str, buffer_id: int) -> Source | None:
        """The source for this key, if it exists."""
        return self._sources.get((peer, task_id, buffer_id))

    # ------------------------------------------------------------ role interface

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one bus event."""
        out: list[Action] = []
        if isinstance(event, MessageReceived) and isinstance(event.message, BinReply):
            self._on_reply(event.peer, event.message, now, out)
        elif isinstance(event, LocalCall):
            self._on_call(event, now, out)
        elif isinstance(event, TimerFired):
            self._on_timer(event.key, now, out)
        elif isinstance(event, PeerUp):
            self.up.add(event.peer)
            for src in self._of_peer(event.peer):
                self._step_one_of_many(src, SourceEvent.PEER_UP, now, out)
        elif isinstance(event, PeerLost):
            self.up.discard(event.peer)
            for src in self._of_peer(event.peer):
                src.last_error = f"peer {event.peer} lost: {event.reason}"
                self._forget_request(src)
                self._step_one_of_many(src, SourceEvent.PEER_LOST, now, out)
        return out

    def _step_one_of_many(self, src: Source, event: SourceEvent, now: float, out: list[Action]) -> None:
        """Step one of the sources an event moves together, so that its failure stops only itself.

        A raise here would lose every action of the sources stepped before it (their requests and
        timers, with their states already moved on) and skip the ones after it: they would wait forever.
        The source that raised fails instead; its caller gets the error.
        """
        try:
            self._step(src, event, now, out)
        except Exception as exc:  # any bug in one source's step, not only the request it could not build
            self._break(src, f"ExchangeFailed: {src.label}: {event.value} raised {exc!r}", out)

    def _of_peer(self, peer: str) -> list[Source]:
        return [s for s in self._sources.values() if s.peer == peer]

    # ------------------------------------------------------------ local calls

    def _on_call(self, call: LocalCall, now: float, out: list[Action]) -> None:
        try:
            key = source_key(call.args)
        except (KeyError, TypeError, ValueError) as exc:
            out.append(Reply(call_id=call.call_id, error=f"LocalProtocolError: bad arguments: {exc!r}"))
            return
        peer = key[0]
        if call.name not in ("fetch", "close", "abandon"):
            out.append(
                Reply(
                    call_id=call.call_id, error=f"LocalProtocolError: {CLIENT_ROLE} has no call {call.name!r}"
                )
            )
            return
        src = self._sources.get(key)
        if src is None and call.name != "fetch" and (call.name == "abandon" or key in self._ended):
            # Nothing is open: a source that already ended, or one never opened that is abandoned. A close
            # here must not open a new source (its DELETE would wait for a lost peer until give-up).
            error = self._ended.get(key) if call.name == "close" else None
            out.append(Reply(call_id=call.call_id, error=error))
            return
        if src is None:
            if len(self._sources) >= self.max_sources:
                out.append(
                    Reply(call_id=call.call_id, error=f"LocalProtocolError: {self.max_sources} sources open")
                )
                return
            src = self._open(key)
        up = peer in self.up
        if call.name == "abandon":
            if up and src.state in _UNDELETED:
                self._send_delete_untracked(src, out)
            src.close_calls.append(call.call_id)
            self._step(src, SourceEvent.ABANDON, now, out)
            return
        if call.name == "close":
            src.closing = True
            src.close_calls.append(call.call_id)
            self._step(src, SourceEvent.CLOSE if up else SourceEvent.CLOSE_DOWN, now, out)
            return
        if src.fetch_call is not None:
            out.append(
                Reply(
                    call_id=call.call_id, error=f"LocalProtocolError: {src.label}: a fetch is already waiting"
                )
            )
            return
        src.fetch_call = call.call_id
        if src.state is SourceState.NEW:
            self._step(src, SourceEvent.OPEN if up else SourceEvent.OPEN_DOWN, now, out)
        self._deliver(src, out)
        if src.state is SourceState.PAUSED and src.queued_bytes < self.max_queued_bytes:
            self._step(src, SourceEvent.DRAINED if up else SourceEvent.DRAINED_DOWN, now, out)

    def _open(self, key: SourceKey) -> Source:
        self._ended.pop(key, None)
        self._next_sid += 1
        src = Source(
            sid=self._next_sid,
            peer=key[0],
            task_id=key[1],
            buffer_id=key[2],
            retry=RetryState(self.policy, self.rng),
        )
        self._sources[key] = src
        self._by_sid[src.sid] = src
        return src

    def _deliver(self, src: Source, out: list[Action]) -> None:
        """Answer a parked fetch if there is anything to say; drop the source once it said everything."""
        if src.fetch_call is None:
            return
        if src.state is SourceState.FAILED:
            out.append(Reply(call_id=src.fetch_call, error=src.error))
            src.fetch_call = None
            self._drop(src)
            return
        ended = src.complete and src.state is not SourceState.REQUESTING
        if not src.queue and not ended:
            return
        pages = list(src.queue)
        result = {"pages": pages, "token": src.queue_token, "complete": src.complete}
        out.append(Reply(call_id=src.fetch_call, result=result))
        src.fetch_call = None
        src.queue_token += len(pages)
        src.queue.clear()
        src.queued_bytes = 0
        src.end_delivered = src.complete
        if src.complete and src.state is SourceState.DONE and not src.close_calls:
            self._drop(src)

    def _drop(self, src: Source) -> None:
        key = (src.peer, src.task_id, src.buffer_id)
        self._sources.pop(key, None)
        self._by_sid.pop(src.sid, None)
        self._ended[key] = src.error if src.state is SourceState.FAILED else None
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    # ------------------------------------------------------------ the state machine

    def _step(self, src: Source, event: SourceEvent, now: float, out: list[Action]) -> None:
        entry = _TRANSITIONS.get((src.state, event))
        if entry is None:
            err = LocalProtocolError if event in _LOCAL_EVENTS else RemoteProtocolError
            raise err(f"{src.label}: event {event.value} is not allowed in state {src.state.value}")
        target, run_entry = entry
        src.state = target
        if run_entry:
            self._enter(src, event, now, out)

    def _enter(self, src: Source, event: SourceEvent, now: float, out: list[Action]) -> None:
        state = src.state
        if state in (SourceState.REQUESTING, SourceState.DELETING):
            self._send(src, now, out)
        elif state in (SourceState.BACKING_OFF, SourceState.DELETE_BACKING_OFF):
            self._back_off(src, now, out)
        elif state is SourceState.POLL_WAIT:
            # No failure: the buffer is open and empty, and the server did not wait for a page.
            self.counters["poll_waits"] += 1
            out.append(SetTimer(key=f"retry/{src.sid}", at=src.sent_at + self.policy.min_delay))
        elif state in (SourceState.WAITING_PEER, SourceState.DELETE_WAITING_PEER):
            src.retry.start_error_period(now)
            self._arm_give_up(src, out)
        elif state is SourceState.PAUSED:
            self._send_ack(src, out)
        elif state is SourceState.DONE and event is SourceEvent.ABANDON:
            self._abandon(src, out)
        elif state is SourceState.DONE:
            self._finish(src, out)
        elif state is SourceState.FAILED:
            self._fail(src, event, now, out)

    def _send(self, src: Source, now: float, out: list[Action]) -> None:
        self._next_seq += 1
        seq = self._next_seq
        if src.state is SourceState.DELETING:
            req = _control(src, RequestType.DELETE, seq)
            wait = 0.0
        else:
            room = max(1, self.max_queued_bytes - src.queued_bytes)
            req = BinRequest(
                sequence=seq,
                requestType=_DATA,
                getDataSize=False,
                maxSizeOctets=min(self.max_request_bytes, room),
                maxWaitMicroSeconds=int(self.max_wait * 1e6),
                taskId=src.task_id,
                bufferId=src.buffer_id,
                pageToken=src.token,
            )
            wait = self.max_wait
            src.sent_at = now
        self._forget_request(src)
        src.outstanding = seq
        self._requests[seq] = src.sid
        self.counters["requests"] += 1
        out.append(Send(peer=src.peer, message=req))
        # One timer per source, not per request: while requests are answered in time, the timer armed for
        # an earlier one is moved to the current request's deadline when it fires (``_on_timer``), so a
        # steady transfer sets about one timer per request timeout instead of a set and a cancel per chunk.
        src.deadline = now + wait + self.request_timeout
        if src.timer_at is None or src.timer_at > src.deadline:
            src.timer_at = src.deadline
            out.append(SetTimer(key=f"request/{src.sid}", at=src.deadline))

    def _send_ack(self, src: Source, out: list[Action]) -> None:
        if src.peer not in self.up:
            return
        self._next_seq += 1
        self.counters["acks"] += 1
        out.append(Send(peer=src.peer, message=_control(src, RequestType.ACK, self._next_seq)))

    def _forget_request(self, src: Source) -> None:
        if src.outstanding is not None:
            self._requests.pop(src.outstanding, None)
            src.outstanding = None

    def _back_off(self, src: Source, now: float, out: list[Action]) -> None:
        delay = src.retry.failed(now)
        give_up_at = src.retry.give_up_at()
        if give_up_at is not None and now >= give_up_at:
            self._step(src, SourceEvent.GIVE_UP, now, out)
            return
        self.counters["retries"] += 1
        out.append(SetTimer(key=f"retry/{src.sid}", at=now + delay))
        self._arm_give_up(src, out)

    def _arm_give_up(self, src: Source, out: list[Action]) -> None:
        at = src.retry.give_up_at()
        if at is not None:
            out.append(SetTimer(key=f"giveup/{src.sid}", at=at))

    def _finish(self, src: Source, out: list[Action]) -> None:
        self._forget_request(src)
        self._cancel_timers(src, out)
        for call_id in src.close_calls:
            out.append(Reply(call_id=call_id, result=None))
        had_close = bool(src.close_calls)
        src.close_calls.clear()
        if had_close:
            if src.fetch_call is not None:
                out.append(Reply(call_id=src.fetch_call, error=f"LocalProtocolError: {src.label} was closed"))
                src.fetch_call = None
            self._drop(src)
        elif src.end_delivered:
            self._drop(src)  # the caller already has every page and the end: nothing left to say
        else:
            self._deliver(src, out)

    def _abandon(self, src: Source, out: list[Action]) -> None:
        self._end_now(src, f"LocalProtocolError: {src.label} was abandoned", None, out)

    def _break(self, src: Source, error: str, out: list[Action]) -> None:
        """Fail a source whose step raised, at once: what it was doing is unknown, so nothing is retried."""
        self.counters["broken_sources"] = self.counters.get("broken_sources", 0) + 1
        src.state = SourceState.FAILED
        src.error = error
        if src.sid in self._by_sid:  # it may have ended before it raised
            self._end_now(src, error, error, out)

    def _end_now(self, src: Source, fetch_error: str, close_error: str | None, out: list[Action]) -> None:
        """Drop a source at once, answering its parked fetch and its closes."""
        self._forget_request(src)
        self._cancel_timers(src, out)
        if src.fetch_call is not None:
            out.append(Reply(call_id=src.fetch_call, error=fetch_error))
            src.fetch_call = None
        for call_id in src.close_calls:
            out.append(Reply(call_id=call_id, error=close_error))
        src.close_calls.clear()
        self._drop(src)

    def _cancel_timers(self, src: Source, out: list[Action]) -> None:
        src.timer_at = None
        out.extend(CancelTimer(key=f"{kind}/{src.sid}") for kind in ("request", "retry", "giveup"))

    def _send_delete_untracked(self, src: Source, out: list[Action]) -> None:
        """A DELETE nobody waits for (its reply counts as stale): frees the server's pages if it is there."""
        self._next_seq += 1
        self.counters["requests"] += 1
        out.append(Send(peer=src.peer, message=_control(src, RequestType.DELETE, self._next_seq)))

    def _fail(self, src: Source, event: SourceEvent, now: float, out: list[Action]) -> None:
        if event in (SourceEvent.CLOSE, SourceEvent.CLOSE_DOWN):
            # A close after the failure: nothing to delete any more; say why the source failed.
            for call_id in src.close_calls:
                out.append(Reply(call_id=call_id, error=src.error))
            src.close_calls.clear()
            self._drop(src)
            return
        if event is SourceEvent.GIVE_UP:
            start = src.retry.first_failure_at if src.retry.first_failure_at is not None else now
            src.error = (
                f"ExchangeGaveUp: {src.label}: no successful reply for {now - start:.1f} s "
                f"(max error duration {self.policy.max_error_duration:g} s); last error: {src.last_error or 'none'}"
            )
        else:
            src.error = src.last_error
        self._forget_request(src)
        self._cancel_timers(src, out)
        if src.complete and not src.closing:
            # Every page arrived; only the clean-up DELETE failed. The caller's data is whole.
            src.state = SourceState.DONE
            self.counters["delete_failures"] = self.counters.get("delete_failures", 0) + 1
            self._deliver(src, out)  # a parked fetch gets the end now, and the source is dropped
            if src.end_delivered:
                self._drop(src)  # the caller had the end already: nobody asks about this source again
            return
        had_close = bool(src.close_calls)
        for call_id in src.close_calls:
            out.append(Reply(call_id=call_id, error=src.error))
        src.close_calls.clear()
        self._deliver(src, out)  # a parked fetch gets the failure, and the source is dropped
        if had_close:
            # The closing caller has the failure. Dropped, it still answers a late "close" with it (``_ended``)
            # and no longer counts against ``max_sources``.
            self._drop(src)

    # ------------------------------------------------------------ timers

    def _on_timer(self, key: str, now: float, out: list[Action]) -> None:
        kind, _, num = key.partition("/")
        if not num.isdigit():
            return
        src = self._by_sid.get(int(num))
        if src is None:
            return
        if kind == "request":
            src.timer_at = None
            if src.outstanding is None:
                return
            if now < src.deadline:  # armed for an earlier request that was answered: move it
                src.timer_at = src.deadline
                out.append(SetTimer(key=f"request/{src.sid}", at=src.deadline))
                return
            seq = src.outstanding
            self._forget_request(src)
            src.last_error = f"no reply to request {seq} within {self.max_wait + self.request_timeout:g} s"
            self._step(src, SourceEvent.REQUEST_TIMEOUT, now, out)
            return
        if kind == "retry" and src.state in _TIMED_RETRY:
            self._step(
                src, SourceEvent.RETRY_DUE if src.peer in self.up else SourceEvent.RETRY_DUE_DOWN, now, out
            )
        elif kind == "giveup" and src.state not in (*_SENDING, SourceState.DONE, SourceState.FAILED):
            # A request in flight decides for itself: its failure checks the deadline in _back_off.
            at = src.retry.give_up_at()
            if at is not None and now >= at:
                self._step(src, SourceEvent.GIVE_UP, now, out)

    # ------------------------------------------------------------ replies

    def _on_reply(self, peer: str, reply: BinReply, now: float, out: list[Action]) -> None:
        if reply.replyType == RequestType.ACK:
            return  # acknowledgements are best-effort; their replies are ignored (RFC-0009)
        sid = self._requests.get(reply.sequence)
        src = self._by_sid.get(sid) if sid is not None else None
        if src is None or src.peer != peer or src.outstanding != reply.sequence:
            self.counters["stale_replies"] += 1
            return
        self._forget_request(src)
        event = self._classify(src, reply)
        if event not in (SourceEvent.RETRYABLE_ERROR, SourceEvent.FATAL_ERROR) and (
            src.retry.first_failure_at is not None
        ):
            src.retry.succeeded()
            out.append(CancelTimer(key=f"giveup/{src.sid}"))
        if event is SourceEvent.EMPTY and now < src.sent_at + self.policy.min_delay:
            event = SourceEvent.EMPTY_AT_ONCE  # no long-poll took place: ask again later, not now
        if event is SourceEvent.PAGES:
            # Hand pages to a waiting caller first, so that the next request can ask for more room.
            self._deliver(src, out)
            if src.queued_bytes >= self.max_queued_bytes:
                event = SourceEvent.PAGES_FULL
        self._step(src, event, now, out)
        if event is SourceEvent.COMPLETE:
            self._deliver(src, out)

    def _classify(self, src: Source, reply: BinReply) -> SourceEvent:
        """Check a reply against the request it answers and turn it into a source event."""
        expected = RequestType.DELETE if src.state is SourceState.DELETING else RequestType.DATA
        if reply.replyType != expected:
            got = RequestType(reply.replyType).name
            return self._violation(src, f"a {got} reply to a {expected.name} request")
        if reply.status == ReplyStatus.SERVER_ERROR:
            code = ErrorCode(reply.errorCode)
            src.last_error = f"{code.name}: {reply.errorMessage}"
            if code.retryable:
                return SourceEvent.RETRYABLE_ERROR
            src.last_error = f"ExchangeFailed: {src.label}: {src.last_error}"
            return SourceEvent.FATAL_ERROR
        if expected is RequestType.DELETE:
            return SourceEvent.DELETE_ACKED
        if src.instance_id and reply.instanceId and reply.instanceId != src.instance_id:
            src.last_error = (
                f"ExchangeFailed: {src.label}: task instance changed from {src.instance_id!r} to "
                f"{reply.instanceId!r} (the producer restarted; its tokens start again)"
            )
            return SourceEvent.FATAL_ERROR
        if reply.pageToken != src.token:
            return self._violation(
                src, f"pageToken {reply.pageToken} answers a request for token {src.token}"
            )
        src.instance_id = src.instance_id or reply.instanceId
        n_pages = reply.pageNextToken - reply.pageToken
        if n_pages == 1:
            # One chunk per reply, as it arrived: bytes, or for a large one (the node's zero-copy
            # threshold) a memoryview on the ZeroMQ frame the node received it in. No copy either way.
            src.queue.append(reply.data)
        elif n_pages:
            # Several pages in one blob: views into a received frame stay views (the pages keep the frame
            # alive, and they all leave together); pages of a small reply, which came as bytes, are copied
            # out so that a caller gets bytes for them, as before.
            pages = reply.pages()
            src.queue.extend(map(bytes, pages) if type(reply.data) is bytes else pages)
        src.queued_bytes += len(reply.data)
        src.token = reply.pageNextToken
        if reply.bufferComplete:
            src.complete = True
            return SourceEvent.COMPLETE
        return SourceEvent.PAGES if n_pages else SourceEvent.EMPTY

    def _violation(self, src: Source, what: str) -> SourceEvent:
        src.last_error = f"RemoteProtocolError: {src.label}: {what}"
        return SourceEvent.FATAL_ERROR
