"""The BinX client against the server through an in-memory link: transfers, races, failures."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.bus.contract import LocalProtocolError, MessageReceived, RemoteProtocolError, Send, SetTimer
from sparkbus.roles.exchange import (
    BackoffPolicy,
    BinReply,
    BinRequest,
    BinxClient,
    BinxServer,
    OutputBuffers,
    ReplyStatus,
    RequestType,
    RetryState,
    SourceEvent,
    SourceState,
    make_server,
    pack_sizes,
)
from sparkbus.roles.exchange import client as client_module
from sparkbus.roles.exchange.client import _TRANSITIONS

from .harness import SERVER, Pair

T, B = "q3.2.0.0", 0


def make_pair(*, buffers: OutputBuffers | None = None, seed: int = 1, **client_kw: Any) -> Pair:
    client_kw.setdefault("max_wait", 1.0)
    return Pair(
        client=BinxClient(rng=random.Random(seed), **client_kw), server=BinxServer(buffers or OutputBuffers())
    )


def produce(pair: Pair, pages: list[bytes], *, finish: bool = True, buffer_id: int = B) -> None:
    srv = pair.server
    if (T, buffer_id) not in srv.buffers:
        pair.apply("srv", srv.create_buffer(T, buffer_id))
    if pages:
        pair.apply("srv", srv.add_pages(T, buffer_id, pages, pair.now))
    if finish:
        pair.apply("srv", srv.no_more_pages(T, buffer_id, pair.now))


def requests_sent(pair: Pair, kind: RequestType | None = None) -> list[BinRequest]:
    return [m for _, m in pair.sent if isinstance(m, BinRequest) and (kind is None or m.requestType == kind)]


def test_full_transfer_then_delete() -> None:
    pair = make_pair(max_request_bytes=3)
    pair.connect()
    pages = [b"one", b"two", b"three", b"four"]
    produce(pair, pages)
    assert pair.fetch_all(T, B) == pages
    deletes = requests_sent(pair, RequestType.DELETE)
    assert len(deletes) == 1
    assert pair.client.source(SERVER, T, B) is None  # dropped once drained and deleted
    assert (T, B) not in pair.server.buffers and pair.server.buffers.bytes_held == 0
    # One DATA request outstanding at a time: tokens strictly increase, each acknowledging the last.
    tokens = [r.pageToken for r in requests_sent(pair, RequestType.DATA)]
    assert tokens == sorted(tokens) and tokens[0] == 0


def test_source_is_dropped_when_the_delete_ack_comes_after_the_end_was_fetched() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [b"only"])
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.step()  # DATA -> server
    pair.step()  # reply (complete) -> client: the end is delivered, DELETE goes out
    assert pair.result(fetch) == {"pages": [b"only"], "token": 0, "complete": True}
    assert pair.client.source(SERVER, T, B) is not None
    pair.flush()  # DELETE acknowledged
    assert pair.client.source(SERVER, T, B) is None


def test_a_source_whose_delete_gives_up_after_the_end_was_fetched_is_dropped_and_frees_its_place() -> None:
    pair = make_pair(max_sources=1, policy=BackoffPolicy(max_error_duration=5.0))
    pair.connect()
    produce(pair, [b"only"])
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.step()  # DATA -> server
    pair.step()  # reply (complete) -> client: the end is delivered, DELETE goes out
    assert pair.result(fetch)["complete"]
    pair.cut("producer died")  # the DELETE is lost and the peer stays away
    pair.advance(pair.now + 60.0)
    assert pair.client.counters["delete_failures"] == 1
    # The caller never asks about a source again once it has the end: a source kept here would stay for
    # the life of the node, and with max_sources=1 refuse every later fetch.
    assert pair.client.source(SERVER, T, B) is None and not pair.client._sources
    close = pair.call("close", task_id=T, buffer_id=B)
    assert pair.result(close) is None  # every page arrived: the data was whole
    pair.connect()
    produce(pair, [b"next"], buffer_id=B + 1)
    assert pair.fetch_all(T, B + 1) == [b"next"]


def test_a_close_that_gives_up_drops_its_source_and_a_late_close_gets_the_failure() -> None:
    pair = make_pair(policy=BackoffPolicy(max_error_duration=5.0))
    close = pair.call("close", task_id=T, buffer_id=B)  # the peer never comes up: the DELETE waits for it
    pair.advance(pair.now + 60.0)
    failure = pair.error(close)
    assert failure.startswith("ExchangeGaveUp")
    assert pair.client.source(SERVER, T, B) is None and not pair.client._sources
    again = pair.call("close", task_id=T, buffer_id=B)
    assert pair.error(again) == failure and not pair.client._sources


def test_long_poll_delivers_pages_produced_later() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [], finish=False)
    cid = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(0.5)
    assert cid not in pair.replies
    produce(pair, [b"late"], finish=False)
    pair.flush()
    assert pair.result(cid) == {"pages": [b"late"], "token": 0, "complete": False}
    pair.advance(5.0)  # long-polls expire with TIMEOUT and are simply asked again
    timeouts = [m for _, m in pair.sent if isinstance(m, BinReply) and m.status == ReplyStatus.TIMEOUT]
    assert len(timeouts) >= 3
    produce(pair, [b"end"])
    assert pair.fetch_all(T, B) == [b"end"]


@pytest.mark.parametrize(
    ("client_wait", "server_wait"),
    [(0.0, 30.0), (2.0, 0.0)],
    ids=["the-client-asks-no-wait", "the-server-caps-the-wait-at-0"],
)
def test_an_open_empty_buffer_without_a_long_poll_is_polled_every_min_delay_not_in_a_tight_loop(
    client_wait: float, server_wait: float
) -> None:
    pair = Pair(
        client=BinxClient(rng=random.Random(1), max_wait=client_wait),
        server=BinxServer(OutputBuffers(), max_wait=server_wait),
    )
    pair.connect()
    produce(pair, [], finish=False)
    cid = pair.call("fetch", task_id=T, buffer_id=B)
    delivered = 0
    while pair.wire and delivered < 100:  # the clock stands still: no timer fires
        pair.step()
        delivered += 1
    assert not pair.wire, f"still polling after {delivered} messages at t={pair.now}"
    assert len(requests_sent(pair, RequestType.DATA)) == 1
    source = pair.client.source(SERVER, T, B)
    assert source is not None and source.state is SourceState.POLL_WAIT
    assert pair.timers[("cli", f"retry/{source.sid}")] == 0.1  # the policy's min_delay after the request
    pair.advance(1.0)
    assert 9 <= len(requests_sent(pair, RequestType.DATA)) <= 11  # one per 100 ms
    assert pair.client.counters["retries"] == 0  # waiting for pages is no failure
    produce(pair, [b"late"])
    pair.advance(1.2)
    assert pair.result(cid) == {"pages": [b"late"], "token": 0, "complete": True}


def test_an_expired_long_poll_is_asked_again_at_once() -> None:
    pair = make_pair(max_wait=0.5)
    pair.connect()
    produce(pair, [], finish=False)
    pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(0.5)  # TIMEOUT at the deadline, and the next request goes out with it
    assert len(requests_sent(pair, RequestType.DATA)) == 2


def test_requests_wait_for_the_peer_lazy_connect() -> None:
    pair = make_pair()
    produce(pair, [b"a"])
    cid = pair.call("fetch", task_id=T, buffer_id=B)
    src = pair.client.source(SERVER, T, B)
    assert src is not None and src.state is SourceState.WAITING_PEER
    assert pair.sent == []
    pair.advance(1.0)
    pair.connect()
    pair.flush()
    assert pair.result(cid)["pages"] == [b"a"]


def test_delete_racing_connection_setup_is_queued_until_connected() -> None:
    pair = make_pair()
    produce(pair, [b"a", b"b"], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    close = pair.call("close", task_id=T, buffer_id=B)
    assert pair.sent == [] and close not in pair.replies
    pair.connect()
    pair.flush()
    assert [r.requestType for r in requests_sent(pair)] == [RequestType.DELETE]
    assert pair.result(close) is None
    assert "closed" in pair.error(fetch)
    assert (T, B) not in pair.server.buffers
    assert pair.client.source(SERVER, T, B) is None


def test_close_without_any_fetch_still_deletes() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [b"a"], finish=False)
    close = pair.call("close", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(close) is None and (T, B) not in pair.server.buffers


def test_close_during_a_long_poll_ignores_the_late_data_reply() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    close = pair.call("close", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(close) is None and "closed" in pair.error(fetch)
    assert pair.client.counters["stale_replies"] == 1  # the parked DATA reply, answered by the DELETE


def test_server_restart_during_transfer_resumes_from_the_token() -> None:
    pair = make_pair(max_request_bytes=1)
    pair.connect()
    produce(pair, [b"a", b"b", b"c", b"d"])
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.step()
    pair.step()  # exactly one request answered, and its reply delivered
    got = pair.result(first)["pages"]
    pair.cut("server restarting")
    src = pair.client.source(SERVER, T, B)
    assert src is not None and src.state in (SourceState.WAITING_PEER, SourceState.BACKING_OFF)
    pair.advance(pair.now + 3.0)
    pair.connect()  # same buffers survived (the link restarted, not the producer)
    got += pair.fetch_all(T, B)
    assert got == [b"a", b"b", b"c", b"d"]


def test_server_restart_with_a_new_task_instance_fails_clearly() -> None:
    pair = make_pair(max_request_bytes=1)
    pair.connect()
    produce(pair, [b"a", b"b"], finish=False)
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(first)["pages"] == [b"a"]
    pair.cut()
    pair.server = BinxServer(OutputBuffers(instance_id="restarted"))
    produce(pair, [b"x", b"y", b"z"], finish=False)
    pair.connect()
    pair.advance(pair.now + 1.0)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(pair.now + 1.0)
    error = pair.error(fetch)
    assert "task instance changed" in error and T in error and "peer srv" in error


def test_a_node_built_again_serves_a_new_instance_and_a_source_resuming_from_its_old_token_fails() -> None:
    # The factory a topology's node runs: every build (a new process of the same node) is a new incarnation.
    ctx = SimpleNamespace(node_id=SERVER)
    pair = Pair(
        client=BinxClient(rng=random.Random(1), max_wait=1.0, max_request_bytes=1), server=make_server(ctx)
    )
    pair.connect()
    produce(pair, [b"a0", b"a1"], finish=False)
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(first)["pages"] == [b"a0"]
    pair.cut("node restarting")
    before = pair.server.buffers.instance_id
    pair.server = make_server(ctx)
    assert pair.server.buffers.instance_id not in ("", before)
    produce(pair, [b"b0", b"b1", b"b2"])  # the same task and buffer, from the new process
    pair.connect()
    pair.advance(pair.now + 1.0)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(pair.now + 1.0)
    error = pair.error(fetch)  # not b1 and b2 under the old tokens, with a1 and b0 lost
    assert "task instance changed" in error and before in error


def first_page_then_parked_fetch(pair: Pair) -> int:
    """Connect, take page ``a`` of an unfinished buffer, and park a second fetch; returns its call id."""
    pair.connect()
    produce(pair, [b"a"], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(fetch)["pages"] == [b"a"]
    return pair.call("fetch", task_id=T, buffer_id=B)


def test_server_gone_for_good_gives_up_after_max_error_duration() -> None:
    pair = make_pair(policy=BackoffPolicy(max_error_duration=30.0))
    fetch = first_page_then_parked_fetch(pair)
    pair.cut("heartbeat silence")
    pair.advance(29.0)
    assert fetch not in pair.replies
    pair.advance(31.0)
    error = pair.error(fetch)
    assert error.startswith("ExchangeGaveUp") and "max error duration 30 s" in error
    assert "heartbeat silence" in error and f"task {T}" in error


def test_close_after_a_failed_fetch_opens_no_new_source() -> None:
    """Regression (found by the fault tier): the close used to open a new source whose DELETE waited for
    the lost peer until give-up, still open 20 s later."""
    pair = make_pair(policy=BackoffPolicy(max_error_duration=10.0))
    fetch = first_page_then_parked_fetch(pair)
    pair.cut("SIGKILL")
    pair.advance(11.0)
    failure = pair.error(fetch)
    assert failure.startswith("ExchangeGaveUp")
    sent = len(pair.sent)
    close = pair.call("close", task_id=T, buffer_id=B)
    assert pair.error(close) == failure  # answered at once, with why the source failed
    assert pair.client.source(SERVER, T, B) is None and not pair.client._sources
    pair.advance(pair.now + 20.0)
    assert not pair.client._sources and len(pair.sent) == sent
    assert not [key for (node, key) in pair.timers if node == "cli"]


def test_close_after_the_end_was_delivered_answers_at_once() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [b"a"])
    assert pair.fetch_all(T, B) == [b"a"]
    pair.flush()
    deletes = len(requests_sent(pair, RequestType.DELETE))
    close = pair.call("close", task_id=T, buffer_id=B)
    assert pair.result(close) is None
    assert len(requests_sent(pair, RequestType.DELETE)) == deletes and not pair.client._sources


def test_abandon_drops_the_source_without_waiting_for_a_lost_peer() -> None:
    pair = make_pair()
    fetch = first_page_then_parked_fetch(pair)
    pair.cut("member left")
    abandon = pair.call("abandon", task_id=T, buffer_id=B)
    assert pair.result(abandon) is None and "abandoned" in pair.error(fetch)
    assert not pair.client._sources
    assert not [k for (node, k) in pair.timers if node == "cli" and not k.startswith("request/")]
    assert pair.result(pair.call("abandon", task_id=T, buffer_id=B)) is None  # idempotent


def test_abandon_while_up_deletes_best_effort() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [b"a", b"b"], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(fetch)["pages"] == [b"a", b"b"]
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    abandon = pair.call("abandon", task_id=T, buffer_id=B)
    assert pair.result(abandon) is None and "abandoned" in pair.error(fetch)
    pair.flush()
    assert (T, B) not in pair.server.buffers and not pair.client._sources


def test_unknown_buffer_backs_off_then_succeeds_when_created() -> None:
    pair = make_pair()
    pair.connect()
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(2.0)
    retries = requests_sent(pair, RequestType.DATA)
    assert 3 <= len(retries) <= 6  # 0, 0.1, 0.2, 0.4, 0.8 s ... apart
    produce(pair, [b"now"])
    pair.advance(10.0)
    assert pair.result(fetch) == {"pages": [b"now"], "token": 0, "complete": True}


def test_unknown_buffer_forever_gives_up() -> None:
    pair = make_pair(policy=BackoffPolicy(max_error_duration=5.0))
    pair.connect()
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(60.0)
    error = pair.error(fetch)
    assert "ExchangeGaveUp" in error and "UNKNOWN_BUFFER" in error
    assert pair.client.source(SERVER, T, B) is None


def test_producer_abort_fails_the_fetch_at_once() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [b"a"], finish=False)
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(first)["pages"] == [b"a"]
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    pair.apply("srv", pair.server.abort_buffer(T, B, "worker out of memory", pair.now))
    pair.flush()
    error = pair.error(fetch)
    assert error.startswith("ExchangeFailed") and "ABORTED" in error and "worker out of memory" in error


def test_request_timeout_retries_with_the_same_token() -> None:
    pair = make_pair(request_timeout=2.0)
    pair.connect()
    produce(pair, [b"a", b"b"])
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    lost = pair.wire.popleft()  # the request vanishes without a broken link
    pair.advance(pair.now + 3.5)
    assert pair.result(fetch)["pages"] == [b"a", b"b"]
    data = requests_sent(pair, RequestType.DATA)
    assert data[0].pageToken == data[1].pageToken == 0 and data[0] == lost[1]


def test_a_retry_after_a_lost_reply_has_a_new_sequence_and_gets_the_same_pages() -> None:
    """The server refuses a (peer, sequence) that is still parked as BAD_REQUEST, which is final; a retry
    must never hit it. The client's retry carries a new sequence and the same token, and a token read
    again returns the same pages (the token rules), so a lost reply costs one request timeout, nothing
    more, whether the first request is still parked or long answered."""
    pair = make_pair(request_timeout=2.0, max_wait=1.0)
    pair.connect()
    produce(pair, [b"a"], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.step()  # the request reaches the server, which answers with the page ...
    lost = pair.wire.popleft()  # ... and the reply vanishes without a broken link
    assert isinstance(lost[1], BinReply) and lost[1].pageNextToken == 1
    pair.advance(pair.now + 3.5)
    assert pair.result(fetch)["pages"] == [b"a"]
    first, retry = requests_sent(pair, RequestType.DATA)[:2]
    assert retry.sequence != first.sequence and retry.pageToken == first.pageToken == 0
    assert pair.server.counters["bad_requests"] == 0


def test_late_reply_after_timeout_is_ignored() -> None:
    pair = make_pair(request_timeout=2.0)
    pair.connect()
    produce(pair, [b"a"], finish=False)
    pair.call("fetch", task_id=T, buffer_id=B)
    _, req = pair.wire.popleft()
    pair.advance(pair.now + 3.1)  # timed out, retried, answered
    late = pair.server.handle(MessageReceived(peer="cli", message=req), pair.now)
    pair.apply("srv", list(late))
    pair.flush()
    assert pair.client.counters["stale_replies"] >= 1


def test_slow_caller_pauses_the_source_and_acks() -> None:
    pair = make_pair(max_queued_bytes=4, max_request_bytes=2)
    pair.connect()
    produce(pair, [b"aa", b"bb", b"cc", b"dd"])
    pair.call("close", task_id="other", buffer_id=9)  # unrelated source; keeps nothing waiting here
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(first)["pages"] == [b"aa"]
    src = pair.client.source(SERVER, T, B)
    assert src is not None and src.state is SourceState.PAUSED
    assert requests_sent(pair, RequestType.ACK)[-1].pageToken == 3
    assert pair.server.buffers.bytes_held == 2  # the ACK freed what the client holds
    assert pair.fetch_all(T, B) == [b"bb", b"cc", b"dd"]


def test_a_second_concurrent_fetch_is_refused() -> None:
    pair = make_pair()
    pair.connect()
    produce(pair, [], finish=False)
    pair.call("fetch", task_id=T, buffer_id=B)
    assert "already waiting" in pair.error(pair.call("fetch", task_id=T, buffer_id=B))
    assert "bad arguments" in pair.error(pair.call("fetch", task_id=T))
    assert "no call" in pair.error(pair.call("peek", task_id=T, buffer_id=B))


#: Buffers no BinRequest can carry: its bufferId is a u64 and its taskId has 1..1024 characters, each with a
#: UTF-8 form (a lone surrogate, as ``os.fsdecode`` makes of undecodable bytes, has none).
UNSENDABLE = [
    {"buffer_id": -1},
    {"buffer_id": 2**64},
    {"task_id": ""},
    {"task_id": "x" * 2000},
    {"task_id": "\ud800"},
    {"task_id": "q3.\udcff.0.0"},
]


@pytest.mark.parametrize("up", [True, False])
@pytest.mark.parametrize("name", ["fetch", "close", "abandon"])
@pytest.mark.parametrize("bad", UNSENDABLE)
def test_a_call_naming_a_buffer_no_request_can_carry_is_refused_and_opens_nothing(
    bad: dict[str, Any], name: str, up: bool
) -> None:
    """Such a fetch used to open a source whose request raised when it was built: a source left open for
    good (counted against ``max_sources``, refusing the next fetch as "already waiting", failing every
    close), or, made while the peer was down, one that stalled the peer's other sources at ``PeerUp``."""
    pair = make_pair(max_sources=1)
    if up:
        pair.connect()
    args = {"task_id": T, "buffer_id": B, **bad}
    error = pair.error(pair.call(name, **args))
    assert error.startswith("LocalProtocolError: bad arguments") and next(iter(bad)) in error
    assert not pair.client._sources and not pair.sent and not pair.timers
    # Nothing of it was kept: the one source allowed is free, and the refusal repeats.
    assert pair.error(pair.call(name, **args)) == error
    if not up:
        pair.connect()
    produce(pair, [b"a"])
    assert pair.fetch_all(T, B) == [b"a"]


