"""Local calls the controller refuses or must check, on the real node core with fixed seeds: every call is
answered, and a refused one leaves the controller and the replicas working."""

from __future__ import annotations

import pytest

from tests.sim.compute.test_compute_sim import CTL, SCHEMA, batch, boot, call, controller, rows

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
