"""Compute messages: wire round trips, strict decoding, constructor validation."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from sparkbus.codecs import REGISTRY, DecodeError, EnvelopeCodec
from sparkbus.roles.compute import (
    Aggregate,
    AllowCompaction,
    AllowWrites,
    AppendUpdates,
    CancelPeek,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    Finishing,
    Frontiers,
    InitializationComplete,
    MapExpr,
    Peek,
    PeekResponse,
    PeekResult,
    Predicate,
    Schedule,
    SortKey,
    Status,
    SubscribeBatch,
    SubscribeDropped,
    TargetKind,
    UpdateConfiguration,
    ViewDef,
)

CODEC = EnvelopeCodec()

VIEW = ViewDef(
    source="t",
    maps=(MapExpr(name="w", op="multiply", left="v", literal=2),),
    filters=(Predicate(column="v", op="ge", value=0), Predicate(column="k", op="is_not_null")),
    project=("k", "v", "w"),
    group_by=("k",),
    aggregates=(Aggregate(func="count", column=None, name="n"), Aggregate(func="avg", column="w", name="a")),
)

SAMPLES: list[Any] = [
    CreateTimely(epoch=3, workers=2),
    CreateInstance(logging_interval_ms=1000, expiration_offset_ms=None),
    InitializationComplete(),
    AllowWrites(),
    UpdateConfiguration(max_result_size=1 << 20, workload_class="prod", dyncfg={"a": "1"}),
    CreateDataflow(
        name="v", as_of=(5,), imports=("t",), index_exports=("v",), sink_exports=("s",), view=VIEW
    ),
    Schedule(id="v"),
    AllowCompaction(id="v", frontier=(9,)),
    AllowCompaction(id="v", frontier=()),
    Peek(
        uuid="p1",
        target=TargetKind.INDEX,
        target_id="v",
        timestamp=7,
        literal_constraints=(("a",), (None,)),
        finishing=Finishing(
            order_by=(SortKey(column="n", descending=True),), limit=3, offset=1, project=("k",)
        ),
    ),
    CancelPeek(uuid="p1"),
    AppendUpdates(id="t", lower=1, upper=2, advanced=("u",), updates=b"ipc"),
    AppendUpdates(id="t", lower=0, upper=9, since=8, updates=b"ipc"),
    Frontiers(id="v", write=(8,), input=None, output=(8,)),
    PeekResponse(uuid="p1", result=PeekResult.ROWS, rows=b"ipc"),
    PeekResponse(uuid="p1", result=PeekResult.ERROR, error="boom"),
    PeekResponse(uuid="p1", result=PeekResult.CANCELED),
    SubscribeBatch(id="s", lower=(5,), upper=(6,), updates=b"ipc"),
    SubscribeBatch(id="s", lower=(5,), upper=(), error="result exceeds max size of 10 bytes"),
    SubscribeDropped(id="s", at=(6,)),
    Status(detail="ok"),
    Status(detail="CreateTimely from ctl: epoch 1 <= seen 2", refused_epoch=1),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Any) -> None:
    assert CODEC.decode(CODEC.encode(msg)).message == msg


def test_codes_are_in_the_compute_range() -> None:
    for msg in SAMPLES:
        assert 0x0300 <= REGISTRY.code_of(type(msg)) <= 0x03FF


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: CreateTimely(epoch=-1), "epoch"),
        (lambda: CreateTimely(epoch=1, workers=0), "workers"),
        (
            lambda: CreateDataflow(name="v", as_of=(), imports=("t",), index_exports=("v",), view=VIEW),
            "as_of",
        ),
        (
            lambda: CreateDataflow(name="v", as_of=(1, 2), imports=("t",), index_exports=("v",), view=VIEW),
            "as_of",
        ),
        (
            lambda: CreateDataflow(name="v", as_of=(1,), imports=("u",), index_exports=("v",), view=VIEW),
            "imports",
        ),
        (lambda: CreateDataflow(name="v", as_of=(1,), imports=("t",), view=VIEW), "exports nothing"),
        (
            lambda: CreateDataflow(
                name="v", as_of=(1,), imports=("t",), index_exports=("v",), sink_exports=("v",), view=VIEW
            ),
            "unique",
        ),
        (
            lambda: CreateDataflow(name="v", as_of=(1,), imports=("t",), index_exports=("t",), view=VIEW),
            "own export",
        ),
        (lambda: AllowCompaction(id="v", frontier=(-1,)), "frontier"),
        (
            lambda: Peek(
                uuid="p", target=TargetKind.INDEX, target_id="v", timestamp=1, literal_constraints=()
            ),
            "never",
        ),
        (lambda: Peek(uuid="", target=TargetKind.INDEX, target_id="v", timestamp=1), "uuid"),
        (lambda: Peek(uuid="p", target=1, target_id="v", timestamp=1), "TargetKind"),  # type: ignore[arg-type]
        (
            lambda: Peek(
                uuid="p",
                target=TargetKind.INDEX,
                target_id="v",
                timestamp=1,
                finishing={"limit": 1},  # type: ignore[arg-type]
            ),
            "must be a Finishing",
        ),
        (lambda: Peek(uuid="p", target=TargetKind.INDEX, target_id="v", timestamp=-3), "timestamp"),
        (lambda: Frontiers(id="v"), "has_updates"),
        (lambda: PeekResponse(uuid="p", result=PeekResult.ROWS), "rows"),
        (lambda: PeekResponse(uuid="p", result=PeekResult.ERROR), "error"),
        (lambda: PeekResponse(uuid="p", result=PeekResult.CANCELED, rows=b"x"), "rows"),
        (lambda: SubscribeBatch(id="s", lower=(5,), upper=(5,), updates=b"x"), "empty"),
        (lambda: SubscribeBatch(id="s", lower=(), upper=(5,), updates=b"x"), "empty"),
        (lambda: SubscribeBatch(id="s", lower=(1,), upper=(5,)), "exactly one"),
        (lambda: AppendUpdates(id="t", lower=3, upper=2, updates=b"x"), "below lower"),
        (lambda: AppendUpdates(id="t", lower=1, upper=2, updates=b""), "Arrow IPC"),
        (lambda: AppendUpdates(id="t", lower=0, upper=2, since=2, updates=b"x"), "not below upper"),
        (lambda: AppendUpdates(id="t", lower=0, upper=2, since=-1, updates=b"x"), "since"),
        (lambda: AppendUpdates(id="t", lower=0, upper=2**63, updates=b"x"), "from 0 to 2"),
        (lambda: UpdateConfiguration(max_result_size=0), "max_result_size"),
        (lambda: Status(refused_epoch=-1), "refused_epoch"),
        (lambda: ViewDef(source="t", project=()), "project"),
        (lambda: ViewDef(source="t", group_by=("k", "k")), "twice"),
        (
            lambda: ViewDef(
                source="t", group_by=("n",), aggregates=(Aggregate(func="count", column=None, name="n"),)
            ),
            "collide",
        ),
        (lambda: Aggregate(func="sum", column=None, name="s"), "needs a column"),
        (lambda: Aggregate(func="sum", column="__time", name="s"), "reserved"),
        (lambda: Predicate(column="v", op="eq"), "value is required"),
        (lambda: Predicate(column="v", op="is_null", value=1), "None"),
        (lambda: MapExpr(name="w", op="add", left="v"), "exactly one"),
        (lambda: MapExpr(name="w", op="add", left="v", right="u", literal=1), "exactly one"),
        (lambda: Finishing(limit=-1), "limit"),
        (lambda: Finishing(offset=-1), "offset"),
        # Arrow slices by int64: a bigger limit or offset would fail in the replica, after the peek was taken.
        (lambda: Finishing(limit=2**63), "limit"),
        (lambda: Finishing(offset=2**63), "offset"),
    ],
)
def test_constructors_refuse_bad_values(build: Any, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        build()


def test_decoding_names_the_bad_field() -> None:
    frames = CODEC.encode(AllowCompaction(id="v", frontier=(3,)))
    frames[1] = msgpack.packb({"id": "v", "frontier": [1, 2]})
    with pytest.raises(DecodeError, match="frontier"):
        CODEC.decode(frames)
    frames[1] = msgpack.packb({"id": "v", "frontier": ["x"]})
    with pytest.raises(DecodeError, match="frontier"):
        CODEC.decode(frames)
    frames[1] = msgpack.packb({"id": "v", "frontier": [1], "extra": 1})
    with pytest.raises(DecodeError, match="extra"):
        CODEC.decode(frames)


def test_peek_with_empty_constraints_is_refused_on_the_wire() -> None:
    frames = CODEC.encode(
        Peek(uuid="p", target=TargetKind.INDEX, target_id="v", timestamp=1, literal_constraints=((1,),))
    )
    body = msgpack.unpackb(frames[1])
    body["literal_constraints"] = []
    frames[1] = msgpack.packb(body)
    with pytest.raises(DecodeError, match="literal_constraints"):
        CODEC.decode(frames)


def test_update_configuration_merges_and_none_keeps_previous() -> None:
    a = UpdateConfiguration(max_result_size=10, workload_class="x", dyncfg={"a": "1", "b": "2"})
    b = UpdateConfiguration(max_result_size=None, workload_class="y", dyncfg={"b": "3"})
    merged = a.update(b)
    assert merged == UpdateConfiguration(max_result_size=10, workload_class="y", dyncfg={"a": "1", "b": "3"})
    assert UpdateConfiguration().all_unset()
    assert not merged.all_unset()


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        (CreateInstance(), CreateInstance(), True),
        (CreateInstance(logging_interval_ms=1), CreateInstance(logging_interval_ms=2), False),
        (CreateInstance(expiration_offset_ms=10), CreateInstance(expiration_offset_ms=5), True),
        (CreateInstance(expiration_offset_ms=5), CreateInstance(expiration_offset_ms=10), False),
        # No offset is the empty antichain, the top: switching expiration on strengthens it, off does not.
        (CreateInstance(expiration_offset_ms=None), CreateInstance(expiration_offset_ms=10), True),
        (CreateInstance(expiration_offset_ms=10), CreateInstance(expiration_offset_ms=None), False),
        (CreateInstance(expiration_offset_ms=None), CreateInstance(expiration_offset_ms=None), True),
    ],
)
def test_instance_compatibility_compares_expiration_offsets_as_antichains(
    old: CreateInstance, new: CreateInstance, ok: bool
) -> None:
    assert old.compatible_with(new) is ok
