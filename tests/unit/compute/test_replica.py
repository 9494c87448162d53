"""The replica role on its own: stages, peeks, frontiers, drops, storage and reconciliation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import LocalCall, MessageReceived, PeerLost, RemoteProtocolError, Reply, Send
from sparkbus.roles.compute import (
    DIFF,
    TIME,
    Aggregate,
    AllowCompaction,
    AllowWrites,
    AppendUpdates,
    CancelPeek,
    ComputeReplica,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    Frontiers,
    InitializationComplete,
    Peek,
    PeekResponse,
    PeekResult,
    Schedule,
    Stage,
    Status,
    SubscribeBatch,
    SubscribeDropped,
    TargetKind,
    UpdateConfiguration,
    ViewDef,
    decode_table,
    encode_table,
)

from .harness import CTL, wire

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
VIEW = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="sum", column="v", name="s"),))


def rows(values: list[tuple[str, int]], t: int, diff: int = 1) -> bytes:
    table = pa.table(
        {
            "k": pa.array([k for k, _ in values], pa.string()),
            "v": pa.array([v for _, v in values], pa.int64()),
            TIME: pa.array([t] * len(values), pa.int64()),
            DIFF: pa.array([diff] * len(values), pa.int64()),
        }
    )
    return encode_table(table)


def table(
    lower: int, upper: int, values: list[tuple[str, int]] | None = None, t: int | None = None
) -> AppendUpdates:
    return AppendUpdates(
        id="t", lower=lower, upper=upper, updates=rows(values or [], lower if t is None else t)
    )


def dataflow(
    name: str = "v", as_of: int = 0, *, view: ViewDef = VIEW, sinks: tuple[str, ...] = ()
) -> CreateDataflow:
    return CreateDataflow(
        name=name,
        as_of=(as_of,),
        imports=(view.source,),
        index_exports=() if sinks else (name,),
        sink_exports=sinks,
        view=view,
    )


def peek(uuid: str, t: int, target: str = "v", **kw: Any) -> Peek:
    return Peek(uuid=uuid, target=TargetKind.INDEX, target_id=target, timestamp=t, **kw)


class Driver:
    """Feeds one replica commands from the controller ``ctl`` and collects what it sends back."""

    def __init__(self) -> None:
        self.replica = ComputeReplica()
        self.out: list[Any] = []

    def send(self, *messages: Any) -> list[Any]:
        got: list[Any] = []
        for m in messages:
            for action in self.replica.handle(MessageReceived(peer=CTL, message=wire(m)), 0.0):
                assert isinstance(action, Send) and action.peer == CTL
                got.append(wire(action.message))
        self.out.extend(got)
        return got

    def connect(self, epoch: int = 1, instance: CreateInstance | None = None, *commands: Any) -> list[Any]:
        return self.send(
            CreateTimely(epoch=epoch), instance or CreateInstance(), *commands, InitializationComplete()
        )

    def lose(self) -> None:
        assert list(self.replica.handle(PeerLost(peer=CTL, reason="test"), 0.0)) == []


def peek_rows(responses: list[Any], uuid: str) -> list[dict[str, Any]]:
    (answer,) = [r for r in responses if isinstance(r, PeekResponse) and r.uuid == uuid]
    assert answer.result is PeekResult.ROWS, answer.error
    out: list[dict[str, Any]] = decode_table(answer.rows).to_pylist()
    return out


def started(*commands: Any) -> Driver:
    d = Driver()
    d.connect(1, None, table(0, 1), *commands)
    return d


# ---------------------------------------------------------------- stages


def test_no_responses_before_initialization_complete() -> None:
    d = Driver()
    assert (
        d.send(CreateTimely(epoch=1), CreateInstance(), table(0, 3, [("a", 1)]), dataflow(), Schedule(id="v"))
        == []
    )
    assert d.replica.stage is Stage.INITIALIZATION
    out = d.send(InitializationComplete())
    assert Frontiers(id="v", write=(3,), input=(3,), output=(3,)) in out
    assert d.replica.stage is Stage.READ_ONLY and not d.replica.writes_allowed
    d.send(AllowWrites())
    assert d.replica.stage is Stage.READ_WRITE and d.replica.writes_allowed


def test_writes_stay_allowed_across_a_lost_link_and_the_next_connection() -> None:
    d = started()
    d.send(AllowWrites())
    d.lose()
    assert d.replica.writes_allowed
    d.send(CreateTimely(epoch=2), CreateInstance())
    assert d.replica.stage is Stage.INITIALIZATION and d.replica.writes_allowed
    d.send(InitializationComplete())
    assert d.replica.stage is Stage.READ_ONLY and d.replica.writes_allowed
    # A halt stands for a restarted process, which starts read-only until the new AllowWrites.
    d.lose()
    d.connect(3, CreateInstance(logging_interval_ms=5), table(0, 1))
    assert d.replica.halts == 1 and not d.replica.writes_allowed


@pytest.mark.parametrize(
    ("prefix", "bad", "stage"),
    [
        ([], CreateInstance(), "disconnected"),
        ([], dataflow(), "disconnected"),
        ([CreateTimely(epoch=1)], InitializationComplete(), "creation"),
        ([CreateTimely(epoch=1)], Schedule(id="v"), "creation"),
        ([CreateTimely(epoch=1), CreateInstance()], AllowWrites(), "initialization"),
        ([CreateTimely(epoch=1), CreateInstance()], CreateTimely(epoch=2), "initialization"),
        ([CreateTimely(epoch=1), CreateInstance(), InitializationComplete()], CreateInstance(), "read-only"),
        (
            [CreateTimely(epoch=1), CreateInstance(), InitializationComplete(), AllowWrites()],
            AllowWrites(),
            "read-write",
        ),
        (
            [CreateTimely(epoch=1), CreateInstance(), InitializationComplete()],
            InitializationComplete(),
            "read-only",
        ),
    ],
)
def test_commands_out_of_stage_are_remote_errors_naming_the_stage(
    prefix: list[Any], bad: Any, stage: str
) -> None:
    d = Driver()
    d.send(*prefix)
    with pytest.raises(RemoteProtocolError, match=stage) as info:
        d.send(bad)
    assert type(bad).__name__ in str(info.value) or "computation command" in str(info.value)


def test_an_epoch_that_does_not_grow_is_refused_and_the_controller_told() -> None:
    d = Driver()
    d.connect(5)
    d.lose()
    # The whole connection is refused: one Status naming the epoch, and the rest of it ignored.
    out = d.send(CreateTimely(epoch=5), CreateInstance(), table(0, 1), dataflow(), InitializationComplete())
    assert out == [Status(detail="CreateTimely from ctl: epoch 5 <= seen 5", refused_epoch=5)]
    assert d.replica.stage is Stage.DISCONNECTED and d.replica.epoch == 5 and not d.replica.tables
    d.connect(6, None, table(0, 1))
    assert d.replica.epoch == 6 and d.replica.stage is Stage.READ_ONLY and d.replica.tables.keys() == {"t"}


def test_a_create_timely_from_another_controller_is_refused_and_it_told() -> None:
    d = started()
    out = list(d.replica.handle(MessageReceived(peer="other", message=CreateTimely(epoch=9)), 0.0))
    status = Status(detail="CreateTimely from other: this replica is connected to ctl", refused_epoch=9)
    assert out == [Send(peer="other", message=status)]
    assert list(d.replica.handle(MessageReceived(peer="other", message=CreateInstance()), 0.0)) == []
    assert d.replica.stage is Stage.READ_ONLY and d.replica.epoch == 1 and d.replica.controller == CTL


def test_commands_from_another_peer_are_refused() -> None:
    d = started()
    with pytest.raises(RemoteProtocolError, match="intruder"):
        list(d.replica.handle(MessageReceived(peer="intruder", message=Schedule(id="v")), 0.0))


def test_local_calls_are_answered_with_an_error() -> None:
    (reply,) = ComputeReplica().handle(LocalCall(call_id=1, name="x"), 0.0)
    assert isinstance(reply, Reply) and reply.error is not None


# ---------------------------------------------------------------- peeks


def test_peek_waits_for_the_frontier_then_answers_once() -> None:
    d = started(dataflow(), Schedule(id="v"))
    assert d.send(peek("p", 2)) == []
    out = d.send(table(1, 2, [("a", 5)]))
    assert not [r for r in out if isinstance(r, PeekResponse)]
    out = d.send(table(2, 3, [("a", 1), ("b", 2)]))
    assert sorted(map(str, peek_rows(out, "p"))) == sorted(map(str, [{"k": "a", "s": 6}, {"k": "b", "s": 2}]))
    assert d.send(CancelPeek(uuid="p")) == []  # answered already: ignored
    assert d.send(table(3, 4)) == [Frontiers(id="v", write=(4,), input=(4,), output=(4,))]


def test_cancel_of_a_pending_peek_answers_canceled() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(peek("p", 9))
    assert d.send(CancelPeek(uuid="p")) == [PeekResponse(uuid="p", result=PeekResult.CANCELED)]
    assert d.send(CancelPeek(uuid="p")) == []
    assert d.send(CancelPeek(uuid="never-seen")) == []


def test_peek_below_since_is_an_error() -> None:
    d = started(
        dataflow(), Schedule(id="v"), table(1, 6, [("a", 1)], t=3), AllowCompaction(id="v", frontier=(4,))
    )
    (answer,) = d.send(peek("p", 3))
    assert answer.result is PeekResult.ERROR and "below the since" in answer.error
    assert peek_rows(d.send(peek("q", 4)), "q") == [{"k": "a", "s": 1}]


def test_peek_at_an_unknown_collection_is_an_error() -> None:
    d = started()
    (answer,) = d.send(peek("p", 0, target="nope"))
    assert answer.result is PeekResult.ERROR and "does not exist" in answer.error


def test_pending_peek_is_answered_with_an_error_when_its_collection_drops() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(peek("p", 5))
    out = d.send(AllowCompaction(id="v", frontier=()))
    assert PeekResponse(uuid="p", result=PeekResult.ERROR, error="collection 'v' was dropped") in out


def test_persist_peek_reads_the_table_with_constraints_and_finishing() -> None:
    from sparkbus.roles.compute import Finishing, SortKey

    d = started(table(1, 2, [("a", 1), ("b", 2), ("a", 3)]))
    p = Peek(
        uuid="p",
        target=TargetKind.PERSIST,
        target_id="t",
        timestamp=1,
        literal_constraints=(("a", 3), ("b", 2)),
        finishing=Finishing(order_by=(SortKey(column="v", descending=True),)),
    )
    assert peek_rows(d.send(p), "p") == [{"k": "a", "v": 3}, {"k": "b", "v": 2}]


def test_peek_with_constraints_of_the_wrong_arity_is_an_error() -> None:
    d = started(dataflow(), Schedule(id="v"))
    (answer,) = d.send(peek("p", 0, literal_constraints=(("a", 1),)))
    assert answer.result is PeekResult.ERROR and "key" in answer.error


def test_peeks_at_the_int64_bounds_are_answered_together_in_one_flush() -> None:
    from sparkbus.roles.compute import Finishing

    d = started(table(1, 2, [("a", 1)]))
    top = 2**63 - 1

    def persist(uuid: str, **kw: Any) -> Peek:
        return Peek(uuid=uuid, target=TargetKind.PERSIST, target_id="t", timestamp=2, **kw)

    # All wait for time 2, so one flush answers them: a peek that fails must not take the others with it.
    d.send(
        persist("whole", finishing=Finishing(limit=top)),
        persist("past", finishing=Finishing(offset=top, limit=top)),
        persist("above", literal_constraints=(("a", 2**63),)),  # msgpack carries up to 2**64 - 1
    )
    out = d.send(table(2, 3, [("b", 2)]))
    assert sorted(r["k"] for r in peek_rows(out, "whole")) == ["a", "b"]
    assert peek_rows(out, "past") == []
    (error,) = [r for r in out if isinstance(r, PeekResponse) and r.result is PeekResult.ERROR]
    assert error.uuid == "above" and "does not fit the key" in str(error.error)


def test_max_result_size_turns_big_answers_into_errors_and_applies_to_pending_peeks() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(peek("p", 1))
    d.send(UpdateConfiguration(max_result_size=16))
    (answer,) = [r for r in d.send(table(1, 2, [("a", 1)])) if isinstance(r, PeekResponse)]
    assert answer.result is PeekResult.ERROR and answer.error == "result exceeds max size of 16 bytes"


# ---------------------------------------------------------------- frontiers and drops


def test_frontiers_never_regress_and_start_at_as_of() -> None:
    d = Driver()
    out = d.connect(1, None, table(0, 2), dataflow(as_of=5), Schedule(id="v"))
    assert out == [Frontiers(id="v", write=(5,), input=(5,), output=(5,))]
    assert d.send(table(2, 4)) == []
    assert d.send(table(4, 7)) == [Frontiers(id="v", write=(7,), input=(7,), output=(7,))]


def test_drop_reports_empty_frontiers_once_and_then_nothing() -> None:
    d = started(dataflow(), Schedule(id="v"))
    assert d.send(AllowCompaction(id="v", frontier=())) == [Frontiers(id="v", write=(), input=(), output=())]
    assert d.send(table(1, 5, [("a", 1)])) == []
    assert d.send(AllowCompaction(id="v", frontier=())) == []
    assert d.replica.collection("v") is None


def test_subscribe_streams_contiguous_consolidated_batches_then_dropped_at() -> None:
    sub = ViewDef(source="v")
    d = started(dataflow(), Schedule(id="v"), dataflow("s", 0, view=sub, sinks=("s",)), Schedule(id="s"))
    first = [m for m in d.out if isinstance(m, SubscribeBatch)]
    assert [(b.lower, b.upper) for b in first] == [((0,), (1,))]
    out = d.send(table(1, 3, [("a", 1), ("a", 2)], t=1))
    (batch,) = [m for m in out if isinstance(m, SubscribeBatch)]
    assert (batch.lower, batch.upper) == ((1,), (3,))
    assert decode_table(batch.updates).to_pylist() == [{"k": "a", "s": 3, TIME: 1, DIFF: 1}]
    assert not [m for m in out if isinstance(m, Frontiers) and m.id == "s"]  # no frontiers for subscribes
    assert d.send(AllowCompaction(id="s", frontier=())) == [SubscribeDropped(id="s", at=(3,))]
    assert not [m for m in d.send(table(3, 4, [("b", 1)])) if isinstance(m, SubscribeBatch)]


# ---------------------------------------------------------------- storage


def test_storage_replays_are_idempotent_and_gaps_are_refused() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(table(1, 3, [("a", 1)]))
    d.send(AppendUpdates(id="t", lower=0, upper=3, updates=rows([("a", 1)], 1)))  # a replay: nothing new
    assert peek_rows(d.send(peek("p", 2)), "p") == [{"k": "a", "s": 1}]
    with pytest.raises(RemoteProtocolError, match="updates are missing"):
        d.send(table(5, 6))


def compacted(upper: int, since: int, values: list[tuple[str, int, int]]) -> AppendUpdates:
    """The controller's snapshot of table ``t`` compacted to ``since``: ``(key, value, diff)`` at the since."""
    updates = pa.table(
        {
            "k": pa.array([k for k, _, _ in values], pa.string()),
            "v": pa.array([v for _, v, _ in values], pa.int64()),
            TIME: pa.array([since] * len(values), pa.int64()),
            DIFF: pa.array([d for _, _, d in values], pa.int64()),
        }
    )
    return AppendUpdates(id="t", lower=0, upper=upper, since=since, updates=encode_table(updates))


