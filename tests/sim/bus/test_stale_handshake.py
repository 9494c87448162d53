"""Handshakes that race a link loss, with fixed seeds: late WELCOMEs, late REJECTs, early messages.

The rules under test (docs/PROTOCOL.md section 4):

* A peer is up only once both sides are welcomed: a node's session is confirmed by the first sequenced
  message the peer sends on it (the HEARTBEAT it sends once welcomed). So nothing of a role reaches a side
  that is not up yet, and nothing has to be held (or dropped, with its sequence number taken).
* A message of a role (or a batch) on a session that is not up is refused with REJECT ``OUT_OF_STATE``
  naming the session, and the link restarts on both sides: loud, never a silent hole.
* A link lost while our HELLO is unanswered ends that attempt: its WELCOME, when it comes, is ignored.
* A REJECT ends only the session named in its header, not a newer one.
* A final REJECT (``HANDSHAKE_HEADER``, ``CLUSTER_ID_MISMATCH``) ends the link for good only as the answer
  to the HELLO the node is waiting on: with ZeroMQ's routing-id handover, the answer to a stranger holding
  the node's routing id at the peer may reach the node itself.
* A HELLO names the peer's attempt whose session its sender has dropped (``dropped_attempt``): the peer
  handshakes again if that is its current attempt (its WELCOME is stale), and keeps its direction
  otherwise, so two sides do not go on replacing each other's sessions.
"""

from __future__ import annotations

import msgpack
import pytest

from sparkbus.bus import ErrorCode, PeerLost, PeerUp, SimBus
from sparkbus.bus import contract as c
from sparkbus.bus.core import NodeCore
from sparkbus.bus.messages import MAGIC, Hello, Reject, StreamBatch
from sparkbus.bus.state import Transmit
from sparkbus.codecs import REGISTRY, EnvelopeCodec

from .roles import Note, Recorder, pair

codec = EnvelopeCodec(REGISTRY)
SEEDS = [1, 2, 3, 7, 42, 99, 123, 2024]


def consistent(sim: SimBus) -> bool:
    """Both up, and each side's outbound session is the one the other side holds for it."""
    if not sim.all_up():
        return False
    ca, cb = sim.node("a").core, sim.node("b").core
    return (
        ca._outbound["b"].session == cb._inbound["a"].session
        and cb._outbound["a"].session == ca._inbound["b"].session
    )


def settled(sim: SimBus, a: Recorder, b: Recorder, *, limit: float = 20.0) -> None:
    """Run until the link is consistent, then check it stays so: no further loss, no restart loop."""
    sim.run_until(lambda: consistent(sim), limit=limit)
    ups = (len(a.of(PeerUp)), len(b.of(PeerUp)))
    sim.run_for(5.0)
    assert consistent(sim)
    assert (len(a.of(PeerUp)), len(b.of(PeerUp))) == ups, "the link went on restarting"
    assert len(a.of(PeerLost)) == ups[0] - 1 and len(b.of(PeerLost)) == ups[1] - 1


def opened(core: NodeCore) -> int:
    return core.counters["sessions_opened"]


def accepted(core: NodeCore) -> int:
    return core.counters["sessions_accepted"]


def late_welcome_to_b(sim: SimBus, stall: float = 0.5) -> None:
    """b forgets the link; a's answer to b's new HELLO (a's WELCOME) comes ``stall`` seconds late."""
    sim.stall("a", "b", stall, channels=("reply",))
    sim.node("b").core._link_lost("a", "test: forgot the session", sim.now)
    sim._flush("b")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_peer_is_up_only_once_the_other_side_has_its_welcome(seed: int) -> None:
    sim, a, b = pair(seed)
    late_welcome_to_b(sim)
    ca, cb = sim.node("a").core, sim.node("b").core
    sim.run_until(lambda: opened(ca) == 2 and accepted(ca) == 2, limit=5)
    # a has both sessions, but b has not heard our WELCOME yet: a must not be up (it would stream to b).
    assert cb._outbound["a"].state == "hello_sent"
    assert not ca.is_up("b")
    sim.run_until(lambda: ca.is_up("b"), limit=5)
    assert cb._outbound["a"].state == "established"
    settled(sim, a, b)
    assert cb.refusals.get("OUT_OF_STATE", 0) == 0 and cb.refusals.get("LIMIT_EXCEEDED", 0) == 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("losers", ["a", "b", "ab", "ba"])
