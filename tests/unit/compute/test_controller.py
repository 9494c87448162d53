"""The controller with replicas over in-memory links: peeks, targets, failures, rehydration, subscribes."""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import LocalProtocolError, MessageReceived, RemoteProtocolError
from sparkbus.codecs import DecodeError
from sparkbus.codecs.schema import to_plain
from sparkbus.roles.client.gateway import ARGS
from sparkbus.roles.client.messages import Op
from sparkbus.roles.compute import (
    TARGET_FAILED,
    Aggregate,
    AllowCompaction,
    CancelPeek,
    ComputeController,
    ComputeReplica,
    CreateDataflow,
    CreateTimely,
    Finishing,
    Frontiers,
    MapExpr,
    Peek,
    PeekResponse,
    PeekResult,
    SortKey,
    Stage,
    Status,
    SubscribeBatch,
    SubscribeDropped,
    ViewDef,
    decode_table,
)

from .harness import CTL, Cluster, ipc

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
VIEW = ViewDef(
    source="t",
    group_by=("k",),
    aggregates=(Aggregate(func="count", column=None, name="n"), Aggregate(func="sum", column="v", name="s")),
)
ORDERED = Finishing(order_by=(SortKey(column="k"),))


def batch(*values: tuple[str, int], diff: int | None = None) -> bytes:
    cols: dict[str, Any] = {
        "k": pa.array([k for k, _ in values], pa.string()),
        "v": pa.array([v for _, v in values], pa.int64()),
    }
    if diff is not None:
        cols["__diff"] = pa.array([diff] * len(values), pa.int64())
    return ipc(pa.table(cols))


def cluster(replicas: tuple[str, ...] = ("r1", "r2"), **kw: Any) -> Cluster:
    c = Cluster(replicas, **kw)
    for r in replicas:
        c.up(r)
    c.run()
    c.do("create_table", name="t", schema=SCHEMA)
    c.do("write", table="t", batch=batch(("a", 1), ("b", 2), ("a", 3)))
    c.do("create_view", name="v", view=VIEW)
    return c


def peek_rows(c: Cluster, cid: int) -> list[dict[str, Any]]:
    return c.rows(cid)


def test_write_view_peek_end_to_end() -> None:
    c = cluster(compaction_lag=1)  # time 1 stays readable after the second write
    cid = c.call("peek", view="v", finishing=ORDERED)
    c.run()
    assert peek_rows(c, cid) == [{"k": "a", "n": 2, "s": 4}, {"k": "b", "n": 1, "s": 2}]
    c.do("write", table="t", batch=batch(("a", 3), diff=-1))
    cid = c.call("peek", view="v", finishing=ORDERED)
    c.run()
    assert peek_rows(c, cid) == [{"k": "a", "n": 1, "s": 1}, {"k": "b", "n": 1, "s": 2}]
    cid = c.call("peek", view="t", timestamp=1, literal_constraints=[("b", 2)])
    c.run()
    assert peek_rows(c, cid) == [{"k": "b", "v": 2}]


@pytest.mark.parametrize("first", ["r1", "r2"])
def test_first_peek_response_wins_and_later_ones_are_ignored(first: str) -> None:
    c = cluster()
    cid = c.call("peek", view="v", finishing=ORDERED)
    second = "r2" if first == "r1" else "r1"
    c.step(CTL, first)
    answer = c.step(first, CTL)
    assert isinstance(answer, PeekResponse) and answer.result is PeekResult.ROWS
    assert cid in c.replies
    # The controller tells everyone to stop; the slower replica's answer (or Canceled) is dropped.
    assert isinstance(c.pending(CTL, second)[-1], CancelPeek)
    c.run()
    assert len([r for r in c.replies if r == cid]) == 1
    assert c.controller.peeks == {}


def test_both_answers_arrive_and_only_the_first_counts() -> None:
    c = cluster()
    cid = c.call("peek", view="v")
    c.step(CTL, "r1")
    c.step(CTL, "r2")
    c.step("r2", CTL)
    rows = c.replies[cid].result
    c.step("r1", CTL)  # a second ROWS answer for an already answered peek: ignored
    assert c.replies[cid].result == rows
    c.run()


def test_targeted_peek_only_accepts_its_replica() -> None:
    c = cluster()
    cid = c.call("peek", view="v", target_replica="r2")
    c.step(CTL, "r1")
    c.step("r1", CTL)
    assert cid not in c.replies
    c.run()
    assert c.replies[cid].error is None
    assert c.controller.peeks == {}


def test_targeted_peek_fails_when_its_replica_fails() -> None:
    c = cluster()
    cid = c.call("peek", view="v", target_replica="r1")
    c.cut("r1")
    assert c.replies[cid].error == TARGET_FAILED
    cid = c.call("peek", view="v", target_replica="r1")
    assert c.replies[cid].error is not None and TARGET_FAILED in c.replies[cid].error


def test_replica_failing_mid_peek_leaves_the_other_to_answer() -> None:
    c = cluster()
    cid = c.call("peek", view="v", finishing=ORDERED)
    c.step(CTL, "r1")
    c.cut("r1")  # r1 had the peek and its answer is lost
    c.run()
    assert peek_rows(c, cid)[0] == {"k": "a", "n": 2, "s": 4}


