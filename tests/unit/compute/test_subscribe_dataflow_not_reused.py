"""protocol-facts 5.4 (Materialize ``server.rs::reconcile``): a dataflow of the new connection whose exports
match an old one is reused only if it is compatible, uncompacted, **subscribe-free**, and its imports are
retained. A subscribe's dataflow is built again, so the subscribe of the new connection starts at its own
``as_of`` with the snapshot there, as a new subscribe does, and not where the old connection's left off."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkbus.bus.contract import MessageReceived, PeerLost, Send
from sparkbus.roles.compute import (
    DIFF,
    TIME,
    Aggregate,
    AppendUpdates,
    ComputeReplica,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    InitializationComplete,
    Schedule,
    SubscribeBatch,
    ViewDef,
    decode_table,
    encode_table,
)
from tests.unit.compute.harness import CTL, wire

VIEW = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="sum", column="v", name="s"),))
SUB = ViewDef(source="v")


def _rows(values: list[tuple[str, int]], t: int) -> bytes:
    return encode_table(
        pa.table(
            {
                "k": pa.array([k for k, _ in values], pa.string()),
                "v": pa.array([v for _, v in values], pa.int64()),
                TIME: pa.array([t] * len(values), pa.int64()),
                DIFF: pa.array([1] * len(values), pa.int64()),
            }
        )
    )


def _table(lower: int, upper: int, values: list[tuple[str, int]], t: int) -> AppendUpdates:
    return AppendUpdates(id="t", lower=lower, upper=upper, updates=_rows(values, t))


def _flows(as_of: int) -> list[Any]:
    index = CreateDataflow(name="v", as_of=(as_of,), imports=("t",), index_exports=("v",), view=VIEW)
    sub = CreateDataflow(name="s", as_of=(as_of,), imports=("v",), sink_exports=("s",), view=SUB)
    return [index, Schedule(id="v"), sub, Schedule(id="s")]


def _send(replica: ComputeReplica, *messages: Any) -> list[Any]:
    got: list[Any] = []
    for m in messages:
        for action in replica.handle(MessageReceived(peer=CTL, message=wire(m)), 0.0):
            assert isinstance(action, Send)
            got.append(wire(action.message))
    return got


def test_a_subscribes_dataflow_is_built_again_on_a_new_connection() -> None:
    replica = ComputeReplica()
    _send(
        replica,
        CreateTimely(epoch=1),
        CreateInstance(),
        _table(0, 1, [], 0),
        *_flows(0),
        InitializationComplete(),
    )
    _send(replica, _table(1, 3, [("a", 1), ("a", 2)], 1))
    reused = replica.reconciliation_failures
    assert list(replica.handle(PeerLost(peer=CTL, reason="test"), 0.0)) == []

    # The new controller (its history reduced) subscribes again from 2, with the table up to 3.
    out = _send(
        replica,
        CreateTimely(epoch=2),
        CreateInstance(),
        _table(0, 3, [("a", 1), ("a", 2)], 1),
        *_flows(2),
        InitializationComplete(),
    )
    batches = [m for m in out if isinstance(m, SubscribeBatch) and m.id == "s"]
    assert replica.reconciliation_failures == reused + 1  # the subscribe's dataflow was not reused
    assert batches, out
    first = batches[0]
    assert first.lower == (2,) and not first.error, first
    # The snapshot at the new as_of: the sum as it stands, not nothing.
    updates = decode_table(first.updates).to_pylist()
    assert [(u["k"], u["s"], u[DIFF]) for u in updates] == [("a", 3, 1)], updates
