"""Local calls the controller refuses or must check, on the real node core with fixed seeds: every call is
answered, and a refused one leaves the controller and the replicas working."""

from __future__ import annotations

import pytest

from sparkbus.roles.compute import Aggregate, MapExpr, Predicate, UpdateConfiguration, ViewDef
from tests.sim.compute.test_compute_sim import (
    CTL,
    EXPECTED,
    ORDERED,
    SCHEMA,
    SUM,
    batch,
    boot,
    call,
    controller,
    rows,
)

SEEDS = [1, 7]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["", 5])
def test_a_refused_table_name_is_answered_and_later_calls_are_too(seed: int, name: object) -> None:
    sim = boot(seed, replicas=("r1",))
    bad = sim.call("ctl", CTL, "create_table", {"name": name, "schema": SCHEMA})
    sim.run_until_idle()
    refused = sim.reply(bad)
    assert refused is not None and refused.error is not None and "non-empty str" in refused.error
    call(sim, "write", table="t", batch=batch(("q", 1)))
    assert {"k": "q", "n": 1, "s": 1} in rows(call(sim, "peek", view="v"))
    assert list(controller(sim).tables) == ["t"]


TOTAL = ViewDef(source="t", aggregates=(Aggregate(func="sum", column="v", name="total"),))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_recreated_view_gets_an_id_no_other_view_has_even_one_named_like_a_generated_id(seed: int) -> None:
    sim = boot(seed, replicas=("r1",))  # view v has id v
    call(sim, "drop_view", name="v")
    ctl = controller(sim)
    taken = f"v.{ctl._counter + 2}"  # the id v would get after one more view is created
    assert call(sim, "create_view", name=taken, view=TOTAL)["id"] == taken
    again = call(sim, "create_view", name="v", view=SUM)["id"]
    assert again not in ("v", taken)
    assert sorted(ctl.views.values()) == sorted([taken, again])
    assert rows(call(sim, "peek", view="v", finishing=ORDERED)) == EXPECTED
    assert rows(call(sim, "peek", view=taken)) == [{"total": 12}]
    call(sim, "drop_view", name=taken)  # drops its own index only
    assert rows(call(sim, "peek", view="v", finishing=ORDERED)) == EXPECTED


@pytest.mark.parametrize("seed", SEEDS)
def test_a_subscribe_ends_at_its_first_error_batch(seed: int) -> None:
    """A batch beyond max_result_size becomes an error for its span: those updates are lost, so no later
    batch may follow it (the subscriber's collection would lack them without a word)."""
    sim = boot(seed, config=UpdateConfiguration(max_result_size=1200))
    sub = call(sim, "subscribe", view="v")
    call(sim, "write", table="t", batch=batch(*[(f"key{i}", i) for i in range(200)]))  # too large
    call(sim, "write", table="t", batch=batch(("a", 1)))
    sim.run_until_idle()
    got = call(sim, "fetch", id=sub["id"])
    errors = [i for i, b in enumerate(got["batches"]) if b[3] is not None]
    assert errors == [len(got["batches"]) - 1], got["batches"]
    lower, upper, _, error = got["batches"][-1]
    assert "exceeds max size" in error and lower == upper == got["upper"]
    assert got["dropped_at"] == (got["upper"],)
    assert sub["id"] not in controller(sim).collections
    sim.run_until_idle()
    assert call(sim, "fetch", id=sub["id"])["batches"] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("view", "needle"),
    [
        (ViewDef(source="t", filters=(Predicate(column="v", op="lt", value=2**63),)), "does not fit"),
        (ViewDef(source="t", maps=(MapExpr(name="v", op="add", left="v", literal=1),)), "repeats the name"),
    ],
    ids=["literal-beyond-int64", "map-named-like-a-column"],
)
def test_a_view_that_cannot_be_computed_is_refused_when_it_is_created(
    seed: int, view: ViewDef, needle: str
) -> None:
    sim = boot(seed, replicas=("r1",))
    cid = sim.call("ctl", CTL, "create_view", {"name": "bad", "view": view})
    sim.run_until_idle()
    done = sim.reply(cid)
    assert done is not None and done.error is not None and needle in done.error, done
    assert "bad" not in controller(sim).views
    call(sim, "write", table="t", batch=batch(("q", 1)))
    assert {"k": "q", "n": 1, "s": 1} in rows(call(sim, "peek", view="v"))
