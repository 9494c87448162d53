"""Sessions, liveness, races and bad input on the real NodeCore, driven by SimBus with fixed seeds."""

from __future__ import annotations

import msgpack
import pytest

from sparkbus.bus import BusConfig, ErrorCode, HandlerFailed, MessageReceived, PeerLost, PeerUp, SimBus
from sparkbus.bus import contract as c
from sparkbus.bus.links import heartbeat_interval
from sparkbus.bus.messages import MAGIC, Hello, Reject, StreamBatch, features_to_bits
from sparkbus.codecs import REGISTRY, EnvelopeCodec, LimitExceeded, Limits

from .roles import Note, Recorder, pair

codec = EnvelopeCodec(REGISTRY)
SEEDS = [1, 2, 3, 7, 42]


def do(sim: SimBus, node: str, *actions: c.Action) -> None:
    sim.result(sim.call(node, "rec", "do", {"actions": list(actions)}), limit=5)


@pytest.mark.parametrize("seed", SEEDS)
def test_handshake_brings_both_peers_up_once(seed: int) -> None:
    _sim, a, b = pair(seed)
    assert a.of(PeerUp) == [PeerUp(peer="b")]
    assert b.of(PeerUp) == [PeerUp(peer="a")]


@pytest.mark.parametrize("seed", SEEDS)
def test_control_messages_arrive_in_order(seed: int) -> None:
    sim, _a, b = pair(seed)
    do(sim, "a", *[c.Send(peer="b", message=Note(text=str(i))) for i in range(50)])
    sim.run_until_idle()
    assert [e.message.text for e in b.of(MessageReceived)] == [str(i) for i in range(50)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_stream_stays_within_credit_and_delivers_everything(seed: int) -> None:
    sim, a, b = pair(seed)
    do(sim, "a", c.OpenStream(peer="b", stream="rec/s", credit=1000))
    sent = 0
    for i in range(40):
        # Send whenever credit allows, as a streaming role does on CreditChanged.
        credit = sim.node("a").core._peers["b"].senders["rec/s"][1].credit
        if credit >= 100:
            do(sim, "a", c.SendBatch(peer="b", stream="rec/s", data=bytes([i]) * 100, last=sent == 2900))
            sent += 100
        sim.run_for(0.01)
        if sent == 3000:
            break
    sim.run_until_idle()
    got = b.of(c.BatchReceived)
    assert sum(e.size for e in got) == sent == 3000
    assert [e.ordinal for e in got] == list(range(len(got)))
    assert got[-1].last
    assert a.of(c.CreditChanged), "the receiver must have granted credit back"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_message_that_cannot_be_encoded_is_the_roles_error_and_the_link_goes_on(seed: int) -> None:
    sim, a, b = pair(seed)
    bad = Note(text=2**64)  # type: ignore[arg-type]  # msgpack has no integer this large
    do(sim, "a", c.Send(peer="b", message=bad), c.Send(peer="b", message=Note(text="after")))
    sim.run_until_idle()
    # The refused message took no sequence number: the next one is not a gap that breaks the link.
    assert [e.message.text for e in b.of(MessageReceived)] == ["after"]
    assert a.of(HandlerFailed)[0].event == c.Send(peer="b", message=bad)
    assert not a.of(PeerLost) and not b.of(PeerLost)
    assert sim.node("b").core.refusals["SEQUENCE_GAP"] == 0


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_batch_that_is_not_a_buffer_is_the_roles_error_and_the_stream_goes_on(seed: int) -> None:
    sim, a, b = pair(seed)
    bad = c.SendBatch(peer="b", stream="rec/s", data="not bytes")  # type: ignore[arg-type]
    do(sim, "a", c.OpenStream(peer="b", stream="rec/s", credit=1000), bad)
    assert "must be bytes-like, not str" in a.of(HandlerFailed)[0].error
    # No credit spent, no ordinal or data sequence number taken: the next batch is the stream's first.
    do(sim, "a", c.SendBatch(peer="b", stream="rec/s", data=b"x" * 10, last=True))
    sim.run_until_idle()
    assert [(e.ordinal, e.size, e.last) for e in b.of(c.BatchReceived)] == [(0, 10, True)]
    assert not a.of(PeerLost) and not b.of(PeerLost)


@pytest.mark.parametrize("seed", SEEDS)
def test_closing_an_incoming_stream_mid_flight_drops_its_rest_and_keeps_the_link(seed: int) -> None:
    sim, a, b = pair(seed)
    batches = [c.SendBatch(peer="b", stream="rec/q", data=b"x" * 100) for _ in range(10)]
    do(sim, "a", c.OpenStream(peer="b", stream="rec/q", credit=1 << 20), *batches)
    sim.run_until(lambda: len(b.of(c.BatchReceived)) >= 3, limit=5)
    got = len(b.of(c.BatchReceived))
    do(sim, "b", c.CloseStream(peer="a", stream="rec/q"))  # a cancel, with batches still in flight
    sim.run_until_idle()
    core = sim.node("b").core
    assert len(b.of(c.BatchReceived)) == got < 10
    assert core.counters["dropped_batches_ended_stream"] == 10 - got
    assert core.refusals["STREAM_VIOLATION"] == 0 and not a.of(PeerLost) and not b.of(PeerLost)
    # The key may name a new stream later (ordinal 0 again), once the sender has closed its side too.
    do(
        sim,
        "a",
        c.CloseStream(peer="b", stream="rec/q"),
        c.OpenStream(peer="b", stream="rec/q", credit=1 << 20),
        c.SendBatch(peer="b", stream="rec/q", data=b"new", last=True),
    )
    sim.run_until_idle()
    last = b.of(c.BatchReceived)[-1]
    assert (last.ordinal, last.data, last.last) == (0, b"new", True)  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_refused_stream_stays_refused_when_a_slot_frees(seed: int) -> None:
    # b takes 2 streams from a peer; a may open more (the nodes of a cluster may differ in this).
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a])
    sim.add_node("b", [b], BusConfig(cluster_tag="t", max_streams=2))
    sim.start()
    sim.run_until(sim.all_up, limit=5)

    def batch(stream: str, last: bool = False) -> c.SendBatch:
        return c.SendBatch(peer="b", stream=stream, data=b"x" * 100, last=last)

    opened = [c.OpenStream(peer="b", stream=f"rec/s{i}", credit=1 << 20) for i in range(3)]
    do(sim, "a", *opened, batch("rec/s0"), batch("rec/s1"), batch("rec/s2"))
    sim.run_until_idle()
    core = sim.node("b").core
    assert core.refusals["TOO_MANY_STREAMS"] == 1
    do(sim, "a", batch("rec/s0", last=True))  # s0 ends: a slot is free
    sim.run_until_idle()
    do(sim, "a", batch("rec/s2"), batch("rec/s2", last=True))  # the rest of the refused stream
    sim.run_until_idle()
    assert core.counters["dropped_batches_ended_stream"] == 2
    assert {e.stream for e in b.of(c.BatchReceived)} == {"rec/s0", "rec/s1"}  # type: ignore[attr-defined]
    assert core.refusals["STREAM_VIOLATION"] == 0 and not a.of(PeerLost)
    assert "rec/s2" not in core._peers["a"].ended  # its last batch has come: nothing left to drop


