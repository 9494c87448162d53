"""The roles' side of the HTTP exchange, driven by hand: the binx.server role's ``read`` / ``acknowledge`` /
``delete`` calls (what the node's HTTP server makes) and the http.client role's jobs protocol (what the
node driver and the simulator speak)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sparkbus.bus.contract import (
    CancelTimer,
    HttpFetch,
    HttpFetched,
    LocalCall,
    PeerLost,
    PeerUp,
    Reply,
    SetTimer,
    TimerFired,
)
from sparkbus.bus.http_fetch import answer_of
from sparkbus.roles.exchange import (
    BackoffPolicy,
    BinxServer,
    BufferState,
    ErrorCode,
    HttpClient,
    OutputBuffers,
    PageResult,
)

KEY = {"peer": "s", "task_id": "t", "buffer_id": 0}


def call(role: Any, call_id: int, name: str, args: dict[str, Any], now: float = 0.0) -> list[Any]:
    return list(role.handle(LocalCall(call_id=call_id, name=name, args=args), now))


def read_args(token: int = 0, wait: float = 0.0, max_bytes: int = 1 << 20) -> dict[str, Any]:
    return {"task_id": "t", "buffer_id": 0, "token": token, "max_bytes": max_bytes, "wait": wait}


# ---------------------------------------------------------------- binx.server: the HTTP server's calls


def test_read_answers_at_once_when_there_are_pages_or_no_wait() -> None:
    server = BinxServer(OutputBuffers(instance_id="i0"))
    server.publish("t", 0, [b"ab", b"c"], False, 0.0)
    [reply] = call(server, 1, "read", read_args())
    assert isinstance(reply, Reply) and isinstance(reply.result, PageResult)
    assert reply.result.pages == (b"ab", b"c") and reply.result.next_token == 2
    [reply] = call(server, 2, "read", read_args(token=2))  # no wait: empty, not complete
    assert reply.result.pages == () and not reply.result.complete
    [reply] = call(server, 3, "read", {**read_args(), "task_id": "nope"})
    assert reply.result.error_code == ErrorCode.UNKNOWN_BUFFER


def test_a_read_long_polls_in_the_role_and_is_answered_by_pages_or_its_timer() -> None:
    server = BinxServer(OutputBuffers(instance_id="i0"))
    server.create_buffer("t", 0)
    [timer] = call(server, 7, "read", read_args(wait=2.0), now=10.0)
    assert timer == SetTimer(key="read/7", at=12.0)
    actions = server.add_pages("t", 0, [b"x"], 10.5)
    assert actions[0] == CancelTimer(key="read/7")
    assert isinstance(actions[1], Reply) and actions[1].call_id == 7 and actions[1].result.pages == (b"x",)
    [timer] = call(server, 8, "read", read_args(token=1, wait=2.0), now=11.0)
    assert list(server.handle(TimerFired(key="read/8"), 12.9)) == []  # moved on: not yet due
    [reply] = server.handle(TimerFired(key="read/8"), 13.0)
    assert isinstance(reply, Reply) and reply.call_id == 8 and reply.result.pages == ()
    assert server.counters["timeouts"] == 1


def test_abort_and_delete_answer_a_parked_read_and_waiters_are_bounded() -> None:
    server = BinxServer(OutputBuffers(instance_id="i0"), max_waiters=1)
    server.create_buffer("t", 0)
    call(server, 1, "read", read_args(wait=5.0))
    [reply] = call(server, 2, "read", read_args(wait=5.0))
    assert reply.result.error_code == ErrorCode.OVERLOADED and "parked requests" in reply.result.error_message
    actions = server.abort_buffer("t", 0, "gone wrong", 1.0)
    answered = [a for a in actions if isinstance(a, Reply)]
    assert [a.call_id for a in answered] == [1] and answered[0].result.error_code == ErrorCode.ABORTED
    server.create_buffer("t", 1)
    call(server, 3, "read", {**read_args(wait=5.0), "buffer_id": 1})
    actions = call(server, 4, "delete", {"task_id": "t", "buffer_id": 1})
    assert [a.call_id for a in actions if isinstance(a, Reply)] == [3, 4]
    assert actions[-2].result.complete  # a deleted buffer reads as complete
    buf = server.buffers.get("t", 1)
    assert buf is not None and buf.state is BufferState.DESTROYED


def test_acknowledge_frees_pages_and_answers_the_code() -> None:
    server = BinxServer(OutputBuffers(instance_id="i0"))
    server.publish("t", 0, [b"aaaa", b"bb"], False, 0.0)
    [reply] = call(server, 1, "acknowledge", {"task_id": "t", "buffer_id": 0, "token": 1})
    assert reply.result == int(ErrorCode.NONE) and server.buffers.bytes_held == 2
    [reply] = call(server, 2, "acknowledge", {"task_id": "t", "buffer_id": 0, "token": 9})
    assert reply.result == int(ErrorCode.TOKEN_AHEAD)


# ---------------------------------------------------------------- http.client: the driver's jobs


class Driver:
    """Plays the node driver: keeps a "jobs" call open and answers requests by hand."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self.next_call = 100
        self.jobs_call = self.call("jobs", {})[1]
        self.jobs: list[HttpFetch] = []
        self.replies: dict[int, Reply] = {}
        self.timers: dict[str, float] = {}

    def call(self, name: str, args: dict[str, Any], now: float = 0.0) -> tuple[list[Any], int]:
        self.next_call += 1
        call_id = self.next_call
        actions = call(self.client, call_id, name, args, now)
        self.take(actions)
        return actions, call_id

    def take(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Reply) and a.call_id == self.jobs_call:
                self.jobs.extend(a.result)
                self.jobs_call = self.call("jobs", {})[1]
            elif isinstance(a, Reply):
                self.replies[a.call_id] = a
            elif isinstance(a, SetTimer):
                self.timers[a.key] = a.at
            elif isinstance(a, CancelTimer):
                self.timers.pop(a.key, None)

    def fire_next(self) -> float:
        """Fire the earliest timer the role set; returns its time."""
        at, key = min((at, key) for key, at in self.timers.items())
        del self.timers[key]
        self.take(list(self.client.handle(TimerFired(key=key), at)))
        return at

    def answer(self, job: HttpFetch, now: float = 0.0, **fields: Any) -> None:
        self.jobs.remove(job)
        self.call("fetched", {"result": HttpFetched(job=job.job, **fields)}, now)


