"""Presto's HTTP exchange (protocol-facts 3.3): "GET .../{token}/acknowledge: explicit ack. Acks are
best-effort and their failures are ignored". ``HttpExchangeClient.acknowledge`` against a server that is
gone returns; it raises nothing."""

from __future__ import annotations

import socket

import pytest

from sparkbus.bus.http_fetch import HttpExchangeClient

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


def test_an_acknowledge_that_cannot_reach_its_server_is_ignored() -> None:
    with HttpExchangeClient("127.0.0.1", _closed_port(), timeout=2.0) as client:
        client.acknowledge("q1.1.0.0", 0, 3)  # refused connection: ignored
        client.acknowledge("q1.1.0.0", 0, 4)  # and again, on a client that closed its connection
