"""A node whose endpoints for two peers are swapped (a stale table, ports another node took after both
restarted) reaches the wrong node under each name, with fixed seeds.

The rule under test (docs/PROTOCOL.md section 4): a WELCOME whose ``node_id`` is not the peer the DEALER
dials opens nothing and names no owner. Taken, it crossed the links (a's messages for c reached b) or made
the answering node's process the owner of the peer's node id (the real peer was then refused
``DUPLICATE_NODE`` and hung up for good). The attempt ends, it is logged and counted, and the handshake is
retried: once the endpoints are right, the links come up.
"""

from __future__ import annotations

import logging

import pytest

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c
from sparkbus.codecs import Buffer

from .roles import Note, Recorder

SEEDS = [1, 2, 3, 7, 42, 99, 123, 2024]


class SwappedBus(SimBus):
    """A simulator in which ``a`` dials c's sockets for ``b`` and b's for ``c`` while ``swapped`` holds: what
    a sends towards one reaches the other (from routing id "a"), and the answers come back on the DEALER
    that sent the HELLO, as ZeroMQ's pipes carry them."""

    swapped = True
    _OTHER = {"b": "c", "c": "b"}

    def send_raw(self, src: str, dst: str, channel: str, frames: list[Buffer]) -> None:
        if self.swapped and src == "a" and dst in self._OTHER and channel in ("ctl", "data"):
            dst = self._OTHER[dst]
        elif self.swapped and dst == "a" and src in self._OTHER and channel == "reply":
            src = self._OTHER[src]  # delivered as an answer on a's DEALER for the other name
        super().send_raw(src, dst, channel, frames)


def swapped(seed: int) -> tuple[SwappedBus, dict[str, Recorder]]:
    sim = SwappedBus(seed=seed, config=BusConfig(cluster_tag="t"))
    recs = {n: Recorder() for n in "abc"}
    for name, rec in recs.items():
        sim.add_node(name, [rec])
    sim.node("a").core.peer_addresses.update({"b": "tcp://10.0.0.3:7000", "c": "tcp://10.0.0.2:7000"})
    sim.start()
    return sim, recs


@pytest.mark.parametrize("seed", SEEDS)
def test_a_welcome_from_another_node_opens_nothing_and_the_link_comes_up_once_the_endpoint_is_right(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    sim, recs = swapped(seed)
    ca, cb, cc = (sim.node(n).core for n in "abc")
    with caplog.at_level(logging.WARNING, logger="sparkbus.bus"):
        sim.run_for(5.0)  # a handshake_timeout (1 s) between a's HELLOs to each: four or five of them
    for peer, other, where in (("b", "c", "10.0.0.3"), ("c", "b", "10.0.0.2")):
        out = ca._outbound[peer]
        assert out.state != "established" and out.session == 0, f"a's link to {peer} opened by {other}"
        assert ca._peers[peer].owner == 0, f"{other}'s process taken for the owner of node id {peer!r}"
        text = f"the endpoint of {peer!r} (tcp://{where}:7000) is answered by node {other!r}"
        assert ca.status()["misdirected"][peer] == text
        assert any(text in r.getMessage() for r in caplog.records)
    assert not ca.peers_up() and ca.refused() == {}
    assert ca.counters["welcomes_from_other_nodes"] >= 8
    assert cb.refused() == {} and cc.refused() == {} and not cb.refusals and not cc.refusals
    assert cb.is_up("c") and cc.is_up("b")
    # The endpoints are put right: the retried handshakes reach the real peers, and nothing is crossed.
    sim.swapped = False
    sim.run_until(sim.all_up, limit=10)
    assert ca.status()["misdirected"] == {}
    for peer in "bc":
        sim.call("a", "rec", "send", {"actions": [c.Send(peer=peer, message=Note(text=f"for {peer}"))]})
    sim.run_until(lambda: all(recs[p].of(c.MessageReceived) for p in "bc"), limit=5)
    for peer in "bc":
        got = [(e.peer, e.message) for e in recs[peer].of(c.MessageReceived)]  # type: ignore[attr-defined]
        assert got == [("a", Note(text=f"for {peer}"))]
    for core in (ca, cb, cc):
        assert core.refused() == {} and core.refusals.get("DUPLICATE_NODE", 0) == 0