def test_a_welcome_for_an_attempt_whose_link_was_lost_is_ignored(seed: int, losers: str) -> None:
    """b's HELLO is answered, its WELCOME is on the way, and then one side or both lose the link again.
    That WELCOME names a session that is over: a has dropped it, or drops it when b's next HELLO replaces
    it. Taking it, b used to be refused as stale, and its REJECT ended a's new session, whose REJECT ended
    b's, and so on for ever (65 restarts in 20 simulated seconds, for every seed)."""
    sim, a, b = pair(seed)
    late_welcome_to_b(sim)
    ca, cb = sim.node("a").core, sim.node("b").core
    sim.run_until(lambda: accepted(ca) == 2, limit=5)  # a has taken b's HELLO; its WELCOME is on the way
    first = cb._outbound["a"].attempt
    for side in losers:
        core, peer = (ca, "b") if side == "a" else (cb, "a")
        core._link_lost(peer, "test: lost again while b's HELLO is unanswered", sim.now)
        sim._flush(side)
    settled(sim, a, b)
    assert cb.counters["dropped_stale_welcome"] == 1
    assert cb._outbound["a"].attempt == first + 1
    for core in (ca, cb):
        assert core.refused() == {} and core.refusals.get("STALE_SESSION", 0) == 0
    assert len(a.of(PeerUp)) == len(b.of(PeerUp)) == 2


@pytest.mark.parametrize("seed", SEEDS)
def test_one_side_forgetting_the_link_costs_one_handshake_each_way(seed: int) -> None:
    sim, a, b = pair(seed)
    ca, cb = sim.node("a").core, sim.node("b").core
    hellos = (ca.counters["hellos_out"], cb.counters["hellos_out"])
    cb._link_lost("a", "test: forgot the session", sim.now)
    sim._flush("b")
    settled(sim, a, b)
    assert (ca.counters["hellos_out"], cb.counters["hellos_out"]) == (hellos[0] + 1, hellos[1] + 1)
    assert len(a.of(PeerUp)) == len(b.of(PeerUp)) == 2


@pytest.mark.parametrize("seed", SEEDS)
def test_a_second_hello_keeps_the_direction_the_peer_still_holds(seed: int) -> None:
    """b sends a second HELLO while it holds a's new session: the HELLO names no dropped attempt of a's, so
    a keeps its direction (and does not make b handshake once more, which could go on for ever)."""
    sim, a, b = pair(seed)
    late_welcome_to_b(sim)
    ca, cb = sim.node("a").core, sim.node("b").core
    # a has re-handshaken with b (b holds a's new session) while b's own HELLO is unanswered.
    sim.run_until(lambda: opened(ca) == 2 and accepted(cb) == 2, limit=5)
    session, hellos = ca._outbound["b"].session, ca.counters["hellos_out"]
    cb._outbound["a"].hello_at = sim.now - cb.config.handshake_timeout  # b's HELLO is sent again
    cb._outbound["a"].state = "idle"
    sim.run_until(lambda: ca.counters["sessions_accepted"] >= 3, limit=5)
    assert ca._outbound["b"].session == session and ca._outbound["b"].state == "established"
    settled(sim, a, b)
    assert ca.counters["hellos_out"] == hellos and ca._outbound["b"].session == session


def test_a_reject_ends_only_the_session_it_names() -> None:
    sim, a, b = pair(1)
    cb = sim.node("b").core
    current = cb._outbound["a"].session
    for session in (current + 1, 0):
        reject = Reject(code=ErrorCode.STALE_SESSION, message="old", version=(1, 0, 0))
        cb.on_reply("a", codec.encode(reject, session=session), sim.now)
        sim._flush("b")
    assert not b.of(PeerLost) and cb.counters["dropped_stale_reject"] == 2
    reject = Reject(code=ErrorCode.STALE_SESSION, message="yours", version=(1, 0, 0))
    cb.on_reply("a", codec.encode(reject, session=current), sim.now)
    sim._flush("b")
    assert b.of(PeerLost) and "yours" in b.of(PeerLost)[0].reason  # type: ignore[attr-defined]
    settled(sim, a, b)


_HELLO_HEADER = bytes([0x96, 0x01, 0x01, 0x00, 0x00, 0xC0, 0x00])  # HELLO, session 0, seq 0


def _hello_of_a(**kw: object) -> list[bytes]:
    fields: dict[str, object] = dict(
        magic=MAGIC, version=(1, 0, 0), features=b"", cluster_tag="t", node_id="a", kind="node", attempt=5
    )
    fields.update(kw)
    return [bytes(f) for f in codec.encode(Hello(**fields))]  # type: ignore[arg-type]


#: What a stranger holding routing id "a" at b's ROUTER sends, whether b has lost a's session first, and the
#: REJECT (code, attempt) b answers with.
STRANGERS = {
    "undecodable HELLO": (
        [_HELLO_HEADER, msgpack.packb({"magic": 1, "version": [1, 0, 0], "attempt": 5})],
        False,
        (ErrorCode.HANDSHAKE_HEADER, 5),
    ),
    "undecodable HELLO, no attempt": (
        [_HELLO_HEADER, b"\x81\xa5magic\x01"],
        False,
        (ErrorCode.HANDSHAKE_HEADER, 0),
    ),
    "wrong magic": (_hello_of_a(magic=b"IGNI"), False, (ErrorCode.HANDSHAKE_HEADER, 5)),
    "another cluster": (_hello_of_a(cluster_tag="other"), False, (ErrorCode.CLUSTER_ID_MISMATCH, 5)),
    "not a HELLO, a's session lost at b": (
        [bytes(f) for f in codec.encode(Note(text="hi"), session=0, seq=0)],
        True,
        (ErrorCode.HANDSHAKE_HEADER, 0),
    ),
}


