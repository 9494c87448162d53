"""Crashes the fuzzers found, kept as plain tests."""

from __future__ import annotations

import pytest

from sparkbus.bus import contract as c
from sparkbus.topologies.echo import MAX_WINDOW_BATCHES, EchoRole, StreamRequest


@pytest.mark.parametrize(
    ("batch_size", "credit"),
    [(1, 2**64 - 1), (2**40, 2**40), (1, MAX_WINDOW_BATCHES + 1)],
)
def test_echo_refuses_a_stream_request_it_could_not_serve_in_bounded_memory(
    batch_size: int, credit: int
) -> None:
    """Found by test_roles: StreamRequest(batch_size=1, credit=2**64-1) made one pump loop for ever."""
    with pytest.raises(ValueError, match="StreamRequest needs"):
        StreamRequest(request_id=1, batches=2**63, batch_size=batch_size, credit=credit)


def test_echo_never_sends_beyond_the_window_it_was_asked_for() -> None:
    """A peer granting 2**64 bytes of credit gets at most the accepted window per pump."""
    role = EchoRole(node_id="a")
    role.handle(c.PeerUp(peer="b"), 0.0)
    req = StreamRequest(request_id=1, batches=10**9, batch_size=1024, credit=4096)
    first = list(role.handle(c.MessageReceived(peer="b", message=req), 0.0))
    assert sum(isinstance(a, c.SendBatch) for a in first) == 4
    more = list(role.handle(c.CreditChanged(peer="b", stream="echo/b/1", credit=2**64), 0.0))
    assert sum(isinstance(a, c.SendBatch) for a in more) == 4
