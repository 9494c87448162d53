"""One stream key used both ways between two peers (as a query edge between two participants is).

Closing the finished incoming stream must leave the outgoing stream with the same key open: before, the
core forgot both, and the sender's next batch failed (or, after a restart, reached the peer as a batch of
an unknown stream, "ordinal N, expected 0").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c

KEY = "pair/edge-1"
BATCH = 1000


@dataclass
class Pair:
    """Sends ``count`` batches to ``peer`` on KEY under credit, receives the peer's on the same key, and
    closes the incoming stream after its last batch (as the query role does)."""

    peer: str
    count: int
    name: str = "pair"
    messages: ClassVar[tuple[type, ...]] = ()
    sent: int = 0
    credit: int = 0
    received: list[int] = field(default_factory=list)
    finished_in: bool = False
    failures: list[str] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.PeerUp) and event.peer == self.peer:
            self.credit = 2 * BATCH
            return [
                c.AcceptStream(peer=self.peer, stream=KEY, credit=2 * BATCH),
                c.OpenStream(peer=self.peer, stream=KEY, credit=2 * BATCH),
                *self._pump(),
            ]
        if isinstance(event, c.CreditChanged):
            self.credit = event.credit
            return self._pump()
        if isinstance(event, c.BatchReceived):
            self.received.append(event.ordinal)
            out: list[c.Action] = [c.Consumed(peer=event.peer, stream=event.stream, size=event.size)]
            if event.last:
                self.finished_in = True
                out.append(c.CloseStream(peer=event.peer, stream=event.stream))
            return out
        if isinstance(event, c.HandlerFailed):
            self.failures.append(event.error)
        return []

    def _pump(self) -> list[c.Action]:
        out: list[c.Action] = []
        while self.sent < self.count and self.credit >= BATCH:
            self.sent += 1
            self.credit -= BATCH
            out.append(
                c.SendBatch(peer=self.peer, stream=KEY, data=b"x" * BATCH, last=self.sent == self.count)
            )
        return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_closing_the_finished_direction_keeps_the_other_open(seed: int) -> None:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    short, long = Pair(peer="b", count=2), Pair(peer="a", count=40)
    sim.add_node("a", [short])
    sim.add_node("b", [long])
    sim.start()
    sim.run_until(lambda: short.finished_in and long.finished_in, limit=30)
    # b received a's 2 batches and closed its incoming stream long before its own 40 were all sent.
    assert long.received == [0, 1]
    assert short.received == list(range(40))
    assert short.failures == [] and long.failures == []
    for name in ("a", "b"):
        assert sim.node(name).core.counters["peers_lost"] == 0
