"""The echo service, paired through an in-memory bus."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.bus import contract as c
from sparkbus.codecs import REGISTRY
from sparkbus.topologies.echo import (
    EchoRefused,
    EchoReply,
    EchoRequest,
    EchoRole,
    StreamRequest,
    StreamSent,
    batch_payload,
)

from .memlink import MemoryBus


def pair(**kw: int) -> MemoryBus:
    bus = MemoryBus({n: EchoRole(node_id=n, **kw) for n in ("a", "b")})  # type: ignore[arg-type]
    bus.connect_all()
    return bus


def echo(bus: MemoryBus, node: str) -> EchoRole:
    role = bus.roles[node]
    assert isinstance(role, EchoRole)
    return role


def test_is_a_role_with_codes_in_its_range() -> None:
    role = EchoRole(node_id="a")
    assert isinstance(role, c.Role)
    for cls in role.messages:
        assert 0x0410 <= REGISTRY.code_of(cls) <= 0x041F


def test_ping_round_trip() -> None:
    bus = pair()
    cid = bus.call("a", "ping", peer="b", payload=b"hello")
    bus.run()
    reply = bus.replies[cid]
    assert reply.error is None
    assert reply.result == {"peer": "b", "payload": b"hello", "rtt": 0.0}
    assert echo(bus, "b").counters.pings_answered == 1
    assert not bus.timers


def test_stream_with_credit_smaller_than_the_whole() -> None:
    bus = pair()
    cid = bus.call("a", "stream", peer="b", batches=10, batch_size=1000, credit=2500)
    bus.run()
    reply = bus.replies[cid]
    assert reply.error is None, reply.error
    assert reply.result["batches"] == 10
    assert reply.result["bytes"] == 10_000
    assert echo(bus, "b").counters.bytes_sent == 10_000
    assert echo(bus, "a").counters.streams_completed == 1
    assert not bus.streams_open
    assert not bus.timers


def test_empty_stream() -> None:
    bus = pair()
    cid = bus.call("a", "stream", peer="b", batches=0, batch_size=10, credit=10)
    bus.run()
    assert bus.replies[cid].result["batches"] == 0


@given(
    batches=st.integers(min_value=0, max_value=40),
    batch_size=st.integers(min_value=1, max_value=5000),
    extra=st.integers(min_value=0, max_value=20_000),
)
def test_stream_totals_always_agree(batches: int, batch_size: int, extra: int) -> None:
    bus = pair()
    cid = bus.call("a", "stream", peer="b", batches=batches, batch_size=batch_size, credit=batch_size + extra)
    cid2 = bus.call(
        "b", "stream", peer="a", batches=batches, batch_size=batch_size, credit=batch_size + extra
    )
    bus.run()
    for call in (cid, cid2):
        result = bus.replies[call].result
        assert (result["batches"], result["bytes"]) == (batches, batches * batch_size)


def test_counters_and_unknown_call() -> None:
    bus = pair()
    cid = bus.call("a", "counters")
    bad = bus.call("a", "dance")
    no_peer = bus.call("a", "ping")
    bad_args = bus.call("a", "stream", peer="b", batches=1, batch_size=10, credit=5)
    bus.run()
    assert bus.replies[cid].result["peers_up"] == 1
    assert bus.replies[bad].error == "echo has no call 'dance'; calls: counters, ping, stream"
    assert bus.replies[no_peer].error == "echo.ping needs args['peer'], a node id"
    assert "batch_size <= credit" in (bus.replies[bad_args].error or "")


def test_ping_times_out_and_late_reply_is_counted() -> None:
    bus = pair(timeout=1)
    bus.cut.add(frozenset(("a", "b")))
    cid = bus.call("a", "ping", peer="b")
    bus.run()
    bus.advance(2.0)
    assert bus.replies[cid].error == "echo.ping to b: no reply (request 1) in time"
    bus.roles["a"].handle(c.MessageReceived(peer="b", message=EchoReply(request_id=1, payload=b"")), bus.now)
    assert echo(bus, "a").counters.late_replies == 1


def test_stream_times_out_when_credit_never_returns() -> None:
    bus = pair(timeout=1)
    cid = bus.call("a", "stream", peer="b", batches=3, batch_size=10, credit=10)
    bus.step()  # a sends the request
    bus.step()  # b opens the stream and spends its credit on batch 0
    bus.cut.add(frozenset(("a", "b")))  # the grant for batch 0 never arrives
    bus.run()
    assert cid not in bus.replies
    bus.advance(2.0)
    assert bus.replies[cid].error == "echo.stream from b: 1/3 batches in time"
    assert echo(bus, "a").counters.failures == 1


def test_peer_lost_fails_pending_calls() -> None:
    bus = pair()
    bus.cut.add(frozenset(("a", "b")))
    ping = bus.call("a", "ping", peer="b")
    stream = bus.call("a", "stream", peer="b", batches=2, batch_size=10, credit=20)
    bus.run()
    bus.lose("a", "b", "heartbeat silence")
    bus.run()
    assert bus.replies[ping].error == "echo.ping: lost b: heartbeat silence"
    assert bus.replies[stream].error == "echo.stream: lost b: heartbeat silence"
    assert echo(bus, "a").peers == frozenset()
    assert not bus.timers


def test_refusal_and_mismatched_totals() -> None:
    role = EchoRole(node_id="a")
    role.handle(c.PeerUp(peer="b"), 0.0)
    list(role.handle(c.LocalCall(call_id=1, name="stream", args={"peer": "b", "batches": 1}), 0.0))
    out = list(
        role.handle(c.MessageReceived(peer="b", message=EchoRefused(request_id=1, reason="busy")), 0.0)
    )
    assert out[-1] == c.Reply(call_id=1, error="b refused: busy")

    list(
        role.handle(
            c.LocalCall(call_id=2, name="stream", args={"peer": "b", "batches": 1, "batch_size": 4}), 0.0
        )
    )
    batch = c.BatchReceived(
        peer="b", stream="echo/a/2", ordinal=0, last=True, data=batch_payload(0, 4), size=4, remaining=0
    )
    list(role.handle(batch, 0.0))
    out = list(
        role.handle(c.MessageReceived(peer="b", message=StreamSent(request_id=2, batches=2, size=8)), 0.0)
    )
    reply = out[-1]
    assert isinstance(reply, c.Reply)
    assert (
        reply.error
        == "stream echo/a/2 from b: received 1 batches / 4 bytes, sender reports 2 / 8, asked for 1"
    )


def test_wrong_batch_content_fails_the_call() -> None:
    role = EchoRole(node_id="a")
    list(
        role.handle(
            c.LocalCall(call_id=1, name="stream", args={"peer": "b", "batches": 2, "batch_size": 4}), 0.0
        )
    )
    bad = c.BatchReceived(
        peer="b", stream="echo/a/1", ordinal=0, last=False, data=b"\x07" * 4, size=4, remaining=0
    )
    out = list(role.handle(bad, 0.0))
    assert out[-1] == c.Reply(call_id=1, error="batch 0 on echo/a/1 from b is not the one expected")


def test_batch_on_unknown_stream_is_a_remote_error() -> None:
    role = EchoRole(node_id="a")
    with pytest.raises(c.RemoteProtocolError, match="batch on unknown stream 'echo/a/9' from b"):
        role.handle(
            c.BatchReceived(peer="b", stream="echo/a/9", ordinal=0, last=True, data=b"", size=0, remaining=0),
            0.0,
        )


def test_duplicate_stream_request_is_refused() -> None:
    role = EchoRole(node_id="b")
    req = StreamRequest(request_id=1, batches=5, batch_size=10, credit=10)
    list(role.handle(c.MessageReceived(peer="a", message=req), 0.0))
    out = list(role.handle(c.MessageReceived(peer="a", message=req), 0.0))
    assert out == [
        c.Send(
            peer="a", message=EchoRefused(request_id=1, reason="stream echo/a/1 to a is already being sent")
        )
    ]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: EchoRequest(request_id=-1, payload=b""), "request_id must be >= 0"),
        (lambda: EchoRequest(request_id=1, payload=b"x" * (2 << 20)), "limit"),
        (lambda: StreamRequest(request_id=1, batches=1, batch_size=0, credit=1), "0 < batch_size <= credit"),
        (lambda: StreamSent(request_id=1, batches=-1, size=0), "batches must be >= 0"),
    ],
)
def test_message_validation(make: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        make()  # type: ignore[operator]


def test_two_nodes_streaming_to_each_other_use_distinct_keys() -> None:
    """Both nodes number requests from 1: the keys must still differ, or closing one stream closes both."""
    a, b = EchoRole(node_id="a"), EchoRole(node_id="b")
    call = {"batches": 1, "batch_size": 4}
    (accept_a, *_) = a.handle(c.LocalCall(call_id=1, name="stream", args={"peer": "b", **call}), 0.0)
    (accept_b, *_) = b.handle(c.LocalCall(call_id=1, name="stream", args={"peer": "a", **call}), 0.0)
    assert isinstance(accept_a, c.AcceptStream) and isinstance(accept_b, c.AcceptStream)
    assert accept_a.stream != accept_b.stream
    served = list(
        b.handle(
            c.MessageReceived(
                peer="a", message=StreamRequest(request_id=1, batches=1, batch_size=4, credit=4)
            ),
            0.0,
        )
    )
    opened = next(x for x in served if isinstance(x, c.OpenStream))
    assert opened.stream == accept_a.stream  # what b sends to a is the stream a accepted
