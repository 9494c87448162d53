"""Prestissimo's RetryState (protocol-facts 3.3) and the client's own doc: a source gives up only after
``max_error_duration`` WITHOUT a successful reply. A success ends the error period: a failure long after
it starts a new one and is retried, not given up at once."""

from __future__ import annotations

import random

from sparkbus.roles.exchange import BackoffPolicy, BinxClient, BinxServer, OutputBuffers
from tests.unit.exchange.harness import Pair

T, B = "q3.2.0.0", 0


def test_a_failure_long_after_a_success_is_retried_not_given_up() -> None:
    pair = Pair(
        client=BinxClient(rng=random.Random(1), max_wait=1.0, policy=BackoffPolicy(max_error_duration=5.0)),
        server=BinxServer(OutputBuffers()),
    )
    pair.connect()
    first = pair.call("fetch", task_id=T, buffer_id=B)
    pair.advance(1.0)  # UNKNOWN_BUFFER: backing off (an error period starts at 0)
    srv = pair.server
    pair.apply("srv", srv.create_buffer(T, B))
    pair.apply("srv", srv.add_pages(T, B, [b"a"], pair.now))
    pair.advance(3.0)
    assert pair.result(first)["pages"] == [b"a"]  # a success at about 1 s: the error period is over
    pair.advance(30.0)  # long polls on the open buffer, all answered in time
    second = pair.call("fetch", task_id=T, buffer_id=B)
    pair.cut()  # one failure, 30 s after the last one
    pair.connect()
    pair.apply("srv", srv.add_pages(T, B, [b"b"], pair.now))
    pair.apply("srv", srv.no_more_pages(T, B, pair.now))
    pair.advance(pair.now + 5.0)
    assert pair.result(second) == {"pages": [b"b"], "token": 1, "complete": True}
