"""Presto's HTTP exchange (protocol-facts 3.3): "Any other status is treated as retryable", with the back-off
of ``RetryState`` until ``exchange.max-error-duration``; the http.client role backs off on 503 (the server is
overloaded, or its node busy) as on 404 (roles/exchange/http_client.py). A 503 does not fail the source: the
request is sent again after a delay, and its pages are delivered."""

from __future__ import annotations

import random

from sparkbus.roles.exchange import ErrorCode, HttpClient
from tests.unit.exchange.test_http_roles import KEY, Driver


def test_an_overloaded_server_is_asked_again_after_a_delay() -> None:
    d = Driver(HttpClient(rng=random.Random(1)))
    _, fetch = d.call("fetch", KEY)
    [job] = d.jobs
    d.answer(job, 1.0, error="HTTP 503: 64 parked requests", code=int(ErrorCode.OVERLOADED))
    assert fetch not in d.replies, d.replies  # not failed
    assert not d.jobs and any(key.startswith("retry/") for key in d.timers), d.timers
    at = d.fire_next()
    assert at >= 1.0
    [again] = d.jobs
    assert again.token == 0
    d.answer(again, at, pages=(b"p0",), token=0, next_token=1, complete=False, instance_id="i")
    reply = d.replies[fetch]
    assert reply.error is None and reply.result["pages"] == [b"p0"], reply
    assert not [k for k in d.timers if k.startswith("retry/")]