def test_peek_with_no_replica_waits_for_rehydration() -> None:
    c = cluster(("r1",))
    c.cut("r1")
    cid = c.call("peek", view="v", finishing=ORDERED)
    c.run()
    assert cid not in c.replies
    c.up("r1")
    c.run()
    assert peek_rows(c, cid)[1] == {"k": "b", "n": 1, "s": 2}


def test_rehydration_bumps_the_epoch_and_replays_the_reduced_history() -> None:
    c = cluster()
    c.cut("r1")
    c.do("write", table="t", batch=batch(("c", 9)))
    sent_before = len(c.sent)
    c.up("r1")
    replay = [m for src, dst, m in c.sent[sent_before:] if dst == "r1"]
    assert replay[0] == CreateTimely(epoch=2)
    assert [type(m).__name__ for m in replay[:3]] == ["CreateTimely", "CreateInstance", "AppendUpdates"]
    c.run()
    assert c.replicas["r1"].epoch == 2
    cid = c.call("peek", view="v", target_replica="r1", finishing=ORDERED)
    c.run()
    assert [r["k"] for r in peek_rows(c, cid)] == ["a", "b", "c"]


def test_replicas_that_refuse_the_epoch_are_not_driven_and_peeks_do_not_wait_for_them() -> None:
    c = Cluster(("r1", "r2"))
    for r in ("r1", "r2"):
        c.replicas[r].epoch = 5 << 32  # they served a controller of a later generation
    c.do("create_table", name="t", schema=SCHEMA)
    c.up("r1")
    c.run()
    link = c.controller.links["r1"]
    assert link.stage is Stage.DISCONNECTED
    assert link.refused == f"CreateTimely from ctl: epoch 1 <= seen {5 << 32}"
    cid = c.call("peek", view="t")
    c.run()
    assert cid not in c.replies  # r2 may still take it
    c.up("r2")
    c.run()
    refused = "every replica refused this controller's epoch: r1: CreateTimely from ctl: epoch 1"
    assert (c.replies[cid].error or "").startswith(refused)
    assert c.controller.peeks == {}
    cid = c.call("peek", view="t")
    assert (c.replies[cid].error or "").startswith(f"peek: {refused}")
    # A replica that starts afresh (a new process) takes the next connection.
    c.cut("r1")
    c.replicas["r1"] = ComputeReplica()
    c.up("r1")
    c.run()
    assert link.refused is None and link.stage is Stage.READ_WRITE
    c.deliver(CTL, MessageReceived(peer="r1", message=Status(detail="late", refused_epoch=1)))
    assert link.refused is None  # an earlier connection's refusal changes nothing
    cid = c.call("peek", view="t")
    c.run()
    assert c.rows(cid) == []


def test_a_generation_must_fit_the_epoch() -> None:
    with pytest.raises(LocalProtocolError, match="generation"):
        ComputeController(replicas=("r1",), generation=2**32)
    assert ComputeController(replicas=("r1",), generation=2**32 - 1).links["r1"].epoch == (2**32 - 1) << 32


def upsert_cluster(key: list[str] | None = None, **kw: Any) -> Cluster:
    """One replica, upsert table ``u`` keyed by ``key`` (default ``k``) and view ``uv`` counting and summing it."""
    c = Cluster(("r1",), **kw)
    c.up("r1")
    c.run()
    c.do("create_table", name="u", schema=SCHEMA, key=key or ["k"])
    c.do("create_view", name="uv", view=dataclasses.replace(VIEW, source="u"))
    return c


def peek(c: Cluster, view: str, **args: Any) -> list[dict[str, Any]]:
    cid = c.call("peek", view=view, finishing=ORDERED, **args)
    c.run()
    return peek_rows(c, cid)


def test_an_upsert_table_replaces_rows_by_key_and_views_count_each_key_once() -> None:
    c = upsert_cluster(compaction_lag=5)  # so that time 1 stays readable
    c.do("write", table="u", batch=batch(("a", 1), ("b", 2)))
    c.do("write", table="u", batch=batch(("a", 5), ("c", 3)))
    assert peek(c, "u") == [{"k": "a", "v": 5}, {"k": "b", "v": 2}, {"k": "c", "v": 3}]
    assert peek(c, "uv") == [
        {"k": "a", "n": 1, "s": 5},
        {"k": "b", "n": 1, "s": 2},
        {"k": "c", "n": 1, "s": 3},
    ]
    # The same rows again (a file loaded twice) change nothing.
    before = peek(c, "uv")
    c.do("write", table="u", batch=batch(("a", 5), ("c", 3)))
    assert peek(c, "uv") == before
    # Readers at an earlier time still see the value of then.
    assert peek(c, "u", timestamp=1) == [{"k": "a", "v": 1}, {"k": "b", "v": 2}]


