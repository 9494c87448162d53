"""The ipc sockets a state file's nodes left behind: removed for a node whose process is gone, kept for a live
one and for any socket something still listens on."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbus.topologies.launcher import remove_stale_ipc

from .test_status import a_gone_pid, start_time

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory under /tmp (a unix socket's path holds at most 107 bytes)."""
    made = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def left_behind(path: Path) -> Path:
    """A unix socket file nothing listens on any more, as a node killed with SIGKILL leaves it."""
    path.parent.mkdir(exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    return path


def endpoints(directory: Path, node: str) -> dict[str, str]:
    return {"control": f"ipc://{directory}/{node}-ctl", "data": f"ipc://{directory}/{node}-data"}


def test_only_the_sockets_of_nodes_gone_are_removed(base: Path) -> None:
    gone, me = a_gone_pid(), os.getpid()
    own, live_own, shared = base / "sparkbus-ipc-a", base / "sparkbus-ipc-l", base / "shared"
    for directory, node in ((own, "a"), (live_own, "l"), (shared, "b")):
        left_behind(directory / f"{node}-ctl")
        left_behind(directory / f"{node}-data")
    other = left_behind(shared / "c-ctl")  # another node's, in a bus.ipc_dir nodes share
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(shared / "d-ctl"))  # bound again since, by a process of another cluster
    listening.listen()
    nodes = {
        "a": {"pid": gone, "started": "1", **endpoints(own, "a")},
        "b": {"pid": gone, **endpoints(shared, "b")},
        "d": {"pid": gone, "control": f"ipc://{shared}/d-ctl"},
        "l": {"pid": me, "started": start_time(me), **endpoints(live_own, "l")},
        "t": {"pid": gone, "status": "tcp://127.0.0.1:9", "control": "tcp://127.0.0.1:9"},
    }
    state = base / "up-x.json"
    state.write_text(json.dumps({"launcher_pid": gone, "nodes": nodes}))
    try:
        assert remove_stale_ipc(state) == ["a", "b"]
    finally:
        listening.close()
    assert not own.exists()
    assert sorted(p.name for p in shared.iterdir()) == ["c-ctl", "d-ctl"] and other.exists()
    assert sorted(p.name for p in live_own.iterdir()) == ["l-ctl", "l-data"]


@pytest.mark.parametrize("text", ["", "{", '{"nodes": 3}', '{"nodes": {"a": {"pid": "x"}}}', "[]"])
def test_a_state_file_that_is_not_ours_removes_nothing(base: Path, text: str) -> None:
    state = base / "up-x.json"
    state.write_text(text)
    assert remove_stale_ipc(state) == []
    assert remove_stale_ipc(base / "none.json") == []
