"""The HTTP exchange client role ("http.client"): exchange sources pulled over Presto's HTTP exchange.

The same caller interface as ``binx.client`` (``LocalCall`` "fetch" with ``peer``, ``task_id``,
``buffer_id`` answers ``{"pages": [...], "token": first token, "complete": bool}`` with the pages received
since the previous call, parking until there is something; "abandon" ends a source at once), so the
query role pulls through either by naming the role. The requests themselves go over HTTP to the peer's
``HttpExchangeServer``, which the *node driver* makes: this role does no I/O. It hands the driver
``HttpFetch`` requests through a ``LocalCall`` "jobs" that the driver keeps open, and gets each answer
back as ``LocalCall`` "fetched" (``sparkbus.bus.contract``, docs/EXCHANGE.md section 5).

Per source, as Presto's HTTP exchange client and ``binx.client``:

* one GET outstanding; its ``X-Presto-Page-End-Sequence-Id`` is the next token, so every request
  acknowledges the pages before it; an expired long-poll (204, not complete) is simply asked again;
  an empty answer that is not the end and came back sooner than ``policy.min_delay`` after its request
  means no long-poll took place (``max_wait`` 0, or the server caps it at 0): the next request then goes
  out ``min_delay`` after the previous one, so that an open buffer with nothing yet is not polled in a
  tight loop;
* on ``X-Presto-Buffer-Complete`` the source sends DELETE (the caller does not wait for its answer). A
  DELETE that fails (503 overloaded or busy, 404, a request timeout or a broken connection) is sent again
  with the same back-off until ``max_error_duration`` has passed, as Presto does, while the peer's bus
  link is up (``PeerUp``, until ``PeerLost``): the server holds the buffer's last pages until it comes.
  Past that, or once the bus lost the peer (its node is gone, or it lost this node too, and the query
  role aborts the buffers it published for a consumer it lost), the DELETE is given up and counted in
  ``delete_failures``;
* a server's retryable refusal (404 unknown buffer: the producer may not have created it yet; 503
  overloaded) backs off with jitter and gives up after ``max_error_duration`` without a success; a final
  one (500 aborted, 410 token gone, 400) or a server that cannot be reached fails the source at once with
  an error naming the peer, task and buffer. (Unlike BinX, HTTP does not ride the bus link: a lost
  connection to the HTTP server means its node is gone, and the query should say so now rather than
  after minutes of retries.)
* received pages wait in the source up to ``max_queued_bytes``; beyond that it stops requesting until
  the caller fetches;
* the driver bounds each request as a whole (its long-poll plus the client's timeout, 20 s by default:
  ``HttpRequestTimeout``, a final failure like an unreachable server), so a server that accepted the
  request and answers a byte at a time fails it there. A request the driver has not answered
  ``answer_timeout`` (default: ``max_error_duration``) after its long-poll ends fails the source too
  (``ExchangeGaveUp``), and a DELETE that long is forgotten: it covers a job the driver never starts or
  a driver that is stuck. The bound is that long so that requests merely queued behind the driver's busy
  workers do not fail.

"abandon" frees the server's buffer with a DELETE unless the source already deleted it; a parked fetch
fails with "abandoned".
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from sparkbus.bus.contract import (
    HTTP_CLIENT,
    Action,
    CancelTimer,
    Event,
    HttpFetch,
    HttpFetched,
    LocalCall,
    PeerLost,
    PeerUp,
    Reply,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import MiB
from sparkbus.roles.exchange.backoff import BackoffPolicy, RetryState
from sparkbus.roles.exchange.client import SourceKey, source_key
from sparkbus.roles.exchange.messages import ErrorCode

#: Name of the role on a node.
HTTP_CLIENT_ROLE = HTTP_CLIENT

#: ``HttpFetched.code`` of a failed DELETE worth sending again: the server could not be reached or did not
#: answer in time (0), did not know the buffer (404), or was busy (503).
_DELETE_AGAIN = frozenset({0, int(ErrorCode.UNKNOWN_BUFFER), int(ErrorCode.OVERLOADED)})


@dataclass(kw_only=True)
class _Delete:
    """A DELETE of one buffer, sent again after a failure until ``max_error_duration`` has passed. Its one
    timer, ``delete/{did}``, is the attempt's answer timeout while ``job`` is set, else its retry."""

    did: int
    peer: str
    task_id: str
    buffer_id: int
    retry: RetryState
    job: int | None = None