def test_the_last_row_of_a_key_in_one_upsert_write_wins() -> None:
    c = upsert_cluster()
    c.do("write", table="u", batch=batch(("a", 1), ("b", 2), ("a", 3), ("b", 4), ("a", 7)))
    assert peek(c, "u") == [{"k": "a", "v": 7}, {"k": "b", "v": 4}]
    c.do("write", table="u", batch=batch(("b", 0), ("b", 9)))
    assert peek(c, "uv") == [{"k": "a", "n": 1, "s": 7}, {"k": "b", "n": 1, "s": 9}]


def test_an_upsert_table_keyed_by_every_column_keeps_distinct_rows() -> None:
    c = upsert_cluster(["k", "v"])
    c.do("write", table="u", batch=batch(("a", 1), ("a", 2), ("a", 1)))
    c.do("write", table="u", batch=batch(("a", 2), ("b", 2)))
    assert peek(c, "uv") == [{"k": "a", "n": 2, "s": 3}, {"k": "b", "n": 1, "s": 2}]


def test_a_rehydrated_replica_sees_the_upserted_rows() -> None:
    c = upsert_cluster()
    c.do("write", table="u", batch=batch(("a", 1), ("b", 2)))
    c.cut("r1")
    c.do("write", table="u", batch=batch(("a", 4)))
    c.up("r1")
    c.run()
    assert peek(c, "uv") == [{"k": "a", "n": 1, "s": 4}, {"k": "b", "n": 1, "s": 2}]


def test_a_table_is_compacted_so_rewriting_the_same_keys_does_not_grow_it() -> None:
    c = upsert_cluster()
    for i in range(300):
        c.do("write", table="u", batch=batch(("a", i), ("b", -i), ("c", 1)))
    # 300 writes of 3 keys made 1,798 updates (each a retraction and an insert, but for c's); compacted to
    # the last write, the table is its 3 rows on the controller and on the replica alike.
    ctl, replica = c.controller, c.replicas["r1"]
    assert ctl._table_data["u"].since == (ctl.upper - 1,)
    assert len(ctl._table_data["u"].updates) == 3
    assert len(replica.tables["u"].updates) == 3
    assert replica.tables["u"].since == (ctl.upper - 1,)
    assert peek(c, "u") == [{"k": "a", "v": 299}, {"k": "b", "v": -299}, {"k": "c", "v": 1}]
    # A replica that comes back gets the compacted table, with its since.
    snapshot = ctl._snapshot("u")
    assert (snapshot.lower, snapshot.upper, snapshot.since) == (0, ctl.upper, ctl.upper - 1)
    assert decode_table(snapshot.updates).num_rows == 3


def peek_at_1_while_r2_races_ahead(c: Cluster, view: str) -> int:
    """A peek of ``view`` at time 1 for r1, which does not hear of it yet, while three writes go by and r2
    takes them all in (advancing the view's frontier)."""
    cid = c.call("peek", view=view, timestamp=1, target_replica="r1")
    for _ in range(3):
        c.call("write", table="t", batch=batch(("q", 1)))
    while c.pending(CTL, "r2") or c.pending("r2", CTL):
        for key in ((CTL, "r2"), ("r2", CTL)):
            if c.pending(*key):
                c.step(*key)
    return cid


def test_a_table_is_not_compacted_past_a_pending_peek_or_a_reading_view() -> None:
    c = cluster(compaction_lag=0)
    cid = peek_at_1_while_r2_races_ahead(c, "t")
    # r1 has not answered: the table stays readable at 1 (and the view reading it holds it no higher).
    assert c.controller._table_data["t"].since == (1,)
    c.run()
    assert sorted(r["k"] for r in peek_rows(c, cid)) == ["a", "a", "b"]
    assert c.controller._table_data["t"].since == (c.controller.upper - 1,)
    # A view created later reads the table from its since, and time 1 is now refused.
    assert c.do("create_view", name="w", view=VIEW)["as_of"] == c.controller.upper - 1
    cid = c.call("peek", view="t", timestamp=1)
    assert f"below the since {c.controller.upper - 1} of 't'" in str(c.replies[cid].error)


def test_a_replica_back_after_the_table_was_compacted_past_its_upper_counts_nothing_twice() -> None:
    c = cluster()
    c.cut("r2")
    for i in range(5):
        c.do("write", table="t", batch=batch(("a", 1), ("z", i)))
    assert c.controller._table_data["t"].since[0] > c.replicas["r2"].tables["t"].upper[0]
    c.up("r2")
    c.run()
    answers = []
    for r in ("r1", "r2"):
        cid = c.call("peek", view="v", finishing=ORDERED, target_replica=r)
        c.run()
        answers.append(peek_rows(c, cid))
    assert answers[0] == answers[1]
    assert answers[1][0] == {"k": "a", "n": 7, "s": 9}