def test_the_largest_task_id_and_buffer_id_a_request_carries_are_accepted() -> None:
    pair = make_pair()
    pair.connect()
    task, buffer_id = "t" * 1024, 2**64 - 1
    pair.apply("srv", pair.server.create_buffer(task, buffer_id))
    pair.apply("srv", pair.server.add_pages(task, buffer_id, [b"a", b"b"], pair.now))
    pair.apply("srv", pair.server.no_more_pages(task, buffer_id, pair.now))
    assert pair.fetch_all(task, buffer_id) == [b"a", b"b"]


def test_a_source_that_fails_to_step_at_peer_up_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer's sources step together at its ``PeerUp``; one that raises fails with the error, and the
    others keep the requests and timers they made in the same step."""

    def unchecked(args: dict[str, Any]) -> tuple[str, str, int]:
        return (str(args["peer"]), str(args["task_id"]), int(args["buffer_id"]))

    monkeypatch.setattr(client_module, "source_key", unchecked)  # lets a bad buffer id in
    pair = make_pair()
    produce(pair, [b"a", b"b"])
    before = pair.call("fetch", task_id=T, buffer_id=B)
    bad = pair.call("fetch", task_id=T, buffer_id=-1)
    broken = pair.client.source(SERVER, T, -1)
    assert broken is not None
    after = pair.call("fetch", task_id=T, buffer_id=1)
    produce(pair, [b"c"], buffer_id=1)
    pair.connect()
    error = pair.error(bad)
    assert error.startswith(f"ExchangeFailed: binx source task {T} buffer -1") and "must be a u64" in error
    assert pair.client.counters["broken_sources"] == 1 and pair.client.source(SERVER, T, -1) is None
    assert not [key for (node, key) in pair.timers if node == "cli" and key.endswith(f"/{broken.sid}")]
    pair.flush()
    assert pair.result(before) == {"pages": [b"a", b"b"], "token": 0, "complete": True}
    assert pair.result(after) == {"pages": [b"c"], "token": 0, "complete": True}
    assert pair.error(pair.call("close", task_id=T, buffer_id=-1)) == error  # remembered as it ended


def test_reply_breaking_the_rules_fails_the_source() -> None:
    pair = make_pair()
    pair.connect()
    pair.call("fetch", task_id=T, buffer_id=B)
    _, req = pair.wire.popleft()
    bogus = BinReply(
        sequence=req.sequence,
        replyType=RequestType.DATA,
        status=ReplyStatus.OK,
        bufferComplete=False,
        pageToken=5,
        pageNextToken=6,
        remainingBytes=b"",
        pageSizes=pack_sizes((1,)),
        instanceId="i",
        data=b"x",
    )
    pair.deliver("cli", MessageReceived(peer=SERVER, message=bogus))
    error = pair.error(1)
    assert error.startswith("RemoteProtocolError") and "pageToken 5" in error


def test_backoff_is_exponential_with_seeded_jitter() -> None:
    policy = BackoffPolicy()
    delays = [RetryState(policy, random.Random(7)).failed(0.0)]
    state = RetryState(policy, random.Random(7))
    delays = [state.failed(float(i)) for i in range(12)]
    assert delays[0] == 0.0
    for i, d in enumerate(delays[1:], start=1):
        base = min(10.0, 0.1 * 2 ** (i - 1))
        assert base * 0.9 <= d <= base * 1.1
    again = RetryState(policy, random.Random(7))
    assert [again.failed(float(i)) for i in range(12)] == delays
    assert state.give_up_at() == 180.0
    state.succeeded()
    assert state.give_up_at() is None and state.failed(5.0) == 0.0
    with pytest.raises(ValueError, match="jitter"):
        BackoffPolicy(jitter=1.5)


def test_backoff_stays_at_its_cap_however_many_failures() -> None:
    """A long error budget (3 h of 10 s retries is about 1,080 failures) used to overflow 2.0 ** n at the
    1,026th failure: the role raised, and the http.client role's parked fetch was never answered."""
    state = RetryState(BackoffPolicy(max_error_duration=3 * 3600.0), random.Random(1))
    delays = [state.failed(float(i)) for i in range(1_200)]
    assert min(delays[200:]) >= 9.0 and max(delays) <= 11.0


