"""docs/PROTOCOL.md, BYE (0x0006): "Orderly close: the receiver reports the peer lost at once". A node that
stops says BYE on every established direction; its peer reports it lost on that message, not after
``peer_timeout`` of silence, and not never while the socket stays connected."""

from __future__ import annotations

import pytest

from sparkbus.bus import PeerLost
from sparkbus.bus.state import Transmit
from tests.sim.bus.roles import pair


@pytest.mark.parametrize("seed", [1, 7])
def test_a_bye_reports_its_sender_lost_at_once(seed: int) -> None:
    sim, a, _b = pair(seed)
    assert not a.of(PeerLost)
    core = sim.node("b").core
    core.stop(sim.now)
    sent = core.take()
    byes = [o for o in sent if isinstance(o, Transmit) and o.channel == "ctl" and o.to == "a"]
    assert len(byes) == 1, sent
    sim.send_raw("b", "a", "ctl", byes[0].frames)
    # Well inside the peer timeout: only the BYE can have ended the link.
    sim.run_for(sim.node("a").core.config.peer_timeout / 10)
    lost = a.of(PeerLost)
    assert [e.peer for e in lost] == ["b"], lost
    assert "goodbye" in lost[0].reason and "node stopping" in lost[0].reason