@pytest.mark.parametrize(
    "bad", [{"buffer_id": -1}, {"buffer_id": 2**64}, {"task_id": ""}, {"task_id": "x" * 1025}]
)
def test_the_http_client_refuses_a_buffer_binx_could_not_name_and_opens_nothing(bad: dict[str, Any]) -> None:
    driver = Driver(HttpClient(rng=random.Random(0), max_sources=1))
    refused = driver.replies[driver.call("fetch", {**KEY, **bad})[1]].error
    assert refused is not None and refused.startswith("LocalProtocolError: bad arguments")
    assert next(iter(bad)) in refused and not driver.jobs
    driver.call("fetch", KEY)  # the one source allowed is still free: its request goes out
    assert [(job.task_id, job.buffer_id) for job in driver.jobs] == [("t", 0)]


def test_fetch_hands_one_request_to_the_driver_and_answers_with_its_pages() -> None:
    d = Driver(HttpClient(max_wait=2.0, max_request_bytes=4096))
    _, fetch = d.call("fetch", KEY)
    [job] = d.jobs
    assert (job.peer, job.task_id, job.buffer_id, job.token, job.max_wait, job.max_bytes) == (
        "s",
        "t",
        0,
        0,
        2.0,
        4096,
    )
    d.answer(job, 2.0, token=0, next_token=0)  # an expired long-poll: asked again, the fetch stays parked
    [job] = d.jobs
    assert job.token == 0 and fetch not in d.replies
    d.answer(job, pages=(b"a", b"b"), token=0, next_token=2, instance_id="i0")
    assert d.replies[fetch].result == {"pages": [b"a", b"b"], "token": 0, "complete": False}
    [job] = d.jobs  # the source keeps one request outstanding while the caller folds
    assert job.token == 2
    d.answer(job, pages=(b"c",), token=2, next_token=3, complete=True, instance_id="i0")
    [delete] = d.jobs
    assert delete.delete and delete.task_id == "t"
    _, again = d.call("fetch", KEY)
    assert d.replies[again].result == {"pages": [b"c"], "token": 2, "complete": True}
    d.answer(delete, complete=True)
    assert d.client.in_flight == 0 and d.client.source("s", "t", 0) is None


