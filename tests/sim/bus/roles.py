"""Small roles used to drive the bus in tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c
from sparkbus.codecs import message


@message(0x7101)
@dataclass(frozen=True, kw_only=True)
class Note:
    text: str


@dataclass
class Recorder:
    """Records every event; sends what it is told to; consumes batches as they arrive (if ``consume``)."""

    name: str = "rec"
    messages: ClassVar[tuple[type, ...]] = (Note,)
    consume: bool = True
    events: list[c.Event] = field(default_factory=list)
    pending: list[c.Action] = field(default_factory=list)
    fail_on: str | None = None

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        self.events.append(event)
        if (
            self.fail_on is not None
            and isinstance(event, c.MessageReceived)
            and event.message.text == self.fail_on
        ):
            raise ValueError(f"told to fail on {self.fail_on}")
        out, self.pending = self.pending, []
        if isinstance(event, c.BatchReceived) and self.consume:
            out.append(c.Consumed(peer=event.peer, stream=event.stream, size=event.size))
        if isinstance(event, c.LocalCall):
            out.extend(event.args["actions"])
            out.append(c.Reply(call_id=event.call_id, result="ok"))
        return out

    def of(self, kind: type) -> list[c.Event]:
        return [e for e in self.events if isinstance(e, kind)]


def pair(seed: int, **cfg: object) -> tuple[SimBus, Recorder, Recorder]:
    """Two nodes ``a`` and ``b``, one Recorder each, run until both are up."""
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t", **cfg))  # type: ignore[arg-type]
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a])
    sim.add_node("b", [b])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    return sim, a, b
