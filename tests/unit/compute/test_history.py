"""The reducible command history: reduce() exactly as protocol-facts 5.3."""

from __future__ import annotations

import pytest

from sparkbus.bus.contract import LocalProtocolError
from sparkbus.roles.compute import (
    AllowCompaction,
    AllowWrites,
    CancelPeek,
    CommandHistory,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    InitializationComplete,
    Peek,
    Schedule,
    TargetKind,
    UpdateConfiguration,
    ViewDef,
)


def flow(
    name: str,
    as_of: int,
    *,
    source: str = "t",
    sinks: tuple[str, ...] = (),
    indexes: tuple[str, ...] | None = None,
) -> CreateDataflow:
    return CreateDataflow(
        name=name,
        as_of=(as_of,),
        imports=(source,),
        index_exports=(name,) if indexes is None else indexes,
        sink_exports=sinks,
        view=ViewDef(source=source),
    )


def peek(uuid: str, target: str = "v", t: int = 5) -> Peek:
    return Peek(uuid=uuid, target=TargetKind.INDEX, target_id=target, timestamp=t)


def names(history: CommandHistory) -> list[str]:
    return [type(c).__name__ for c in history]


def test_reduce_emits_the_fixed_order() -> None:
    h = CommandHistory(
        [
            AllowWrites(),
            InitializationComplete(),
            peek("p1"),
            AllowCompaction(id="v", frontier=(7,)),
            AllowCompaction(id="w", frontier=(3,)),
            Schedule(id="v"),
            flow("v", 2),
            UpdateConfiguration(max_result_size=5),
            CreateInstance(),
            CreateTimely(epoch=1),
            flow("w", 1, indexes=("w", "w2")),
        ]
    )
    h.reduce()
    assert names(h) == [
        "CreateTimely",
        "CreateInstance",
        "UpdateConfiguration",
        "CreateDataflow",
        "CreateDataflow",
        "Schedule",
        "Peek",
        "AllowCompaction",
        "InitializationComplete",
        "AllowWrites",
    ]
    # v's compaction is absorbed into its as_of; w has two exports, only one compacted: as_of = the meet.
    assert [c.as_of for c in h if isinstance(c, CreateDataflow)] == [(7,), (1,)]
    assert [c for c in h if isinstance(c, AllowCompaction)] == [AllowCompaction(id="w", frontier=(3,))]


def test_configuration_merges_and_all_unset_is_not_emitted() -> None:
    h = CommandHistory(
        [
            UpdateConfiguration(max_result_size=5, dyncfg={"a": "1"}),
            UpdateConfiguration(workload_class="x"),
            UpdateConfiguration(max_result_size=None, dyncfg={"a": "2"}),
        ]
    )
    h.reduce()
    assert list(h) == [UpdateConfiguration(max_result_size=5, workload_class="x", dyncfg={"a": "2"})]
    h = CommandHistory([UpdateConfiguration(), UpdateConfiguration()])
    h.reduce()
    assert list(h) == []


def test_empty_frontier_drops_the_dataflow_and_its_schedules() -> None:
    h = CommandHistory(
        [
            flow("v", 1),
            Schedule(id="v"),
            flow("w", 1, source="v"),
            Schedule(id="w"),
            AllowCompaction(id="v", frontier=()),
        ]
    )
    h.reduce()
    assert [c.name for c in h if isinstance(c, CreateDataflow)] == ["w"]
    assert [c for c in h if isinstance(c, Schedule)] == [Schedule(id="w")]
    assert not any(isinstance(c, AllowCompaction) for c in h)


def test_partly_dropped_dataflow_keeps_its_drop_command() -> None:
    h = CommandHistory([flow("v", 1, indexes=("a", "b")), AllowCompaction(id="a", frontier=())])
    h.reduce()
    assert [c.as_of for c in h if isinstance(c, CreateDataflow)] == [(1,)]
    assert [c for c in h if isinstance(c, AllowCompaction)] == [AllowCompaction(id="a", frontier=())]


def test_last_compaction_per_id_wins_and_never_regresses_the_as_of() -> None:
    h = CommandHistory(
        [flow("v", 5), AllowCompaction(id="v", frontier=(9,)), AllowCompaction(id="v", frontier=(12,))]
    )
    h.reduce()
    assert list(h) == [flow("v", 12)]
    h = CommandHistory([flow("v", 5), AllowCompaction(id="v", frontier=(2,))])
    h.reduce()
    assert next(c for c in h if isinstance(c, CreateDataflow)).as_of == (5,)


def test_peeks_cancel_out_and_compaction_follows_them() -> None:
    h = CommandHistory(
        [
            flow("v", 1),
            peek("p1"),
            peek("p2"),
            CancelPeek(uuid="p1"),
            CancelPeek(uuid="nope"),
            AllowCompaction(id="x", frontier=(4,)),
        ]
    )
    h.reduce()
    assert names(h) == ["CreateDataflow", "Peek", "AllowCompaction"]
    assert next(c for c in h if isinstance(c, Peek)).uuid == "p2"


def test_discard_peeks_removes_peeks_and_cancels() -> None:
    h = CommandHistory([flow("v", 1), peek("p1"), CancelPeek(uuid="p1"), peek("p2")])
    h.discard_peeks()
    assert names(h) == ["CreateDataflow"]


def test_duplicate_creation_commands_are_a_local_error() -> None:
    h = CommandHistory([CreateTimely(epoch=1), CreateTimely(epoch=2)])
    with pytest.raises(LocalProtocolError, match="CreateTimely"):
        h.reduce()
    h = CommandHistory([CreateInstance(), CreateInstance()])
    with pytest.raises(LocalProtocolError, match="CreateInstance"):
        h.reduce()


def test_push_reduces_when_the_history_doubles() -> None:
    h = CommandHistory()
    h.push(CreateTimely(epoch=1))  # reduced_count starts at 0: the first push reduces
    assert h.reduced_count == 1
    h.push(CreateInstance())
    assert len(h) == 2 and h.reduced_count == 1
    h.push(flow("v", 1))  # 3 > 2 * 1: reduces
    assert h.reduced_count == 3
    for t in range(2, 40):
        h.push(AllowCompaction(id="v", frontier=(t,)))
        assert len(h) <= 2 * h.reduced_count
    h.reduce()
    assert list(h) == [CreateTimely(epoch=1), CreateInstance(), flow("v", 39)]


def test_reduce_is_idempotent() -> None:
    h = CommandHistory(
        [
            CreateTimely(epoch=1),
            CreateInstance(),
            flow("v", 1, indexes=("v", "v2")),
            AllowCompaction(id="v", frontier=(4,)),
            peek("p"),
        ]
    )
    h.reduce()
    once = h.commands
    h.reduce()
    assert h.commands == once
