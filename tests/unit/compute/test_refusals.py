"""What a replica that refuses its controller's commands still tells it, and what the controller's clients see.

A subscribe over a table the replica stopped is told so and ends; reconciliation refuses a bad command alone
and completes; a view that failed on its data says how to get it back.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkbus.bus.contract import HandlerFailed, MessageReceived, RemoteProtocolError
from sparkbus.roles.compute import (
    DIFF,
    TIME,
    AllowCompaction,
    AppendUpdates,
    PeekResponse,
    Schedule,
    SubscribeBatch,
    SubscribeDropped,
    ViewDef,
)

from .harness import CTL, Cluster
from .test_controller import SCHEMA, batch, cluster
from .test_replica import Driver, columns, dataflow, peek, started

#: An append whose __diff has nulls: the replica refuses it, and its table stays at its upper.
BAD = columns("k", "v", TIME, DIFF, null=DIFF)


def subscribe(name: str = "s", source: str = "v", as_of: int = 0) -> list[Any]:
    return [dataflow(name, as_of, view=ViewDef(source=source), sinks=(name,)), Schedule(id=name)]


def failed(d: Driver, error: Exception) -> list[Any]:
    """What the replica sends when the node tells it that handling a message raised (``HandlerFailed``)."""
    actions = d.replica.handle(HandlerFailed(event=None, error=str(error)), 0.0)
    return [a.message for a in actions]


def subscribe_batches(out: list[Any]) -> list[SubscribeBatch]:
    return [m for m in out if isinstance(m, SubscribeBatch)]


# ---------------------------------------------------------------- a subscribe over a refused table


def test_a_subscribe_over_a_table_the_replica_refused_ends_with_an_error_naming_the_table() -> None:
    """It used to get nothing more: the table stayed at its upper, so the subscribe's frontier did, and no
    batch ever said why."""
    d = started(dataflow(), Schedule(id="v"), *subscribe())
    assert [b.upper for b in subscribe_batches(d.out)] == [(1,)]
    with pytest.raises(RemoteProtocolError, match="nulls") as info:
        d.send(AppendUpdates(id="t", lower=1, upper=2, updates=BAD))
    (last,) = subscribe_batches(failed(d, info.value))
    # Closed: nothing more will come for it here, and it says why.
    assert last.id == "s" and last.lower == (1,) and last.upper == () and not last.updates
    assert "table 't' stays at its upper: this replica refused its updates" in last.error
    assert "nulls" in last.error
    # Said once; a drop sends no SubscribeDropped after a closed upper (the last batch's upper is closed).
    assert subscribe_batches(failed(d, info.value)) == []
    out = d.send(AllowCompaction(id="s", frontier=()))
    assert not [m for m in out if isinstance(m, SubscribeBatch | SubscribeDropped)]
    assert d.replica.dataflow("s") is None


@pytest.mark.parametrize("first", [False, True], ids=["stopped-table", "table-never-created"])
def test_a_subscribe_created_over_a_refused_table_is_told_at_once(first: bool) -> None:
    """A subscribe made after the refusal: over a table stopped at its upper, or over one whose first
    append was refused, so that neither it nor the view under it can be built here."""
    d = started()
    with pytest.raises(RemoteProtocolError) as info:
        if first:
            d.send(AppendUpdates(id="u", lower=0, upper=2, advanced=("t",), updates=BAD))
        else:
            d.send(AppendUpdates(id="t", lower=1, upper=2, updates=BAD))
    failed(d, info.value)
    source = "u" if first else "t"
    out = d.send(dataflow(view=ViewDef(source=source)), Schedule(id="v"), *subscribe(as_of=1), peek("p", 1))
    (last,) = subscribe_batches(out)
    assert last.upper == () and f"table {source!r} stays at its upper" in last.error
    (answer,) = [m for m in out if isinstance(m, PeekResponse)]
    assert answer.error == last.error  # not "collection 'v' does not exist"
    if first:
        assert d.replica.dataflow("v") is None and d.replica.unbuilt.keys() == {"v", "s"}
        d.send(AllowCompaction(id="s", frontier=()), AllowCompaction(id="v", frontier=()))
        assert d.replica.unbuilt == {}


def test_a_subscriber_gets_the_error_and_the_subscribe_ends() -> None:
    """The controller ends a subscribe whose batch closes its upper, as Materialize's stops tracking one
    whose upper is empty: the error is the last batch, the subscribe is dropped, and the other replica's
    later batches are not delivered after it."""
    c = cluster()
    sub = c.do("subscribe", view="v")
    c.do("fetch", id=sub["id"])
    upper = c.controller.subscribes[sub["id"]].upper
    why = "table 't' stays at its upper: this replica refused its updates (nulls)"
    closed = SubscribeBatch(id=sub["id"], lower=(upper,), upper=(), error=why)
    c.deliver(CTL, MessageReceived(peer="r1", message=closed))
    c.run()
    c.do("write", table="t", batch=batch(("z", 1)))
    got = c.do("fetch", id=sub["id"])
    assert got["batches"] == [(upper, upper, None, why)] and got["dropped_at"] == (upper,)
    assert sub["id"] not in c.controller.collections
    assert all(r.dataflow(sub["id"]) is None for r in c.replicas.values())


def test_a_subscriber_over_a_table_its_replica_refused_is_told_end_to_end() -> None:
    c = Cluster(("r1",))
    c.up("r1")
    c.run()
    c.do("create_table", name="t", schema=SCHEMA)
    c.do("create_view", name="v", view=ViewDef(source="t"))
    sub = c.do("subscribe", view="v")
    c.call("write", table="t", batch=batch(("a", 1)))
    (append,) = c.queues[(CTL, "r1")]
    c.queues[(CTL, "r1")][0] = AppendUpdates(id="t", lower=append.lower, upper=append.upper, updates=BAD)
    with pytest.raises(RemoteProtocolError, match="nulls") as info:
        c.step(CTL, "r1")
    c.deliver("r1", HandlerFailed(event=None, error=str(info.value)))
    c.run()
    got = c.do("fetch", id=sub["id"])
    error = got["batches"][-1][3]
    assert "table 't' stays at its upper" in error and "nulls" in error
    assert got["dropped_at"] is not None