def test_a_compacted_replay_beyond_our_upper_is_merged_by_difference() -> None:
    # The replica holds t up to 3; while it was away the table moved on to 6 and was compacted to 5, so
    # the rows it holds come back inside the snapshot at time 5, indistinguishable from the new ones.
    d = started(dataflow(), Schedule(id="v"))
    d.send(table(1, 2, [("a", 1), ("b", 2)]), table(2, 3, [("a", 10)]))
    d.send(compacted(6, 5, [("a", 1, 1), ("a", 10, 1), ("b", 2, 1), ("c", 7, 1)]))
    t = d.replica.tables["t"]
    assert t.since == (5,) and t.upper == (6,)
    assert sorted(map(repr, t.read_at(5).to_pylist())) == sorted(
        map(repr, [{"k": "a", "v": 1}, {"k": "a", "v": 10}, {"k": "b", "v": 2}, {"k": "c", "v": 7}])
    )
    # The view reading it got the difference, not the snapshot again: nothing is counted twice.
    assert peek_rows(d.send(peek("p", 5)), "p") == [
        {"k": "a", "s": 11},
        {"k": "b", "s": 2},
        {"k": "c", "s": 7},
    ]
    # Rows deleted while it was away are gone too.
    d.send(compacted(8, 7, [("c", 7, 1)]))
    assert peek_rows(d.send(peek("q", 7)), "q") == [{"k": "c", "s": 7}]


