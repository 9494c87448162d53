"""The http.client role against a binx.server role, with the simulator as the driver that makes its HTTP
requests (docs/EXCHANGE.md section 5): pages, long-polls, DELETE, and every way a source fails."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any, ClassVar

import pytest

from sparkbus.bus.contract import HTTP_BUFFERS, Action, Event, LocalCall
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

    def __init__(self, seed: int, *, give_up: float = 5.0, **client_kw: Any) -> None:
        self.sim = SimBus(seed=seed)
        self.server = BinxServer(OutputBuffers(instance_id="s0"))
        self.client = HttpClient(
            rng=random.Random(seed),
            policy=BackoffPolicy(max_error_duration=give_up),
            max_wait=1.0,
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


@pytest.mark.parametrize("notify", [True, False])
def test_a_server_that_dies_under_a_long_poll_fails_the_fetch(notify: bool) -> None:
    p = Pair(7, answer_timeout=2 * HTTP_TIMEOUT)  # the role's own bound comes after the socket timeout
    p.on_server("create", BUF)
    cid = p.fetch()
    p.sim.run_for(0.5)
    p.sim.crash("s", notify=notify)
    start = p.sim.now
    result, error = p.outcome(cid)
    assert result is None and error is not None
    assert "at peer s" in error and "connection reset (peer process died)" in error
    # With a notice the client's connection breaks at once; without, only its socket timeout ends it.
    assert (p.sim.now - start < 0.1) if notify else (p.sim.now - start >= HTTP_TIMEOUT)
    # A fetch started afterwards finds nobody listening.
    result, error = p.outcome(p.fetch({**KEY, "task_id": "t2"}))
    assert error is not None and "connection refused" in error


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


def test_a_server_that_never_answers_fails_the_fetch_after_the_wait_and_the_give_up_time() -> None:
    sim = SimBus(seed=11)
    mute = MuteServer()
    client = HttpClient(rng=random.Random(11), policy=BackoffPolicy(max_error_duration=5.0), max_wait=1.0)
    sim.add_node("m", [mute])
    sim.add_node("c", [client])
    sim.start()
    sim.run_until(sim.all_up)
    start = sim.now
    cid = sim.call("c", "http.client", "fetch", {**KEY, "peer": "m"})
    sim.run_until(lambda: sim.reply(cid) is not None, limit=30.0)
    done = sim.reply(cid)
    assert done is not None and done.result is None and done.error is not None
    assert done.error.startswith("ExchangeGaveUp: http source task t1 buffer 0 at peer m: no answer")
    assert mute.requests == 1 and 6.0 <= sim.now - start < 6.1  # the 1 s long-poll plus the 5 s
    assert client.source("m", "t1", 0) is None and client.in_flight == 0
