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

from .test_compute_sim import EXPECTED, ORDERED, SCHEMA, SEEDS, SUM, boot, call, controller, replica, rows

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


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_sent_a_bad_snapshot_at_reconnect_refuses_that_table_and_builds_the_rest(seed: int) -> None:
    """r1 comes back to a table and a view created while it was away, and the table's snapshot is spoiled:
    reconciliation used to stop at it, so the view created after it was never built on r1."""
    sim = boot(seed, kind=Spoiling)
    sim.run_until_idle()
    sim.cut("ctl", "r1")
    call(sim, "create_table", name="u", schema=SCHEMA)
    call(sim, "write", table="u", batch=encode_table(pa.table({"k": ["e"], "v": [4]})))
    call(sim, "create_view", name="w", view=dataclasses.replace(SUM, group_by=()))
    call(sim, "create_view", name="x", view=dataclasses.replace(SUM, source="u"))
    spoiling(sim).spoil = lambda peer, msg: peer == "r1" and msg.id == "u" and msg.lower == 0
    sim.heal("ctl", "r1")
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    r1 = replica(sim, "r1")
    assert r1.epoch == 2 and r1.reconciliation_refusals == 1 and "nulls" in r1.refused["u"]
    assert rows(call(sim, "peek", view="v", target_replica="r1", finishing=ORDERED)) == EXPECTED
    assert rows(call(sim, "peek", view="w", target_replica="r1")) == [{"n": 5, "s": 12}]
    with pytest.raises(RuntimeError, match="table 'u' stays at its upper"):
        call(sim, "peek", view="x", target_replica="r1")
    assert rows(call(sim, "peek", view="x", target_replica="r2")) == [{"k": "e", "n": 1, "s": 4}]