def test_a_replica_cut_between_create_dataflow_and_schedule_builds_the_view_again() -> None:
    # r1 gets v's CreateDataflow (as_of 1) but not its Schedule; the table is then compacted to 4 while r1
    # is away. The unscheduled dataflow computed nothing, so r1 builds v anew at the new as_of rather than
    # keep one that would read the table below its since.
    c = cluster()
    c.call("create_view", name="w", view=VIEW)
    while not isinstance(c.step(CTL, "r1"), CreateDataflow):
        pass
    assert not c.replicas["r1"].dataflow("w").scheduled  # type: ignore[union-attr]
    c.cut("r1")
    c.run()
    for i in range(3):
        c.do("write", table="t", batch=batch(("a", 10 + i)))
    c.up("r1")
    c.run()
    cid = c.call("peek", view="w", finishing=ORDERED, target_replica="r1")
    c.run()
    assert peek_rows(c, cid) == [{"k": "a", "n": 5, "s": 37}, {"k": "b", "n": 1, "s": 2}]
    assert c.replicas["r1"].reconciliation_failures == 0


def test_a_restarted_controller_that_holds_a_table_from_below_the_replicas_since_reloads_it() -> None:
    c = cluster(("r1",))
    for i in range(3):
        c.do("write", table="t", batch=batch(("a", i)))
    assert c.replicas["r1"].tables["t"].since[0] > 1
    # A new controller process rebuilds the table and the view before it replays the writes, so it holds
    # the table from since 0 and builds the view at as_of 0, below what r1 compacted its table to.
    c.cut("r1")
    c.controller = ComputeController(replicas=["r1"], generation=1)
    c.do("create_table", name="t", schema=SCHEMA)
    c.do("create_view", name="v", view=VIEW)
    c.up("r1")
    c.run()
    for data in (batch(("a", 1), ("b", 2), ("a", 3)), batch(("a", 0)), batch(("a", 1)), batch(("a", 2))):
        c.do("write", table="t", batch=data)
    assert peek(c, "v") == [{"k": "a", "n": 5, "s": 7}, {"k": "b", "n": 1, "s": 2}]
    assert sorted((r["k"], r["v"]) for r in peek(c, "t")) == [
        ("a", 0),
        ("a", 1),
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 2),
    ]


@pytest.mark.parametrize(("writes", "lag"), [(1, 0), (3, 5)], ids=["same-since-and-upper", "shorter"])
def test_a_restarted_controllers_table_replaces_the_rows_of_its_predecessor(writes: int, lag: int) -> None:
    c = cluster(("r1",), compaction_lag=lag)
    for _ in range(writes - 1):
        c.do("write", table="t", batch=batch(("a", 1)))
    # A new controller process builds the table anew with other rows: with one write and lag 0 its since
    # and upper are r1's; with three writes and lag 5 it ends below r1's upper.
    c.cut("r1")
    c.controller = ComputeController(replicas=["r1"], generation=1)
    c.do("create_table", name="t", schema=SCHEMA)
    c.do("write", table="t", batch=batch(("new", 7)))
    c.do("create_view", name="v", view=VIEW)
    c.up("r1")
    c.run()
    assert peek(c, "t") == [{"k": "new", "v": 7}]
    assert peek(c, "v") == [{"k": "new", "n": 1, "s": 7}]
    assert c.replicas["r1"].reconciliation_failures == 1  # the view over it was built again


def test_a_table_may_not_take_the_id_of_a_dropped_view() -> None:
    # Collection ids are never reused: the dropped view's commands are still in the history.
    c = cluster(("r1",))
    c.do("create_view", name="x", view=VIEW)
    c.do("drop_view", name="x")
    cid = c.call("create_table", name="x", schema=SCHEMA)
    assert "'x' was the id of a dropped collection" in str(c.replies[cid].error)


def test_upsert_table_errors_leave_the_table_as_it_was() -> None:
    c = upsert_cluster()
    c.do("write", table="u", batch=batch(("a", 1)))
    nulls = ipc(pa.table({"k": pa.array([None, "b"], pa.string()), "v": pa.array([1, 2], pa.int64())}))
    for name, args, needle in [
        ("create_table", {"name": "w", "schema": SCHEMA, "key": ["zz"]}, "not a list of distinct columns"),
        (
            "create_table",
            {"name": "w", "schema": SCHEMA, "key": ["k", "k"]},
            "not a list of distinct columns",
        ),
        ("create_table", {"name": "w", "schema": SCHEMA, "key": []}, "not a list of distinct columns"),
        ("create_table", {"name": "w", "schema": SCHEMA, "key": "k"}, "not a list of distinct columns"),
        ("write", {"table": "u", "batch": batch(("a", 2), diff=1)}, "not __diff"),
        ("write", {"table": "u", "batch": nulls}, "key column 'k' has nulls"),
    ]:
        cid = c.call(name, **args)
        error = c.replies[cid].error
        assert error is not None and needle in error, (name, error)
    assert "w" not in c.controller.tables
    assert peek(c, "u") == [{"k": "a", "v": 1}]


def test_a_cancel_is_answered_at_once_and_the_answer_in_flight_is_dropped() -> None:
    c = cluster(("r1",))
    cid = c.call("peek", view="v")
    c.step(CTL, "r1")  # r1 answers at once; the answer is in flight
    assert c.result(c.call("cancel_peek", call_id=cid)) is True
    assert c.replies[cid].error is not None and "canceled" in c.replies[cid].error
    assert c.controller.peeks == {}
    c.run()  # the rows arrive for a peek the controller no longer has: dropped (the harness refuses two replies)
    assert not any(isinstance(m, Peek) for m in c.controller.history)


