"""``sparkbus status FILE`` against a state file: nodes whose process is gone are down at once, the live ones
are asked together. Status endpoints here are plain ZeroMQ sockets on 127.0.0.1, each receive bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from sparkbus.topologies.launcher import state_file, status_command

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

#: Long enough that a node asked in vain would be seen waiting for it; the tests never wait for it.
TIMEOUT = 10.0


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``, field 22)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


class Sockets:
    """Sockets bound on 127.0.0.1, all closed at the end."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.made: list[zmq.Socket[bytes]] = []

    def bound(self, kind: int) -> tuple[zmq.Socket[bytes], str]:
        sock = self.ctx.socket(kind)
        self.made.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        return sock, f"tcp://127.0.0.1:{port}"

    def close(self) -> None:
        for sock in self.made:
            sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def sockets() -> Iterator[Sockets]:
    made = Sockets()
    yield made
    made.close()


def write_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: dict[str, dict[str, Any]]) -> str:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    topology = tmp_path / "t.toml"
    path = state_file(topology)
    path.parent.mkdir(mode=0o700, parents=True)
    state = {"topology": str(topology), "cluster": "t", "launcher_pid": os.getpid(), "nodes": nodes}
    path.write_text(json.dumps(state))
    return str(topology)


def a_gone_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_nodes_whose_process_is_gone_are_down_at_once_and_never_asked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sockets: Sockets,
    capsys: pytest.CaptureFixture[str],
) -> None:
    listener, address = sockets.bound(zmq.ROUTER)  # would see any request sent to the recorded endpoint
    gone = a_gone_pid()
    me = os.getpid()
    target = write_state(
        tmp_path,
        monkeypatch,
        {
            "gone": {"pid": gone, "started": "1", "status": address},
            # the pid is running, but another process than the one recorded (a pid used again)
            "reused": {"pid": me, "started": str(int(start_time(me)) + 1), "status": address},
        },
    )
    assert status_command(target, timeout=TIMEOUT, as_json=True) == 1
    assert json.loads(capsys.readouterr().out) == {
        "gone": f"down: its process (pid {gone}) is gone",
        "reused": f"down: pid {me} is another process now",
    }
    assert listener.poll(0) == 0  # nothing was asked


def test_live_nodes_are_asked_together(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sockets: Sockets,
    capsys: pytest.CaptureFixture[str],
) -> None:
    me, started = os.getpid(), start_time(os.getpid())
    servers = dict(sockets.bound(zmq.REP) for _ in range(2))
    gone = a_gone_pid()
    nodes: dict[str, dict[str, Any]] = {
        f"n{i}": {"pid": me, "started": started, "status": address}
        for i, address in enumerate(servers.values())
    }
    nodes["gone"] = {"pid": gone, "started": "1", "status": "tcp://127.0.0.1:9"}
    target = write_state(tmp_path, monkeypatch, nodes)

    def answer_once_both_asked() -> None:
        # Asked one after the other, the first node would wait its whole timeout for this answer.
        poller = zmq.Poller()
        for sock in servers:
            poller.register(sock, zmq.POLLIN)
        asked: set[zmq.Socket[bytes]] = set()
        deadline = time.monotonic() + TIMEOUT
        while len(asked) < len(servers) and time.monotonic() < deadline:
            for sock, _ in poller.poll(100):
                poller.unregister(sock)
                asked.add(sock)
        for sock in asked if len(asked) == len(servers) else ():
            sock.recv()
            sock.send(json.dumps({"ok": True, "node": servers[sock], "status": {}}).encode())

    server = threading.Thread(target=answer_once_both_asked, daemon=True)
    server.start()
    assert status_command(target, timeout=TIMEOUT, as_json=True) == 1  # one node is down
    server.join(timeout=TIMEOUT)
    answers = json.loads(capsys.readouterr().out)
    for i, address in enumerate(servers.values()):
        assert answers[f"n{i}"] == {"ok": True, "node": address, "status": {}}
    assert answers["gone"] == f"down: its process (pid {gone}) is gone"


def test_a_state_file_without_start_times_is_read_by_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = a_gone_pid()
    target = write_state(tmp_path, monkeypatch, {"old": {"pid": gone, "status": "tcp://127.0.0.1:9"}})
    assert status_command(target, timeout=TIMEOUT, as_json=True) == 1
    assert json.loads(capsys.readouterr().out) == {"old": f"down: its process (pid {gone}) is gone"}
