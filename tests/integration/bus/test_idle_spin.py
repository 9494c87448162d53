"""The loop polls before sleeping after it served input, only while that pays (``BusConfig.idle_spin``)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from sparkbus.bus import BusConfig, MessageReceived, Reply, Send
from sparkbus.bus import contract as c
from sparkbus.bus import node as node_module
from sparkbus.bus.node import Node

from .peer_proc import Note
from .test_node import Peer

pytestmark = pytest.mark.integration


@dataclass
class PingPong:
    """Sends Note "n", and on each echo of it the next, down to 0; the "start" call's answer is the
    texts of the echoes. The peer (``peer_proc.py``) answers every Note with "echo:<text>"."""

    name: str = "echo"
    messages: ClassVar[tuple[type, ...]] = (Note,)
    seen: list[str] | None = None
    waiting: int | None = None

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.seen, self.waiting = [], event.call_id
            return [Send(peer=event.args["peer"], message=Note(text=str(event.args["count"])))]
        if isinstance(event, MessageReceived) and self.seen is not None:
            text = event.message.text
            self.seen.append(text)
            n = int(text.removeprefix("echo:"))
            if n > 0:
                return [Send(peer=event.peer, message=Note(text=str(n - 1)))]
            if self.waiting is not None:
                call_id, self.waiting = self.waiting, None
                return [Reply(call_id=call_id, result=self.seen)]
        return []


def echoes(count: int) -> list[str]:
    return [f"echo:{n}" for n in range(count, -1, -1)]


class Spins:
    """Counts the loop's spins (``node._spin``, wrapped), and how many found input."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = self.found = 0
        self.lock = threading.Lock()
        real = node_module._spin

        def counted(*args: Any) -> list[tuple[int, int]]:
            events = real(*args)
            with self.lock:
                self.calls += 1
                self.found += bool(events)
            return events

        monkeypatch.setattr(node_module, "_spin", counted)

    def now(self) -> tuple[int, int]:
        with self.lock:
            return self.calls, self.found


def _config(idle_spin: float) -> BusConfig:
    return BusConfig(cluster_tag="spin", heartbeat_interval=0.1, peer_timeout=2.0, idle_spin=idle_spin)


@contextlib.contextmanager
def _node(idle_spin: float, role: c.Role | None = None, config: BusConfig | None = None) -> Iterator[Node]:
    """Node "t" here (running ``role``, a PingPong by default), its peer "p" in a process of its own."""
    node = Node("t", config or _config(idle_spin), [role or PingPong()])
    node.bind()
    peer = Peer("p", "spin", 0.1, 2.0)
    try:
        peer.give_peers({"t": node.endpoints, "p": peer.endpoints})  # type: ignore[dict-item]
        node.start({"p": peer.endpoints})
        node.wait_ready(timeout=10)
        yield node
    finally:
        peer.reap()
        node.stop()


def test_a_ping_pong_spins_and_finds_its_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    spins = Spins(monkeypatch)
    # A spin far longer than a loopback round trip, so that every answer comes within it.
    with _node(idle_spin=0.05) as node:
        assert node.call("echo", "start", {"peer": "p", "count": 200}, timeout=30) == echoes(200)
    calls, found = spins.now()
    assert found >= 150  # the answers were read by spinning, not after a sleep
    assert calls - found <= 4  # the spins that found nothing: the last ones, before the link went idle


def test_an_idle_node_stops_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    spins = Spins(monkeypatch)
    with _node(idle_spin=0.05) as node:
        node.call("echo", "start", {"peer": "p", "count": 20}, timeout=30)
        heartbeats = node.status()["counters"]["heartbeats_in"]  # a call wakes the loop: before the window
        time.sleep(0.3)  # the last spins after the exchange and the call (each finds nothing) are over
        before = spins.now()
        time.sleep(1.0)  # ten heartbeats: served turns whose next input is 0.1 s away
        assert spins.now() == before
        assert node.status()["counters"]["heartbeats_in"] >= heartbeats + 5  # it did serve input meanwhile


@dataclass
class Pairs:
    """Every ``gap`` seconds (a timer), sends two Notes to "p" at once, ``bursts`` times; counts echoes."""

    gap: float
    bursts: int
    name: str = "echo"
    messages: ClassVar[tuple[type, ...]] = (Note,)
    echoes: int = 0

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            return [c.SetTimer(key="burst", at=now + self.gap), Reply(call_id=event.call_id)]
        if isinstance(event, c.TimerFired) and self.bursts:
            self.bursts -= 1
            notes = [Send(peer="p", message=Note(text=str(i))) for i in (1, 2)]
            return [*notes, c.SetTimer(key="burst", at=now + self.gap)]
        if isinstance(event, MessageReceived):
            self.echoes += 1
        return []