def test_cancel_before_the_replica_can_answer_yields_canceled() -> None:
    c = cluster(("r1",))
    cid = c.call("peek", view="v", timestamp=50)  # waits for time 50
    c.run()
    cancel = c.call("cancel_peek", call_id=cid)
    c.run()
    assert c.result(cancel) is True
    assert c.replies[cid].error is not None and "canceled" in c.replies[cid].error


def test_cancel_with_no_replica_connected_answers_at_once() -> None:
    c = cluster(("r1",))
    c.cut("r1")
    cid = c.call("peek", view="v")
    c.call("cancel_peek", call_id=cid)
    assert c.replies[cid].error is not None and "canceled" in c.replies[cid].error
    c.up("r1")
    c.run()
    assert not any(isinstance(m, Peek) for m in c.controller.history)


def test_canceled_without_a_cancel_is_a_remote_error() -> None:
    c = cluster(("r1",))
    cid = c.call("peek", view="v", timestamp=50)
    uuid = c.controller._peek_calls[cid]
    with pytest.raises(RemoteProtocolError, match="not canceled"):
        c.deliver(
            CTL, MessageReceived(peer="r1", message=PeekResponse(uuid=uuid, result=PeekResult.CANCELED))
        )


def test_responses_for_unknown_peeks_are_dropped() -> None:
    c = cluster(("r1",))
    c.deliver(
        CTL, MessageReceived(peer="r1", message=PeekResponse(uuid="zz", result=PeekResult.ERROR, error="x"))
    )
    assert c.replies.keys() == {1, 2, 3}


def test_regressing_frontiers_are_a_remote_error() -> None:
    c = cluster(("r1",))
    with pytest.raises(RemoteProtocolError, match="regressed"):
        c.deliver(CTL, MessageReceived(peer="r1", message=Frontiers(id="v", write=(0,))))


def test_an_empty_frontier_for_a_live_view_is_a_remote_error_and_compaction_goes_on() -> None:
    # Only a drop empties a view's frontier; joined in, this one would have frozen the view and its table.
    c = cluster()
    with pytest.raises(RemoteProtocolError, match="empty write frontier"):
        c.deliver(CTL, MessageReceived(peer="r2", message=Frontiers(id="v", write=())))
    for i in range(3):
        c.do("write", table="t", batch=batch(("a", i)))
    ctl = c.controller
    assert ctl.collections["v"].since == ctl.upper - 1
    assert ctl._table_data["t"].since == (ctl.upper - 1,)


def test_frontiers_for_ids_the_controller_does_not_track_are_not_kept() -> None:
    c = cluster(("r1",))
    c.do("create_view", name="w", view=VIEW)
    c.do("drop_view", name="w")
    for id in ("w", "junk"):  # a dropped view, and an id that never was
        c.deliver(CTL, MessageReceived(peer="r1", message=Frontiers(id=id, write=(9,))))
    assert c.controller.links["r1"].frontiers.keys() == {"v"}


def test_responses_from_strangers_or_in_creation_are_remote_errors() -> None:
    c = cluster(("r1",))
    with pytest.raises(RemoteProtocolError, match="not a replica"):
        c.deliver(CTL, MessageReceived(peer="zz", message=Frontiers(id="v", write=(9,))))
    c.cut("r1")
    with pytest.raises(RemoteProtocolError, match="disconnected"):
        c.deliver(CTL, MessageReceived(peer="r1", message=Frontiers(id="v", write=(9,))))


def test_write_frontier_advances_with_any_replica_and_compaction_follows() -> None:
    c = cluster()
    c.do("write", table="t", batch=batch(("z", 1)))
    coll = c.controller.collections["v"]
    assert coll.write == (c.controller.upper,)
    assert coll.since == c.controller.upper - 1
    compactions = {m.id: m.frontier for _, to, m in c.sent if to == "r1" and isinstance(m, AllowCompaction)}
    # The view and the table it reads, both to the last write.
    assert compactions == {"v": (c.controller.upper - 1,), "t": (c.controller.upper - 1,)}


def test_compaction_holds_back_for_a_pending_peek() -> None:
    c = cluster(compaction_lag=0)
    cid = peek_at_1_while_r2_races_ahead(c, "v")
    assert c.controller.collections["v"].write == (c.controller.upper,)
    assert c.controller.collections["v"].since == 1
    c.run()
    assert peek_rows(c, cid) != []
    assert c.controller.collections["v"].since == c.controller.upper - 1


@pytest.mark.parametrize(
    ("finishing", "expected"),
    [
        ({"limit": 1}, [{"k": "a", "n": 2, "s": 4}]),
        (to_plain(Finishing(order_by=(SortKey(column="k", descending=True),))), [{"k": "b"}, {"k": "a"}]),
        (None, [{"k": "a"}, {"k": "b"}]),
    ],
)
def test_a_thin_clients_plain_finishing_is_converted_by_the_gateway(
    finishing: Any, expected: list[dict[str, Any]]
) -> None:
    c = cluster(("r1",))
    args = ARGS[Op.PEEK]({"view": "v", "finishing": finishing})
    cid = c.call("peek", **args)
    c.run()
    got = peek_rows(c, cid)
    if finishing is None:
        got = sorted(got, key=lambda r: r["k"])
    assert [{k: r[k] for k in e} for r, e in zip(got, expected, strict=True)] == expected