@pytest.mark.parametrize("max_wait", [0.0, 2.0], ids=["no-wait-asked", "the-server-caps-the-wait-at-0"])
def test_an_open_empty_buffer_without_a_long_poll_is_asked_again_after_min_delay_not_at_once(
    max_wait: float,
) -> None:
    d = Driver(HttpClient(max_wait=max_wait))
    _, fetch = d.call("fetch", KEY, now=10.0)
    src = d.client.source("s", "t", 0)
    assert src is not None
    for n in range(3):
        [job] = d.jobs
        d.answer(job, src.sent_at + 0.01, token=0, next_token=0)  # answered at once
        assert d.jobs == [] and fetch not in d.replies  # no request goes out at once after an empty 204
        assert d.fire_next() == pytest.approx(10.1 + 0.1 * n)  # min_delay after the previous request
    [job] = d.jobs
    d.answer(job, 10.31, pages=(b"a",), token=0, next_token=1)
    assert d.replies[fetch].result == {"pages": [b"a"], "token": 0, "complete": False}
    assert d.client.counters["poll_waits"] == 3 and d.client.counters["retries"] == 0


def test_a_changed_instance_or_a_wrong_token_fails_the_source() -> None:
    d = Driver(HttpClient())
    _, fetch = d.call("fetch", KEY)
    d.answer(d.jobs[0], pages=(b"a",), token=0, next_token=1, instance_id="i0")
    _, fetch = d.call("fetch", KEY)
    d.answer(d.jobs[0], pages=(b"b",), token=1, next_token=2, instance_id="i1")
    assert "task instance changed from 'i0' to 'i1'" in str(d.replies[fetch].error)
    _, fetch = d.call("fetch", {**KEY, "buffer_id": 1})
    d.answer(d.jobs[-1], pages=(b"b",), token=5, next_token=6)
    assert str(d.replies[fetch].error).startswith("RemoteProtocolError: http source task t buffer 1")


def test_retryable_refusals_back_off_and_final_ones_fail_at_once() -> None:
    d = Driver(HttpClient(rng=random.Random(1)))
    _, fetch = d.call("fetch", KEY)
    actions, _ = d.call("fetched", {"result": HttpFetched(job=d.jobs.pop().job, error="404", code=1)}, 1.0)
    assert not d.jobs and fetch not in d.replies  # the first retry goes at once, on a timer
    [timer] = [a for a in actions if isinstance(a, SetTimer)]
    d.take(list(d.client.handle(TimerFired(key=timer.key), timer.at)))
    [job] = d.jobs
    d.answer(job, error="aborted: disk on fire", code=int(ErrorCode.ABORTED))
    error = str(d.replies[fetch].error)
    assert (
        error.startswith("ExchangeFailed: http source task t buffer 0 at peer s") and "disk on fire" in error
    )
    assert d.client.source("s", "t", 0) is None


def test_a_source_refused_until_its_give_up_time_retries_until_then_and_gives_up_only_then() -> None:
    d = Driver(HttpClient(rng=random.Random(3), policy=BackoffPolicy(max_error_duration=180.0)))
    _, fetch = d.call("fetch", KEY)
    now, sent = 0.0, []
    while fetch not in d.replies:
        for job in list(d.jobs):  # the producer never creates its buffer
            sent.append(now)
            d.answer(job, now, error="HTTP 404: no such buffer", code=int(ErrorCode.UNKNOWN_BUFFER))
        if fetch not in d.replies:
            now = d.fire_next()
    # The last delay is cut short to end at the deadline: the last request goes out then, not a whole
    # back-off delay (about 10 s) before it, and its failure gives up.
    assert sent[-1] == 180.0 and sent == sorted(sent) and len(sent) > 20
    error = str(d.replies[fetch].error)
    assert error.startswith(
        "ExchangeGaveUp: http source task t buffer 0 at peer s: no successful answer for 180.0 s"
    )
    assert "(max error duration 180 s)" in error and error.endswith("HTTP 404: no such buffer")


def test_stale_answers_and_answers_after_abandon_are_counted_not_delivered() -> None:
    d = Driver(HttpClient())
    _, fetch = d.call("fetch", KEY)
    [job] = d.jobs
    _, abandon = d.call("abandon", KEY)
    assert d.replies[abandon].error is None and "was abandoned" in str(d.replies[fetch].error)
    assert [j.delete for j in d.jobs] == [False, True]  # the DELETE frees the server's pages
    d.answer(job, pages=(b"late",), token=0, next_token=1)
    assert d.client.counters["stale_answers"] == 1
    d.call("fetched", {"result": HttpFetched(job=999)})
    assert d.client.counters["stale_answers"] == 2


def test_received_pages_are_bounded_per_source_until_the_caller_fetches() -> None:
    d = Driver(HttpClient(max_queued_bytes=10))
    _, fetch = d.call("fetch", KEY)
    d.answer(d.jobs[0], pages=(b"x" * 6,), token=0, next_token=1)
    assert d.replies[fetch].result["pages"] == [b"x" * 6]
    d.answer(d.jobs[0], pages=(b"y" * 6,), token=1, next_token=2)
    d.answer(d.jobs[0], pages=(b"z" * 6,), token=2, next_token=3)
    assert d.jobs == []  # 12 bytes held: no more requests until the caller takes them
    _, fetch = d.call("fetch", KEY)
    assert d.replies[fetch].result["pages"] == [b"y" * 6, b"z" * 6]
    [job] = d.jobs
    assert job.token == 3