def test_accepting_a_stream_with_no_credit_is_the_roles_error() -> None:
    sim, _a, b = pair(1)
    do(sim, "b", c.AcceptStream(peer="a", stream="rec/s", credit=0))
    assert "credit must be a positive int, got 0" in b.of(HandlerFailed)[0].error
    # Nothing was recorded: the stream's first batch opens it with the node's default credit.
    do(
        sim,
        "a",
        c.OpenStream(peer="b", stream="rec/s", credit=100),
        c.SendBatch(peer="b", stream="rec/s", data=b"x"),
    )
    sim.run_until_idle()
    assert [e.size for e in b.of(c.BatchReceived)] == [1]  # type: ignore[attr-defined]


def test_batch_beyond_credit_is_a_local_error_told_to_the_role() -> None:
    sim, a, _b = pair(1)
    do(
        sim,
        "a",
        c.OpenStream(peer="b", stream="rec/s", credit=100),
        c.SendBatch(peer="b", stream="rec/s", data=b"x" * 101),
    )
    failed = a.of(HandlerFailed)
    assert failed and "exceeds credit 100" in failed[0].error
    assert sim.node("a").core.counters["role_errors"] == 1


def test_a_role_that_raises_does_not_take_the_node_down() -> None:
    sim, _a, b = pair(1)
    b.fail_on = "boom"
    do(sim, "a", c.Send(peer="b", message=Note(text="boom")), c.Send(peer="b", message=Note(text="after")))
    sim.run_until_idle()
    assert [e.message.text for e in b.of(MessageReceived)] == ["boom", "after"]
    assert "told to fail on boom" in b.of(HandlerFailed)[0].error