@pytest.mark.parametrize(
    ("finishing", "needle"),
    [({"limit": -1}, "limit"), ({"top": 1}, "unexpected field"), ([1], "expected a map")],
)
def test_a_thin_clients_bad_finishing_is_refused_by_the_gateway(finishing: Any, needle: str) -> None:
    with pytest.raises(DecodeError, match=needle):
        ARGS[Op.PEEK]({"view": "v", "finishing": finishing})


def test_a_peek_whose_finishing_is_not_a_finishing_is_refused_and_never_sent() -> None:
    c = cluster(("r1",))
    sent = len(c.sent)
    cid = c.call("peek", view="v", finishing={"limit": 1})
    error = c.replies[cid].error
    assert error == "peek: finishing must be a Finishing, got dict"
    assert len(c.sent) == sent and c.controller.peeks == {}
    assert not any(isinstance(m, Peek) for m in c.controller.history)


def test_local_call_errors() -> None:
    c = cluster(("r1",))
    for name, args, needle in [
        ("nope", {}, "no call"),
        ("create_table", {"name": "t", "schema": SCHEMA}, "already exists"),
        ("create_table", {"name": "u", "schema": pa.schema([("__x", pa.int64())])}, "'__'"),
        ("create_table", {"name": "u", "schema": pa.schema([("a", pa.int64())] * 2)}, "distinct"),
        ("create_table", {"name": "u", "schema": pa.schema([("a", pa.list_(pa.int64()))])}, "consolidated"),
        (
            "create_table",
            {"name": "u", "schema": pa.schema([("a", pa.struct([("b", pa.int64())]))])},
            "consolidated",
        ),
        ("write", {"table": "zz", "batch": batch()}, "no table"),
        ("write", {"table": "t", "batch": b"junk"}, "IPC"),
        ("write", {"table": "t", "batch": ipc(pa.table({"x": [1]}))}, "schema"),
        (
            "write",
            {
                "table": "t",
                "batch": ipc(pa.table({"k": ["a"], "v": [1], "__diff": pa.array([1], pa.int32())})),
            },
            "int64",
        ),
        (
            "write",
            {
                "table": "t",
                "batch": ipc(
                    pa.table({"k": ["a", "b"], "v": [1, 2], "__diff": pa.array([1, None], pa.int64())})
                ),
            },
            "__diff has nulls",
        ),
        ("create_view", {"name": "w", "view": ViewDef(source="zz")}, "no table or view"),
        ("create_view", {"name": "w", "view": ViewDef(source="t", project=("zz",))}, "zz"),
        ("create_view", {"name": "w", "view": "SELECT 1"}, "ViewDef"),
        ("drop_view", {"name": "t"}, "no view"),
        ("peek", {"view": "zz"}, "no table or view"),
        ("peek", {"view": "v", "timestamp": 0}, "below the since"),
        ("peek", {"view": "v", "target_replica": "r9"}, TARGET_FAILED),
        ("subscribe", {"view": "zz"}, "no view"),
        ("fetch", {"id": "zz"}, "no subscribe"),
        ("unsubscribe", {"id": "zz"}, "no subscribe"),
    ]:
        cid = c.call(name, **args)
        error = c.replies[cid].error
        assert error is not None and needle in error, (name, error)
    c.do("create_view", name="w", view=ViewDef(source="v"))
    cid = c.call("drop_view", name="v")
    assert "read by" in (c.replies[cid].error or "")
    with pytest.raises(LocalProtocolError):
        Cluster(())


def test_a_view_with_a_computed_column_is_maintained_and_so_is_everything_fed_after_it() -> None:
    # Its map column used to land after __time/__diff, so every feed raised: the view never advanced, and
    # the views and tables the same append fed after it were left behind.
    c = cluster(("r1",))
    c.do("create_table", name="t2", schema=SCHEMA)
    mapped = ViewDef(source="t", maps=(MapExpr(name="w", op="multiply", left="v", literal=10),))
    c.do("create_view", name="m", view=mapped)
    c.do("create_view", name="s", view=VIEW)
    c.do("write", table="t", batch=batch(("b", 5)))
    c.do("write", table="t2", batch=batch(("x", 9)))
    assert sorted(peek(c, "m"), key=repr) == [
        {"k": "a", "v": 1, "w": 10},
        {"k": "a", "v": 3, "w": 30},
        {"k": "b", "v": 2, "w": 20},
        {"k": "b", "v": 5, "w": 50},
    ]
    assert peek(c, "s") == [{"k": "a", "n": 2, "s": 4}, {"k": "b", "n": 2, "s": 7}]
    assert peek(c, "t2") == [{"k": "x", "v": 9}]


