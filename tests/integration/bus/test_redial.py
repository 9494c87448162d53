"""A DEALER that dials a listener which never answers ZeroMQ's handshake (a stopped process's socket file,
or its listening socket) gives up within twice ``peer_timeout`` and dials again, reaching the process that
listens there now."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node

pytestmark = pytest.mark.integration


@pytest.fixture
def ipc() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="redial-", dir="/tmp")  # short: ipc paths have a length limit
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def test_a_handshake_that_is_never_answered_is_given_up_and_the_new_listener_reached(
    ipc: str, nodes: list[Node]
) -> None:
    config = BusConfig(cluster_tag="it", heartbeat_interval=0.1, peer_timeout=0.8)
    mute = []
    for name in ("p-ctl", "p-data"):  # what a stopped process leaves: its files, accepting, silent
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(f"{ipc}/{name}")
        listener.listen()
        mute.append(listener)
    try:
        t = Node("t", config, [], transport="ipc", ipc_dir=ipc)
        nodes.append(t)
        ep_p = Endpoints(control=f"ipc://{ipc}/p-ctl", data=f"ipc://{ipc}/p-data")
        t.bind()
        t.start({"p": ep_p})
        mute[0].settimeout(10)
        held, _ = mute[0].accept()  # t's DEALER is connected, and waits for a greeting that never comes
        p = Node("p", config, [], transport="ipc", ipc_dir=ipc)
        nodes.append(p)
        assert p.bind() == ep_p  # bound again over the silent files
        assert t.endpoints is not None
        p.start({"t": t.endpoints})
        # libzmq's default gives a handshake 30 s; the node's sockets give it twice peer_timeout.
        _until("p is up at t", lambda: bool(t.status()["peers"]["p"]["up"]))
        held.close()
    finally:
        for listener in mute:
            listener.close()
