"""The http.client role against a binx.server role, with the simulator as the driver that makes its HTTP
requests (docs/EXCHANGE.md section 5): pages, long-polls, DELETE, and every way a source fails."""

from __future__ import annotations

import inspect
import random
import socket
from collections.abc import Iterable
from typing import Any, ClassVar

import pytest

from sparkbus.bus import sim as sim_module
from sparkbus.bus.contract import HTTP_BUFFERS, Action, Event, HttpFetch, LocalCall
from sparkbus.bus.http_fetch import HttpExchangeClient, HttpFetcher, fetch
from sparkbus.bus.sim import HTTP_TIMEOUT, SimBus
from sparkbus.roles.exchange import (
    BackoffPolicy,
    BinxServer,
    BufferState,
    HttpClient,
    OutputBuffers,
)

KEY = {"peer": "s", "task_id": "t1", "buffer_id": 0}
BUF = {"task_id": "t1", "buffer_id": 0}


class Pair:
    """Server ``s`` (binx.server), client ``c`` (http.client), and ``bare``, a node with no buffers."""

    def __init__(self, seed: int, *, give_up: float = 5.0, max_wait: float = 1.0, **client_kw: Any) -> None:
        self.sim = SimBus(seed=seed)
        self.server = BinxServer(OutputBuffers(instance_id="s0"))
        self.client = HttpClient(
            rng=random.Random(seed),
            policy=BackoffPolicy(max_error_duration=give_up),
            max_wait=max_wait,
            **client_kw,
        )
        self.sim.add_node("s", [self.server])
        self.sim.add_node("c", [self.client])
        self.sim.add_node("bare", [])
        self.sim.start()
        self.sim.run_until(self.sim.all_up)

    def on_server(self, name: str, args: dict[str, Any]) -> Any:
        return self.sim.result(self.sim.call("s", "binx.server", name, args))

    def fetch(self, key: dict[str, Any] | None = None) -> tuple[str, int]:
        return self.sim.call("c", "http.client", "fetch", key or KEY)

    def outcome(self, cid: tuple[str, int], limit: float = 60.0) -> tuple[Any, str | None]:
        self.sim.run_until(lambda: self.sim.reply(cid) is not None, limit=limit)
        done = self.sim.reply(cid)
        assert done is not None
        return done.result, done.error


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pages_arrive_in_order_across_long_polls_and_the_buffer_is_deleted_at_the_end(seed: int) -> None:
    p = Pair(seed)
    p.on_server("create", BUF)
    first = p.fetch()
    p.sim.run_for(3.0)  # several long-polls expire with nothing: the fetch stays parked
    assert p.sim.reply(first) is None and p.client.counters["requests"] >= 3
    p.on_server("add_pages", {**BUF, "pages": [b"a", b"bc"]})
    assert p.outcome(first) == ({"pages": [b"a", b"bc"], "token": 0, "complete": False}, None)
    p.on_server("add_pages", {**BUF, "pages": [b"d"]})
    p.on_server("no_more_pages", BUF)
    pages: list[bytes] = []
    complete = False
    token = 2
    while not complete:
        result, error = p.outcome(p.fetch())
        assert error is None and result["token"] == token
        pages += result["pages"]
        token += len(result["pages"])
        complete = result["complete"]
    assert pages == [b"d"]
    p.sim.run_until_idle()
    buf = p.server.buffers.get("t1", 0)
    assert buf is not None and buf.state is BufferState.DESTROYED  # the client's DELETE
    assert (
        p.server.buffers.bytes_held == 0 and p.client.in_flight == 0 and p.client.source("s", "t1", 0) is None
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_without_a_long_poll_an_empty_buffer_is_asked_about_once_per_min_delay(seed: int) -> None:
    p = Pair(seed, max_wait=0.0)
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(2.0)  # nothing produced yet: each request is answered 204 at once
    assert p.sim.reply(cid) is None
    assert 10 <= p.client.counters["requests"] <= 21  # 100 ms apart (min_delay), not one per round trip
    p.on_server("publish", {**BUF, "pages": [b"late"], "last": True})
    assert p.outcome(cid) == ({"pages": [b"late"], "token": 0, "complete": True}, None)


def test_an_unknown_buffer_is_retried_until_it_appears() -> None:
    p = Pair(4, give_up=30.0)
    cid = p.fetch()
    p.sim.run_for(2.0)
    assert p.sim.reply(cid) is None and p.client.counters["retries"] >= 2
    p.on_server("publish", {**BUF, "pages": [b"late"], "last": True})
    assert p.outcome(cid) == ({"pages": [b"late"], "token": 0, "complete": True}, None)


def test_an_unknown_buffer_that_never_appears_fails_the_fetch_after_the_give_up_time() -> None:
    p = Pair(5, give_up=5.0)
    result, error = p.outcome(p.fetch())
    assert result is None and error is not None
    assert error.startswith("ExchangeGaveUp: http source task t1 buffer 0 at peer s")
    assert "HTTP 404" in error and "no such buffer" in error
    p.sim.run_until_idle()
    assert p.client.in_flight == 0 and p.client.source("s", "t1", 0) is None


def test_an_aborted_producer_fails_a_parked_fetch_at_once_with_its_reason() -> None:
    p = Pair(6)
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(0.5)
    p.on_server("abort", {**BUF, "reason": "disk on fire"})
    start = p.sim.now
    result, error = p.outcome(cid)
    assert result is None and error is not None
    assert error.startswith("ExchangeFailed: http source task t1 buffer 0 at peer s")
    assert "HTTP 500" in error and "disk on fire" in error
    assert p.sim.now - start < 0.1  # the parked read was answered by the abort, not by its long-poll
    assert p.client.counters["retries"] == 0


def test_a_server_that_dies_with_a_notice_under_a_long_poll_fails_the_fetch_at_once() -> None:
    p = Pair(7, answer_timeout=2 * HTTP_TIMEOUT)  # the role's own bound comes after the request timeout
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(0.5)
    p.sim.crash("s")  # SIGKILL: the kernel closes the server's connections
    start = p.sim.now
    result, error = p.outcome(cid)
    assert result is None and error is not None
    assert error.startswith("ExchangeFailed: http source task t1 buffer 0 at peer s: http://sim:s: ")
    assert "cannot reach the HTTP exchange: connection reset (peer process died)" in error
    assert p.sim.now - start < 0.1
    # A fetch started afterwards finds nobody listening.
    result, error = p.outcome(p.fetch({**KEY, "task_id": "t2"}))
    assert error is not None and "connection refused" in error


def timed_out(peer: str, task: str, wait: float, cause: str = "timed out") -> str:
    """The fetch's error once a GET for token 0 had no answer within its limit: the role's prefix and
    ``HttpRequestTimeout``'s text as ``fetch`` passes it on (``bus/http_fetch.py``)."""
    here = f"http://sim:{peer}"
    limit = HTTP_TIMEOUT + wait
    return (
        f"ExchangeFailed: http source task {task} buffer 0 at peer {peer}: {here}: "
        f"GET {here}/v1/task/{task}/results/0/0: no complete answer within {limit:g} s "
        f"(long-poll {wait:g} s + request timeout {HTTP_TIMEOUT:g} s), connection closed: {cause}"
    )


def sent_at(p: Pair, task: str = "t1") -> float:
    src = p.client.source("s", task, 0)
    assert src is not None and src.job is not None  # a request in flight
    return src.sent_at


def test_a_server_that_stops_silently_fails_each_request_at_its_own_deadline() -> None:
    """No notice (SIGSTOP): the client's connection stays open and nothing answers, so each request ends
    when its limit (long-poll plus request timeout) from its start runs out, as ``HttpRequestTimeout``;
    the role's own bound comes later. A request started after the stop is accepted by the stopped
    process's kernel and ends the same way, not refused."""
    wait = 10.0
    p = Pair(7, max_wait=wait, answer_timeout=2 * HTTP_TIMEOUT)
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(3.0)  # the first GET is parked in its 10 s long-poll
    start = sent_at(p)
    p.sim.crash("s", notify=False)
    result, error = p.outcome(cid)
    assert (result, error) == (None, timed_out("s", "t1", wait))
    assert p.sim.now == pytest.approx(start + wait + HTTP_TIMEOUT)  # not HTTP_TIMEOUT after the stop
    later = p.fetch({**KEY, "task_id": "t2"})
    p.sim.run_for(0.01)
    start = sent_at(p, "t2")
    result, error = p.outcome(later)
    assert (result, error) == (None, timed_out("s", "t2", wait))
    assert p.sim.now == pytest.approx(start + wait + HTTP_TIMEOUT)
    # Started again, the node answers (it lost its buffers: 404 until the give-up time).
    p.sim.restart("s", [BinxServer(OutputBuffers(instance_id="s1"))])
    result, error = p.outcome(p.fetch({**KEY, "task_id": "t3"}))
    assert result is None and error is not None
    assert error.startswith("ExchangeGaveUp: http source task t3 buffer 0 at peer s") and "HTTP 404" in error
    p.sim.run_until_idle()
    assert p.client.in_flight == 0 and p.client.counters["stale_answers"] == 0


def test_a_link_cut_silently_fails_requests_at_their_deadline_and_a_healed_one_carries_pages() -> None:
    wait = 5.0
    p = Pair(12, max_wait=wait, answer_timeout=2 * HTTP_TIMEOUT)
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(1.0)
    start = sent_at(p)
    p.sim.cut("c", "s", notify=False)
    p.on_server("add_pages", {**BUF, "pages": [b"lost"]})  # the parked read answers; the answer is lost
    result, error = p.outcome(cid)
    assert (result, error) == (None, timed_out("s", "t1", wait))
    assert p.sim.now == pytest.approx(start + wait + HTTP_TIMEOUT)
    # A new request's connect hears nothing either.
    later = p.fetch({**KEY, "task_id": "t2"})
    p.sim.run_for(0.01)
    start = sent_at(p, "t2")
    result, error = p.outcome(later)
    limit = wait + HTTP_TIMEOUT
    assert (result, error) == (
        None,
        timed_out("s", "t2", wait, f"connecting to sim:s: no answer in {limit:g} s"),
    )
    assert p.sim.now == pytest.approx(start + limit)
    p.sim.heal("c", "s")
    p.on_server("publish", {"task_id": "t3", "buffer_id": 0, "pages": [b"back"], "last": True})
    result, error = p.outcome(p.fetch({**KEY, "task_id": "t3"}))
    assert (result, error) == ({"pages": [b"back"], "token": 0, "complete": True}, None)
    p.sim.run_until_idle()
    assert p.client.in_flight == 0 and p.client.counters["delete_failures"] == 0


def test_a_delete_to_a_silently_stopped_server_ends_after_the_request_timeout_alone() -> None:
    """A DELETE has no long-poll: its limit is the request timeout; the role counts it failed then."""
    p = Pair(13, max_wait=10.0, answer_timeout=2 * HTTP_TIMEOUT)
    p.on_server("publish", {**BUF, "pages": [b"x"], "last": True})
    assert p.outcome(p.fetch()) == ({"pages": [b"x"], "token": 0, "complete": True}, None)
    start = p.sim.now  # the role handed its DELETE out with the last pages
    assert p.client.counters["deletes"] == 1
    p.sim.crash("s", notify=False)
    p.sim.run_until(lambda: p.client.counters["delete_failures"] == 1, limit=2 * HTTP_TIMEOUT)
    assert p.sim.now == pytest.approx(start + HTTP_TIMEOUT)


def test_a_delete_that_times_out_is_sent_again_and_frees_the_last_pages() -> None:
    """Only the DELETE frees the last answer's pages: one lost DELETE must not keep them for the life of
    the producer's node."""
    p = Pair(14, give_up=60.0, answer_timeout=2 * HTTP_TIMEOUT)
    p.on_server("publish", {**BUF, "pages": [b"x" * 1000], "last": True})
    assert p.outcome(p.fetch()) == ({"pages": [b"x" * 1000], "token": 0, "complete": True}, None)
    assert p.client.counters["deletes"] == 1 and p.server.buffers.bytes_held == 1000
    p.sim.cut("c", "s", notify=False)  # the DELETE in flight is lost, and ends at its request timeout
    p.sim.run_for(1.0)
    p.sim.heal("c", "s")
    p.sim.run_until(lambda: p.client.in_flight == 0, limit=3 * HTTP_TIMEOUT)
    assert p.client.counters["deletes"] == 2 and p.client.counters["delete_retries"] == 1
    assert p.client.counters["delete_failures"] == 0
    buf = p.server.buffers.get("t1", 0)
    assert p.server.buffers.bytes_held == 0 and buf is not None and buf.state is BufferState.DESTROYED


def test_a_peer_that_serves_no_buffers_fails_the_fetch_clearly() -> None:
    p = Pair(8)
    result, error = p.outcome(p.fetch({**KEY, "peer": "bare"}))
    assert result is None and error is not None
    assert "at peer bare" in error and "advertises no HTTP exchange" in error


def test_abandon_fails_a_parked_fetch_and_deletes_the_buffer() -> None:
    p = Pair(9)
    p.on_server("publish", {**BUF, "pages": [b"x" * 100], "last": False})
    assert p.outcome(p.fetch())[0]["pages"] == [b"x" * 100]
    cid = p.fetch()
    p.sim.run_for(0.2)
    assert p.sim.result(p.sim.call("c", "http.client", "abandon", KEY)) is None
    _, error = p.outcome(cid)
    assert error is not None and "was abandoned" in error
    p.sim.run_until_idle()
    buf = p.server.buffers.get("t1", 0)
    assert buf is not None and buf.state is BufferState.DESTROYED
    assert p.client.in_flight == 0 and p.client.counters["stale_answers"] <= 1


def test_a_second_fetch_while_one_waits_and_unknown_calls_are_refused() -> None:
    p = Pair(10)
    p.on_server("create", BUF)
    first = p.fetch()
    _, error = p.outcome(p.fetch())
    assert error is not None and "a fetch is already waiting" in error
    _, error = p.outcome(p.sim.call("c", "http.client", "close", KEY))
    assert error is not None and "has no call 'close'" in error
    _, error = p.outcome(p.sim.call("c", "http.client", "fetch", {"peer": "s"}))
    assert error is not None and "bad arguments" in error
    assert p.sim.reply(first) is None


class MuteServer:
    """A ``binx.server`` that takes every HTTP request and never answers: what the client sees of a server
    that accepted the connection and then hangs, or trickles its answer so no socket timeout fires."""

    name = HTTP_BUFFERS
    messages: ClassVar[tuple[type, ...]] = ()

    def __init__(self) -> None:
        self.requests = 0

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        if isinstance(event, LocalCall):
            self.requests += 1
        return []


def mute_pair(answer_timeout: float, max_wait: float = 1.0) -> tuple[SimBus, MuteServer, HttpClient]:
    sim = SimBus(seed=11)
    mute = MuteServer()
    client = HttpClient(
        rng=random.Random(11),
        policy=BackoffPolicy(max_error_duration=5.0),
        max_wait=max_wait,
        answer_timeout=answer_timeout,
    )
    sim.add_node("m", [mute])
    sim.add_node("c", [client])
    sim.start()
    sim.run_until(sim.all_up)
    return sim, mute, client


def test_a_server_that_never_answers_fails_the_fetch_after_the_long_poll_and_the_request_timeout() -> None:
    """The driver's client gives up first when the role's own bound is longer."""
    sim, mute, client = mute_pair(answer_timeout=3 * HTTP_TIMEOUT)
    start = sim.now
    cid = sim.call("c", "http.client", "fetch", {**KEY, "peer": "m"})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=2 * HTTP_TIMEOUT)
    done = sim.reply(cid)
    assert done is not None and done.result is None
    assert done.error == timed_out("m", "t1", 1.0)
    assert mute.requests == 1 and sim.now == pytest.approx(start + 1.0 + HTTP_TIMEOUT)
    assert client.source("m", "t1", 0) is None and client.in_flight == 0


