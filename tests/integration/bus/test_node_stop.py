"""Stopping a node: whose loop has already ended on its own (it saw the stop flag before the caller woke it),
or with calls still queued for its loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
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


@dataclass
class Blocker:
    """Holds the loop inside its timer until ``release`` is set (a role busy while the node stops)."""

    name: str = "blk"
    messages: ClassVar[tuple[type, ...]] = ()
    inside: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            timer = [c.SetTimer(key="hold", at=now)] if event.name == "hold" else []
            return [*timer, c.Reply(call_id=event.call_id, result=event.name)]
        if isinstance(event, c.TimerFired):
            self.inside.set()
            self.release.wait(10)
        return []


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_calls_queued_for_the_loop_while_it_ends_fail_naming_the_node() -> None:
    """A call or a status request that reaches the loop's queue in its last turn is never run: it fails
    "node ... stopped" (it used to wait for ever, or for its whole timeout)."""
    role = Blocker()
    node = Node("lonely", BusConfig(cluster_tag="it"), [role])
    node.start({})
    assert node.call("blk", "hold", timeout=5) == "hold"
    assert role.inside.wait(5)  # the loop is in the role, past this turn's reading of its queue
    call = node.call_async("blk", "ping")
    with ThreadPoolExecutor(2) as pool:
        status = pool.submit(node.status, timeout=10.0)
        _until(lambda: node._commands.qsize() == 2, "the status request was not queued")
        stopper = pool.submit(node.stop)
        _until(lambda: node._stopping, "stop() did not set its flag")
        role.release.set()  # the loop ends its turn, and then itself
        stopper.result(timeout=10)
        for fut in (call, status):
            with pytest.raises(RuntimeError, match="node lonely stopped"):
                fut.result(timeout=5)
    assert node.error is None
