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
    Finishing,
    Frontiers,
    MapExpr,
    PeekResponse,
    Predicate,
    Schedule,
    SortKey,
    SubscribeBatch,
    SubscribeDropped,
    UpdateConfiguration,
    ViewDef,
)

from .harness import CTL, Cluster
from .test_controller import SCHEMA, batch, cluster
from .test_replica import Driver, columns, dataflow, peek, peek_rows, rows, started, table

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


# ---------------------------------------------------------------- reconciliation


def reconnect(d: Driver, *commands: Any) -> list[Any]:
    """Lose the link and connect again (epoch 2) with ``commands``: none may raise."""
    d.lose()
    return d.connect(2, None, *commands)


def test_a_bad_snapshot_at_reconciliation_is_refused_alone_and_the_rest_is_built() -> None:
    """The snapshot of a table new to the replica is malformed: reconciliation used to stop there, so the
    commands after it (the views, the parameters, the peeks) were never applied, while the dataflows it
    did not reuse were already dropped."""
    d = started(dataflow(), Schedule(id="v"), table(1, 2, [("a", 1)]))
    over_u = ViewDef(source="u")
    out = reconnect(
        d,
        table(0, 2, [("a", 1)], t=1),
        AppendUpdates(id="u", lower=0, upper=2, updates=BAD),
        UpdateConfiguration(max_result_size=10_000),
        dataflow(),
        dataflow("w", 1, view=ViewDef(source="t")),
        dataflow("x", 1, view=over_u),
        *subscribe("s", "x", 1),
        Schedule(id="v"),
        Schedule(id="w"),
        Schedule(id="x"),
        peek("pw", 1, "w"),
        peek("px", 1, "x"),
    )
    r = d.replica
    assert r.reconciliation_refusals == 1 and "nulls" in r.refused["u"] and "u" not in r.tables
    assert r.config.max_result_size == 10_000
    assert r.dataflow("v") is not None and r.reconciliation_failures == 0  # reused
    assert peek_rows(out, "pw") == [{"k": "a", "v": 1}]
    errors = {m.uuid: m.error for m in out if isinstance(m, PeekResponse) and m.error}
    assert errors.keys() == {"px"} and "table 'u' stays at its upper" in errors["px"]
    (closed,) = subscribe_batches(out)
    assert closed.id == "s" and closed.upper == () and closed.error == errors["px"]
    assert Frontiers(id="w", write=(2,), input=(2,), output=(2,)) in out


@pytest.mark.parametrize(
    "updates",
    [b"junk", BAD],
    ids=["not-ipc", "null-diff"],
)
def test_a_bad_snapshot_of_a_table_the_replica_holds_refuses_that_table_alone(updates: bytes) -> None:
    """Reconciliation used to raise while it compared the snapshot with the table it held, before it had
    applied anything: the connection went on in the computation stage with the previous one's state. What
    the replica holds cannot be told to be the snapshot's history, so it is dropped with the views over it."""
    other = ViewDef(source="o")
    d = started(
        AppendUpdates(id="o", lower=0, upper=1, advanced=("t",), updates=rows([("b", 2)], 0)),
        dataflow(),
        Schedule(id="v"),
        dataflow("w", view=other),
        Schedule(id="w"),
    )
    out = reconnect(
        d,
        AppendUpdates(id="t", lower=0, upper=1, updates=updates),
        AppendUpdates(id="o", lower=0, upper=1, updates=rows([("b", 2)], 0)),
        dataflow(),
        dataflow("w", view=other),
        Schedule(id="v"),
        Schedule(id="w"),
        peek("pv", 0),
        peek("pw", 0, "w"),
    )
    r = d.replica
    assert r.reconciliation_refusals == 1 and "t" in r.refused and sorted(r.tables) == ["o"]
    assert r.unbuilt.keys() == {"v"} and r.dataflow("w") is not None
    errors = {m.uuid: m.error for m in out if isinstance(m, PeekResponse) and m.error}
    assert errors.keys() == {"pv"} and "table 't' stays at its upper" in errors["pv"]
    assert peek_rows(out, "pw") == [{"k": "b", "v": 2}]