@dataclass(kw_only=True)
class HttpSource:
    """The state of one HTTP exchange source (mutable; owned by ``HttpClient``)."""

    sid: int
    peer: str
    task_id: str
    buffer_id: int
    retry: RetryState
    token: int = 0
    instance_id: str = ""
    queue: list[bytes] = field(default_factory=list)
    queue_token: int = 0
    queued_bytes: int = 0
    complete: bool = False
    job: int | None = None
    sent_at: float = 0.0
    timer_at: float | None = None
    waiting: bool = False  # the "retry/{sid}" timer sends the next request (a back-off or a poll delay)
    fetch_call: int | None = None
    error: str = ""
    last_error: str = ""

    @property
    def label(self) -> str:
        """How errors name this source."""
        return f"http source task {self.task_id} buffer {self.buffer_id} at peer {self.peer}"


class HttpClient:
    """Exchange sources over HTTP, pulled by ``LocalCall`` "fetch"; the driver makes the requests.

    Args:
        rng: the source of back-off jitter (seed it; never the global random).
        policy: back-off and give-up settings.
        max_request_bytes: ``X-Presto-Max-Size`` of each GET (the first page is sent even if larger).
        max_wait: ``X-Presto-Max-Wait`` of each GET, seconds (the long-poll).
        max_queued_bytes: received bytes held per source before it stops requesting until the caller
            fetches.
        max_sources: the most sources at once; more "fetch" calls are refused.
        answer_timeout: how long past its long-poll a request may go unanswered by the driver before the
            source fails (None: the policy's ``max_error_duration``).
    """

    name = HTTP_CLIENT_ROLE
    messages: ClassVar[tuple[type, ...]] = ()

    def __init__(
        self,
        *,
        rng: random.Random | None = None,
        policy: BackoffPolicy | None = None,
        max_request_bytes: int = 1 * MiB,
        max_wait: float = 2.0,
        max_queued_bytes: int = 32 * MiB,
        max_sources: int = 10_000,
        answer_timeout: float | None = None,
    ) -> None:
        if max_request_bytes <= 0 or max_queued_bytes <= 0 or max_wait < 0:
            raise ValueError("max_request_bytes and max_queued_bytes must be > 0, max_wait >= 0")
        if answer_timeout is not None and answer_timeout <= 0:
            raise ValueError(f"answer_timeout must be positive, got {answer_timeout}")
        self.rng = rng if rng is not None else random.Random(0)
        self.policy = policy or BackoffPolicy()
        self.answer_timeout = self.policy.max_error_duration if answer_timeout is None else answer_timeout
        self.max_request_bytes = max_request_bytes
        self.max_wait = max_wait
        self.max_queued_bytes = max_queued_bytes
        self.max_sources = max_sources
        self.up: set[str] = set()  # peers whose bus link is up: a failed DELETE to them is sent again
        self._sources: dict[SourceKey, HttpSource] = {}
        self._by_sid: dict[int, HttpSource] = {}
        self._jobs: dict[int, int] = {}  # job id -> source id (DATA requests in flight)
        self._deletes: dict[int, _Delete] = {}  # DELETEs not yet answered, by id: in flight or to retry
        self._delete_jobs: dict[int, int] = {}  # job id of a DELETE in flight -> its DELETE's id
        self._pending: list[HttpFetch] = []  # not yet handed to the driver
        self._driver_call: int | None = None  # the driver's open "jobs" call
        self._next_sid = 0
        self._next_job = 0
        self.counters: dict[str, int] = {
            "requests": 0,
            "deletes": 0,
            "retries": 0,
            "poll_waits": 0,
            "stale_answers": 0,
            "delete_failures": 0,
            "delete_retries": 0,
        }

    def source(self, peer: str, task_id: str, buffer_id: int) -> HttpSource | None:
        """The source for this key, if it exists."""
        return self._sources.get((peer, task_id, buffer_id))

    @property
    def in_flight(self) -> int:
        """Requests handed out (or waiting to be) whose answer has not come back, and DELETEs waiting to be
        sent again."""
        return len(self._jobs) + len(self._deletes)

    # ------------------------------------------------------------ role interface

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one bus event."""
        out: list[Action] = []
        if isinstance(event, LocalCall):
            self._on_call(event, now, out)
        elif isinstance(event, TimerFired):
            self._on_timer(event.key, now, out)
        elif isinstance(event, PeerUp):
            self.up.add(event.peer)
        elif isinstance(event, PeerLost):
            self.up.discard(event.peer)
            self._drop_deletes_to(event.peer, out)
        if self._pending and self._driver_call is not None:
            out.append(Reply(call_id=self._driver_call, result=tuple(self._pending)))
            self._pending = []
            self._driver_call = None
        return out

    # ------------------------------------------------------------ calls

    def _on_call(self, call: LocalCall, now: float, out: list[Action]) -> None:
        if call.name == "jobs":  # the driver asks for requests to make
            if self._driver_call is not None:
                out.append(Reply(call_id=self._driver_call, result=()))
            self._driver_call = call.call_id
            return
        if call.name == "fetched":
            answer = call.args.get("result")
            out.append(Reply(call_id=call.call_id))
            if isinstance(answer, HttpFetched):
                self._on_answer(answer, now, out)
            return
        if call.name not in ("fetch", "abandon"):
            out.append(
                Reply(
                    call_id=call.call_id, error=f"LocalProtocolError: {self.name} has no call {call.name!r}"
                )
            )
            return
        try:
            key = source_key(call.args)
        except (KeyError, TypeError, ValueError) as exc:
            out.append(Reply(call_id=call.call_id, error=f"LocalProtocolError: bad arguments: {exc!r}"))
            return
        src = self._sources.get(key)
        if call.name == "abandon":
            if src is not None:
                self._abandon(src, now, out)
            out.append(Reply(call_id=call.call_id))
            return
        if src is None:
            if len(self._sources) >= self.max_sources:
                text = f"LocalProtocolError: {self.name} has {len(self._sources)} sources open"
                out.append(Reply(call_id=call.call_id, error=text))
                return
            self._next_sid += 1
            src = HttpSource(
                sid=self._next_sid,
                peer=key[0],
                task_id=key[1],
                buffer_id=key[2],
                retry=RetryState(self.policy, self.rng),
            )
            self._sources[key] = src
            self._by_sid[src.sid] = src
        if src.fetch_call is not None:
            out.append(
                Reply(
                    call_id=call.call_id, error=f"LocalProtocolError: {src.label}: a fetch is already waiting"
                )
            )
            return
        src.fetch_call = call.call_id
        self._deliver(src, out)
        if src.sid in self._by_sid and src.job is None and not src.waiting and not src.complete:
            self._request(src, now, out)

    # ------------------------------------------------------------ requests and answers

    def _request(self, src: HttpSource, now: float, out: list[Action]) -> None:
        if src.queued_bytes >= self.max_queued_bytes:
            return  # the caller's next fetch asks again
        self._next_job += 1
        self._jobs[self._next_job] = src.sid
        src.job = self._next_job
        src.sent_at = now
        self.counters["requests"] += 1
        # One timer per source, not per request, as binx.client's request timer: while the driver answers,
        # the timer armed for an earlier request is moved to the current one's deadline when it fires.
        if src.timer_at is None:
            src.timer_at = self._deadline(src)
            out.append(SetTimer(key=f"answer/{src.sid}", at=src.timer_at))
        self._pending.append(
            HttpFetch(
                job=self._next_job,
                peer=src.peer,
                task_id=src.task_id,
                buffer_id=src.buffer_id,
                token=src.token,
                max_bytes=self.max_request_bytes,
                max_wait=self.max_wait,
            )
        )

    def _deadline(self, src: HttpSource) -> float:
        """When the source's request in flight has waited too long for the driver's answer."""
        return src.sent_at + self.max_wait + self.answer_timeout

    def _delete(self, src: HttpSource, now: float, out: list[Action]) -> None:
        self._next_job += 1
        did = self._next_job  # the first attempt's job id
        delete = _Delete(
            did=did,
            peer=src.peer,
            task_id=src.task_id,
            buffer_id=src.buffer_id,
            retry=RetryState(self.policy, self.rng),
        )
        self._deletes[did] = delete
        self._send_delete(delete, did, now, out)

    def _send_delete(self, delete: _Delete, job: int, now: float, out: list[Action]) -> None:
        delete.job = job
        self._delete_jobs[job] = delete.did
        out.append(SetTimer(key=f"delete/{delete.did}", at=now + self.answer_timeout))
        self.counters["deletes"] += 1
        self._pending.append(
            HttpFetch(
                job=job, peer=delete.peer, task_id=delete.task_id, buffer_id=delete.buffer_id, delete=True
            )
        )

    def _on_delete_answer(self, delete: _Delete, answer: HttpFetched, now: float, out: list[Action]) -> None:
        delete.job = None
        at = None
        if answer.error is not None and answer.code in _DELETE_AGAIN and delete.peer in self.up:
            at = delete.retry.retry_at(now)
        if at is not None:
            self.counters["delete_retries"] += 1
            out.append(SetTimer(key=f"delete/{delete.did}", at=at))
            return
        del self._deletes[delete.did]
        out.append(CancelTimer(key=f"delete/{delete.did}"))
        if answer.error is not None:
            self.counters["delete_failures"] += 1

    def _drop_deletes_to(self, peer: str, out: list[Action]) -> None:
        """The bus lost ``peer``: its DELETEs waiting to be sent again are given up. Its node is gone, or
        it lost this node too, and the query role aborts the buffers it published for a consumer it lost."""
        for did, delete in list(self._deletes.items()):
            if delete.peer == peer and delete.job is None:
                del self._deletes[did]
                out.append(CancelTimer(key=f"delete/{did}"))
                self.counters["delete_failures"] += 1

    def _on_delete_timer(self, did: int, now: float, out: list[Action]) -> None:
        delete = self._deletes.get(did)
        if delete is None:
            return
        if delete.job is None:  # its retry is due
            self._next_job += 1
            self._send_delete(delete, self._next_job, now, out)
            return
        # No answer from the driver for that long: forgotten (a late answer is then stale).
        del self._deletes[did]
        self._delete_jobs.pop(delete.job, None)
        self.counters["delete_failures"] += 1

    def _on_answer(self, answer: HttpFetched, now: float, out: list[Action]) -> None:
        did = self._delete_jobs.pop(answer.job, None)
        if did is not None:
            self._on_delete_answer(self._deletes[did], answer, now, out)
            return
        sid = self._jobs.pop(answer.job, None)
        src = self._by_sid.get(sid) if sid is not None else None
        if src is None or src.job != answer.job:
            self.counters["stale_answers"] += 1
            return
        src.job = None
        if answer.error is not None:
            src.last_error = answer.error
            if answer.code in (int(ErrorCode.UNKNOWN_BUFFER), int(ErrorCode.OVERLOADED)):
                self._back_off(src, now, out)
            else:
                self._fail(src, f"ExchangeFailed: {src.label}: {answer.error}", out)
            return
        if src.retry.first_failure_at is not None:
            src.retry.succeeded()
        if src.instance_id and answer.instance_id and answer.instance_id != src.instance_id:
            text = (
                f"ExchangeFailed: {src.label}: task instance changed from {src.instance_id!r} to "
                f"{answer.instance_id!r} (the producer restarted; its tokens start again)"
            )
            self._fail(src, text, out)
            return
        if answer.token != src.token or answer.next_token - answer.token != len(answer.pages):
            text = (
                f"RemoteProtocolError: {src.label}: pages {answer.token}..{answer.next_token} "
                f"({len(answer.pages)} pages) answer a request for token {src.token}"
            )
            self._fail(src, text, out)
            return
        src.instance_id = src.instance_id or answer.instance_id
        if not src.queue:
            src.queue_token = src.token
        src.queue.extend(answer.pages)
        src.queued_bytes += sum(map(len, answer.pages))
        src.token = answer.next_token
        if answer.complete:
            src.complete = True
            self._delete(src, now, out)
        self._deliver(src, out)
        if src.complete or src.sid not in self._by_sid:
            return
        poll_at = src.sent_at + self.policy.min_delay
        if not answer.pages and now < poll_at:
            # No long-poll took place (none asked, or the server caps it at 0): ask again later, not now.
            self.counters["poll_waits"] += 1
            src.waiting = True
            out.append(SetTimer(key=f"retry/{src.sid}", at=poll_at))
            return
        self._request(src, now, out)

    def _back_off(self, src: HttpSource, now: float, out: list[Action]) -> None:
        at = src.retry.retry_at(now)
        if at is None:
            start = src.retry.first_failure_at if src.retry.first_failure_at is not None else now
            text = (
                f"ExchangeGaveUp: {src.label}: no successful answer for {now - start:.1f} s "
                f"(max error duration {self.policy.max_error_duration:g} s); last error: {src.last_error}"
            )
            self._fail(src, text, out)
            return
        self.counters["retries"] += 1
        src.waiting = True
        out.append(SetTimer(key=f"retry/{src.sid}", at=at))

    def _on_timer(self, key: str, now: float, out: list[Action]) -> None:
        kind, _, num = key.partition("/")
        if not num.isdigit():
            return
        if kind == "delete":
            self._on_delete_timer(int(num), now, out)
            return
        src = self._by_sid.get(int(num))
        if src is None:
            return
        if kind == "answer":
            self._on_answer_timer(src, now, out)
        elif kind == "retry" and src.waiting:
            src.waiting = False
            if src.job is None:
                self._request(src, now, out)

    def _on_answer_timer(self, src: HttpSource, now: float, out: list[Action]) -> None:
        src.timer_at = None
        if src.job is None:
            return  # answered; the next request arms the timer again
        deadline = self._deadline(src)
        if now < deadline:  # armed for an earlier request that was answered: move it
            src.timer_at = deadline
            out.append(SetTimer(key=f"answer/{src.sid}", at=deadline))
            return
        text = (
            f"ExchangeGaveUp: {src.label}: no answer to its request for {now - src.sent_at:.1f} s "
            f"(long-poll {self.max_wait:g} s + answer timeout {self.answer_timeout:g} s): the server "
            "accepted it and does not answer, or the request never started"
        )
        self._fail(src, text, out)

    # ------------------------------------------------------------ endings

    def _deliver(self, src: HttpSource, out: list[Action]) -> None:
        """Answer a waiting fetch with what the source has: pages, its end, or its failure."""
        if src.fetch_call is None:
            return
        if src.error:
            out.append(Reply(call_id=src.fetch_call, error=src.error))
            src.fetch_call = None
            self._drop(src, out)
            return
        if not src.queue and not src.complete:
            return
        result = {"pages": src.queue, "token": src.queue_token, "complete": src.complete}
        out.append(Reply(call_id=src.fetch_call, result=result))
        src.fetch_call = None
        src.queue = []
        src.queue_token = src.token
        src.queued_bytes = 0
        if src.complete:
            self._drop(src, out)

    def _fail(self, src: HttpSource, text: str, out: list[Action]) -> None:
        src.error = text
        if src.job is not None:  # a request the driver still holds: its answer, if it comes, is stale
            self._jobs.pop(src.job, None)
            src.job = None
        self._deliver(src, out)  # a fetch waiting gets the error now; otherwise the next one does

    def _abandon(self, src: HttpSource, now: float, out: list[Action]) -> None:
        if src.fetch_call is not None:
            out.append(Reply(call_id=src.fetch_call, error=f"LocalProtocolError: {src.label} was abandoned"))
            src.fetch_call = None
        if not src.complete and not src.error:
            self._delete(src, now, out)  # frees the server's pages; nobody waits for the answer
        self._drop(src, out)

    def _drop(self, src: HttpSource, out: list[Action]) -> None:
        self._sources.pop((src.peer, src.task_id, src.buffer_id), None)
        self._by_sid.pop(src.sid, None)
        if src.job is not None:
            self._jobs.pop(src.job, None)
            src.job = None
        if src.timer_at is not None:
            src.timer_at = None
            out.append(CancelTimer(key=f"answer/{src.sid}"))
