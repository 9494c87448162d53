"""Property: replaying the reduced history builds what replaying the full history builds.

A controller is driven through random operations (tables written, views created over tables and over views,
views dropped, peeks now and in the future, cancels) with one live replica. Then two fresh replicas get,
respectively, every update and command the controller ever issued, and the table as the controller holds it
(compacted) with the reduced history. Every
live view must read the same at every readable time, and every live peek must get the same answer.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sparkbus.bus.contract import MessageReceived, Send
from sparkbus.roles.compute import (
    Aggregate,
    AppendUpdates,
    CommandHistory,
    ComputeCommand,
    ComputeReplica,
    CreateInstance,
    CreateTimely,
    Peek,
    PeekResponse,
    Predicate,
    ViewDef,
    decode_table,
    encode_table,
)
from sparkbus.roles.compute.arrangement import update_schema

from .harness import CTL, Cluster, ipc, wire

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
VIEWS = [
    ViewDef(
        source="t",
        group_by=("k",),
        aggregates=(
            Aggregate(func="count", column=None, name="n"),
            Aggregate(func="sum", column="v", name="s"),
            Aggregate(func="min", column="v", name="lo"),
            Aggregate(func="max", column="v", name="hi"),
        ),
    ),
    ViewDef(source="t", filters=(Predicate(column="v", op="gt", value=3),)),
    ViewDef(source="t", aggregates=(Aggregate(func="avg", column="v", name="a"),)),
]


class Recording(CommandHistory):
    """A history that also keeps every command ever pushed."""

    def __init__(self, commands: Any) -> None:
        super().__init__(commands)
        self.log: list[ComputeCommand] = list(commands)

    def push(self, command: ComputeCommand) -> None:
        self.log.append(command)
        super().push(command)


def replay(commands: list[Any]) -> tuple[ComputeReplica, list[Any]]:
    replica = ComputeReplica()
    out: list[Any] = []
    for m in commands:
        for action in replica.handle(MessageReceived(peer=CTL, message=wire(m)), 0.0):
            assert isinstance(action, Send)
            out.append(action.message)
    return replica, out


def answers(out: list[Any], uuids: set[str]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for m in out:
        if isinstance(m, PeekResponse) and m.uuid in uuids:
            assert m.uuid not in got, f"peek {m.uuid} answered twice"
            rows = sorted(map(repr, decode_table(m.rows).to_pylist())) if m.rows else None
            got[m.uuid] = (m.result, m.error, rows)
    return got


op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from("abc"), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("view"), st.integers(0, len(VIEWS) - 1), st.booleans()),
    st.tuples(st.just("drop"), st.integers(0, 5)),
    st.tuples(st.just("peek"), st.integers(0, 5), st.sampled_from([0, 0, 1, 2, 40])),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
)


@settings(max_examples=40)
@given(ops=st.lists(op, min_size=3, max_size=40), lag=st.integers(0, 2), first=st.integers(0, len(VIEWS) - 1))
def test_reduced_history_builds_the_same_views_and_answers(ops: list[Any], lag: int, first: int) -> None:
    c = Cluster(("r1",), compaction_lag=lag)
    c.controller.history = Recording(c.controller.history.commands)
    c.up("r1")
    c.do("create_table", name="t", schema=SCHEMA)
    present: list[tuple[str, int]] = []
    c.do("create_view", name="first", view=VIEWS[first])
    names: list[str] = ["first"]
    peeks: list[int] = []
    for i, o in enumerate(ops):
        if o[0] == "write":
            _, k, v, retract = o
            if retract and present:
                k, v = present.pop(v % len(present))
                data = pa.table(
                    {"k": [k], "v": [v], "__diff": [-1]}, schema=SCHEMA.append(pa.field("__diff", pa.int64()))
                )
            else:
                present.append((k, v))
                data = pa.table({"k": [k], "v": [v]}, schema=SCHEMA)
            c.call("write", table="t", batch=ipc(data))
        elif o[0] == "view":
            _, which, over_view = o
            view = VIEWS[which]
            if over_view and names:
                view = ViewDef(source=names[-1])
            name = f"v{i}"
            c.call("create_view", name=name, view=view)
            names.append(name)
        elif o[0] == "drop" and names:
            c.call("drop_view", name=names[o[1] % len(names)])  # refused while another view reads it
            names = [n for n in names if n in c.controller.views]
        elif o[0] == "peek" and names:
            _, which, ahead = o
            peeks.append(
                c.call("peek", view=names[which % len(names)], timestamp=c.controller.upper - 1 + ahead)
            )
        elif o[0] == "cancel" and peeks:
            c.call("cancel_peek", call_id=peeks[o[1] % len(peeks)])
        c.run()
        history = c.controller.history
        assert len(history) <= 2 * max(history.reduced_count, 1)

    ctl = c.controller
    assert isinstance(ctl.history, Recording)
    full = list(ctl.history.log)
    reduced = CommandHistory(full)
    reduced.reduce()
    assert len(reduced) <= len(full)
    again = CommandHistory(reduced.commands)
    again.reduce()
    assert again.commands == reduced.commands  # reduce() is a fixpoint

    # The reduced history goes with the table as the controller holds it now, compacted; the full history
    # starts from time 0, so it goes with every update the table ever had.
    written = [decode_table(m.updates) for src, _, m in c.sent if src == CTL and isinstance(m, AppendUpdates)]
    whole = AppendUpdates(id="t", lower=0, upper=ctl.upper, updates=encode_table(pa.concat_tables(written)))
    head_full = [CreateTimely(epoch=1), CreateInstance(), whole]
    head_reduced = [CreateTimely(epoch=1), CreateInstance(), ctl._snapshot("t")]
    # Close the tables' frontier far ahead so every pending peek can be answered.
    later = ctl.upper + 50
    empty = encode_table(update_schema(SCHEMA).empty_table())
    tail = [AppendUpdates(id="t", lower=ctl.upper, upper=later, updates=empty)]
    body_full = [m for m in full if not isinstance(m, CreateTimely | CreateInstance)]
    body_reduced = [m for m in reduced if not isinstance(m, CreateTimely | CreateInstance)]
    a, out_a = replay([*head_full, *body_full, *tail])
    b, out_b = replay([*head_reduced, *body_reduced, *tail])

    for view_id in (cid for cid, coll in ctl.collections.items() if not coll.subscribe):
        arr_a, arr_b = a.collection(view_id), b.collection(view_id)
        assert arr_a is not None and arr_b is not None
        since = max(arr_a.since[0], arr_b.since[0])
        for t in range(since, ctl.upper):
            assert sorted(map(repr, arr_a.read_at(t).to_pylist())) == sorted(
                map(repr, arr_b.read_at(t).to_pylist())
            )
    live = {m.uuid for m in reduced if isinstance(m, Peek)}
    event(f"live views: {min(len(ctl.views), 3)}, live peeks: {min(len(live), 2)}")
    event(f"reduced to less than half: {len(reduced) < len(full) / 2}")
    got_a, got_b = answers(out_a, live), answers(out_b, live)
    assert got_a == got_b
    assert set(got_b) == live
