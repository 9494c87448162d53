"""Presto's HTTP exchange (protocol-facts 3.3): ``X-Presto-Buffer-Remaining-Bytes`` is the comma-separated
sizes of the pages available next, and "a single ``0`` means none". A Presto client parses the header as a
list of numbers, so a buffer with nothing next must answer ``0``, never an empty value."""

from __future__ import annotations

import pytest

from sparkbus.roles.exchange import OutputBuffers

from .http_stub import ask, publish, serving

pytestmark = pytest.mark.integration

T = "q7.1.0.0"


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_nothing_available_next_is_a_single_zero(method: str) -> None:
    with serving(OutputBuffers(instance_id="inst-1")) as server:
        publish(server, T, [])
        answer = ask(server, method, T, 0)  # open and empty
        assert answer.status == (204 if method == "GET" else 200)
        assert answer.headers["x-presto-buffer-remaining-bytes"] == "0"
        publish(server, T, [b"abc", b"defgh"])
        answer = ask(server, method, T, 0)
    assert answer.status == 200
    if method == "HEAD":
        assert answer.headers["x-presto-buffer-remaining-bytes"] == "3,5"
    else:  # both pages taken: none left after them
        assert answer.headers["x-presto-buffer-remaining-bytes"] == "0"