def timers_of(actions: list[Any]) -> list[SetTimer]:
    return [a for a in actions if isinstance(a, SetTimer)]


def test_a_request_the_driver_never_answers_fails_the_fetch_after_the_wait_and_the_give_up_time() -> None:
    """The driver's socket timeout is per read, so a server that accepted the request and trickles its
    answer (or a driver that never starts the job) would leave the fetch waiting for ever: the role gives
    the request its long-poll plus ``max_error_duration``, then fails the source clearly."""
    d = Driver(HttpClient(policy=BackoffPolicy(max_error_duration=5.0), max_wait=1.0))
    actions, fetch = d.call("fetch", KEY, now=10.0)
    [job] = d.jobs
    [timer] = timers_of(actions)
    assert timer.at == 16.0  # 10 + the 1 s long-poll + the 5 s give-up time
    d.take(list(d.client.handle(TimerFired(key=timer.key), timer.at - 0.5)))
    assert fetch not in d.replies  # not due yet
    d.take(list(d.client.handle(TimerFired(key=timer.key), timer.at)))
    error = str(d.replies[fetch].error)
    assert error.startswith("ExchangeGaveUp: http source task t buffer 0 at peer s: no answer to its request")
    assert "for 6.0 s (long-poll 1 s + answer timeout 5 s)" in error
    assert d.client.source("s", "t", 0) is None and d.client.in_flight == 0
    d.answer(job, pages=(b"too late",), token=0, next_token=1)  # the driver's answer, if it ever comes
    assert d.client.counters["stale_answers"] == 1


def test_the_answer_timer_follows_the_latest_request_without_one_timer_per_request() -> None:
    d = Driver(HttpClient(policy=BackoffPolicy(max_error_duration=5.0), max_wait=1.0))
    actions, fetch = d.call("fetch", KEY, now=0.0)
    [timer] = timers_of(actions)
    for i in range(3):  # answered in time: the next requests arm no timer of their own
        actions, _ = d.call(
            "fetched",
            {"result": HttpFetched(job=d.jobs.pop().job, token=i, next_token=i + 1, pages=(b"p",))},
            2.0 * i,
        )
        assert timers_of(actions) == []
        d.replies.pop(fetch, None)
        _, fetch = d.call("fetch", KEY, now=2.0 * i)
    # The timer armed for the first request fires: moved to the latest request's deadline (4 + 1 + 5).
    actions = list(d.client.handle(TimerFired(key=timer.key), timer.at))
    assert timers_of(actions) == [SetTimer(key=timer.key, at=10.0)]
    assert fetch not in d.replies
    d.take(list(d.client.handle(TimerFired(key=timer.key), 10.0)))
    assert "ExchangeGaveUp" in str(d.replies[fetch].error)


def test_a_delete_the_driver_never_answers_is_forgotten_after_the_give_up_time() -> None:
    d = Driver(HttpClient(policy=BackoffPolicy(max_error_duration=5.0), max_wait=1.0))
    d.call("fetch", KEY)
    actions, _ = d.call("abandon", KEY, now=3.0)
    [delete] = [j for j in d.jobs if j.delete]
    [timer] = [t for t in timers_of(actions) if t.key.startswith("delete/")]
    assert timer.at == 8.0 and d.client.in_flight == 1  # the abandoned request's answer is not awaited
    d.take(list(d.client.handle(TimerFired(key=timer.key), timer.at)))
    assert d.client.in_flight == 0 and d.client.counters["delete_failures"] == 1
    d.answer(delete, complete=True)  # late: counted once, not twice
    assert d.client.counters["delete_failures"] == 1


def serve(d: Driver, server: BinxServer, job: HttpFetch, now: float) -> None:
    """Run a job against the server's buffers and hand its answer back, as the node driver does."""
    if job.delete:
        server.buffers.delete(job.task_id, job.buffer_id)
        d.answer(job, now, complete=True)
        return
    d.jobs.remove(job)
    result = server.buffers.read(job.task_id, job.buffer_id, job.token, job.max_bytes)
    d.call("fetched", {"result": answer_of(job, result, "127.0.0.1:1")}, now)