def test_a_compacted_replay_below_our_upper_keeps_only_the_new_times() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(table(1, 4, [("a", 1)], t=1), table(4, 5, [("b", 2)]))
    # Compacted to 2: time 1's row is at 2 in the replay, still below our upper 5, so it is not new.
    replay = pa.table(
        {"k": ["a", "b", "c"], "v": [1, 2, 3], TIME: [2, 4, 5], DIFF: [1, 1, 1]},
        schema=pa.schema([("k", pa.string()), ("v", pa.int64()), (TIME, pa.int64()), (DIFF, pa.int64())]),
    )
    d.send(AppendUpdates(id="t", lower=0, upper=6, since=2, updates=encode_table(replay)))
    assert peek_rows(d.send(peek("p", 5)), "p") == [
        {"k": "a", "s": 1},
        {"k": "b", "s": 2},
        {"k": "c", "s": 3},
    ]


def test_a_table_started_again_below_our_since_is_reloaded_unless_a_dataflow_reads_it() -> None:
    d = started()
    d.send(table(1, 2, [("a", 1)]), table(2, 3, [("b", 2)]), AllowCompaction(id="t", frontier=(2,)))
    # The table anew (a restarted controller's, from since 0): what we held is replaced, not merged.
    d.send(table(0, 2, [("c", 3)], t=1))
    t = d.replica.tables["t"]
    assert (t.since, t.upper) == ((0,), (2,))
    assert t.read_at(1).to_pylist() == [{"k": "c", "v": 3}]
    d.send(AllowCompaction(id="t", frontier=(1,)), dataflow("v", 1), Schedule(id="v"))
    with pytest.raises(RemoteProtocolError, match="dataflows read it"):
        d.send(table(0, 2))


