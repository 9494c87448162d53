"""A peer whose CURVE handshake refused us is listed under ``refused`` until a handshake with it succeeds.

Driven through ``Node._on_monitor`` with the monitor events of the peer's DEALER. On real sockets libzmq
4.3 never dials an endpoint again after a handshake failure of either kind (it ends the connecting
session on a protocol error), so a success after a refusal needs a DEALER that dials again; the entry
must not outlive the refusal whatever the library does.
"""

from __future__ import annotations

import logging
import struct

import pytest
import zmq

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node


class Monitor:
    """A DEALER's monitor socket holding ``events`` (event, value) for ``Node._on_monitor`` to read."""

    def __init__(self, *events: tuple[int, int]) -> None:
        self.frames = [[struct.pack("=hi", event, value), b"tcp://127.0.0.1:5555"] for event, value in events]

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


def _refused(node: Node, *events: tuple[int, int]) -> dict[str, str]:
    node._on_monitor(Monitor(*events), "b")  # type: ignore[arg-type]
    return dict(node._refused_by_peer)


def test_a_handshake_that_succeeds_after_a_refusal_ends_it(caplog: pytest.LogCaptureFixture) -> None:
    node = Node("a", BusConfig(cluster_tag="u"), [])
    refused = {"b": "CURVE: b refused our key (ZAP status 400)"}
    assert _refused(node, (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)) == refused
    assert _refused(node, (zmq.EVENT_DISCONNECTED, 0)) == refused
    with caplog.at_level(logging.INFO, logger="sparkbus.bus"):
        assert _refused(node, (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)) == {}
    assert "node a: CURVE: b admits our key now" in caplog.text
    assert node._security_refusals == {"curve_refused_by_peer": 1}  # it happened: still counted
    protocol = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x11000001)
    assert _refused(node, protocol) == {"b": "CURVE handshake with b failed (protocol error 0x11000001)"}
    assert _refused(node, (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)) == {}
    assert node._security_refusals == {"curve_refused_by_peer": 2}
