"""The BinX server role ("binx.server"): answers DATA, ACK and DELETE requests from its output buffers.

DATA requests that find no page long-poll up to their ``maxWaitMicroSeconds`` (capped by the server): the
request is parked on its buffer and a timer is set for its deadline. A parked request is answered as soon
as a page, completion, an abort or a DELETE makes it answerable, or with TIMEOUT when its timer fires.
Parked requests of a peer that is lost are dropped (there is nobody to answer).

Producers on the node use the methods ``create_buffer``, ``add_pages``, ``no_more_pages`` and
``abort_buffer`` (each returns the actions that answer parked requests), or the same operations as
``LocalCall`` names: ``create``, ``add_pages``, ``no_more_pages``, ``abort``, ``room``. ``publish``
(``pages``, ``last``) does create, add and finish in one call, as another role of the node (the query
role) uses it through the bus's ``Call``.

The node driver's HTTP exchange server reads the same buffers through three more ``LocalCall`` names
(the buffers live on the loop thread): ``read`` (``token``, ``max_bytes``, ``wait`` seconds,
``size_only``) answers a ``PageResult``, long-polling like a DATA request (parked on the buffer with a
timer; answered early by pages, completion, abort or DELETE); ``acknowledge`` (``token``) answers the
error code as an int; ``delete`` answers None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from sparkbus.bus.contract import (
    Action,
    CancelTimer,
    Event,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    PeerLost,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import MiB
from sparkbus.roles.exchange.buffers import BufferKey, OutputBuffers, PageResult, Waiter
from sparkbus.roles.exchange.messages import (
    BinReply,
    BinRequest,
    ErrorCode,
    ReplyStatus,
    RequestType,
    check_buffer_key,
    page_sizes_of,
)

#: Name of the role on a node.
SERVER_ROLE = "binx.server"


# The coded fields as plain ints: the codec sends an int as it is, an IntEnum through a conversion.
_DATA = int(RequestType.DATA)
_OK, _NODATA, _SERVER_ERROR, _TIMEOUT = (
    int(ReplyStatus.OK),
    int(ReplyStatus.NODATA),
    int(ReplyStatus.SERVER_ERROR),
    int(ReplyStatus.TIMEOUT),
)


def reply_for(request: BinRequest, result: PageResult, *, timed_out: bool = False) -> BinReply:
    """The reply to a DATA request from a buffer read.

    Status: SERVER_ERROR for an error; OK with pages (or with sizes, for a size probe); otherwise TIMEOUT
    when a long-poll expired, else NODATA (nothing to wait for: complete, or no wait was asked).
    """
    pages = result.pages
    code = result.error_code
    if code is not ErrorCode.NONE:
        status = _SERVER_ERROR
    elif pages or (request.getDataSize and result.remaining):
        status = _OK
    elif timed_out:
        status = _TIMEOUT
    else:
        status = _NODATA
    return BinReply(
        sequence=request.sequence,
        replyType=_DATA,
        status=status,
        bufferComplete=result.complete,
        pageToken=result.token,
        pageNextToken=result.next_token,
        remainingBytes=result.remaining,
        pageSizes=page_sizes_of(pages) if pages else b"",
        instanceId=result.instance_id,
        errorCode=int(code),
        errorMessage=result.error_message,
        data=pages[0] if len(pages) == 1 else b"".join(pages),
    )


def _simple_reply(
    request: BinRequest, instance_id: str, code: ErrorCode = ErrorCode.NONE, text: str = ""
) -> BinReply:
    return BinReply(
        sequence=request.sequence,
        replyType=int(request.requestType),
        status=_OK if code is ErrorCode.NONE else _SERVER_ERROR,
        bufferComplete=request.requestType == RequestType.DELETE,
        pageToken=request.pageToken,
        pageNextToken=request.pageToken,
        remainingBytes=b"",
        pageSizes=b"",
        instanceId=instance_id,
        errorCode=int(code),
        errorMessage=text,
    )


class BinxServer:
    """Serves a node's output buffers over BinX.

    Args:
        buffers: the node's output buffers (shared with producers and possibly the HTTP exchange).
        max_wait: the longest long-poll honoured, in seconds (longer requests are capped).
        max_reply_bytes: cap on ``maxSizeOctets`` (a single page larger than this is still sent whole).
        max_waiters: the most parked requests on the node; beyond it DATA requests that would park are
            answered SERVER_ERROR / OVERLOADED (retryable), so no peer can make the server hold
            unbounded state.
    """

    name = SERVER_ROLE
    messages: ClassVar[tuple[type, ...]] = (BinRequest,)

    def __init__(
        self,
        buffers: OutputBuffers | None = None,
        *,
        max_wait: float = 30.0,
        max_reply_bytes: int = 32 * MiB,
        max_waiters: int = 10_000,
    ) -> None:
        self.buffers = buffers if buffers is not None else OutputBuffers()
        self.max_wait = max_wait
        self.max_reply_bytes = max_reply_bytes
        self.max_waiters = max_waiters
        # (peer, sequence) -> (buffer key, request) for every parked request.
        self._parked: dict[tuple[str, int], tuple[BufferKey, BinRequest]] = {}
        # call id -> buffer key for every parked ``read`` call (the HTTP exchange's long-polls); their
        # waiters are keyed by the call id alone, an int, where BinX's are (peer, sequence) tuples.
        self._reads: dict[int, BufferKey] = {}
        self.counters: dict[str, int] = {
            "requests": 0,
            "timeouts": 0,
            "bad_requests": 0,
            "dropped_waiters": 0,
        }

    # ------------------------------------------------------------ role interface

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one bus event."""
        if isinstance(event, MessageReceived) and isinstance(event.message, BinRequest):
            return self._on_request(event.peer, event.message, now)
        if isinstance(event, TimerFired):
            return self._on_timer(event.key, now)
        if isinstance(event, PeerLost):
            return self._on_peer_lost(event.peer)
        if isinstance(event, LocalCall):
            return self._on_call(event, now)
        return []

    # ------------------------------------------------------------ producer API

    def create_buffer(self, task_id: str, buffer_id: int, *, max_bytes: int | None = None) -> list[Action]:
        """Create an empty output buffer (see ``OutputBuffers.create``)."""
        self.buffers.create(task_id, buffer_id, max_bytes=max_bytes)
        return []

    def add_pages(self, task_id: str, buffer_id: int, pages: Sequence[bytes], now: float) -> list[Action]:
        """Append pages and answer the requests that were waiting for them."""
        self.buffers.add_pages(task_id, buffer_id, pages)
        return self._answer_ready((task_id, buffer_id), now)

    def no_more_pages(self, task_id: str, buffer_id: int, now: float) -> list[Action]:
        """Finish a buffer and answer waiting requests with completion."""
        self.buffers.no_more_pages(task_id, buffer_id)
        return self._answer_ready((task_id, buffer_id), now)

    def publish(
        self, task_id: str, buffer_id: int, pages: Sequence[bytes], last: bool, now: float
    ) -> list[Action]:
        """Create the buffer if it is new, append ``pages`` and, with ``last``, finish it: one call for a
        producer whose output is ready at once (a query fragment). The pages are that producer's whole
        output, which cannot wait for room: they enter an empty buffer, or a node holding no page, whatever
        the bounds; where pages are already held, nothing is added if they do not fit (``BufferFullError``)."""
        if self.buffers.get(task_id, buffer_id) is None:  # a deleted buffer stays deleted: pages dropped
            self.buffers.create(task_id, buffer_id)
        if pages:
            self.buffers.add_pages(task_id, buffer_id, pages, whole=True)
        if last:
            self.buffers.no_more_pages(task_id, buffer_id)
        return self._answer_ready((task_id, buffer_id), now)

    def abort_buffer(self, task_id: str, buffer_id: int, reason: str, now: float) -> list[Action]:
        """Abort a buffer: waiting and later requests get SERVER_ERROR / ABORTED."""
        self.buffers.abort(task_id, buffer_id, reason)
        return self._answer_ready((task_id, buffer_id), now)

    # ------------------------------------------------------------ requests

    def _on_request(self, peer: str, req: BinRequest, now: float) -> list[Action]:
        self.counters["requests"] += 1
        key = (req.taskId, req.bufferId)
        kind = req.requestType
        if kind == RequestType.ACK:
            code = self.buffers.acknowledge(req.taskId, req.bufferId, req.pageToken)
            text = (
                "" if code is ErrorCode.NONE else f"task {req.taskId} buffer {req.bufferId}: ack past the end"
            )
            return [Send(peer=peer, message=_simple_reply(req, self._instance(key), code, text))]
        if kind == RequestType.DELETE:
            instance = self._instance(key)
            self.buffers.delete(req.taskId, req.bufferId)
            return [*self._answer_ready(key, now), Send(peer=peer, message=_simple_reply(req, instance))]
        if (peer, req.sequence) in self._parked:
            self.counters["bad_requests"] += 1
            text = f"task {req.taskId} buffer {req.bufferId}: request {req.sequence} is already pending"
            return [Send(peer=peer, message=_simple_reply(req, "", ErrorCode.BAD_REQUEST, text))]
        max_bytes = min(req.maxSizeOctets, self.max_reply_bytes)
        result = self.buffers.read(
            req.taskId, req.bufferId, req.pageToken, max_bytes, size_only=req.getDataSize
        )
        wait = min(req.maxWaitMicroSeconds / 1e6, self.max_wait)
        if result.answerable or result.error_code is not ErrorCode.NONE or wait <= 0:
            return [Send(peer=peer, message=reply_for(req, result))]
        buf = self.buffers.get(req.taskId, req.bufferId)
        if buf is None or len(self._parked) + len(self._reads) >= self.max_waiters:
            text = f"task {req.taskId} buffer {req.bufferId}: server has {len(self._parked)} parked requests"
            return [
                Send(peer=peer, message=_simple_reply(req, result.instance_id, ErrorCode.OVERLOADED, text))
            ]
        deadline = now + wait
        buf.wait(
            Waiter(
                key=(peer, req.sequence),
                token=req.pageToken,
                max_bytes=max_bytes,
                size_only=req.getDataSize,
                deadline=deadline,
            )
        )
        self._parked[(peer, req.sequence)] = (key, req)
        return [SetTimer(key=_timer_key(peer, req.sequence), at=deadline)]

    def _instance(self, key: BufferKey) -> str:
        buf = self.buffers.get(*key)
        return buf.instance_id if buf is not None else ""

    def _answer_ready(self, key: BufferKey, now: float) -> list[Action]:
        actions: list[Action] = []
        for waiter, result, timed_out in self.buffers.take_ready(key[0], key[1], now):
            if type(waiter.key) is int:  # a ``read`` call of the HTTP exchange
                if self._reads.pop(waiter.key, None) is None:
                    continue
                if timed_out:
                    self.counters["timeouts"] += 1
                else:
                    actions.append(CancelTimer(key=f"read/{waiter.key}"))
                actions.append(Reply(call_id=waiter.key, result=result))
                continue
            assert isinstance(waiter.key, tuple)
            peer, sequence = waiter.key
            entry = self._parked.pop((peer, sequence), None)
            if entry is None:
                continue
            if timed_out:
                self.counters["timeouts"] += 1
            else:
                actions.append(CancelTimer(key=_timer_key(peer, sequence)))
            actions.append(Send(peer=peer, message=reply_for(entry[1], result, timed_out=timed_out)))
        return actions

    def _on_timer(self, timer: str, now: float) -> list[Action]:
        if timer.startswith("read/"):
            number = timer[5:]
            read = self._reads.get(int(number)) if number.isdigit() else None
            return self._answer_ready(read, now) if read is not None else []
        parsed = _parse_timer_key(timer)
        entry = self._parked.get(parsed) if parsed is not None else None
        if entry is None:
            return []
        return self._answer_ready(entry[0], now)

    def _on_peer_lost(self, peer: str) -> list[Action]:
        actions: list[Action] = []
        for (p, sequence), (key, _) in list(self._parked.items()):
            if p != peer:
                continue
            del self._parked[(p, sequence)]
            buf = self.buffers.get(*key)
            if buf is not None:
                buf.cancel_wait((p, sequence))
            self.counters["dropped_waiters"] += 1
            actions.append(CancelTimer(key=_timer_key(p, sequence)))
        return actions

    # ------------------------------------------------------------ local calls

    def _on_call(self, call: LocalCall, now: float) -> list[Action]:
        args: dict[str, Any] = call.args
        try:
            task_id, buffer_id = str(args["task_id"]), int(args["buffer_id"])
            # A buffer no BinRequest can name (a lone surrogate, an empty or overlong task id, a buffer id
            # that is no u64) could never be read: refused at the call.
            check_buffer_key(task_id, buffer_id)
            if call.name == "create":
                actions = self.create_buffer(task_id, buffer_id, max_bytes=args.get("max_bytes"))
            elif call.name == "add_pages":
                actions = self.add_pages(task_id, buffer_id, list(args["pages"]), now)
            elif call.name == "no_more_pages":
                actions = self.no_more_pages(task_id, buffer_id, now)
            elif call.name == "abort":
                reason = str(args.get("reason", ""))
                reason.encode()  # goes into every reader's reply: one with no UTF-8 form failed them all
                actions = self.abort_buffer(task_id, buffer_id, reason, now)
            elif call.name == "publish":
                actions = self.publish(task_id, buffer_id, list(args["pages"]), bool(args.get("last")), now)
            elif call.name == "room":
                return [Reply(call_id=call.call_id, result=self.buffers.room(task_id, buffer_id))]
            elif call.name == "read":
                return self._read_call(call, task_id, buffer_id, now)
            elif call.name == "acknowledge":
                code = self.buffers.acknowledge(task_id, buffer_id, int(args["token"]))
                return [Reply(call_id=call.call_id, result=int(code))]
            elif call.name == "delete":
                self.buffers.delete(task_id, buffer_id)
                return [*self._answer_ready((task_id, buffer_id), now), Reply(call_id=call.call_id)]
            else:
                raise LocalProtocolError(f"{SERVER_ROLE} has no call named {call.name!r}")
        except (LocalProtocolError, KeyError, TypeError, ValueError) as exc:
            return [Reply(call_id=call.call_id, error=f"{type(exc).__name__}: {exc}")]
        return [*actions, Reply(call_id=call.call_id, result=None)]

    def _read_call(self, call: LocalCall, task_id: str, buffer_id: int, now: float) -> list[Action]:
        """A read for the HTTP exchange: answered now, or parked like a DATA request until its wait ends."""
        args = call.args
        token, size_only = int(args["token"]), bool(args.get("size_only", False))
        max_bytes = max(1, min(int(args["max_bytes"]), self.max_reply_bytes))
        wait = min(float(args.get("wait", 0.0)), self.max_wait)
        self.counters["requests"] += 1
        result = self.buffers.read(task_id, buffer_id, token, max_bytes, size_only=size_only)
        if result.answerable or wait <= 0:
            return [Reply(call_id=call.call_id, result=result)]
        buf = self.buffers.get(task_id, buffer_id)
        if buf is None or len(self._parked) + len(self._reads) >= self.max_waiters:
            code, text = (
                ErrorCode.OVERLOADED,
                f"server has {len(self._parked) + len(self._reads)} parked requests",
            )
            return [Reply(call_id=call.call_id, result=_error_result(result, code, text))]
        deadline = now + wait
        buf.wait(
            Waiter(key=call.call_id, token=token, max_bytes=max_bytes, size_only=size_only, deadline=deadline)
        )
        self._reads[call.call_id] = (task_id, buffer_id)
        return [SetTimer(key=f"read/{call.call_id}", at=deadline)]


def _error_result(result: PageResult, code: ErrorCode, text: str) -> PageResult:
    return PageResult(
        task_id=result.task_id,
        buffer_id=result.buffer_id,
        instance_id=result.instance_id,
        token=result.token,
        next_token=result.token,
        error_code=code,
        error_message=f"task {result.task_id} buffer {result.buffer_id}: {text}",
    )


def _timer_key(peer: str, sequence: int) -> str:
    # The sequence comes first so that a peer name containing "/" cannot confuse the parse.
    return f"wait/{sequence}/{peer}"


def _parse_timer_key(key: str) -> tuple[str, int] | None:
    kind, _, rest = key.partition("/")
    sequence, _, peer = rest.partition("/")
    if kind != "wait" or not sequence.isdigit():
        return None
    return peer, int(sequence)