def test_a_bad_dataflow_at_reconciliation_is_refused_alone() -> None:
    """A CreateDataflow the replica cannot build (a column its source lacks) used to stop reconciliation."""
    d = started()
    missing = ViewDef(source="t", group_by=("nope",))
    out = reconnect(
        d,
        table(0, 1),
        dataflow("bad", view=missing),
        dataflow(),
        Schedule(id="bad"),
        Schedule(id="v"),
        peek("p", 0),
    )
    assert d.replica.reconciliation_refusals == 1 and d.replica.dataflow("bad") is None
    assert peek_rows(out, "p") == []


@pytest.mark.parametrize(
    "view",
    [
        ViewDef(source="t", filters=(Predicate(column="v", op="lt", value=2**63),)),
        ViewDef(source="t", maps=(MapExpr(name="v", op="add", left="v", literal=1),)),
    ],
    ids=["literal-beyond-int64", "map-named-like-a-column"],
)
def test_a_view_that_cannot_be_built_is_refused_alone_at_reconciliation(view: ViewDef) -> None:
    """A literal beyond its column's type raised OverflowError, which stopped reconciliation half-way; a map
    repeating a column's name was built and failed on its first data."""
    d = started()
    out = reconnect(d, table(0, 1), dataflow("bad", view=view), dataflow(), Schedule(id="v"), peek("p", 0))
    assert d.replica.reconciliation_refusals == 1 and d.replica.dataflow("bad") is None
    assert peek_rows(out, "p") == []


def test_a_view_not_built_here_is_built_on_the_next_connection_if_its_table_comes() -> None:
    """An export the replica left unbuilt belongs to its connection: the next one may build it."""
    d = started()
    with pytest.raises(RemoteProtocolError):
        d.send(AppendUpdates(id="u", lower=0, upper=1, updates=BAD))
    d.send(dataflow("x", view=ViewDef(source="u")), Schedule(id="x"))
    assert d.replica.unbuilt.keys() == {"x"}
    out = reconnect(
        d,
        table(0, 1),
        AppendUpdates(id="u", lower=0, upper=1, updates=rows([("c", 3)], 0)),
        dataflow("x", view=ViewDef(source="u")),
        Schedule(id="x"),
        peek("p", 0, "x"),
    )
    assert d.replica.unbuilt == {} and not d.replica.refused and d.replica.reconciliation_refusals == 0
    assert peek_rows(out, "p") == [{"k": "c", "v": 3}]


# ---------------------------------------------------------------- a view that failed on its data


def test_a_failed_view_stays_failed_until_it_is_dropped_and_its_error_says_so() -> None:
    """Its state is not exact once a step failed (that step's output never reached its index), and a
    subscriber cannot be told an error is taken back: it stays failed, even once the offending rows are
    retracted, and its error says how to get it back. Created again, it is computed from the data as it is
    then, on every replica alike."""
    c = cluster()
    shifted = ViewDef(
        source="t", maps=(MapExpr(name="w", op="add", left="v", literal=0.5),), project=("k", "w")
    )
    c.do("create_view", name="f", view=shifted)
    c.do("create_view", name="g", view=ViewDef(source="f"))
    sub = c.do("subscribe", view="f")
    c.do("write", table="t", batch=batch(("big", 2**60)))
    c.do("write", table="t", batch=batch(("big", 2**60), diff=-1))  # the cause is gone
    for view in ("f", "g"):
        for r in ("r1", "r2"):
            cid = c.call("peek", view=view, target_replica=r)
            c.run()
            error = str(c.replies[cid].error)
            assert "view 'f' failed on its data" in error
            assert "stays failed until it is dropped: drop and create it again" in error
    assert c.do("fetch", id=sub["id"])["batches"][-1][3] == error
    c.do("unsubscribe", id=sub["id"])
    c.do("drop_view", name="g")
    c.do("drop_view", name="f")
    c.do("create_view", name="f", view=shifted)
    for r in ("r1", "r2"):
        cid = c.call("peek", view="f", target_replica=r, finishing=Finishing(order_by=(SortKey(column="w"),)))
        c.run()
        assert c.rows(cid) == [{"k": "a", "w": 1.5}, {"k": "b", "w": 2.5}, {"k": "a", "w": 3.5}]
