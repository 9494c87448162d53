"""The BinX server role on its own: every request type and status, long-poll, DELETE, peer loss."""

from __future__ import annotations

from typing import Any

from sparkbus.bus.contract import (
    CancelTimer,
    LocalCall,
    MessageReceived,
    PeerLost,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from sparkbus.roles.exchange import (
    BinReply,
    BinRequest,
    BinxServer,
    ErrorCode,
    OutputBuffers,
    ReplyStatus,
    RequestType,
)

T, B, P = "q2.1.0.0", 1, "peer-a"
_seq = iter(range(1, 1_000_000))


def request(
    kind: RequestType = RequestType.DATA, *, token: int = 0, wait_us: int = 0, **kw: Any
) -> BinRequest:
    data = kind is RequestType.DATA
    fields: dict[str, Any] = {
        "sequence": next(_seq),
        "requestType": kind,
        "getDataSize": False,
        "maxSizeOctets": 1 << 20 if data else 0,
        "maxWaitMicroSeconds": wait_us,
        "taskId": T,
        "bufferId": B,
        "pageToken": token,
    }
    fields.update(kw)
    return BinRequest(**fields)


def server_with(*pages: bytes, **kw: Any) -> BinxServer:
    srv = BinxServer(OutputBuffers(instance_id="i7"), **kw)
    srv.create_buffer(T, B)
    if pages:
        srv.add_pages(T, B, list(pages), now=0.0)
    return srv


def send(srv: BinxServer, req: BinRequest, now: float = 0.0, peer: str = P) -> list[Any]:
    return list(srv.handle(MessageReceived(peer=peer, message=req), now))


def only_reply(actions: list[Any]) -> BinReply:
    sends = [a for a in actions if isinstance(a, Send)]
    assert len(sends) == 1, actions
    assert isinstance(sends[0].message, BinReply)
    return sends[0].message


def test_data_ok() -> None:
    srv = server_with(b"ab", b"c")
    req = request()
    rep = only_reply(send(srv, req))
    assert rep.sequence == req.sequence and rep.status == ReplyStatus.OK and rep.replyType == RequestType.DATA
    assert [bytes(p) for p in rep.pages()] == [b"ab", b"c"]
    assert (rep.pageToken, rep.pageNextToken, rep.instanceId) == (0, 2, "i7")


def test_data_nodata_without_wait() -> None:
    rep = only_reply(send(server_with(), request()))
    assert rep.status == ReplyStatus.NODATA and not rep.bufferComplete


def test_data_long_poll_expires_with_timeout() -> None:
    srv = server_with()
    actions = send(srv, request(wait_us=500_000), now=1.0)
    [timer] = actions
    assert isinstance(timer, SetTimer) and timer.at == 1.5
    assert list(srv.handle(TimerFired(key="wait/999/nobody"), 1.5)) == []
    rep = only_reply(list(srv.handle(TimerFired(key=timer.key), 1.5)))
    assert rep.status == ReplyStatus.TIMEOUT and rep.pageNextToken == 0
    assert srv.counters["timeouts"] == 1


def test_long_poll_is_answered_by_new_pages() -> None:
    srv = server_with()
    [timer] = send(srv, request(wait_us=2_000_000))
    actions = srv.add_pages(T, B, [b"late"], now=0.3)
    assert CancelTimer(key=timer.key) in actions
    rep = only_reply(actions)
    assert rep.status == ReplyStatus.OK and bytes(rep.data) == b"late"


def test_long_poll_is_answered_by_completion() -> None:
    srv = server_with()
    send(srv, request(wait_us=2_000_000))
    rep = only_reply(srv.no_more_pages(T, B, now=0.1))
    assert rep.status == ReplyStatus.NODATA and rep.bufferComplete


def test_max_wait_is_capped_by_the_server() -> None:
    srv = server_with(max_wait=1.0)
    [timer] = send(srv, request(wait_us=3_600_000_000))
    assert isinstance(timer, SetTimer) and timer.at == 1.0


def test_size_probe_long_polls_then_reports_sizes() -> None:
    srv = server_with()
    probe = request(getDataSize=True, maxSizeOctets=0, wait_us=1_000_000)
    assert isinstance(send(srv, probe)[0], SetTimer)
    rep = only_reply(srv.add_pages(T, B, [b"xyz", b"q"], now=0.2))
    assert rep.status == ReplyStatus.OK and rep.remaining() == (3, 1) and rep.data == b""
    assert rep.pageNextToken == rep.pageToken == 0


def test_size_probe_timeout_and_nodata() -> None:
    srv = server_with()
    probe = request(getDataSize=True, maxSizeOctets=0)
    assert only_reply(send(srv, probe)).status == ReplyStatus.NODATA


def test_ack_frees_and_is_answered_ok() -> None:
    srv = server_with(b"a", b"b")
    rep = only_reply(send(srv, request(RequestType.ACK, token=1)))
    assert rep.replyType == RequestType.ACK and rep.status == ReplyStatus.OK
    assert srv.buffers.bytes_held == 1
    bad = only_reply(send(srv, request(RequestType.ACK, token=9)))
    assert bad.status == ReplyStatus.SERVER_ERROR and bad.errorCode == ErrorCode.TOKEN_AHEAD


def test_delete_is_acknowledged_idempotent_and_answers_waiters() -> None:
    srv = server_with(b"a")
    send(srv, request(token=1, wait_us=1_000_000), peer="other")
    actions = send(srv, request(RequestType.DELETE))
    replies = [a.message for a in actions if isinstance(a, Send)]
    by_peer = {a.peer: a.message for a in actions if isinstance(a, Send)}
    assert len(replies) == 2
    assert by_peer["other"].bufferComplete and by_peer["other"].status == ReplyStatus.NODATA
    assert by_peer[P].replyType == RequestType.DELETE and by_peer[P].status == ReplyStatus.OK
    assert srv.buffers.bytes_held == 0
    again = only_reply(send(srv, request(RequestType.DELETE)))
    assert again.status == ReplyStatus.OK
    after = only_reply(send(srv, request()))
    assert after.status == ReplyStatus.NODATA and after.bufferComplete


def test_a_published_output_enters_an_empty_buffer_whatever_its_size_but_added_pages_keep_to_the_bound() -> (
    None
):
    srv = BinxServer(OutputBuffers(instance_id="i7", max_buffer_bytes=1000, max_total_bytes=2000))
    call = LocalCall(
        call_id=1, name="add_pages", args={"task_id": T, "buffer_id": B, "pages": [b"x" * 100] * 20}
    )
    srv.create_buffer(T, B)
    [refused] = srv.handle(call, 0.0)
    assert isinstance(refused, Reply) and refused.error is not None and "BufferFullError" in refused.error
    assert srv.buffers.bytes_held == 0
    # The query role publishes a receiver's whole part in one call and never waits for room.
    srv.publish(T, B + 1, [b"y" * 100] * 1000, last=True, now=0.0)
    assert srv.buffers.bytes_held == 100_000


def test_pages_published_after_a_delete_are_dropped() -> None:
    """The consumer's DELETE may land before the producer publishes (the query role creates, then
    publishes its fragment's pages): the buffer stays deleted and holds nothing, before and after create."""
    srv = BinxServer(OutputBuffers(instance_id="i7"))
    srv.create_buffer(T, B)
    assert only_reply(send(srv, request(RequestType.DELETE))).status == ReplyStatus.OK
    srv.publish(T, B, [b"x" * 1000], last=True, now=1.0)
    assert srv.buffers.bytes_held == 0
    late = BinxServer(OutputBuffers(instance_id="i7"))
    assert only_reply(send(late, request(RequestType.DELETE))).status == ReplyStatus.OK  # before create
    late.create_buffer(T, B)
    late.publish(T, B, [b"y" * 1000], last=True, now=1.0)
    assert late.buffers.bytes_held == 0
    assert only_reply(send(late, request())).bufferComplete


def test_server_error_codes() -> None:
    srv = server_with(b"a", b"b")
    send(srv, request(token=2))
    gone = only_reply(send(srv, request(token=0)))
    assert gone.status == ReplyStatus.SERVER_ERROR and gone.errorCode == ErrorCode.TOKEN_GONE
    ahead = only_reply(send(srv, request(token=7)))
    assert ahead.errorCode == ErrorCode.TOKEN_AHEAD
    unknown = only_reply(send(srv, request(taskId="ghost")))
    assert unknown.errorCode == ErrorCode.UNKNOWN_BUFFER and "ghost" in unknown.errorMessage
    srv.abort_buffer(T, B, "out of memory", now=0.0)
    aborted = only_reply(send(srv, request(token=2)))
    assert aborted.errorCode == ErrorCode.ABORTED and "out of memory" in aborted.errorMessage


def test_abort_answers_parked_requests() -> None:
    srv = server_with()
    send(srv, request(wait_us=1_000_000))
    rep = only_reply(srv.abort_buffer(T, B, "killed", now=0.1))
    assert rep.status == ReplyStatus.SERVER_ERROR and rep.errorCode == ErrorCode.ABORTED


def test_parked_requests_are_bounded() -> None:
    srv = server_with(max_waiters=1)
    send(srv, request(wait_us=1_000_000))
    rep = only_reply(send(srv, request(wait_us=1_000_000)))
    assert rep.errorCode == ErrorCode.OVERLOADED and ErrorCode(rep.errorCode).retryable


def test_duplicate_pending_sequence_is_a_bad_request() -> None:
    """Two requests of one peer with one sequence at once: the client's dispatcher keys its promises by the
    sequence (RFC-0009), so two replies with it could not both be right. A client's retry carries a new
    sequence (test_client's lost-reply test), and a restarted client's old requests are dropped on the
    PeerLost the bus delivers before its new session's messages."""
    srv = server_with()
    req = request(wait_us=1_000_000)
    send(srv, req)
    rep = only_reply(send(srv, req))
    assert rep.errorCode == ErrorCode.BAD_REQUEST and not ErrorCode(rep.errorCode).retryable


def test_a_sequence_repeated_after_its_reply_is_answered_again_with_the_same_pages() -> None:
    """A client that resends a request with its old sequence after the reply was lost gets the reply again:
    the sequence is refused only while its request is parked."""
    srv = server_with(b"ab")
    req = request()
    first = only_reply(send(srv, req))
    again = only_reply(send(srv, req))
    assert again == first and again.status == ReplyStatus.OK and bytes(again.data) == b"ab"
    assert srv.counters["bad_requests"] == 0


def test_peer_lost_drops_its_parked_requests() -> None:
    srv = server_with()
    [timer] = send(srv, request(wait_us=1_000_000))
    send(srv, request(wait_us=1_000_000), peer="other")
    actions = list(srv.handle(PeerLost(peer=P, reason="gone"), 0.1))
    assert actions == [CancelTimer(key=timer.key)]
    rep = only_reply(srv.add_pages(T, B, [b"x"], now=0.2))
    assert srv.counters["dropped_waiters"] == 1 and rep.status == ReplyStatus.OK


def test_local_calls_drive_the_producer_api() -> None:
    srv = BinxServer()

    def call(name: str, **args: Any) -> Reply:
        [*_, reply] = srv.handle(LocalCall(call_id=1, name=name, args=args), 0.0)
        assert isinstance(reply, Reply)
        return reply

    assert call("create", task_id=T, buffer_id=B).error is None
    assert call("add_pages", task_id=T, buffer_id=B, pages=[b"a"]).error is None
    assert call("room", task_id=T, buffer_id=B).result == 32 * 1024 * 1024 - 1
    assert call("no_more_pages", task_id=T, buffer_id=B).error is None
    err = call("add_pages", task_id=T, buffer_id=B, pages=[b"b"]).error
    assert err is not None and "LocalProtocolError" in err
    assert call("abort", task_id=T, buffer_id=B, reason="x").error is None
    assert "no call named" in (call("bogus", task_id=T, buffer_id=B).error or "")
    assert "KeyError" in (call("create").error or "")


def test_a_late_request_for_a_forgotten_buffer_is_answered_at_once() -> None:
    """Ended buffers are remembered only up to the bound: a request that comes after its buffer was
    forgotten gets UNKNOWN_BUFFER at once, even a long-poll, and a DELETE of it is acknowledged."""
    srv = BinxServer(OutputBuffers(instance_id="i7", max_tombstones=1))
    for buffer_id in (0, 1):
        srv.create_buffer(T, buffer_id)
        srv.add_pages(T, buffer_id, [b"a"], now=0.0)
        srv.abort_buffer(T, buffer_id, "killed", now=0.0)
    assert srv.buffers.keys() == []
    aborted = only_reply(send(srv, request(bufferId=1, wait_us=1_000_000)))
    assert aborted.errorCode == ErrorCode.ABORTED and "killed" in aborted.errorMessage
    late = only_reply(send(srv, request(bufferId=0, wait_us=1_000_000)))
    assert late.status == ReplyStatus.SERVER_ERROR and late.errorCode == ErrorCode.UNKNOWN_BUFFER
    assert f"task {T} buffer 0" in late.errorMessage and not srv._parked
    assert only_reply(send(srv, request(RequestType.DELETE, bufferId=0))).status == ReplyStatus.OK


def call(srv: BinxServer, name: str, **args: Any) -> Reply:
    [reply] = [a for a in srv.handle(LocalCall(call_id=9, name=name, args=args), 0.0) if isinstance(a, Reply)]
    return reply


def test_an_abort_reason_with_no_utf8_form_is_refused_and_readers_are_still_answered() -> None:
    """The reason goes into every reader's reply: with a lone surrogate each reply failed in the node's
    encoder, and the fetch was never answered."""
    srv = server_with(b"ab")
    reply = call(srv, "abort", task_id=T, buffer_id=B, reason="bad \ud800")
    assert reply.error is not None and "UnicodeEncodeError" in reply.error
    assert only_reply(send(srv, request())).status == ReplyStatus.OK  # not aborted


def test_a_buffer_no_request_can_name_is_refused_at_the_call() -> None:
    srv = BinxServer(OutputBuffers(instance_id="i7"))
    for task_id, buffer_id in (("t\ud800", 1), ("", 1), ("x" * 1025, 1), ("t", -1), ("t", 2**64)):
        reply = call(srv, "create", task_id=task_id, buffer_id=buffer_id)
        assert reply.error is not None and "ValueError" in reply.error, (task_id, buffer_id, reply)
    assert call(srv, "create", task_id="t", buffer_id=1).error is None