@pytest.mark.parametrize("seed", SEEDS)
def test_crash_is_reported_at_once_and_restart_is_a_new_session(seed: int) -> None:
    sim, a, _b = pair(seed)
    sim.crash("b")
    assert a.of(PeerLost) and a.of(PeerLost)[0].peer == "b"
    b2 = Recorder()
    sim.restart("b", [b2])
    sim.run_until(sim.all_up, limit=10)
    assert a.of(PeerUp) == [PeerUp(peer="b"), PeerUp(peer="b")]
    assert b2.of(PeerUp) == [PeerUp(peer="a")]


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_peer_is_lost_after_the_timeout(seed: int) -> None:
    sim, a, _b = pair(seed, heartbeat_interval=0.1, peer_timeout=0.5)
    start = sim.now
    sim.crash("b", notify=False)  # SIGSTOP: no disconnect, only silence
    sim.run_until(lambda: bool(a.of(PeerLost)), limit=5)
    assert 0.4 <= sim.now - start <= 0.7
    assert "silent" in a.of(PeerLost)[0].reason


@pytest.mark.parametrize(
    ("configured", "idle_ms", "interval"),
    [(0.3, 1500, 0.3), (3.0, 2400, 0.8), (3.0, 900, 0.5), (0.1, 900, 0.1), (3.0, 0, 3.0)],
)
def test_the_heartbeat_interval_follows_the_peers_idle_timeout(
    configured: float, idle_ms: int, interval: float
) -> None:
    assert heartbeat_interval(configured, idle_ms) == pytest.approx(interval)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_peer_with_a_shorter_timeout_is_heard_from_in_time(seed: int) -> None:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a], BusConfig(cluster_tag="t", heartbeat_interval=0.3, peer_timeout=2.4))
    sim.add_node("b", [b], BusConfig(cluster_tag="t", heartbeat_interval=3.0, peer_timeout=6.0))
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    sim.run_for(20.0)  # idle: b heartbeats every 0.8 s (a's 2.4 s idle timeout / 3), not every 3 s
    assert not a.of(PeerLost) and not b.of(PeerLost)


@pytest.mark.parametrize("seed", SEEDS)
def test_heartbeats_keep_an_idle_link_alive(seed: int) -> None:
    sim, a, b = pair(seed, heartbeat_interval=0.1, peer_timeout=0.5)
    sim.run_for(5.0)
    assert not a.of(PeerLost) and not b.of(PeerLost)
    assert sim.node("a").core.counters["heartbeats_out"] >= 40


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_link_loses_streams_and_heals_as_a_new_session(seed: int) -> None:
    sim, a, b = pair(seed)
    do(sim, "a", c.OpenStream(peer="b", stream="rec/s", credit=1000))
    sim.cut("a", "b")
    assert a.of(PeerLost) and b.of(PeerLost)
    assert not sim.node("a").core._peers["b"].senders
    sim.heal("a", "b")
    sim.run_until(sim.all_up, limit=10)
    assert len(a.of(PeerUp)) == 2
    # The old stream is gone: sending on it is the role's error, not a silent resumption.
    do(sim, "a", c.SendBatch(peer="b", stream="rec/s", data=b"x"))
    assert "not open" in a.of(HandlerFailed)[-1].error


def hello(**kw: object) -> list[bytes]:
    fields: dict[str, object] = dict(
        magic=MAGIC,
        version=(1, 0, 0),
        features=features_to_bits([0]),
        cluster_tag="t",
        node_id="x",
        kind="client",
        attempt=1,
    )
    fields.update(kw)
    return [bytes(f) for f in codec.encode(Hello(**fields))]  # type: ignore[arg-type]


def refusal(sim: SimBus, node: str, rid: str, frames: list[bytes]) -> Reject:
    """Send frames to ``node``'s ROUTER as routing id ``rid`` and return the REJECT it answers with."""
    core = sim.node(node).core
    core.on_control(rid.encode(), frames, sim.now)
    replies = [t for t in core.take() if getattr(t, "to", None) == rid.encode()]
    assert replies, "no answer"
    msg = codec.decode(replies[-1].frames).message
    assert isinstance(msg, Reject)
    return msg


