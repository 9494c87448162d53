"""A peer that restarts without its old process being noticed (no disconnect, within the timeout).

The new process's HELLO is the first sign. Every direction of the old link is stale, ours included: the
old process held the session our HELLO opened. So the roles are told the peer was lost and is back, and
the first message sent after that PeerUp reaches the new process instead of being refused STALE_SESSION.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from sparkbus.bus import ErrorCode, MessageReceived, PeerLost, PeerUp
from sparkbus.bus import contract as c
from sparkbus.bus.core import NodeCore
from sparkbus.bus.messages import INCARNATION, MAGIC, Hello, Reject, features_to_bits
from sparkbus.bus.state import RETIRED_KEPT
from sparkbus.codecs import REGISTRY, EnvelopeCodec

from .roles import Note, Recorder, pair

SEEDS = [1, 2, 3, 7, 42, 99, 123, 2024]
codec = EnvelopeCodec(REGISTRY)


@dataclass
class Greeter(Recorder):
    """A Recorder that sends Note "hello <n>" to every peer that comes up (the n-th PeerUp)."""

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        out = list(super().handle(event, now))
        if isinstance(event, PeerUp):
            out.append(c.Send(peer=event.peer, message=Note(text=f"hello {len(self.of(PeerUp))}")))
        return out


@pytest.mark.parametrize("seed", SEEDS)
def test_a_silent_restart_is_lost_and_up_and_the_first_message_after_arrives(seed: int) -> None:
    sim, _a, _b = pair(seed, heartbeat_interval=0.2, peer_timeout=5.0)
    greeter = Greeter()
    a = sim.node("a").core
    a.roles["rec"] = greeter  # type: ignore[index]
    sim.crash("b", notify=False)  # gone without a disconnect: "a" hears nothing for now
    sim.run_for(0.05)
    b2 = Recorder()
    sim.restart("b", [b2])
    sim.run_until(lambda: bool(b2.of(MessageReceived)), limit=2.0)  # well within "a"'s peer timeout
    sim.run_for(0.5)
    kinds = [type(e) for e in greeter.events if isinstance(e, PeerLost | PeerUp)]
    assert kinds == [PeerLost, PeerUp], "told once that the peer was lost, then once that it is back"
    assert [e.message.text for e in b2.of(MessageReceived)] == ["hello 1"]
    assert sim.node("b").core.refusals.get("STALE_SESSION", 0) == 0, "nothing was sent on the old session"
    assert [type(e) for e in b2.events if isinstance(e, PeerLost | PeerUp)] == [PeerUp]


def hello_of_b(extensions: dict[str, str], attempt: int = 12345) -> list[bytes]:
    """The frames of a HELLO from node "b" (a new attempt) with ``extensions``."""
    hello = Hello(
        magic=MAGIC,
        version=(1, 0, 0),
        features=features_to_bits([0, 1, 2]),
        cluster_tag="t",
        node_id="b",
        kind="node",
        attempt=attempt,
        extensions=extensions,
    )
    return [bytes(f) for f in codec.encode(hello)]


def hello_from_b(core: NodeCore, now: float, extensions: dict[str, str]) -> None:
    """A HELLO from node "b" (a new attempt) with ``extensions``, straight into ``core``'s ROUTER."""
    core.on_control(b"b", hello_of_b(extensions), now)


@pytest.mark.parametrize("value", ["", "abc", "-5", "1" * 21, "٣", "007", "0", str(2**63), str(2**64)])
def test_a_hello_with_no_usable_incarnation_keeps_our_direction(value: str) -> None:
    """Not a number (or none, as a peer in another language may send): the HELLO is a new session of
    the peer we know, as before incarnations; our established direction towards it is kept."""
    sim, a, _b = pair(1)
    core = sim.node("a").core
    before = core._outbound["b"].session
    hello_from_b(core, sim.now, {INCARNATION: value} if value else {})
    assert [type(e) for e in a.events if isinstance(e, PeerLost)] == [PeerLost]  # the old inbound session
    assert "new session" in a.of(PeerLost)[0].reason  # type: ignore[attr-defined]
    assert core._outbound["b"].state == "established" and core._outbound["b"].session == before
    assert core.status()["counters"].get("peer_restarts_seen", 0) == 0


def test_a_new_incarnation_resets_our_direction_too() -> None:
    sim, a, _b = pair(1)
    core = sim.node("a").core
    known = core._peers["b"].incarnation
    assert known, "a learnt b's incarnation from its HELLO"
    hello_from_b(core, sim.now, {INCARNATION: str(known + 1)})
    assert "restarted" in a.of(PeerLost)[0].reason  # type: ignore[attr-defined]
    assert core._outbound["b"].state == "idle"  # handshakes again on the next tick
    assert core._peers["b"].incarnation == known + 1
    assert core.status()["counters"]["peer_restarts_seen"] == 1


