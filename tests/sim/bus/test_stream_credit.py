"""Credit grants of a long stream between real NodeCores driven by SimBus.

The receiver reckons the sender's credit as its latest grant less the bytes received since (bus/credit.py):
batches sent before the sender applied a grant carry the older, lower credit, and taken at their word each
of them called for another FLOW_CONTROL, one per batch from the first grant on. With a receiver that
consumes on arrival a grant now comes once per (1 - low_watermark) of the window received.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c

from .roles import Recorder

SEEDS = [1, 2, 3, 7, 42]
BATCH = 1024


@dataclass
class Pump:
    """Streams ``total`` bytes to ``b`` in batches of ``BATCH``, as much as each credit allows."""

    name: str = "pump"
    messages: ClassVar[tuple[type, ...]] = ()
    total: int = 0
    credit: int = 0
    sent: int = 0
    batches: int = 0
    in_flight_max: int = 0
    log: list[int] = field(default_factory=list)  # the credit after every CreditChanged

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.total = event.args["total"]
            out: list[c.Action] = [c.OpenStream(peer="b", stream="rec/s", credit=event.args["credit"])]
            return [*out, *self._pump(event.args["credit"]), c.Reply(call_id=event.call_id)]
        if isinstance(event, c.CreditChanged):
            self.log.append(event.credit)
            return self._pump(event.credit)
        return []

    def _pump(self, credit: int) -> list[c.Action]:
        out: list[c.Action] = []
        while self.sent < self.total and credit > 0:
            n = min(BATCH, credit, self.total - self.sent)
            credit -= n
            self.sent += n
            self.batches += 1
            out.append(c.SendBatch(peer="b", stream="rec/s", data=b"x" * n, last=self.sent == self.total))
        return out


def stream(seed: int, window_batches: int, batches: int) -> tuple[SimBus, Pump, Recorder]:
    # The receiver accepts the stream on its first batch with the bus's initial credit: the same window.
    sim = SimBus(
        seed=seed, config=BusConfig(cluster_tag="t", batch_size=BATCH, initial_credit=window_batches * BATCH)
    )
    pump, rec = Pump(), Recorder()
    sim.add_node("a", [pump])
    sim.add_node("b", [rec])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    sim.result(sim.call("a", "pump", "go", {"total": batches * BATCH, "credit": window_batches * BATCH}))
    sim.run_until(lambda: any(isinstance(e, c.BatchReceived) and e.last for e in rec.events), limit=120)
    sim.run_until_idle()  # the grants still in flight
    return sim, pump, rec


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("window_batches", [4, 8])
def test_a_long_stream_is_granted_once_per_window_not_once_per_batch(seed: int, window_batches: int) -> None:
    sim, pump, rec = stream(seed, window_batches, 1000)
    got = rec.of(c.BatchReceived)
    assert [e.ordinal for e in got] == list(range(len(got)))  # type: ignore[attr-defined]
    assert sum(e.size for e in got) == 1000 * BATCH  # type: ignore[attr-defined]
    grants = sim.node("b").core._n_flow_control_out
    # (A grant that arrives after the sender's last batch finds its stream gone: counted, not applied.)
    core_a = sim.node("a").core
    assert core_a._n_flow_control_in + core_a._counts["dropped_flow_control_unknown_stream"] == grants
    # From one grant to the next at least 60 % of the window arrives (the receiver consumes at once, so
    # every grant is the whole window): 4 batches of 8, 3 of 4 (their 2.4 rounds up to whole batches).
    per_grant = -(-window_batches * 6 // 10)
    assert grants <= 1000 // per_grant + 1
    assert grants >= 1000 // window_batches - 1  # and it is granted: the stream needs a grant per window
    assert all(0 < credit <= window_batches * BATCH for credit in pump.log)
