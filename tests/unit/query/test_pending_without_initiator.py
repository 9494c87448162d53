"""Mustang check loop (protocol-facts 1.2, ``tryCancelOnMemberLeave``): a participant checks its
initiator; a state whose initiator is missing is cancelled. A batch for a query of an initiator that is
not up (it left before its start reached us) must not leave a PENDING state waiting for ever."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.messages import QueryId, stream_key
from sparkbus.roles.query.role import QueryRole

QID = QueryId(member="i", local="x.1")


def test_a_pending_query_of_an_initiator_that_is_not_up_is_released_by_the_check() -> None:
    role = QueryRole("p1", config=QueryConfig(check_period=0.5), incarnation="x")
    role.handle(c.PeerUp(peer="p2"), 0.0)  # the initiator "i" is not up
    role.handle(
        c.BatchReceived(
            peer="p2", stream=stream_key(QID, 1), ordinal=0, last=False, data=b"", size=0, remaining=9
        ),
        1.0,
    )
    assert QID in role.queries
    acts = role.handle(c.TimerFired(key="check"), 1.5)
    assert role.queries == {}, "the PENDING state of a missing initiator is kept"
    assert not any(isinstance(a, c.Send) for a in acts), acts  # nobody to ask
    assert c.CloseStream(peer="p2", stream=stream_key(QID, 1)) in acts