def test_a_view_that_fails_on_its_data_answers_errors_and_the_rest_goes_on() -> None:
    # Arrow casts the int64 column to add a float, and refuses values beyond 2**53: a failure on data only.
    c = cluster(("r1",))
    c.do("create_table", name="t2", schema=SCHEMA)
    shifted = ViewDef(
        source="t", maps=(MapExpr(name="w", op="add", left="v", literal=0.5),), project=("k", "w")
    )
    c.do("create_view", name="f", view=shifted)
    c.do("create_view", name="g", view=ViewDef(source="f"))  # reads the failing view
    sub = c.do("subscribe", view="f")
    c.do("create_view", name="s", view=VIEW)
    c.do("write", table="t", batch=batch(("big", 2**60)))
    c.do("write", table="t2", batch=batch(("x", 9)))
    for view in ("f", "g"):
        cid = c.call("peek", view=view)
        c.run()
        assert "view 'f' failed on its data" in str(c.replies[cid].error)
    assert c.do("fetch", id=sub["id"])["batches"][-1][3] == c.replies[cid].error
    assert peek(c, "s") == [
        {"k": "a", "n": 2, "s": 4},
        {"k": "b", "n": 1, "s": 2},
        {"k": "big", "n": 1, "s": 2**60},
    ]
    assert peek(c, "t2") == [{"k": "x", "v": 9}]
    ctl = c.controller
    assert ctl.collections["f"].write == (ctl.upper,)  # its frontier moves on, so nothing waits for it


def test_drop_view_drops_it_everywhere() -> None:
    c = cluster()
    c.do("drop_view", name="v")
    assert all(r.collection("v") is None for r in c.replicas.values())
    c.do("create_view", name="v", view=VIEW)  # the name is free again
    cid = c.call("peek", view="v")
    c.run()
    assert len(peek_rows(c, cid)) == 2


def test_subscribe_delivers_each_span_once_across_replicas() -> None:
    c = cluster()
    sub = c.do("subscribe", view="v")
    c.do("write", table="t", batch=batch(("b", 5)))
    c.do("write", table="t", batch=batch(("a", 1), diff=-1))
    got = c.do("fetch", id=sub["id"])
    spans = [(lo, hi) for lo, hi, _, _ in got["batches"]]
    assert spans == sorted(spans) and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert spans[0][0] == sub["as_of"] and spans[-1][1] == got["upper"]
    updates = pa.concat_tables([decode_table(d) for _, _, d, _ in got["batches"] if d is not None])
    assert sorted((r["k"], r["n"], r["__diff"]) for r in updates.to_pylist()) == [
        ("a", 1, 1),
        ("a", 2, -1),
        ("a", 2, 1),
        ("b", 1, -1),
        ("b", 1, 1),
        ("b", 2, 1),
    ]
    c.do("unsubscribe", id=sub["id"])
    assert all(r.dataflow(sub["id"]) is None for r in c.replicas.values())


def test_subscribe_survives_a_replica_failure_without_duplicates() -> None:
    c = cluster()
    sub = c.do("subscribe", view="v")
    c.cut("r1")
    c.do("write", table="t", batch=batch(("c", 1)))
    c.cut("r2")
    c.up("r1")
    c.run()
    c.do("write", table="t", batch=batch(("d", 1)))
    got = c.do("fetch", id=sub["id"])
    updates = pa.concat_tables([decode_table(d) for _, _, d, _ in got["batches"] if d is not None])
    keys = sorted(r["k"] for r in updates.to_pylist() if r["__diff"] > 0)
    assert keys == ["a", "b", "c", "d"]


def test_an_open_subscribe_lets_its_view_and_table_compact_and_survives_rehydration() -> None:
    c = upsert_cluster()
    sub = c.do("subscribe", view="uv")
    for i in range(50):
        c.do("write", table="u", batch=batch(("a", i), ("c", 1)))
    ctl = c.controller
    # The subscribe holds its view, and the view the table, only back to what it has delivered.
    assert ctl._table_data["u"].since == (ctl.upper - 1,)
    assert len(c.replicas["r1"].tables["u"].updates) == 2
    # A rehydrated replica builds the subscribe again from there; nothing is delivered twice.
    c.cut("r1")
    c.do("write", table="u", batch=batch(("a", 100)))
    c.up("r1")
    c.run()
    c.do("write", table="u", batch=batch(("b", 7)))
    got = c.do("fetch", id=sub["id"])
    spans = [(lo, hi) for lo, hi, _, _ in got["batches"]]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    updates = pa.concat_tables([decode_table(d) for _, _, d, _ in got["batches"] if d is not None])
    total: dict[tuple[str, int, int], int] = {}
    for r in updates.to_pylist():
        key = (r["k"], r["n"], r["s"])
        total[key] = total.get(key, 0) + r["__diff"]
    assert sorted(k for k, n in total.items() if n) == [("a", 1, 100), ("b", 1, 7), ("c", 1, 1)]
    assert all(n in (0, 1) for n in total.values())


def test_targeted_subscribe_gets_an_error_batch_when_its_replica_fails() -> None:
    c = cluster()
    sub = c.do("subscribe", view="v", target_replica="r1")
    c.cut("r1")
    got = c.do("fetch", id=sub["id"])
    assert got["batches"][-1][3] == TARGET_FAILED and got["dropped_at"] is not None