def test_max_peers_bounds_thin_clients_and_never_locks_out_the_topologys_nodes() -> None:
    sim, _a, _b = pair(1, max_peers=2)
    core = sim.node("a").core
    for i in range(2):
        core.on_control(f"c{i}".encode(), hello(node_id=f"c{i}"), sim.now)
    assert refusal(sim, "a", "c2", hello(node_id="c2")).code == ErrorCode.TOO_MANY_PEERS
    # The link to b drops and comes back while both client slots are taken: b still gets its session.
    sim.cut("a", "b")
    sim.heal("a", "b")
    sim.run_until(sim.all_up, limit=10)
    assert core.is_up("b") and core.refusals["TOO_MANY_PEERS"] == 1


def test_a_thin_clients_session_that_ends_leaves_no_peer_entry() -> None:
    """Every client session has a routing id of its own: a node serving many short-lived clients (one per
    CLI call) must not keep an entry for each one ever served."""
    sim, _a, _b = pair(1, heartbeat_interval=0.1, peer_timeout=0.5)
    core = sim.node("a").core
    for i in range(50):
        core.on_control(f"c{i}".encode(), hello(node_id=f"c{i}"), sim.now)
    assert sum(p.startswith("client:") for p in core.status()["peers"]) == 50
    sim.run_for(2.0)  # the clients are silent: each session times out
    assert list(core.status()["peers"]) == ["b"] and core.is_up("b")
    core.on_control(b"c0", hello(node_id="c0"), sim.now)  # a client that says HELLO again is served anew
    assert core.is_up(f"client:{b'c0'.hex()}")


def test_a_message_over_a_limit_is_refused_as_limit_exceeded_and_a_malformed_one_as_malformed() -> None:
    sim, _a, _b = pair(1, limits=Limits(max_frame_bytes=1024))
    core = sim.node("b").core
    assert refusal(sim, "b", "big", [b"\x01" * 2000]).code == ErrorCode.LIMIT_EXCEEDED
    assert refusal(sim, "b", "bad", [b"\xc1"]).code == ErrorCode.MALFORMED
    # On the data socket (no answer there): counted under its code.
    core.on_data([b"\x01" * 2000], sim.now)
    assert core.refusals["LIMIT_EXCEEDED"] == 2 and core.refusals["MALFORMED"] == 1
    with pytest.raises(LimitExceeded, match="limit is 1024"):
        EnvelopeCodec(REGISTRY, limits=Limits(max_frame_bytes=1024)).decode([b"\x01" * 2000])


def test_a_gap_on_data_is_answered_with_reject_as_on_ctl() -> None:
    sim, _a, _b = pair(1)
    core = sim.node("b").core
    inbound = core._inbound["a"]
    batch = StreamBatch(ordinal=0, last=True, remaining=0, data=b"x")
    core.on_data(
        codec.encode(batch, session=inbound.session, seq=inbound.data_seq + 2, stream="rec/s"), sim.now
    )
    answers = [codec.decode(t.frames) for t in core.take() if getattr(t, "to", None) == inbound.rid]
    assert [(e.message.code, e.header.session) for e in answers] == [
        (ErrorCode.SEQUENCE_GAP, inbound.session)
    ]
    assert not core.is_up("a")


def test_wrong_magic_cluster_and_version_are_refused_with_codes() -> None:
    sim, a, _b = pair(1)
    assert refusal(sim, "a", "m", hello(magic=b"IGNI")).code == ErrorCode.HANDSHAKE_HEADER
    wrong = refusal(sim, "a", "t", hello(cluster_tag="other"))
    assert wrong.code == ErrorCode.CLUSTER_ID_MISMATCH and "other" in wrong.message
    v = refusal(sim, "a", "v", hello(version=(9, 0, 0)))
    assert v.code == ErrorCode.PROTOCOL_COMPATIBILITY and v.version == (1, 0, 0)
    assert refusal(sim, "a", "g", [b"garbage"]).code == ErrorCode.MALFORMED
    early = refusal(sim, "a", "e", [bytes(f) for f in codec.encode(Note(text="hi"), session=0, seq=0)])
    assert early.code == ErrorCode.HANDSHAKE_HEADER and "HELLO" in early.message
    stale = refusal(sim, "a", "s", [bytes(f) for f in codec.encode(Note(text="hi"), session=5, seq=1)])
    assert stale.code == ErrorCode.STALE_SESSION
    assert refusal(sim, "a", "n", hello(kind="node", node_id="n")).code == ErrorCode.RESOURCE_NOT_FOUND
    refusals = sim.node("a").core.refusals
    assert refusals["HANDSHAKE_HEADER"] == 2 and refusals["CLUSTER_ID_MISMATCH"] == 1
    assert a.of(PeerLost) == []  # the real peer was never disturbed


