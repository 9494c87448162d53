"""Materialize controller (protocol-facts 5.5): a command with a ``target_replica`` takes responses from
that replica only. A targeted subscribe must ignore another replica's batches: here r1 reports an error
for the span (say it refused the table) while the target r2 is fine; the subscribe must not end."""

from __future__ import annotations

from sparkbus.bus.contract import MessageReceived
from sparkbus.roles.compute import SubscribeBatch
from tests.unit.compute.harness import CTL
from tests.unit.compute.test_controller import batch, cluster


def test_a_targeted_subscribe_ignores_batches_of_other_replicas() -> None:
    c = cluster()
    sub = c.do("subscribe", view="v", target_replica="r2")
    c.do("fetch", id=sub["id"])
    upper = c.controller.subscribes[sub["id"]].upper
    other = SubscribeBatch(id=sub["id"], lower=(upper,), upper=(upper + 1,), error="r1 refused table t")
    c.deliver(CTL, MessageReceived(peer="r1", message=other))
    state = c.controller.subscribes[sub["id"]]
    assert state.dropped_at is None and state.upper == upper
    c.do("write", table="t", batch=batch(("z", 1)))
    got = c.do("fetch", id=sub["id"])
    assert got["dropped_at"] is None
    assert all(err is None for _, _, _, err in got["batches"]), got["batches"]