def test_subscribe_batch_beyond_the_delivered_upper_is_a_remote_error() -> None:
    c = cluster(("r1",))
    sub = c.do("subscribe", view="v")
    bad = SubscribeBatch(id=sub["id"], lower=(99,), upper=(100,), error="x")
    with pytest.raises(RemoteProtocolError, match="beyond"):
        c.deliver(CTL, MessageReceived(peer="r1", message=bad))


@pytest.mark.parametrize("overlap", [False, True], ids=["next-span", "overlapping-span"])
def test_a_subscribe_batch_of_other_columns_is_a_remote_error(overlap: bool) -> None:
    c = cluster(("r1",))
    sub = c.do("subscribe", view="v")
    c.do("fetch", id=sub["id"])
    upper = c.controller.subscribes[sub["id"]].upper
    lower = upper - 1 if overlap else upper  # an overlap is trimmed by __time, which this batch lacks
    bad = SubscribeBatch(id=sub["id"], lower=(lower,), upper=(upper + 5,), updates=ipc(pa.table({"x": [1]})))
    with pytest.raises(RemoteProtocolError, match="not the view's"):
        c.deliver(CTL, MessageReceived(peer="r1", message=bad))
    assert c.do("fetch", id=sub["id"])["batches"] == []


def test_a_subscribe_dropped_the_controller_did_not_ask_for_is_a_remote_error() -> None:
    c = cluster()
    sub = c.do("subscribe", view="v", target_replica="r1")
    with pytest.raises(RemoteProtocolError, match="not dropped"):
        c.deliver(CTL, MessageReceived(peer="r2", message=SubscribeDropped(id=sub["id"], at=(0,))))
    c.do("write", table="t", batch=batch(("z", 1)))
    got = c.do("fetch", id=sub["id"])
    assert got["dropped_at"] is None and got["upper"] == c.controller.upper


def test_read_only_controller_allows_writes_later() -> None:
    c = cluster(("r1",), read_only=True)
    assert c.replicas["r1"].stage is Stage.READ_ONLY
    c.do("allow_writes")
    assert c.replicas["r1"].stage is Stage.READ_WRITE
    c.do("allow_writes")
    assert c.replicas["r1"].stage is Stage.READ_WRITE


@pytest.mark.parametrize("seed", range(8))
def test_seeded_interleavings_agree(seed: int) -> None:
    rng = random.Random(seed)
    c = Cluster(("r1", "r2"))
    c.up("r1")
    c.up("r2")
    c.do("create_table", rng, name="t", schema=SCHEMA)
    c.do("create_view", rng, name="v", view=VIEW)
    expected: dict[str, list[int]] = {}
    calls = []
    for i in range(12):
        k = rng.choice("abc")
        c.call("write", table="t", batch=batch((k, i)))
        expected.setdefault(k, []).append(i)
        if rng.random() < 0.3:
            victim = rng.choice(["r1", "r2"])
            c.run(rng)
            c.cut(victim)
            c.up(victim)
        calls.append(c.call("peek", view="v", finishing=ORDERED))
        c.run(rng)
    last = peek_rows(c, calls[-1])
    assert last == [{"k": k, "n": len(v), "s": sum(v)} for k, v in sorted(expected.items())]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_upserts_by_one_key_and_by_every_column_match_a_dict(seed: int) -> None:
    """The one-key path (unique keys, is_in) and the composite one (group-by, join) against a reference."""
    rng = random.Random(seed)
    one, every = upsert_cluster(), upsert_cluster(["k", "v"])
    by_key: dict[str, int] = {}
    rows: set[tuple[str, int]] = set()
    for _ in range(8):
        written = [(rng.choice("abcdefgh"), rng.randrange(4)) for _ in range(rng.randrange(1, 12))]
        for c in (one, every):
            c.do("write", table="u", batch=batch(*written))
        by_key.update(dict(written))
        rows.update(written)
    assert sorted((r["k"], r["v"]) for r in peek(one, "u")) == sorted(by_key.items())
    assert sorted((r["k"], r["v"]) for r in peek(every, "u")) == sorted(rows)


def test_a_name_with_no_utf8_form_is_refused_and_the_replicas_go_on_taking_commands() -> None:
    """Every command to the replicas carries the name: with a lone surrogate each failed to encode, the
    ones for healthy tables after it too."""
    c = Cluster(("r1",))
    c.up("r1")
    c.run()
    cid = c.call("create_table", name="t\ud800", schema=SCHEMA)
    c.run()
    assert c.replies[cid].error is not None and "UTF-8" in c.replies[cid].error
    c.do("create_table", name="u", schema=SCHEMA)
    cid = c.call("create_view", name="v\ud800", view=dataclasses.replace(VIEW, source="u"))
    c.run()
    assert c.replies[cid].error is not None and "UTF-8" in c.replies[cid].error
    c.do("create_view", name="uv", view=dataclasses.replace(VIEW, source="u"))
    c.do("write", table="u", batch=batch(("a", 1)))
    assert peek(c, "uv") == [{"k": "a", "n": 1, "s": 1}]