def test_allow_compaction_compacts_a_table_and_cannot_drop_it() -> None:
    d = started()
    d.send(table(1, 2, [("a", 1)]), table(2, 3, [("a", 1)], t=2), table(3, 4, [("a", 5)]))
    assert len(d.replica.tables["t"].updates) == 3
    d.send(AllowCompaction(id="t", frontier=(3,)))
    t = d.replica.tables["t"]
    assert t.since == (3,)
    assert t.updates.to_pylist() == [
        {"k": "a", "v": 1, TIME: 3, DIFF: 2},
        {"k": "a", "v": 5, TIME: 3, DIFF: 1},
    ]
    with pytest.raises(RemoteProtocolError, match="cannot be dropped"):
        d.send(AllowCompaction(id="t", frontier=()))


def columns(*names: str, null: str | None = None) -> bytes:
    """One update at time 1 with the columns ``names`` (``k`` a string, the rest int64), ``null`` null."""
    arrays = [
        pa.array([None if n == null else ("a" if n == "k" else 1)], pa.string() if n == "k" else pa.int64())
        for n in names
    ]
    return encode_table(pa.Table.from_arrays(arrays, names=list(names)))


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (AppendUpdates(id="t", lower=1, upper=2, updates=b"junk"), "IPC"),
        (AppendUpdates(id="t", lower=0, upper=4, since=3, updates=rows([("a", 1)], 2)), "below the since"),
        (AppendUpdates(id="t", lower=1, upper=2, updates=rows([("a", 1)], 7)), "outside"),
        (AppendUpdates(id="u", lower=3, upper=4, updates=rows([], 3)), "first append"),
        (AppendUpdates(id="t", lower=1, upper=2, advanced=("zz",), updates=rows([], 1)), "advanced"),
        (
            AppendUpdates(
                id="t",
                lower=1,
                upper=2,
                updates=encode_table(pa.table({"x": [1], TIME: [1], DIFF: [1]})),
            ),
            "schema",
        ),
        (
            AppendUpdates(id="t", lower=1, upper=2, updates=encode_table(pa.table({"k": ["a"], "v": [1]}))),
            "__time",
        ),
        (AppendUpdates(id="t", lower=1, upper=2, updates=columns(TIME, "k", "v", TIME, DIFF)), "distinct"),
        (AppendUpdates(id="u", lower=0, upper=2, updates=columns("k", "k", TIME, DIFF)), "distinct"),
        (AppendUpdates(id="t", lower=1, upper=2, updates=columns("k", "v", TIME, DIFF, null=TIME)), "nulls"),
        (AppendUpdates(id="t", lower=1, upper=2, updates=columns("k", "v", TIME, DIFF, null=DIFF)), "nulls"),
        (AppendUpdates(id="u", lower=0, upper=2, advanced=("zz",), updates=rows([], 1)), "advanced"),
    ],
)
def test_bad_appends_are_remote_errors_and_change_nothing(message: AppendUpdates, needle: str) -> None:
    d = started(table(1, 2, [("a", 1)]))
    with pytest.raises(RemoteProtocolError, match=needle):
        d.send(message)
    assert d.replica.tables.keys() == {"t"}  # no table half created
    assert d.replica.tables["t"].upper == (2,)


