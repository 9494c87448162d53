"""Role-to-role calls on one node: ``Call`` in, ``LocalCall`` to the target, ``CallResult`` back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c


@dataclass
class Callee:
    """Answers ``double`` at once, ``later`` on its next timer, and raises on ``boom``."""

    name: str = "callee"
    messages: ClassVar[tuple[type, ...]] = ()
    held: list[int] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            if event.name == "boom":
                raise ValueError("told to fail")
            if event.name == "later":
                self.held.append(event.call_id)
                return [c.SetTimer(key="later", at=now + 1.0)]
            return [c.Reply(call_id=event.call_id, result=event.args["x"] * 2)]
        if isinstance(event, c.TimerFired):
            return [c.Reply(call_id=cid, result="late") for cid in self.held]
        return []


@dataclass
class Caller:
    """Turns its local call ``go(role, name, args)`` into a ``Call`` and records the ``CallResult``s."""

    name: str = "caller"
    messages: ClassVar[tuple[type, ...]] = ()
    results: list[c.CallResult] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            a = event.args
            return [
                c.Call(role=a["role"], name=a["name"], args=a.get("args", {}), tag=f"t{event.call_id}"),
                c.Reply(call_id=event.call_id, result="sent"),
            ]
        if isinstance(event, c.CallResult):
            self.results.append(event)
        return []


def one_node(seed: int) -> tuple[SimBus, Caller, Callee]:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    caller, callee = Caller(), Callee()
    sim.add_node("n", [caller, callee])
    sim.start()
    return sim, caller, callee


def go(sim: SimBus, role: str, name: str, **args: object) -> None:
    assert sim.result(sim.call("n", "caller", "go", {"role": role, "name": name, "args": args})) == "sent"


def test_a_call_is_answered_to_the_calling_role_not_the_driver() -> None:
    sim, caller, _ = one_node(1)
    go(sim, "callee", "double", x=21)
    assert [(r.result, r.error) for r in caller.results] == [(42, None)]
    assert caller.results[0].tag.startswith("t")
    assert not [o for o in sim.node("n").core.take()]  # nothing left for the driver


def test_a_late_reply_comes_back_as_a_call_result() -> None:
    sim, caller, _ = one_node(2)
    go(sim, "callee", "later")
    assert caller.results == []
    sim.run_until(lambda: bool(caller.results), limit=5)
    assert caller.results[0].result == "late" and caller.results[0].error is None


def test_an_unknown_role_gives_an_error_result() -> None:
    sim, caller, _ = one_node(3)
    go(sim, "nobody", "x")
    assert len(caller.results) == 1
    error = caller.results[0].error
    assert error is not None and "no role 'nobody'" in error and "callee" in error


def test_a_raising_role_gives_an_error_result_and_the_node_serves_on() -> None:
    sim, caller, _ = one_node(4)
    go(sim, "callee", "boom")
    error = caller.results[0].error
    assert error is not None and "ValueError: told to fail" in error
    go(sim, "callee", "double", x=1)
    assert caller.results[1].result == 2
    assert sim.node("n").core.counters["role_errors"] == 1
