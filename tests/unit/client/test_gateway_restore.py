"""RESTORE is taken only as the first message of a session: one refused (connection unknown) leaves the
session not fresh, so a session cannot try one connection id after another."""

from __future__ import annotations

from sparkbus.bus import ErrorCode
from sparkbus.bus import contract as c
from sparkbus.roles.client.gateway import Gateway
from sparkbus.roles.client.messages import Restore, RestoreRefused

OWNER, OTHER = "client:01", "client:02"


def restore(gw: Gateway, peer: str, connection_id: str) -> RestoreRefused:
    out = list(gw.handle(c.MessageReceived(peer=peer, message=Restore(connection_id=connection_id)), 0.0))
    refused = [a.message for a in out if isinstance(a, c.Send) and isinstance(a.message, RestoreRefused)]
    assert len(out) == len(refused) == 1, f"RESTORE {connection_id[:8]}... answered {out}"
    return refused[0]


def test_a_restore_after_a_refused_one_is_refused_out_of_state() -> None:
    gw = Gateway("n1")
    for peer, cid in ((OWNER, "a" * 32), (OTHER, "b" * 32)):
        assert list(gw.handle(c.PeerUp(peer=peer, connection_id=cid), 0.0)) == []
    assert restore(gw, OTHER, "0" * 32).code == ErrorCode.RESOURCE_NOT_FOUND  # a guess: unknown
    assert restore(gw, OTHER, "a" * 32).code == ErrorCode.OUT_OF_STATE  # not the first message any more
    assert gw.contexts["a" * 32].peer == OWNER and gw.by_peer[OWNER] == "a" * 32
    assert gw.counters["restored"] == 0 and gw.counters["restore_refused"] == 2