def test_a_refused_append_leaves_its_table_behind_but_not_the_others() -> None:
    """One append the replica cannot take stops its table, not every table: the tables it advances still
    move, later appends skip the refused table, and peeks it can never answer are answered with an error."""
    u = dataclasses.replace(VIEW, source="u")
    d = Driver()
    d.connect(
        1,
        None,
        table(0, 1),
        AppendUpdates(id="u", lower=0, upper=1, advanced=("t",), updates=rows([], 0)),
        dataflow(),
        Schedule(id="v"),
        dataflow("w", view=u),
        Schedule(id="w"),
    )
    bad = columns("k", "v", TIME, DIFF, null=DIFF)
    with pytest.raises(RemoteProtocolError, match="nulls"):
        d.send(AppendUpdates(id="t", lower=1, upper=2, advanced=("u",), updates=bad))
    assert d.replica.tables["t"].upper == (1,) and d.replica.tables["u"].upper == (2,)
    out = d.send(
        AppendUpdates(id="u", lower=2, upper=3, advanced=("t",), updates=rows([("a", 5)], 2)),
        peek("w2", 2, "w"),
        peek("v0", 0),
        peek("v2", 2),
        Peek(uuid="t2", target=TargetKind.PERSIST, target_id="t", timestamp=2),
    )
    assert d.replica.tables["u"].upper == (3,)
    assert peek_rows(out, "w2") == [{"k": "a", "s": 5}]
    assert peek_rows(out, "v0") == []  # below where the table stopped: answered
    errors = {r.uuid: r.error for r in out if isinstance(r, PeekResponse) and r.result is PeekResult.ERROR}
    assert errors.keys() == {"v2", "t2"}
    assert all("table 't' stays at its upper" in e and "nulls" in e for e in errors.values()), errors
    # The table's next append is a gap, refused too; the first reason is kept, and u still moves.
    with pytest.raises(RemoteProtocolError, match="updates are missing"):
        d.send(AppendUpdates(id="t", lower=3, upper=4, advanced=("u",), updates=rows([], 3)))
    assert d.replica.tables["u"].upper == (4,) and "nulls" in d.replica.refused["t"]


