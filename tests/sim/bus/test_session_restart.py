"""A session restart in the middle of a stream: every stream starts from scratch, nothing stale is taken.

The report: once, under load, after a spurious peer loss, a receiver refused a batch with STREAM_VIOLATION
"ordinal 42, expected 0", as if the sender's stream state had outlived the session. These tests play the
one-sided losses that could lead there, with fixed seeds: one side stops hearing the other (a loaded loop,
frames queued and delivered late) and declares it lost by silence while the other goes on streaming; then
they handshake again and the sender streams again under the same stream key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from sparkbus.bus import BusConfig, PeerLost, PeerUp, SimBus
from sparkbus.bus import contract as c

SEEDS = [1, 2, 3, 7, 42, 99, 123, 2024]
BATCH = 4096
CREDIT = 16 * BATCH
STREAM = "stream/s"


@dataclass
class Streamer:
    """Streams ``STREAM`` to ``to`` from each PeerUp, for as long as credit allows, without end; stops at
    PeerLost. The receiving side consumes what arrives and records it per session of the link."""

    to: str = ""
    name: str = "stream"
    messages: ClassVar[tuple[type, ...]] = ()
    open: bool = False
    sent: int = 0
    ups: int = 0
    received: list[list[int]] = field(default_factory=list)  # ordinals, one list per PeerUp
    failures: list[str] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, PeerUp):
            self.ups += 1
            self.received.append([])
            if self.to == event.peer:
                self.open = True
                opened: list[c.Action] = [c.OpenStream(peer=self.to, stream=STREAM, credit=CREDIT)]
                return opened + self._pump(CREDIT)
            return []
        if isinstance(event, PeerLost):
            self.open = False
            return []
        if isinstance(event, c.CreditChanged) and self.open:
            return self._pump(event.credit)
        if isinstance(event, c.BatchReceived):
            self.received[-1].append(event.ordinal)
            return [c.Consumed(peer=event.peer, stream=event.stream, size=event.size)]
        if isinstance(event, c.HandlerFailed):
            self.failures.append(event.error)
        return []

    def _pump(self, credit: int) -> list[c.Action]:
        out: list[c.Action] = []
        while credit >= BATCH:
            credit -= BATCH
            self.sent += 1
            out.append(c.SendBatch(peer=self.to, stream=STREAM, data=b"x" * BATCH, last=False))
        return out


def streaming_pair(seed: int) -> tuple[SimBus, Streamer, Streamer]:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t", initial_credit=CREDIT, batch_size=BATCH))
    sender, receiver = Streamer(to="b"), Streamer()
    sim.add_node("a", [sender])
    sim.add_node("b", [receiver])
    sim.start()
    sim.run_until(lambda: sum(map(len, receiver.received)) >= 40, limit=10)
    return sim, sender, receiver


def check_clean_restart(sim: SimBus, sender: Streamer, receiver: Streamer) -> None:
    # Both came back, and the stream flows again from ordinal 0 in the new session.
    sim.run_until(lambda: receiver.ups >= 2 and len(receiver.received[-1]) >= 40, limit=20)
    for core in (sim.node("a").core, sim.node("b").core):
        # A cut loses messages, which may show as a sequence gap and a further restart: loud, and allowed.
        assert core.refusals.get("STREAM_VIOLATION", 0) == 0, core.status()
    for ordinals in receiver.received:
        assert ordinals == list(range(len(ordinals))), "each session's stream starts at 0, without gaps"
    assert not sender.failures and not receiver.failures


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stall", [2.0, 5.0])
def test_receiver_loses_a_sender_that_keeps_streaming(seed: int, stall: float) -> None:
    """The sender's frames reach the receiver late (stalled pipe): the receiver declares it lost by
    silence and handshakes again while the sender's old-session batches are still arriving."""
    sim, sender, receiver = streaming_pair(seed)
    sim.stall("a", "b", stall)
    sim.run_until(lambda: bool(receiver.received) and receiver.ups >= 2, limit=20)
    check_clean_restart(sim, sender, receiver)
    assert sim.node("b").core.refusals["STALE_SESSION"] >= 1, "late batches of the old session are refused"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stall", [2.0, 5.0])
def test_sender_loses_a_receiver_whose_grants_are_late(seed: int, stall: float) -> None:
    """The receiver's flow control and heartbeats reach the sender late: the sender declares it lost and
    handshakes again; its grants of the old session arrive afterwards and must not feed the new stream."""
    sim, sender, receiver = streaming_pair(seed)
    sim.stall("b", "a", stall)
    check_clean_restart(sim, sender, receiver)


@pytest.mark.parametrize("seed", SEEDS)
def test_both_directions_stall_and_the_hellos_cross(seed: int) -> None:
    sim, sender, receiver = streaming_pair(seed)
    sim.stall("a", "b", 2.0)
    sim.stall("b", "a", 2.0)
    check_clean_restart(sim, sender, receiver)


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_cut_mid_stream_then_heal(seed: int) -> None:
    """No disconnect notice: each side finds out by silence on its own clock, then they meet again."""
    sim, sender, receiver = streaming_pair(seed)
    sim.cut("a", "b", notify=False)
    sim.run_for(1.0)
    sim.heal("a", "b")
    check_clean_restart(sim, sender, receiver)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stall", [0.2, 0.5, 1.2])
def test_batches_held_before_the_receiver_is_up_are_never_dropped_from_a_live_stream(
    seed: int, stall: float
) -> None:
    """After a restart the receiver's WELCOME can come late. The sender used to be up already and stream a
    whole credit's worth, which the receiver held, bounded: past the bound it dropped a batch whose sequence
    number was taken ("ordinal 16, expected 4"), and the sender waited for credit for ever. Now a peer is up
    only once the other side has heard its WELCOME (it confirms its session with a first message), so
    nothing reaches the receiver before it is up: nothing is held, nothing dropped, the stream flows on."""
    sim = SimBus(
        seed=seed, config=BusConfig(cluster_tag="t", initial_credit=CREDIT, batch_size=BATCH, max_streams=4)
    )
    sender, receiver = Streamer(to="b"), Streamer()
    sim.add_node("a", [sender])
    sim.add_node("b", [receiver])
    sim.start()
    sim.run_until(lambda: sum(map(len, receiver.received)) >= 40, limit=10)
    # b drops its session with a; a's answer to b's new HELLO (its WELCOME) comes late, so a is up and
    # streaming a whole credit's worth while b is not up yet.
    sim.stall("a", "b", stall, channels=("reply",))
    sim.node("b").core._link_lost("a", "test: forgot the session", sim.now)
    sim.run_until(lambda: receiver.ups >= 2 and len(receiver.received[-1]) >= 40, limit=20)
    for core in (sim.node("a").core, sim.node("b").core):
        for refusal in ("STREAM_VIOLATION", "LIMIT_EXCEEDED", "OUT_OF_STATE"):
            assert core.refusals.get(refusal, 0) == 0, core.status()
    assert sender.ups == receiver.ups == 2, "one restart, and no more"
    assert not sender.failures and not receiver.failures
    for ordinals in receiver.received:
        assert ordinals == list(range(len(ordinals))), "each session's stream starts at 0, without gaps"