def test_a_failed_clean_up_delete_is_sent_again_until_the_server_frees_the_last_pages() -> None:
    server = BinxServer(OutputBuffers(instance_id="i0"))
    server.publish("t", 0, [b"a" * 1000, b"b" * 1000], True, 0.0)
    policy = BackoffPolicy(max_error_duration=60.0)
    d = Driver(HttpClient(rng=random.Random(1), policy=policy, max_request_bytes=1000))
    d.take(list(d.client.handle(PeerUp(peer="s"), 0.0)))
    _, fetch = d.call("fetch", KEY)
    serve(d, server, d.jobs[0], 0.0)  # page a
    serve(d, server, d.jobs[0], 0.1)  # page b and the end; acknowledges a, and b waits for the DELETE
    _, fetch = d.call("fetch", KEY, now=0.1)
    assert d.replies[fetch].result == {"pages": [b"b" * 1000], "token": 1, "complete": True}
    [delete] = d.jobs
    assert delete.delete and server.buffers.bytes_held == 1000
    # The node's loop was busy: its HTTP server answered 503. Nothing else would ever free page b.
    d.answer(
        delete, 0.2, error="http://127.0.0.1:1: HTTP 503: node p1 is busy", code=int(ErrorCode.OVERLOADED)
    )
    assert not d.jobs and d.client.in_flight == 1
    now = d.fire_next()  # the retry (the first one at once)
    [again] = d.jobs
    assert again.delete and again.job != delete.job
    serve(d, server, again, now)
    assert server.buffers.bytes_held == 0 and not server.buffers.keys()
    assert d.client.in_flight == 0 and not d.timers
    assert (d.client.counters["delete_retries"], d.client.counters["delete_failures"]) == (1, 0)


def test_a_delete_that_keeps_failing_is_retried_until_the_give_up_time_and_a_final_refusal_is_not() -> None:
    d = Driver(HttpClient(rng=random.Random(2), policy=BackoffPolicy(max_error_duration=30.0)))
    d.take(list(d.client.handle(PeerUp(peer="s"), 0.0)))
    d.call("fetch", KEY)
    d.call("abandon", KEY, now=5.0)
    sent, now = [], 5.0
    while d.client.in_flight:
        for job in [j for j in d.jobs if j.delete]:  # the server never answers in time
            sent.append(now)
            d.answer(job, now, error="http://127.0.0.1:1: DELETE ...: no complete answer within 20 s")
        if d.client.in_flight:
            now = d.fire_next()
    assert sent[0] == 5.0 and sent[-1] == 35.0 and len(sent) > 5  # the last one at the give-up time
    assert d.client.counters["delete_failures"] == 1 and not d.timers
    d.call("fetch", {**KEY, "buffer_id": 1})
    d.call("abandon", {**KEY, "buffer_id": 1}, now=40.0)
    [delete] = [j for j in d.jobs if j.delete and j.buffer_id == 1]
    d.answer(delete, 40.0, error="http://127.0.0.1:1: HTTP 400: bad request", code=int(ErrorCode.BAD_REQUEST))
    assert d.client.in_flight == 0 and d.client.counters["delete_failures"] == 2 and not d.timers


def test_delete_retries_to_a_peer_the_bus_lost_are_given_up() -> None:
    """Its node is gone, or it lost this node too and aborts what it published for it: nothing to free."""
    d = Driver(HttpClient(rng=random.Random(3), policy=BackoffPolicy(max_error_duration=30.0)))
    d.take(list(d.client.handle(PeerUp(peer="s"), 0.0)))
    d.call("fetch", KEY)
    d.call("abandon", KEY, now=1.0)
    [delete] = [j for j in d.jobs if j.delete]
    d.answer(delete, 1.0, error="http://127.0.0.1:1: cannot reach the HTTP exchange: ConnectionRefusedError")
    assert d.client.in_flight == 1 and d.client.counters["delete_retries"] == 1  # waits for its retry
    d.take(list(d.client.handle(PeerLost(peer="s", reason="heartbeat silence"), 1.0)))
    assert d.client.in_flight == 0 and d.client.counters["delete_failures"] == 1 and not d.timers
    d.call("fetch", {**KEY, "buffer_id": 1})
    d.call("abandon", {**KEY, "buffer_id": 1}, now=2.0)  # after the loss: a failure is not sent again
    [delete] = [j for j in d.jobs if j.delete and j.buffer_id == 1]
    d.answer(delete, 2.0, error="http://127.0.0.1:1: cannot reach the HTTP exchange: ConnectionRefusedError")
    assert d.client.in_flight == 0 and d.client.counters["delete_failures"] == 2 and not d.timers