@pytest.mark.parametrize("n", [0, 1], ids=["empty", "one-row"])
def test_a_table_whose_rows_cannot_be_consolidated_is_refused_before_it_is_created(n: int) -> None:
    d = started()
    lists = pa.table(
        {
            "a": pa.array([[1]] * n, pa.list_(pa.int64())),
            TIME: pa.array([0] * n, pa.int64()),
            DIFF: pa.array([1] * n, pa.int64()),
        }
    )
    with pytest.raises(RemoteProtocolError, match="cannot be consolidated"):
        d.send(AppendUpdates(id="l", lower=0, upper=2, advanced=("t",), updates=encode_table(lists)))
    assert "l" not in d.replica.tables and "Keys of type list" in d.replica.refused["l"]
    assert d.replica.tables["t"].upper == (2,)  # what it advances still moves
    d.send(AppendUpdates(id="t", lower=2, upper=3, advanced=("l",), updates=rows([("a", 1)], 2)))
    assert d.replica.tables["t"].upper == (3,)


def test_reconciliation_drops_the_tables_the_new_connection_has_no_snapshot_of() -> None:
    """A controller sends a snapshot of every table it has, so the others are a previous controller's:
    kept, they would hold memory for good and keep their ids from the new controller's views."""
    d = started(dataflow(), Schedule(id="v"))
    with pytest.raises(RemoteProtocolError, match="nulls"):  # and a refusal of a table that goes too
        d.send(AppendUpdates(id="x", lower=0, upper=1, updates=columns("k", "v", TIME, DIFF, null=DIFF)))
    assert "x" in d.replica.refused
    d.lose()
    over_u = dataclasses.replace(VIEW, source="u")
    d.connect(
        2, None, AppendUpdates(id="u", lower=0, upper=1, updates=rows([], 0)), dataflow("t", view=over_u)
    )
    assert sorted(d.replica.tables) == ["u"] and not d.replica.refused
    assert d.replica.dataflow("v") is None and d.replica.dataflow("t") is not None


