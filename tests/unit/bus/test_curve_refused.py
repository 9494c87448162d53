"""A peer whose CURVE handshake refused us is listed under ``refused`` until a handshake with it succeeds.

Driven through ``Node._on_monitor`` with the monitor events of the peer's DEALER. On real sockets libzmq
4.3 never dials an endpoint again after a handshake failure of either kind (it ends the connecting
session on a protocol error), so the node dials a refused peer again itself, backing off (test below;
with real nodes: tests/integration/security/test_curve.py).
"""

from __future__ import annotations

import logging
import struct

import pytest
import zmq

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node
from sparkbus.bus.refusals import REDIAL_FIRST, REDIAL_MAX, CurveRefusals


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
    return node._refusals.snapshot()[1]


def test_a_handshake_that_succeeds_after_a_refusal_ends_it(caplog: pytest.LogCaptureFixture) -> None:
    node = Node("a", BusConfig(cluster_tag="u"), [])
    refused = {"b": "CURVE: b refused our key (ZAP status 400)"}
    assert _refused(node, (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)) == refused
    assert _refused(node, (zmq.EVENT_DISCONNECTED, 0)) == refused
    with caplog.at_level(logging.INFO, logger="sparkbus.bus"):
        assert _refused(node, (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)) == {}
    assert "node a: CURVE: b admits our key now" in caplog.text
    assert node._refusals.snapshot()[0] == {"curve_refused_by_peer": 1}  # it happened: still counted
    protocol = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x11000001)
    assert _refused(node, protocol) == {"b": "CURVE handshake with b failed (protocol error 0x11000001)"}
    assert _refused(node, (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)) == {}
    assert node._refusals.snapshot()[0] == {"curve_refused_by_peer": 2}


def test_a_refused_peer_is_dialled_again_backing_off_until_it_admits_us() -> None:
    refusals = CurveRefusals("a")
    now, waits = 100.0, []
    refusals.refused_by("b", zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, now)
    for _ in range(8):
        assert refusals.due(now) == []
        wait = 0.0
        while not refusals.due(now + wait):
            wait += 0.25
        waits.append(wait)
        assert refusals.due(now + wait) == []  # due once per refusal, not on every turn after
        now += wait
        refusals.refused_by("b", zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, now)  # refused again
    assert waits == [REDIAL_FIRST, 2.0, 4.0, 8.0, 16.0, REDIAL_MAX, REDIAL_MAX, REDIAL_MAX]
    refusals.admitted("b")
    assert refusals.due(now + 3600) == [] and refusals.snapshot()[1] == {}
    refusals.refused_by("b", zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, now)  # a later refusal starts over
    assert refusals.due(now + REDIAL_FIRST) == ["b"]