def test_a_node_of_another_cluster_is_refused_and_never_retried() -> None:
    sim = SimBus(seed=3)
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a], BusConfig(cluster_tag="one"))
    sim.add_node("b", [b], BusConfig(cluster_tag="two"))
    sim.start()
    sim.run_for(5.0)
    assert "CLUSTER_ID_MISMATCH" in sim.node("a").core.refused()["b"]
    assert sim.node("a").core.counters["hellos_out"] == 1
    assert not a.of(PeerUp)


def test_version_negotiation_falls_back_to_the_servers_version() -> None:
    sim = SimBus(seed=5)
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a], BusConfig(cluster_tag="t", versions=((1, 1, 0), (1, 0, 0))))
    sim.add_node("b", [b], BusConfig(cluster_tag="t", versions=((1, 0, 0),)))
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    assert sim.node("a").core.counters["rejected_protocol_compatibility"] == 1


def test_no_common_version_is_refused_for_good() -> None:
    sim = SimBus(seed=5)
    sim.add_node("a", [Recorder()], BusConfig(cluster_tag="t", versions=((2, 0, 0),)))
    sim.add_node("b", [Recorder()], BusConfig(cluster_tag="t", versions=((1, 0, 0),)))
    sim.start()
    sim.run_for(3.0)
    assert "no common protocol version" in sim.node("a").core.refused()["b"]


def test_sequence_gap_and_stale_session_break_the_link() -> None:
    sim, _a, b = pair(1)
    core = sim.node("b").core
    sess = core._inbound["a"].session
    core.on_control(b"a", codec.encode(Note(text="x"), session=sess, seq=99), sim.now)
    sim._flush("b")
    assert "sequence gap" in b.of(PeerLost)[0].reason
    sim.run_until(lambda: len(b.of(PeerUp)) == 2, limit=10)
    core.on_control(b"a", codec.encode(Note(text="x"), session=12345, seq=1), sim.now)
    assert core.refusals["STALE_SESSION"] == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_garbage_at_both_sockets_leaves_the_node_serving(seed: int) -> None:
    sim, a, _b = pair(seed)
    junk = [
        [b"\x00"],
        [b"\x96" * 10],
        [msgpack.packb([1, 0x0010, 77, 1, "rec/x", 0]), b"\x80", b"zz"],
        [],
        [b"x" * 70_000] * 3,
    ]
    for i, frames in enumerate(junk * 5):
        sim.send_raw(f"evil{i}", "a", "ctl", frames)
        sim.send_raw(f"evil{i}", "a", "data", frames)
        do(sim, "b", c.Send(peer="a", message=Note(text=str(i))))
    sim.run_until_idle()
    assert [e.message.text for e in a.of(MessageReceived)] == [str(i) for i in range(len(junk) * 5)]
    assert not a.of(PeerLost)
    assert sim.node("a").core.counters["refused"] >= len(junk) * 5


@pytest.mark.parametrize("seed", SEEDS)
def test_a_message_on_a_session_the_receiver_dropped_leads_to_a_new_handshake(seed: int) -> None:
    """One side lost the link (for example after a gap from an HWM drop) while the other still thinks it is
    open: the stale session is refused as STALE_SESSION, never as a final refusal, and both come back."""
    sim, a, _b = pair(seed)
    sim.node("b").core._link_lost("a", "test: forgot the session", sim.now)
    do(sim, "a", c.Send(peer="b", message=Note(text="into the void")))
    sim.run_until(lambda: sim.all_up() and len(a.of(PeerUp)) == 2, limit=10)
    assert sim.node("a").core.refused() == {}
    assert sim.node("b").core.refusals["STALE_SESSION"] >= 1
    assert a.of(PeerLost), "a must see the old session end, whichever side noticed first"


def test_call_ids_are_not_reused_across_a_restart() -> None:
    sim, _a, _b = pair(1)
    first = sim.call("b", "rec", "do", {"actions": []})
    sim.crash("b")
    sim.restart("b", [Recorder()])
    second = sim.call("b", "rec", "do", {"actions": []})
    assert first != second
    assert sim.result(second) == "ok"