def test_a_connection_has_the_parameters_its_initialization_sets_and_no_others() -> None:
    d = Driver()
    d.connect(1, None, UpdateConfiguration(max_result_size=64, dyncfg={"a": "1"}))
    d.send(UpdateConfiguration(workload_class="w"))
    assert d.replica.config == UpdateConfiguration(max_result_size=64, workload_class="w", dyncfg={"a": "1"})
    d.lose()
    d.connect(2)  # a controller that sets none
    assert d.replica.config == UpdateConfiguration()
    d.lose()
    d.connect(3, None, UpdateConfiguration(dyncfg={"b": "2"}))
    assert d.replica.config == UpdateConfiguration(dyncfg={"b": "2"})


def test_bad_dataflows_are_remote_errors() -> None:
    d = started(dataflow(), Schedule(id="v"))
    with pytest.raises(RemoteProtocolError, match="does not exist"):
        d.send(dataflow("w", view=ViewDef(source="nope")))
    with pytest.raises(RemoteProtocolError, match="already in use"):
        d.send(dataflow("v"))
    with pytest.raises(RemoteProtocolError, match="does not fit"):
        d.send(dataflow("w", view=ViewDef(source="t", project=("zz",))))
    d.send(AllowCompaction(id="v", frontier=(1,)), table(1, 3))
    d.send(AllowCompaction(id="v", frontier=(2,)))
    d.send(dataflow("w", as_of=0, view=ViewDef(source="v")))
    with pytest.raises(RemoteProtocolError, match="not readable at as_of 0"):
        d.send(Schedule(id="w"))


# ---------------------------------------------------------------- reconciliation


def test_reconnect_reuses_compatible_dataflows() -> None:
    d = started(dataflow(), Schedule(id="v"), table(1, 3, [("a", 1)]))
    before = d.replica.dataflow("v")
    d.send(peek("p", 10))
    d.lose()
    d.out.clear()
    out = d.connect(2, None, table(0, 4, [("a", 1)], t=1), dataflow(as_of=2), Schedule(id="v"))
    assert d.replica.dataflow("v") is before
    assert d.replica.reconciliation_failures == 0
    assert not [m for m in out if isinstance(m, PeekResponse)]  # the old pending peek is dropped silently
    assert Frontiers(id="v", write=(4,), input=(4,), output=(4,)) in out
    assert peek_rows(d.send(peek("q", 3)), "q") == [{"k": "a", "s": 1}]
    assert d.replica.collection("v").since == (2,)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("snapshot", "same", "view"),
    [
        (table(0, 6, [("a", 1)], t=1), True, [{"k": "a", "s": 1}]),  # our rows, and more times: a replay
        (compacted(6, 2, [("a", 1, 1)]), True, [{"k": "a", "s": 1}]),  # our row, advanced to its since
        (table(0, 6, [("b", 1)], t=1), False, [{"k": "b", "s": 1}]),  # other rows at times we hold
        (compacted(6, 2, [("a", 1, 2)]), False, [{"k": "a", "s": 2}]),
        (table(0, 4, [("a", 1)], t=1), False, [{"k": "a", "s": 1}]),  # it ends below our upper
        # Compacted to our upper: no time both hold exactly, and the difference is right for any history.
        (compacted(6, 5, [("b", 1, 1)]), True, [{"k": "b", "s": 1}]),
    ],
    ids=["replay", "compacted-replay", "other-rows", "other-diffs", "shorter", "compacted-past-our-upper"],
)
def test_reconnect_reloads_a_table_whose_snapshot_is_another_history(
    snapshot: AppendUpdates, same: bool, view: list[dict[str, Any]]
) -> None:
    # A restarted controller rebuilds its tables: one may match ours in since and upper and still hold
    # other rows, and a replica that kept its own would answer with the previous controller's.
    d = started(dataflow(), Schedule(id="v"), table(1, 3, [("a", 1)]), table(3, 5))
    before = d.replica.dataflow("v")
    d.lose()
    d.connect(2, None, snapshot, dataflow(as_of=2), Schedule(id="v"))
    assert (d.replica.dataflow("v") is before) is same
    assert d.replica.reconciliation_failures == (0 if same else 1)
    assert peek_rows(d.send(peek("q", snapshot.upper - 1)), "q") == view