def test_backoff_timers_follow_the_policy() -> None:
    pair = make_pair(seed=3)
    pair.connect()
    pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    retry_at = [at for (node, key), at in pair.timers.items() if key.startswith("retry/")]
    assert retry_at == [0.0]  # the first retry goes out at once
    pair.advance(0.0)
    [at] = [at for (node, key), at in pair.timers.items() if key.startswith("retry/")]
    assert 0.09 <= at <= 0.11


STATES = [s for s in SourceState]
EVENTS = [e for e in SourceEvent]


@given(state=st.sampled_from(STATES), event=st.sampled_from(EVENTS))
def test_every_state_event_pair_is_in_the_table_or_names_both(state: SourceState, event: SourceEvent) -> None:
    client = BinxClient(rng=random.Random(0))
    client.up.add(SERVER)
    src = client._open((SERVER, T, B))
    src.state = state
    out: list[Any] = []
    if (state, event) in _TRANSITIONS:
        client._step(src, event, 0.0, out)
        assert all(isinstance(a, Send | SetTimer) or a is not None for a in out)
    else:
        with pytest.raises((LocalProtocolError, RemoteProtocolError)) as err:
            client._step(src, event, 0.0, out)
        assert state.value in str(err.value) and event.value in str(err.value) and T in str(err.value)


