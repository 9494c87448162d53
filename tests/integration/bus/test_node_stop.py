"""Stopping a node whose loop has already ended on its own (it saw the stop flag before the caller woke it)."""

from __future__ import annotations

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node

pytestmark = pytest.mark.integration


def _started() -> Node:
    node = Node("lonely", BusConfig(cluster_tag="it", heartbeat_interval=0.1, peer_timeout=0.8), [])
    node.start({})
    return node


def test_stop_after_the_loop_closed_its_sockets_does_not_raise() -> None:
    node = _started()
    thread = node._thread
    assert thread is not None
    # What a stop racing the loop's own poll timeout looks like: the loop reads the flag and closes every
    # socket, the wake-up socket included, before stop() sends its wake-up.
    node._stopping = True
    thread.join(5.0)
    assert not thread.is_alive()
    node.stop()
    assert node._thread is None
    assert node.error is None


def test_calls_after_the_loop_ended_name_the_node() -> None:
    node = _started()
    node._stopping = True
    assert node._thread is not None
    node._thread.join(5.0)
    with pytest.raises(RuntimeError, match="node lonely is not running"):
        node.status(timeout=1.0)
    node.stop()


def test_stop_twice_is_harmless() -> None:
    node = _started()
    node.stop()
    node.stop()
