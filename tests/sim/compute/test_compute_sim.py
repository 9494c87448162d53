"""The compute roles on the real node core, driven by SimBus with fixed seeds.

Covers the races the issue names: a reconnect with compatible and with incompatible dataflows, CancelPeek
racing the answer, two replicas where either answers first, and a replica that fails mid-peek; and replicas
cut off or restarted while their table is compacted past what they hold.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus import SimBus
from sparkbus.bus.contract import Action, Event, LocalCall, Reply
from sparkbus.roles.compute import (
    TARGET_FAILED,
    Aggregate,
    ComputeController,
    ComputeReplica,
    Finishing,
    SortKey,
    Stage,
    UpdateConfiguration,
    ViewDef,
    decode_table,
    encode_table,
    make_controller,
)

SEEDS = [1, 2, 3, 7, 42]
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
SUM = ViewDef(
    source="t",
    group_by=("k",),
    aggregates=(Aggregate(func="count", column=None, name="n"), Aggregate(func="sum", column="v", name="s")),
)
MAX = ViewDef(source="t", group_by=("k",), aggregates=(Aggregate(func="max", column="v", name="s"),))
ORDERED = Finishing(order_by=(SortKey(column="k"),))
CTL = "compute.controller"


def batch(*values: tuple[str, int]) -> bytes:
    return encode_table(pa.table({"k": [k for k, _ in values], "v": [v for _, v in values]}, schema=SCHEMA))


WRITES = [batch(("a", 1), ("b", 2)), batch(("a", 3)), batch(("c", 5), ("b", 1))]


def boot(
    seed: int,
    replicas: tuple[str, ...] = ("r1", "r2"),
    config: UpdateConfiguration | None = None,
    kind: type[ComputeController] = ComputeController,
) -> SimBus:
    sim = SimBus(seed=seed)
    sim.add_node("ctl", [kind(replicas=replicas, config=config)])
    for r in replicas:
        sim.add_node(r, [ComputeReplica()])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    call(sim, "create_table", name="t", schema=SCHEMA)
    for data in WRITES:
        call(sim, "write", table="t", batch=data)
    call(sim, "create_view", name="v", view=SUM)
    return sim


def call(sim: SimBus, call_name: str, /, **args: Any) -> Any:
    return sim.result(sim.call("ctl", CTL, call_name, args), limit=10)


def rows(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = decode_table(data).to_pylist()
    return out


def replica(sim: SimBus, name: str) -> ComputeReplica:
    role = sim.node(name).roles["compute.replica"]
    assert isinstance(role, ComputeReplica)
    return role


def controller(sim: SimBus) -> ComputeController:
    role = sim.node("ctl").roles[CTL]
    assert isinstance(role, ComputeController)
    return role


EXPECTED = [{"k": "a", "n": 2, "s": 4}, {"k": "b", "n": 2, "s": 3}, {"k": "c", "n": 1, "s": 5}]


@pytest.mark.parametrize("seed", SEEDS)
def test_either_replica_may_answer_first_and_exactly_one_answer_counts(seed: int) -> None:
    sim = boot(seed)
    for _ in range(5):
        assert rows(call(sim, "peek", view="v", finishing=ORDERED)) == EXPECTED
    sim.run_until_idle()
    assert controller(sim).peeks == {}
    assert all(not replica(sim, r).peeks for r in ("r1", "r2"))


@pytest.mark.parametrize("seed", SEEDS)
def test_cancel_peek_races_the_answer(seed: int) -> None:
    sim = boot(seed)
    cid = sim.call("ctl", CTL, "peek", {"view": "v"})
    sim.run_for(0.0005 * (seed % 4))  # cancel before, while, or after the replicas answer
    sim.call("ctl", CTL, "cancel_peek", {"call_id": cid[1]})
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None
    assert done.error is None or "canceled" in done.error
    assert controller(sim).peeks == {}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("back", [True, False], ids=["healed", "gone"])
def test_a_canceled_peek_is_answered_even_if_the_link_breaks_before_the_replica_answers(
    seed: int, back: bool
) -> None:
    """The rehydrated replica replays a history without the canceled peek, so it would never answer it."""
    sim = boot(seed, replicas=("r1",))
    sim.run_until_idle()
    cid = sim.call("ctl", CTL, "peek", {"view": "v", "timestamp": 50})  # waits for a time that never comes
    sim.run_for(0.0005 * (seed % 3))
    sim.call("ctl", CTL, "cancel_peek", {"call_id": cid[1]})
    sim.run_for(0.0005 * (seed % 2))  # the Peek, the CancelPeek or the Canceled answer is lost with the link
    sim.cut("ctl", "r1")
    if back:
        sim.heal("ctl", "r1")
        sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None and done.error is not None and "canceled" in done.error
    assert controller(sim).peeks == {}  # nor does it hold back compaction
    assert not replica(sim, "r1").peeks or not back


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_failing_mid_peek_leaves_the_other_to_answer(seed: int) -> None:
    sim = boot(seed)
    cid = sim.call("ctl", CTL, "peek", {"view": "v", "finishing": ORDERED})
    sim.crash("r1")
    assert rows(sim.result(cid)) == EXPECTED
    targeted = sim.call("ctl", CTL, "peek", {"view": "v", "target_replica": "r2", "timestamp": 99})
    sim.run_for(0.01)
    sim.crash("r2")
    sim.run_until(lambda: sim.reply(targeted) is not None, limit=10)
    done = sim.reply(targeted)
    assert done is not None and done.error == TARGET_FAILED


@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_whose_diff_has_nulls_is_refused_and_later_writes_are_seen(seed: int) -> None:
    """The replicas refuse an update without a diff; had the controller taken such a write, the table would
    have stopped there for them, and with it every view."""
    sim = boot(seed)
    sim.run_until_idle()
    bad = pa.table(
        {"k": ["a", "z"], "v": [1, 2], "__diff": pa.array([1, None], pa.int64())},
        schema=pa.schema([*SCHEMA, ("__diff", pa.int64())]),
    )
    cid = sim.call("ctl", CTL, "write", {"table": "t", "batch": encode_table(bad)})
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None and done.error is not None and "__diff has nulls" in done.error
    call(sim, "write", table="t", batch=batch(("d", 7)))
    for r in ("r1", "r2"):
        got = rows(call(sim, "peek", view="v", target_replica=r, finishing=ORDERED))
        assert got == [*EXPECTED, {"k": "d", "n": 1, "s": 7}]
        assert not replica(sim, r).refused


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        (pa.schema([("a", pa.int64()), ("a", pa.int64())]), "distinct"),
        (pa.schema([("a", pa.list_(pa.int64()))]), "Keys of type list"),
    ],
    ids=["repeated-name", "list-column"],
)
def test_a_table_the_replicas_cannot_hold_is_refused_and_the_other_tables_go_on(
    seed: int, schema: pa.Schema, needle: str
) -> None:
    """The replicas refuse such a table's appends; had the controller created it, every later append of
    another table (which lists it as advanced) would have been refused with it, and every view stopped."""
    sim = boot(seed)
    sim.run_until_idle()
    cid = sim.call("ctl", CTL, "create_table", {"name": "d", "schema": schema})
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None and done.error is not None and needle in done.error
    call(sim, "write", table="t", batch=batch(("d", 7)))
    for r in ("r1", "r2"):
        got = rows(call(sim, "peek", view="v", target_replica=r, finishing=ORDERED))
        assert got == [*EXPECTED, {"k": "d", "n": 1, "s": 7}]
        assert "d" not in replica(sim, r).tables and not replica(sim, r).refused


@pytest.mark.parametrize("seed", SEEDS)
def test_a_peek_whose_finishing_is_no_finishing_is_answered_and_leaves_no_trace(seed: int) -> None:
    """A plain map (a thin client's form) used to be broadcast as it was: no replica could decode the Peek,
    so it was never answered, and it stayed in the history, holding back the compaction of its view."""
    sim = boot(seed)
    sim.run_until_idle()
    cid = sim.call("ctl", CTL, "peek", {"view": "v", "finishing": {"limit": 1}})
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None and done.error is not None and "must be a Finishing" in done.error
    ctl = controller(sim)
    assert ctl.peeks == {} and not any(type(c).__name__ == "Peek" for c in ctl.history)
    assert rows(call(sim, "peek", view="v", finishing=ORDERED)) == EXPECTED


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restarted_replica_is_rehydrated_with_a_new_epoch(seed: int) -> None:
    sim = boot(seed)
    sim.crash("r1")
    call(sim, "write", table="t", batch=batch(("d", 7)))
    sim.restart("r1", [ComputeReplica()])
    sim.run_until(sim.all_up, limit=10)
    sim.run_until_idle()
    assert replica(sim, "r1").epoch == 2
    got = rows(call(sim, "peek", view="v", target_replica="r1", finishing=ORDERED))
    assert got == [*EXPECTED, {"k": "d", "n": 1, "s": 7}]


@pytest.mark.parametrize("seed", SEEDS)
def test_reconnect_with_compatible_dataflows_reuses_them(seed: int) -> None:
    sim = boot(seed)
    sim.run_until_idle()
    before = replica(sim, "r1").dataflow("v")
    sim.cut("ctl", "r1")
    call(sim, "write", table="t", batch=batch(("a", 10)))
    sim.heal("ctl", "r1")
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    r1 = replica(sim, "r1")
    assert r1.dataflow("v") is before and r1.reconciliation_failures == 0 and r1.epoch == 2
    got = rows(call(sim, "peek", view="v", target_replica="r1", finishing=ORDERED))
    assert got[0] == {"k": "a", "n": 3, "s": 14}


def restarted_controller(view: ViewDef, generation: int = 1) -> ComputeController:
    """A new controller process (generation 1) that rebuilt the same tables and a view named ``v``."""
    ctl = ComputeController(replicas=("r1", "r2"), generation=generation)
    calls = [("create_table", {"name": "t", "schema": SCHEMA})]
    calls += [("write", {"table": "t", "batch": data}) for data in WRITES]
    calls += [("create_view", {"name": "v", "view": view})]
    for i, (name, args) in enumerate(calls):
        list(ctl.handle(LocalCall(call_id=i, name=name, args=args), 0.0))
    return ctl


def replies_of(ctl: ComputeController) -> dict[int, Reply]:
    """The replies ``ctl`` gives, by call id, as it gives them. SimBus keeps a crashed node's replies under
    the call ids its restart hands out again, so ``SimBus.reply`` cannot tell a restarted controller's."""
    replies: dict[int, Reply] = {}
    handle = ctl.handle

    def spy(event: Event, now: float) -> list[Action]:
        out = list(handle(event, now))
        replies.update((a.call_id, a) for a in out if isinstance(a, Reply))
        return out

    ctl.handle = spy  # type: ignore[method-assign]
    return replies


def answer(sim: SimBus, replies: dict[int, Reply], call_name: str, /, **args: Any) -> Reply:
    """Call the restarted controller and run until it answers (``replies`` from ``replies_of``)."""
    _, cid = sim.call("ctl", CTL, call_name, args)
    sim.run_until(lambda: cid in replies, limit=10)
    return replies[cid]


class _Topology:
    """What ``make_controller`` reads of a topology."""

    cluster = SimpleNamespace(name="sim")

    def hosting(self, role: str) -> list[str]:
        return ["r1", "r2"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kept", [True, False], ids=["data-dir", "clock"])
def test_a_controller_restarted_by_its_factory_drives_the_replicas_again(
    seed: int, kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node builds its controller with ``make_controller``, whose generation must beat its predecessor's,
    or the replicas refuse its epochs. With a data directory a kept counter does it, even for restarts in
    the same second; without one the clock does (the first controller here has generation 0)."""
    monkeypatch.delenv("SPARKBUS_DATA_DIR", raising=False)
    ctx = SimpleNamespace(
        topology=_Topology(), node_id="ctl", data_dir=str(tmp_path) if kept else None, started_at=time.time()
    )
    sim = boot(seed)
    sim.run_until_idle()
    epochs = {r: replica(sim, r).epoch for r in ("r1", "r2")}
    for _ in range(2 if kept else 1):
        sim.crash("ctl")
        ctl = make_controller(ctx)
        replies = replies_of(ctl)
        sim.restart("ctl", [ctl])
        sim.run_until(sim.all_up, limit=30)
        sim.run_until_idle()
        for r in ("r1", "r2"):
            assert replica(sim, r).stage is Stage.READ_WRITE
            assert replica(sim, r).epoch > epochs[r]
            epochs[r] = replica(sim, r).epoch
        assert answer(sim, replies, "create_table", name="t", schema=SCHEMA).error is None
        for data in WRITES:
            assert answer(sim, replies, "write", table="t", batch=data).error is None
        assert answer(sim, replies, "create_view", name="v", view=SUM).error is None
        done = answer(sim, replies, "peek", view="v", finishing=ORDERED)
        assert done.error is None and rows(done.result) == EXPECTED


@pytest.mark.parametrize("seed", SEEDS)
def test_a_controller_whose_epoch_the_replicas_refuse_is_told_and_its_peeks_answered(seed: int) -> None:
    """A controller of an earlier generation than one the replicas have served: they refuse it with a
    Status, and its peeks are answered with the refusal instead of waiting for ever."""
    sim = boot(seed)
    sim.run_until_idle()
    sim.crash("ctl")
    sim.restart("ctl", [restarted_controller(SUM)])  # generation 1
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    sim.crash("ctl")
    stale = restarted_controller(SUM, generation=0)
    replies = replies_of(stale)
    sim.restart("ctl", [stale])
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    for r in ("r1", "r2"):
        assert replica(sim, r).stage is Stage.DISCONNECTED and replica(sim, r).epoch == (1 << 32) + 1
        link = stale.links[r]
        assert link.stage is Stage.DISCONNECTED and link.refused is not None and "<= seen" in link.refused
    done = answer(sim, replies, "peek", view="v")
    assert done.error is not None and "every replica refused this controller's epoch" in done.error
    assert stale.peeks == {}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("same", [True, False], ids=["compatible", "incompatible"])
def test_reconnect_to_a_new_controller_reconciles_dataflows(seed: int, same: bool) -> None:
    sim = boot(seed)
    sim.run_until_idle()
    before = {r: replica(sim, r).dataflow("v") for r in ("r1", "r2")}
    sim.crash("ctl")
    sim.restart("ctl", [restarted_controller(SUM if same else MAX)])
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    for r in ("r1", "r2"):
        rep = replica(sim, r)
        assert (rep.dataflow("v") is before[r]) is same
        assert rep.reconciliation_failures == (0 if same else 1)
        assert rep.epoch == (1 << 32) + 1
    # Read the replicas' arrangements directly: SimBus keeps the crashed controller's replies under the
    # call ids a restarted node hands out again, so a new call's reply cannot be told from an old one.
    expected = EXPECTED if same else [{"k": "a", "s": 3}, {"k": "b", "s": 2}, {"k": "c", "s": 5}]
    for r in ("r1", "r2"):
        view = replica(sim, r).collection("v")
        assert view is not None
        got = view.read_at(len(WRITES)).sort_by("k").to_pylist()
        assert got == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_a_new_controllers_view_may_take_the_name_of_a_table_it_does_not_have(seed: int) -> None:
    """Reconciliation used to keep a previous controller's tables: a restarted controller's view named like
    one of them was refused ("export id 't' is already in use") and every peek on it failed."""
    sim = boot(seed, replicas=("r1",))  # table "t", view "v" over it
    sim.run_until_idle()
    sim.crash("ctl")
    ctl = ComputeController(replicas=("r1",), generation=1)
    calls = [("create_table", {"name": "u", "schema": SCHEMA})]
    calls += [("write", {"table": "u", "batch": data}) for data in WRITES]
    calls += [("create_view", {"name": "t", "view": dataclasses.replace(SUM, source="u")})]
    for i, (name, args) in enumerate(calls):
        list(ctl.handle(LocalCall(call_id=i, name=name, args=args), 0.0))
    replies = replies_of(ctl)
    sim.restart("ctl", [ctl])
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    r1 = replica(sim, "r1")
    assert sorted(r1.tables) == ["u"] and r1.dataflow("v") is None
    done = answer(sim, replies, "peek", view="t", timestamp=len(WRITES), finishing=ORDERED)
    assert done.error is None and rows(done.result) == EXPECTED


@pytest.mark.parametrize("seed", SEEDS)
def test_compute_parameters_are_the_connections_own(seed: int) -> None:
    """A reconnecting controller gets its parameters back from its reduced history; a restarted one that
    sets none is not held to its predecessor's max_result_size (its peeks used to fail on it)."""
    config = UpdateConfiguration(max_result_size=64)
    sim = boot(seed, config=config)
    sim.cut("ctl", "r1")
    sim.heal("ctl", "r1")
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    assert replica(sim, "r1").epoch == 2 and replica(sim, "r1").config == config
    with pytest.raises(RuntimeError, match="exceeds max size of 64 bytes"):
        call(sim, "peek", view="v", target_replica="r1")
    sim.crash("ctl")
    ctl = restarted_controller(SUM)  # generation 1, no parameters
    replies = replies_of(ctl)
    sim.restart("ctl", [ctl])
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    for r in ("r1", "r2"):
        assert replica(sim, r).config == UpdateConfiguration()
        done = answer(sim, replies, "peek", view="v", target_replica=r, finishing=ORDERED)
        assert done.error is None and rows(done.result) == EXPECTED


@pytest.mark.parametrize("seed", SEEDS)
def test_no_response_is_ever_sent_for_a_discarded_peek(seed: int) -> None:
    sim = boot(seed, replicas=("r1",))
    sim.run_until_idle()
    sim.call("ctl", CTL, "peek", {"view": "v", "timestamp": 50})
    sim.run_until_idle()
    assert replica(sim, "r1").peeks
    sim.crash("ctl")
    sim.restart("ctl", [restarted_controller(SUM)])
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    assert not replica(sim, "r1").peeks


@pytest.mark.parametrize("seed", range(12))
def test_replicas_away_while_the_table_is_compacted_come_back_with_exactly_its_rows(seed: int) -> None:
    """Upserts into a compacted table while replicas are cut off, crash and restart at random: once healed,
    every replica's table and view hold exactly the controller's rows, nothing lost and nothing twice."""
    rng = random.Random(seed)
    sim = SimBus(seed=seed)
    sim.add_node("ctl", [ComputeController(replicas=("r1", "r2"))])
    for r in ("r1", "r2"):
        sim.add_node(r, [ComputeReplica()])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    call(sim, "create_table", name="u", schema=SCHEMA, key=["k"])
    call(sim, "create_view", name="uv", view=dataclasses.replace(SUM, source="u"))
    truth: dict[str, int] = {}
    away: set[str] = set()
    for _ in range(25):
        r = rng.choice(("r1", "r2"))
        roll = rng.random()
        if roll < 0.15 and r not in away:
            sim.cut("ctl", r)
            away.add(r)
        elif roll < 0.25 and r in away:
            sim.heal("ctl", r)
            away.discard(r)
        elif roll < 0.3:
            sim.crash(r)
            sim.restart(r, [ComputeReplica()])
            if r in away:  # a restarted node's links are whole again
                away.discard(r)
        rows_ = [(rng.choice("abcdef"), rng.randrange(100)) for _ in range(rng.randrange(1, 4))]
        call(sim, "write", table="u", batch=batch(*rows_))
        truth.update(rows_)
        sim.run_until_idle()  # the replicas in reach keep up
    for r in away:
        sim.heal("ctl", r)
    sim.run_until(sim.all_up, limit=30)
    sim.run_until_idle()
    ctl = controller(sim)
    last = ctl.upper - 1
    assert ctl._table_data["u"].since == (last,)
    table_rows = sorted(truth.items())
    view_rows = [{"k": k, "n": 1, "s": v} for k, v in table_rows]
    for r in ("r1", "r2"):
        rep = replica(sim, r)
        got = rep.tables["u"].read_at(last).sort_by("k").to_pylist()
        assert [(row["k"], row["v"]) for row in got] == table_rows
        view = rep.collection(ctl.views["uv"])
        assert view is not None
        assert view.read_at(last).sort_by("k").to_pylist() == view_rows