def refusals_to_b(core: NodeCore) -> list[Reject]:
    """The REJECTs ``core`` has queued for routing id ``b`` (taken from its outputs)."""
    out = [codec.decode(t.frames).message for t in core.take() if getattr(t, "to", None) == b"b"]
    return [m for m in out if isinstance(m, Reject)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replaced_process_that_speaks_again_is_refused_and_the_new_one_keeps_its_link(seed: int) -> None:
    """b restarts while its old process is stopped (no disconnect); once "a" reaches the new process at
    b's endpoint, the old one is retired, and its HELLO when it resumes gets DUPLICATE_NODE echoing its
    attempt; the new process's link is not touched."""
    sim, a, _b = pair(seed, heartbeat_interval=0.2, peer_timeout=5.0)
    core = sim.node("a").core
    old = core._peers["b"].incarnation
    assert core._peers["b"].owner == old, "learnt from b's WELCOME"
    sim.crash("b", notify=False)
    b2 = Recorder()
    sim.restart("b", [b2])
    sim.run_until(lambda: len(a.of(PeerUp)) == 2 and core.is_up("b"), limit=3.0)
    new = core._peers["b"].incarnation
    assert new not in (0, old) and core._peers["b"].owner == new and core._peers["b"].retired == [old]
    session = core._inbound["b"].session
    lost = len(a.of(PeerLost))

    hello_from_b(core, sim.now, {INCARNATION: str(old)})
    [reject] = refusals_to_b(core)
    assert reject.code == ErrorCode.DUPLICATE_NODE and reject.attempt == 12345
    assert f"incarnation {new}" in reject.message and f"incarnation {old}" in reject.message
    assert core.is_up("b") and core._inbound["b"].session == session and len(a.of(PeerLost)) == lost
    assert core.status()["counters"]["replaced_processes_refused"] == 1
    assert core.refusals["DUPLICATE_NODE"] == 1
    sim.run_for(1.0)  # and the new process goes on being heard
    assert core.is_up("b") and len(a.of(PeerLost)) == lost


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hello_alone_retires_nobody_and_a_process_not_at_the_endpoint_is_refused(seed: int) -> None:
    """One HELLO as b under a new incarnation (a second process started by mistake, or anything that
    reaches the ROUTER) is taken as a restart for now, but "a" then reaches b's endpoint and finds the
    live process there: the stranger is retired and its session ended, the live b comes back up, and
    the stranger's next HELLO is refused. Retiring on the HELLO would have refused the live b."""
    sim, _a, _b = pair(seed, heartbeat_interval=0.2, peer_timeout=1.0)
    core = sim.node("a").core
    live = core._peers["b"].incarnation
    stranger = live + 1
    hello_from_b(core, sim.now, {INCARNATION: str(stranger)})
    sim._flush("a")
    sim.run_until(lambda: core.is_up("b") and sim.node("b").core.is_up("a"), limit=10.0)
    assert core._peers["b"].owner == live and core._peers["b"].retired == [stranger]
    assert core._inbound["b"].incarnation == live
    assert sim.node("b").core.refused() == {}
    hello_from_b(core, sim.now, {INCARNATION: str(stranger)})
    [reject] = refusals_to_b(core)
    assert reject.code == ErrorCode.DUPLICATE_NODE and core.is_up("b")
    sim.run_for(30.0)
    assert core.is_up("b") and sim.node("b").core.refused() == {}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_node_that_restarted_takes_the_process_at_the_endpoint_not_the_first_hello(seed: int) -> None:
    """b1 was replaced by b2; then "a" restarts and forgets, and b1, resumed, says HELLO first: "a"
    takes it for now and reaches b2 at b's endpoint; whichever of b2's HELLO and that WELCOME comes
    first, b2 ends up holding both directions, and b1, once it speaks while b2 answers at the
    endpoint, is retired; b2 is never refused."""
    sim, _a, _b = pair(seed, heartbeat_interval=0.2, peer_timeout=5.0)
    b1 = sim.node("a").core._peers["b"].incarnation
    sim.crash("b", notify=False)
    sim.restart("b", [Recorder()])
    sim.run_until(lambda: sim.node("a").core._peers["b"].retired == [b1], limit=3.0)
    sim.run_until(sim.all_up, limit=10.0)
    b2 = sim.node("b").core._incarnation
    sim.crash("a")
    sim.restart("a", [Recorder()])
    core = sim.node("a").core
    hello_from_b(core, sim.now, {INCARNATION: str(b1)})  # before b2's own HELLO reaches the new "a"
    sim._flush("a")
    held = lambda: sim.all_up() and core._peers["b"].owner == b2 and core._inbound["b"].incarnation == b2  # noqa: E731
    sim.run_until(held, limit=10.0)
    hello_from_b(core, sim.now, {INCARNATION: str(b1)})  # b1 speaks again
    sim._flush("a")
    sim.run_until(lambda: held() and core._peers["b"].retired == [b1], limit=10.0)
    sim.run_for(30.0)
    assert sim.all_up() and sim.node("b").core.refused() == {}


def test_the_retired_processes_of_a_peer_are_bounded_and_the_owner_is_never_one() -> None:
    sim, _a, _b = pair(1)
    core = sim.node("a").core
    first = core._peers["b"].owner
    for k in range(1, RETIRED_KEPT + 3):
        core._learn_owner("b", first + k, sim.now)
    st = core._peers["b"]
    assert st.retired == [first + k for k in range(2, RETIRED_KEPT + 2)]
    assert st.owner == first + RETIRED_KEPT + 2
    core._learn_owner("b", first + 5, sim.now)  # back at the endpoint: not retired any more
    assert first + 5 not in st.retired and first + RETIRED_KEPT + 2 in st.retired


def reject_to_a(core: NodeCore, code: ErrorCode, attempt: int, now: float) -> None:
    reject = Reject(code=code, message="replaced", version=(1, 0, 0), attempt=attempt)
    core.on_reply("b", [bytes(f) for f in codec.encode(reject)], now)


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.DUPLICATE_NODE,
        ErrorCode.AUTHENTICATION,
        ErrorCode.HANDSHAKE_HEADER,
        ErrorCode.CLUSTER_ID_MISMATCH,
    ],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_refusal_for_good_ends_the_link_only_for_the_hello_it_answers(seed: int, code: ErrorCode) -> None:
    """With ZeroMQ's handover the REJECT meant for the process that held the routing id may reach the
    other one: a DUPLICATE_NODE (or an AUTHENTICATION: another process's key; or a final code) for an
    attempt that is not ours (0 included: no attempt at all), or for an open link, is dropped."""
    sim, a, _b = pair(seed)
    core = sim.node("a").core
    out = core._outbound["b"]
    for attempt in (out.attempt, 0):  # established: not a refusal of a HELLO we are waiting on
        reject_to_a(core, code, attempt, sim.now)
    assert core.is_up("b") and core.refused() == {}
    sim.crash("b")
    sim.run_until(lambda: out.state == "hello_sent", limit=3.0)
    for attempt in (out.attempt + 1, 0):
        reject_to_a(core, code, attempt, sim.now)
    assert out.state == "hello_sent" and core.counters["dropped_stale_reject"] == 4
    reject_to_a(core, code, out.attempt, sim.now)
    assert core.refused()["b"] == f"{code.name}: replaced" and core.is_refused("b")
    sim.restart("b", [Recorder()])
    sim.run_for(5.0)
    assert not core.is_up("b") and len(a.of(PeerUp)) == 1  # never dialled again


