"""The thin client's core when a call, a node or a reply goes wrong: each failure ends the calls it concerns
with a clear error, in time, and the client serves on (simulator, fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ClientConfig, Gateway, Op

from .harness import ClientSim, error_of

SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_an_argument_msgpack_cannot_carry_fails_that_call_and_the_next_one_runs(seed: int) -> None:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    sim.add_node("n1", [Gateway("n1")])
    sim.start()
    c = sim.add_client("c", ["n1:1"], ClientConfig(cluster_tag="sim"))
    queued = c.submit(sim, Op.SQL, {"sql": "SELECT ?", "parameters": [object()]})  # before the link is up
    sim.run_until(lambda: c.core.connected, limit=5)
    bad = c.submit(sim, Op.SQL, {"sql": "SELECT ?", "parameters": [np.int64(3)]})  # what pandas hands out
    for handle in (queued, bad):
        err = error_of(sim.wait(c, handle, limit=1))
        assert err.code == ErrorCode.MALFORMED and "request SQL: an argument cannot be sent" in err.message
    assert not c.core.ops and not c.core.links["n1:1"].requests
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"
