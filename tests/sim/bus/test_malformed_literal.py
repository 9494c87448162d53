"""A control message whose Literal field holds an array or a map, on the real NodeCore driven by SimBus.

The decoder looked the value up in the set of the literal's values, and an array or a map is not hashable:
a TypeError escaped the node's receive path, so the peer got no answer and nothing counted the refusal. It
is now refused as MALFORMED like any other wrong field, and the link carries on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import msgpack
import pytest

from sparkbus.bus import BusConfig, PeerLost, SimBus
from sparkbus.bus import contract as c
from sparkbus.codecs import REGISTRY, message

from .roles import Recorder
from .test_sessions import do

SEEDS = [1, 2, 3, 7, 42]


@message(0x7104)
@dataclass(frozen=True, kw_only=True)
class Pick:
    op: Literal["eq", "ne"]


@dataclass
class Picker(Recorder):
    messages: ClassVar[tuple[type, ...]] = (Pick,)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("value", [["eq"], {"eq": 1}], ids=["array", "map"])
def test_a_literal_field_holding_a_container_is_refused_malformed_and_the_link_carries_on(
    seed: int, value: object
) -> None:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    a, b = Picker(), Picker()
    sim.add_node("a", [a])
    sim.add_node("b", [b])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    # b plays a hostile peer: the next control message on its own session, with a body no role could send.
    out = sim.node("b").core._outbound["a"]
    out.seq += 1
    header = msgpack.packb([1, REGISTRY.code_of(Pick), out.session, out.seq, None, 0])
    sim.send_raw("b", "a", "ctl", [header, msgpack.packb({"op": value})])
    sim.run_until_idle()
    assert sim.node("a").core.refusals["MALFORMED"] == 1
    do(sim, "b", c.Send(peer="a", message=Pick(op="ne")))
    sim.run_until_idle()
    assert [e.message for e in a.of(c.MessageReceived)] == [Pick(op="ne")]
    assert a.of(PeerLost) == [] and b.of(PeerLost) == []