def test_reconnect_rebuilds_incompatible_and_drops_unmatched_dataflows_silently() -> None:
    d = started(
        dataflow(),
        Schedule(id="v"),
        dataflow("gone", view=ViewDef(source="t")),
        Schedule(id="gone"),
        dataflow("s", view=ViewDef(source="v"), sinks=("s",)),
        Schedule(id="s"),
        table(1, 3, [("a", 1)]),
    )
    before = d.replica.dataflow("v")
    d.lose()
    changed = ViewDef(
        source="t", group_by=("k",), aggregates=(Aggregate(func="count", column=None, name="n"),)
    )
    out = d.connect(2, None, table(0, 3, [("a", 1)], t=1), dataflow(view=changed, as_of=2), Schedule(id="v"))
    assert d.replica.dataflow("v") is not before
    assert d.replica.dataflow("gone") is None and d.replica.dataflow("s") is None
    assert d.replica.reconciliation_failures == 1
    # Nothing about the dropped collections leaks to the new controller: no Frontiers, no DroppedAt.
    assert {m.id for m in out if isinstance(m, Frontiers)} == {"v"}
    assert not [m for m in out if isinstance(m, SubscribeDropped | SubscribeBatch)]
    assert peek_rows(d.send(peek("q", 2)), "q") == [{"k": "a", "n": 1}]


def test_compacted_dataflow_is_not_reused_below_its_since() -> None:
    d = started(dataflow(), Schedule(id="v"), table(1, 6), AllowCompaction(id="v", frontier=(5,)))
    before = d.replica.dataflow("v")
    d.lose()
    d.connect(2, None, table(0, 6), dataflow(as_of=3), Schedule(id="v"))
    assert d.replica.dataflow("v") is not before
    assert d.replica.reconciliation_failures == 1


def test_dataflow_over_a_rebuilt_index_is_rebuilt_too() -> None:
    over = ViewDef(source="v", group_by=("k",))
    d = started(dataflow(), Schedule(id="v"), dataflow("w", view=over), Schedule(id="w"))
    d.lose()
    changed = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="max", column="v", name="s"),))
    d.connect(
        2,
        None,
        table(0, 1),
        dataflow(view=changed),
        Schedule(id="v"),
        dataflow("w", view=over),
        Schedule(id="w"),
    )
    assert d.replica.reconciliation_failures == 2


def test_incompatible_instance_halts_and_starts_over() -> None:
    d = Driver()
    d.connect(
        1, CreateInstance(expiration_offset_ms=10), table(0, 3, [("a", 1)], t=1), dataflow(), Schedule(id="v")
    )
    before = d.replica.dataflow("v")
    d.lose()
    d.connect(
        2,
        CreateInstance(expiration_offset_ms=20),
        table(0, 3, [("a", 1)], t=1),
        dataflow(as_of=1),
        Schedule(id="v"),
    )
    assert d.replica.halts == 1
    assert d.replica.dataflow("v") is not before
    assert d.replica.instance == CreateInstance(expiration_offset_ms=20)
    assert peek_rows(d.send(peek("q", 2)), "q") == [{"k": "a", "s": 1}]


def test_lost_connection_mid_initialization_discards_the_buffer() -> None:
    d = Driver()
    d.send(CreateTimely(epoch=1), CreateInstance(), table(0, 1), dataflow())
    d.lose()
    assert d.replica.stage is Stage.DISCONNECTED
    d.connect(2, None, table(0, 1))
    assert d.replica.dataflow("v") is None