def test_a_hello_on_a_connection_with_another_nodes_key_is_refused_and_nothing_else_is_taken() -> None:
    """The node found the connection's CURVE key is not node "b"'s own (``Node._drain_control``): the HELLO
    is refused AUTHENTICATION echoing its attempt, and touches neither b's session nor its owner; any
    other message is dropped without an answer."""
    sim, a, _b = pair(1)
    core = sim.node("a").core
    core.take()
    session, owner = core._inbound["b"].session, core._peers["b"].owner
    core.on_wrong_key(b"b", hello_of_b({INCARNATION: "5"}, attempt=777), "c", sim.now)
    [reject] = refusals_to_b(core)
    assert reject.code == ErrorCode.AUTHENTICATION and reject.attempt == 777
    assert reject.message.startswith("node id 'b' has a CURVE key of its own (public/b.key)")
    assert "this connection's key is 'c'" in reject.message
    core.on_wrong_key(b"b", [bytes(f) for f in codec.encode(Note(text="x"))], "c", sim.now)
    core.on_wrong_key(b"b", [b"garbage"], "c", sim.now)
    assert refusals_to_b(core) == []
    assert core.status()["counters"]["wrong_key_refused"] == 3 and core.refusals["AUTHENTICATION"] == 3
    assert core.is_up("b") and core._inbound["b"].session == session and core._peers["b"].owner == owner
    assert not a.of(PeerLost)
