"""``sparkbus up processes.toml`` as a real command: ready, status, SIGTERM, a node killed. Loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbus.topologies import shipped
from sparkbus.topologies.launcher import process_gone

pytestmark = pytest.mark.integration

READY_TIMEOUT = 30.0


def alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not reaped, does not): as ``sparkbus status`` tells."""
    return process_gone(pid, None) is None


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def cli(
    env: dict[str, str], *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """One ``sparkbus`` command, killed if it outlives ``timeout`` (a launcher's nodes stop with it)."""
    return subprocess.run(
        [sys.executable, "-m", "sparkbus.topologies.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


class Up:
    """A running ``sparkbus up`` (of ``processes.toml`` unless ``topology`` says) and its output, line by line."""

    def __init__(self, env: dict[str, str], topology: str | None = None) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sparkbus.topologies.cli",
                "up",
                topology or str(shipped("processes.toml")),
                "--skip-unavailable",
                "--timeout",
                str(READY_TIMEOUT),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"sparkbus up ended before {text!r}:\n{''.join(self.output)}")
            self.output.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} within {timeout}s:\n{''.join(self.output)}")

    def finish(self, timeout: float = 20.0) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        while True:
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            self.output.append(line)
        return code, "".join(self.output)

    def kill(self) -> None:
        """SIGKILL its process group if it still runs (its nodes stop when their stdin closes), reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def node_pids(self) -> dict[str, int]:
        files = list(Path(self.env["XDG_RUNTIME_DIR"]).glob("sparkbus-*/up-processes-*.json"))
        assert len(files) == 1, files
        state = json.loads(files[0].read_text())
        return {node: int(info["pid"]) for node, info in state["nodes"].items()}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    (tmp_path / "tmp").mkdir()  # the nodes' temporary files (their replicas: no $SPARKBUS_DATA_DIR)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    env.pop("SPARKBUS_DATA_DIR", None)
    running = Up(env)
    try:
        yield running
    finally:
        running.kill()


def test_up_reaches_ready_answers_status_and_stops_on_sigterm(up: Up) -> None:
    up.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
    up.wait_for("state:", 10)
    pids = up.node_pids()
    assert sorted(pids) == ["coordinator", "store-0", "store-1", "store-2"]
    assert all(alive(p) for p in pids.values())

    status = subprocess.run(
        [sys.executable, "-m", "sparkbus.topologies.cli", "status", str(shipped("processes.toml")), "--json"],
        capture_output=True,
        text=True,
        env=up.env,
        timeout=30,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    answers = json.loads(status.stdout)
    for node, ans in answers.items():
        peers = ans["status"]["peers"]
        assert len(peers) == 3 and all(p["up"] for p in peers.values()), (node, peers)

    up.proc.send_signal(signal.SIGTERM)
    code, out = up.finish()
    assert code == 0, out
    assert "SIGTERM" in out
    assert wait_gone([*pids.values(), up.proc.pid]) == []
    assert not list(Path(up.env["XDG_RUNTIME_DIR"]).glob("sparkbus-*/*.json"))
    assert list(Path(up.env["TMPDIR"]).iterdir()) == []


def test_a_killed_node_stops_the_others_and_is_named(up: Up) -> None:
    up.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
    up.wait_for("state:", 10)
    pids = up.node_pids()
    os.kill(pids["store-1"], signal.SIGKILL)
    code, out = up.finish()
    assert code == 1, out
    assert "node store-1" in out and "SIGKILL" in out, out
    assert wait_gone([*pids.values(), up.proc.pid]) == []
    # The killed node's replicas (in a temporary directory) went with the run's.
    assert list(Path(up.env["TMPDIR"]).iterdir()) == []


def test_status_without_a_running_cluster_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "sparkbus.topologies.cli", "status", str(shipped("processes.toml"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert res.returncode == 1
    assert "no running cluster recorded" in res.stderr


def test_up_without_xdg_runtime_dir_starts_its_nodes_with_the_keys_it_made(tmp_path: Path) -> None:
    """Without XDG_RUNTIME_DIR the run directory (and the keys `up` makes for processes.toml) is in the
    temporary directory, which differs for the nodes (their TMPDIR is the run's own): they must still find
    the keys."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for name in ("XDG_RUNTIME_DIR", "SPARKBUS_RUN_DIR", "SPARKBUS_DATA_DIR"):
        env.pop(name, None)
    running = Up(env)
    try:
        running.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
        running.wait_for("state:", 10)
        assert list(tmp_path.glob(f"sparkbus-{os.getuid()}/keys-processes/private/*.key_secret"))
        running.proc.send_signal(signal.SIGTERM)
        code, out = running.finish()
        assert code == 0, out
    finally:
        running.kill()