@given(
    sizes=st.lists(st.integers(1, 300), min_size=0, max_size=25),
    max_request=st.integers(1, 700),
    cut_after=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_transfer_survives_a_link_cut_anywhere(
    sizes: list[int], max_request: int, cut_after: int, seed: int
) -> None:
    pair = make_pair(seed=seed, max_request_bytes=max_request, max_queued_bytes=1000)
    pair.connect()
    pages = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    produce(pair, pages)
    got: list[bytes] = []
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    for _ in range(cut_after):
        if not pair.wire:
            break
        pair.step()
    pair.cut()
    pair.advance(pair.now + 20.0)
    pair.connect()
    while fetch not in pair.replies:
        pair.advance(pair.now + 0.5)
    res = pair.result(fetch)
    got += res["pages"]
    if not res["complete"]:
        got += pair.fetch_all(T, B)
    assert got == pages


class _CountingPair(Pair):
    """A pair that records every client action, to count timer churn."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.client_actions: list[object] = []

    def apply(self, node: str, actions: list[Any]) -> None:
        if node == "cli":
            self.client_actions.extend(actions)
        super().apply(node, actions)


def test_a_steady_transfer_arms_one_request_timer_not_one_per_chunk() -> None:
    pair = _CountingPair(client=BinxClient(rng=random.Random(1), max_request_bytes=1), server=BinxServer())
    pair.connect()
    pages = [bytes([i]) for i in range(50)]
    produce(pair, pages)
    assert pair.fetch_all(T, B) == pages
    data = requests_sent(pair, RequestType.DATA)
    assert len(data) == 50  # one chunk per request
    request_timers = [
        a for a in pair.client_actions if isinstance(a, SetTimer) and a.key.startswith("request/")
    ]
    assert len(request_timers) == 2  # one for the data requests, one for the DELETE (no long-poll)
    # Nothing of the source is left armed once it is done.
    assert not [k for (node, k) in pair.timers if node == "cli"]


def test_the_request_timer_moves_to_the_latest_request_and_still_times_it_out() -> None:
    pair = make_pair(max_wait=1.0, request_timeout=5.0)
    pair.connect()
    produce(pair, [b"a"], finish=False)
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    pair.flush()
    assert pair.result(fetch)["pages"] == [b"a"]
    # Long-polls expire and are asked again every second; the source's timer was armed at t=0 for t=6.
    pair.advance(4.0)
    last = requests_sent(pair, RequestType.DATA)[-1]
    assert pair.client.source(SERVER, T, B).deadline == 10.0  # the request sent at t=4
    pair.up = False  # from here on nothing arrives
    pair.wire.clear()
    pair.advance(9.5)  # the timer fires at 6 and is moved to 10: not a timeout
    src = pair.client.source(SERVER, T, B)
    assert src is not None and src.last_error == "" and src.outstanding == last.sequence
    pair.advance(10.5)
    assert src.last_error.startswith(f"no reply to request {last.sequence} within 6 s")
    assert requests_sent(pair, RequestType.DATA)[-1].pageToken == last.pageToken  # asked again


def test_a_single_page_reply_is_queued_without_a_copy() -> None:
    pair = make_pair(max_request_bytes=1)
    pair.connect()
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    _, req = pair.wire.popleft()
    page = b"p" * 100_000
    reply = BinReply(
        sequence=req.sequence,
        replyType=RequestType.DATA,
        status=ReplyStatus.OK,
        bufferComplete=True,
        pageToken=0,
        pageNextToken=1,
        remainingBytes=b"",
        pageSizes=pack_sizes((len(page),)),
        instanceId="i",
        data=page,
    )
    pair.deliver("cli", MessageReceived(peer=SERVER, message=reply))
    [got] = pair.result(fetch)["pages"]
    assert got is page
