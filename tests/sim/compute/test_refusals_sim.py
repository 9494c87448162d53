"""Replicas that refuse some of their controller's appends, on the real node core with fixed seeds.

The controller checks what it sends, so these tests spoil its appends on the way out (``Spoiling``): a
replica refuses an append whose ``__diff`` has nulls, raising ``RemoteProtocolError``, which the node counts
and logs before telling the role (``HandlerFailed``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import Action, Event, Send
from sparkbus.roles.compute import DIFF, TIME, AppendUpdates, ComputeController, encode_table

from .test_compute_sim import SEEDS, boot, call, controller, replica

PEEK_ALL = ("r1", "r2")


class Spoiling(ComputeController):
    """A controller whose appends that ``spoil`` picks reach their replica with a null ``__diff``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.spoil: Callable[[str, AppendUpdates], bool] = lambda peer, msg: False

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        return [self._spoiled(a) for a in super().handle(event, now)]

    def _spoiled(self, action: Action) -> Action:
        if not isinstance(action, Send) or not isinstance(action.message, AppendUpdates):
            return action
        msg = action.message
        if not self.spoil(action.peer, msg):
            return action
        row = pa.table(
            {
                "k": pa.array(["x"], pa.string()),
                "v": pa.array([1], pa.int64()),
                TIME: pa.array([max(msg.lower, msg.since)], pa.int64()),
                DIFF: pa.array([None], pa.int64()),
            }
        )
        return Send(peer=action.peer, message=dataclasses.replace(msg, updates=encode_table(row)))


def spoiling(sim: Any) -> Spoiling:
    ctl = controller(sim)
    assert isinstance(ctl, Spoiling)
    return ctl


@pytest.mark.parametrize("seed", SEEDS)
def test_a_subscriber_is_told_when_the_replicas_refuse_its_table(seed: int) -> None:
    """The subscriber used to get nothing more and no error: the table stopped at its upper on every replica,
    and so did the subscribe. Now it gets the replica's error, naming the table and the reason, and ends."""
    sim = boot(seed, kind=Spoiling)
    sub = call(sim, "subscribe", view="v")
    sim.run_until_idle()
    spoiling(sim).spoil = lambda peer, msg: msg.id == "t" and msg.lower > 0
    call(sim, "write", table="t", batch=encode_table(pa.table({"k": ["d"], "v": [7]})))
    sim.run_until_idle()
    got = call(sim, "fetch", id=sub["id"])
    error = got["batches"][-1][3]
    assert error is not None and "table 't' stays at its upper" in error and "nulls" in error
    assert got["dropped_at"] is not None and sub["id"] not in controller(sim).collections
    for r in PEEK_ALL:
        assert replica(sim, r).dataflow(sub["id"]) is None  # the controller dropped it everywhere
        with pytest.raises(RuntimeError, match="table 't' stays at its upper"):
            call(sim, "peek", view="v", target_replica=r)
    # A subscribe made now is told at once.
    again = call(sim, "subscribe", view="v")
    sim.run_until_idle()
    got = call(sim, "fetch", id=again["id"])
    assert "table 't' stays at its upper" in got["batches"][-1][3] and got["dropped_at"] is not None
