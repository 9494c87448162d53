"""``sparkbus up`` of two echo nodes over ``transport = "ipc"``: the socket files a node killed with SIGKILL
leaves behind are removed, by the launcher watching it or by the next ``up`` of the file; a live node's never.
Each node's own ipc directory is under /tmp (bus.node); every one a test sees is removed at its end."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbus.topologies.launcher import state_file

from .test_up import READY_TIMEOUT, Up, wait_gone
from .test_up_guards import TWO, running

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))  # state_file() here finds the launchers' state
    return {**os.environ, "COLUMNS": "200"}


@pytest.fixture
def seen() -> Iterator[set[Path]]:
    """The nodes' ipc directories a test saw, removed at its end whatever it found."""
    dirs: set[Path] = set()
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def ipc_topology(tmp_path: Path) -> Path:
    path = tmp_path / "ipc.toml"
    path.write_text(TWO.format(bus='[bus]\ntransport = "ipc"').replace('name = "two"', 'name = "ipc"'))
    return path


def recorded(path: Path, seen: set[Path]) -> dict[str, tuple[int, Path]]:
    """Node -> (pid, its ipc directory), from the state file of ``sparkbus up path``."""
    state = json.loads(state_file(path).read_text())
    nodes = {}
    for node, info in state["nodes"].items():
        assert info["control"].startswith("ipc://"), info
        directory = Path(info["control"].removeprefix("ipc://")).parent
        seen.add(directory)
        nodes[node] = (int(info["pid"]), directory)
    return nodes


def test_the_launcher_removes_the_ipc_directory_of_a_node_killed(
    tmp_path: Path, env: dict[str, str], seen: set[Path]
) -> None:
    path = ipc_topology(tmp_path)
    with running(env, path) as up:
        nodes = recorded(path, seen)
        assert all(d.is_dir() for _, d in nodes.values())
        os.kill(nodes["a-1"][0], signal.SIGKILL)
        code, out = up.finish()
    assert code == 1 and "node a-1" in out and "SIGKILL" in out, out
    assert [d for _, d in nodes.values() if d.exists()] == []


def test_the_next_up_removes_the_ipc_directories_of_nodes_gone_and_keeps_live_ones(
    tmp_path: Path, env: dict[str, str], seen: set[Path]
) -> None:
    path = ipc_topology(tmp_path)
    first = Up(env, str(path))
    try:
        first.wait_for("state:", READY_TIMEOUT + 10)
        nodes = recorded(path, seen)
        # A crash of all: the launcher held (so it cannot clean up after its nodes), the nodes killed, then
        # the launcher. Holding the nodes instead does not work: once the launcher dies, the kernel sends
        # each held node of its orphaned process group SIGHUP and SIGCONT, and a node that stops on SIGHUP
        # removes its directory before a SIGKILL sent after reaches it.
        os.kill(first.proc.pid, signal.SIGSTOP)
        for pid, _ in nodes.values():
            os.kill(pid, signal.SIGKILL)
        first.kill()
        assert wait_gone([pid for pid, _ in nodes.values()]) == []
    finally:
        first.kill()
    left = sorted(d for _, d in nodes.values() if d.is_dir())
    assert left == sorted(d for _, d in nodes.values()), "the crash left no ipc directory to remove"

    # The stale state file also names a node of a live process: its ipc directory stays.
    live = Path(f"/tmp/sparkbus-ipc-live-{os.getpid()}")
    seen.add(live)
    live.mkdir()
    (live / "z-ctl").touch()
    stale = json.loads(state_file(path).read_text())
    stale["nodes"]["z"] = {
        "pid": os.getpid(),
        "status": "tcp://127.0.0.1:9",
        "control": f"ipc://{live}/z-ctl",
    }
    state_file(path).write_text(json.dumps(stale))

    with running(env, path) as second:
        assert [d for d in left if d.exists()] == []
        assert (live / "z-ctl").exists()
        again = recorded(path, seen)
        assert all(d.is_dir() for _, d in again.values())  # the running nodes' own
        second.proc.send_signal(signal.SIGTERM)
        code, out = second.finish()
    assert code == 0, out
    assert "removed the ipc sockets left by a-0, a-1" in out, out