def test_the_simulated_request_timeout_is_the_node_fetchers() -> None:
    """``Node`` builds its ``HttpFetcher`` with the default timeout, which the simulator models."""
    assert inspect.signature(HttpFetcher).parameters["timeout"].default == HTTP_TIMEOUT
    assert inspect.signature(HttpExchangeClient).parameters["timeout"].default == HTTP_TIMEOUT


def test_a_server_that_never_answers_fails_the_fetch_after_the_wait_and_the_give_up_time() -> None:
    sim, mute, client = mute_pair(answer_timeout=5.0)  # shorter than the request timeout: the role's
    start = sim.now
    cid = sim.call("c", "http.client", "fetch", {**KEY, "peer": "m"})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=30.0)
    done = sim.reply(cid)
    assert done is not None and done.result is None and done.error is not None
    assert done.error.startswith("ExchangeGaveUp: http source task t1 buffer 0 at peer m: no answer")
    assert mute.requests == 1 and 6.0 <= sim.now - start < 6.1  # the 1 s long-poll plus the 5 s
    assert client.source("m", "t1", 0) is None and client.in_flight == 0


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_the_simulated_timeout_reads_as_the_real_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same request against a real server that accepts and never answers (a listening socket nobody
    accepts from: what a stopped process looks like) and against the simulator's silent server give the
    same error, up to the server's address; short limits keep the real wait short."""
    task = "q/7 x"  # quoted in the URL
    job = HttpFetch(job=1, peer="m", task_id=task, buffer_id=0, max_bytes=1 << 20, max_wait=0.1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with HttpExchangeClient("127.0.0.1", port, timeout=0.2) as client:
            real = fetch(client, job)
    assert real.error is not None and real.code == 0
    monkeypatch.setattr(sim_module, "HTTP_TIMEOUT", 0.2)
    sim, _, _ = mute_pair(answer_timeout=60.0, max_wait=0.1)
    cid = sim.call("c", "http.client", "fetch", {**KEY, "peer": "m", "task_id": task})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=5.0)
    done = sim.reply(cid)
    assert done is not None
    assert done.error == f"ExchangeFailed: http source task {task} buffer 0 at peer m: " + real.error.replace(
        f"127.0.0.1:{port}", "sim:m"
    )