def test_pairs_of_messages_with_gaps_between_them_do_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each burst's two echoes arrive close together, then nothing for 50 ms: one short wait, never two
    in a row, so no spin (which would find nothing once per burst)."""
    spins = Spins(monkeypatch)
    pairs = Pairs(gap=0.05, bursts=20)
    with _node(idle_spin=0.01, role=pairs) as node:
        node.call("echo", "go", {}, timeout=10)
        deadline = time.monotonic() + 20
        while pairs.echoes < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = spins.now()  # the handshake's and the call's turns are over: bursts only from here
        while pairs.echoes < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pairs.echoes == 40
        assert spins.now() == before


def test_a_spin_never_runs_past_the_next_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a spin far longer than the time to a role's timer, each spin ends at the timer's deadline."""
    budgets: list[float] = []
    real = node_module._spin

    def recorded(poll: Any, until: float, clock: Any) -> list[tuple[int, int]]:
        budgets.append(until - clock())
        return real(poll, until, clock)

    monkeypatch.setattr(node_module, "_spin", recorded)

    @dataclass
    class Ticker:
        """Pings "p" at once on each echo (so spins pay), and keeps a timer 20 ms ahead."""

        name: str = "echo"
        messages: ClassVar[tuple[type, ...]] = (Note,)
        left: int = 40

        def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
            if isinstance(event, c.LocalCall | MessageReceived) and self.left:
                self.left -= 1
                out: list[c.Action] = [c.SetTimer(key="tick", at=now + 0.02)]
                out.append(Send(peer="p", message=Note(text=str(self.left))))
                if isinstance(event, c.LocalCall):
                    out.append(Reply(call_id=event.call_id))
                return out
            return []

    ticker = Ticker()
    config = BusConfig(cluster_tag="spin", heartbeat_interval=0.5, peer_timeout=2.0, idle_spin=0.25)
    with _node(0.25, role=ticker, config=config) as node:
        budgets.clear()  # the handshake's spins, before any timer was set
        node.call("echo", "go", {}, timeout=10)
        deadline = time.monotonic() + 20
        while ticker.left and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ticker.left
        assert budgets, "it spun"
        assert max(budgets) <= 0.025  # the timer's 20 ms (and the loop's 1 ms rounding), not 250 ms


def test_a_forked_child_starts_with_no_loops() -> None:
    with _node(idle_spin=0.05):
        assert node_module._LOOPS[0] == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, touching nothing else
            os.write(write, str(node_module._LOOPS[0]).encode())
            os._exit(0)
        os.close(write)
        try:
            assert os.read(read, 16) == b"0"
        finally:
            os.close(read)
            os.waitpid(pid, 0)


def test_a_node_that_never_spins_exchanges_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    spins = Spins(monkeypatch)
    with _node(idle_spin=0.0) as node:
        assert node.call("echo", "start", {"peer": "p", "count": 50}, timeout=30) == echoes(50)
    assert spins.now() == (0, 0)


def test_two_nodes_that_may_spin_in_one_process_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    spins = Spins(monkeypatch)
    other = Node("o", _config(idle_spin=0.05), [])  # a second loop that may spin, in this process
    other.bind()
    other.start({})
    try:
        with _node(idle_spin=0.05) as node:
            before = spins.now()  # (each may have spun before the other's loop ran)
            assert node.call("echo", "start", {"peer": "p", "count": 50}, timeout=30) == echoes(50)
            assert spins.now() == before  # they would take the GIL from each other
    finally:
        other.stop()
    with _node(idle_spin=0.05) as node:  # alone again: it spins
        before = spins.now()
        node.call("echo", "start", {"peer": "p", "count": 50}, timeout=30)
        assert spins.now()[1] > before[1]


@pytest.mark.parametrize(
    ("spin", "heartbeat"), [(-0.001, 0.3), (0.3, 0.3), (0.5, 0.3)], ids=["negative", "equal", "longer"]
)
def test_a_spin_must_be_shorter_than_the_heartbeat(spin: float, heartbeat: float) -> None:
    with pytest.raises(ValueError, match="idle_spin"):
        BusConfig(idle_spin=spin, heartbeat_interval=heartbeat)


def test_spin_returns_the_first_input_or_nothing_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    yields: list[int] = []
    monkeypatch.setattr(node_module.os, "sched_yield", lambda: yields.append(1))
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    polls = iter([[], [], [(7, 1)]])
    assert node_module._spin(lambda ms: next(polls), 10.0, lambda: next(clock)) == [(7, 1)]
    assert len(yields) == 2  # the CPU was given away between the polls, not after the last one
    ticks = iter([0.0, 1.0, 2.0])
    assert node_module._spin(lambda ms: [], 1.5, lambda: next(ticks)) == []
    assert len(yields) == 4  # two more: the deadline passed at the third look at the clock