@pytest.mark.parametrize("seed", SEEDS[:4])
@pytest.mark.parametrize("stranger", list(STRANGERS))
def test_a_final_reject_for_a_stranger_under_the_nodes_routing_id_leaves_its_link(
    seed: int, stranger: str
) -> None:
    """b refuses what a stranger holding routing id "a" sent, echoing the attempt it could read; the
    REJECT reaches the real a (the handover). a is not waiting on a HELLO of that attempt: it drops the
    REJECT. It used to take any final REJECT of attempt 0 and give its link to b up for good."""
    sim, a, b = pair(seed)
    ca, cb = sim.node("a").core, sim.node("b").core
    frames, forget, answer = STRANGERS[stranger]
    if forget:  # b answers a message on session 0 from a routing id it holds no session for
        cb._link_lost("a", "test: forgot the session", sim.now)
        sim._flush("b")
    cb.on_control(b"a", frames, sim.now)
    [reply] = cb.take()
    assert isinstance(reply, Transmit)
    reject = codec.decode(reply.frames).message
    assert isinstance(reject, Reject) and (reject.code, reject.attempt) == answer
    sim.send_raw("b", "a", "reply", reply.frames)
    settled(sim, a, b)
    assert ca.refused() == {} and ca.counters["dropped_stale_reject"] == 1


def _send_regardless(sim: SimBus, src: str, dst: str, channel: str) -> None:
    """A peer that ignores the confirmation rule: sends on its session as soon as it is welcomed."""
    core = sim.node(src).core
    out = core._outbound[dst]
    assert out.state == "established"
    if channel == "ctl":
        core._send_ctl(out, Note(text="too early"), sim.now)
    else:
        out.data_seq += 1
        batch = StreamBatch(ordinal=0, last=False, remaining=0, data=b"x" * 100)
        core._emit("data", dst, codec.encode(batch, session=out.session, seq=out.data_seq, stream="rec/s"))
    sim._flush(src)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("channel", ["ctl", "data"])
def test_a_message_before_the_link_is_up_is_refused_and_the_link_restarts(seed: int, channel: str) -> None:
    sim, a, b = pair(seed)
    late_welcome_to_b(sim)
    ca, cb = sim.node("a").core, sim.node("b").core
    sim.run_until(lambda: opened(ca) == 2, limit=5)
    assert not cb.is_up("a")
    _send_regardless(sim, "a", "b", channel)
    sim.run_until(lambda: cb.refusals["OUT_OF_STATE"] >= 1, limit=5)
    settled(sim, a, b)
    assert cb.refusals["OUT_OF_STATE"] == 1
    # Refused, never delivered late nor dropped quietly; the sender's side of the link ended at once.
    assert not [e for e in b.of(c.MessageReceived) if e.message == Note(text="too early")]  # type: ignore[attr-defined]
    assert not b.of(c.BatchReceived)
    assert (
        any("OUT_OF_STATE" in e.reason for e in a.of(PeerLost)) or ca.counters["rejected_out_of_state"] == 1
    )  # type: ignore[attr-defined]
    for core in (ca, cb):
        assert core.refusals.get("LIMIT_EXCEEDED", 0) == 0 and core.refusals.get("STREAM_VIOLATION", 0) == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hello_the_socket_refused_is_sent_again_once_it_connects(seed: int) -> None:
    """A real DEALER refuses a HELLO while it is not connected (IMMEDIATE); the node then reports it ready
    (its ZMTP handshake) and the next HELLO goes at once. Sent again while the first one's WELCOME is in
    fact on the way, that WELCOME is ignored (an attempt that is over) and the link still settles."""
    sim, a, b = pair(seed)
    ca, cb = sim.node("a").core, sim.node("b").core
    hellos_a = ca.counters["hellos_out"]
    ca.on_transport_ready("b", sim.now)  # established: nothing to send again
    assert ca.counters["hellos_out"] == hellos_a and ca._outbound["b"].state == "established"
    late_welcome_to_b(sim)
    sim.run_until(lambda: accepted(ca) == 2, limit=5)  # a has taken b's HELLO; its WELCOME is on the way
    out = cb._outbound["a"]
    assert out.state == "hello_sent"
    attempt, hellos = out.attempt, cb.counters["hellos_out"]
    cb.on_transport_ready("a", sim.now)
    sim._flush("b")
    assert out.attempt == attempt + 1 and cb.counters["hellos_out"] == hellos + 1
    settled(sim, a, b)
    assert cb.counters["dropped_stale_welcome"] == 1
    for core in (ca, cb):
        assert core.refused() == {} and core.refusals.get("STALE_SESSION", 0) == 0
