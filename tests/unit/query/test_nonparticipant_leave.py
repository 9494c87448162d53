"""Mustang check loop (protocol-facts 1.2, ``tryCancelOnMemberLeave``): the initiator cancels a query on
the loss of one of ITS participants. A peer that takes no part in the query leaving changes nothing."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.roles.query.role import QueryRole


def test_the_loss_of_a_peer_outside_the_query_leaves_it_running() -> None:
    role = QueryRole("i", incarnation="x")
    for p in ("p1", "p9"):
        role.handle(c.PeerUp(peer=p), 0.0)
    role.handle(
        c.LocalCall(call_id=1, name="execute", args={"sql": "SELECT x FROM t", "participants": ["p1"]}), 0.0
    )
    (qid,) = role.queries
    acts = role.handle(c.PeerLost(peer="p9", reason="heartbeat"), 0.1)
    assert not any(isinstance(a, c.Reply) for a in acts), acts
    assert qid in role.queries and role.calls == {1: qid}
    # Losing the participant does end it, with MEMBER_LEAVE.
    acts = role.handle(c.PeerLost(peer="p1", reason="heartbeat"), 0.2)
    (reply,) = [a for a in acts if isinstance(a, c.Reply)]
    assert reply.error is not None and "p1 left" in reply.error and role.queries == {}
