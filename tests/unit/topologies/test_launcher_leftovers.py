"""What a launcher killed or stuck leaves: ``up`` stops on a signal handled late, and the next ``up`` removes
the temporary directory of a run whose launcher was killed with SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkbus.topologies.launcher import UP_TMP_PREFIX, remove_stale_tmp

from .test_status import a_gone_pid, start_time

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "processes.toml"

CHILD = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    from rich.console import Console
    from sparkbus.topologies.launcher import Launcher
    from sparkbus.topologies.schema import load

    path = sys.argv[1]
    launcher = Launcher(path, load(path), console=Console(file=open(os.devnull, "w")))
    launcher.start = lambda flag: True          # no nodes: watch() alone, as after "ready"
    launcher.write_state = lambda: None
    launcher.print_endpoints = lambda: None
    launcher.stop = lambda: None

    sys.setswitchinterval(0.3)
    def busy():                                 # holds the GIL from 50 ms on, as a busy process would
        time.sleep(0.05)
        while True:
            pass
    threading.Thread(target=busy, daemon=True).start()
    subprocess.Popen(["sh", "-c", f"sleep 0.1; kill -TERM {os.getpid()}"])
    print("run returned", launcher.run(), flush=True)
    os._exit(0)
    """
)


def test_up_stops_on_a_sigterm_whose_handler_runs_after_the_wait_ended(tmp_path: Path) -> None:
    """On CPython 3.11 a SimpleQueue.get cut short by a signal waited again, for ever once the time left
    was negative: the handler set the stop flag, nothing looked at it again, and up ignored every signal."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(TOPOLOGY)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"Launcher.run did not return within 30 s of a SIGTERM: {out!r}") from None
    assert "run returned 0" in out, out


def state(tmp_path: Path, tmp: Path, pid: int, started: str | None) -> Path:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"tmp": str(tmp), "nodes": {"a": {"pid": pid, "started": started}}}))
    return path


def left_tmp(tmp_path: Path, name: str = UP_TMP_PREFIX + "x1") -> Path:
    tmp = tmp_path / name
    (tmp / "store-0-data" / "orders~0").mkdir(parents=True)
    (tmp / "store-0-data" / "orders~0" / "wal").write_bytes(b"rows")
    return tmp


def test_the_temporary_directory_of_a_run_whose_nodes_are_gone_is_removed(tmp_path: Path) -> None:
    tmp = left_tmp(tmp_path)
    assert remove_stale_tmp(state(tmp_path, tmp, a_gone_pid(), "1")) == str(tmp)
    assert not tmp.exists()


def test_a_temporary_directory_a_node_still_runs_in_is_kept(tmp_path: Path) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads /proc")
    tmp = left_tmp(tmp_path)
    me = os.getpid()
    assert remove_stale_tmp(state(tmp_path, tmp, me, start_time(me))) is None
    assert tmp.exists()


@pytest.mark.parametrize("name", ["elsewhere", "sparkbus-ipc-x"])
def test_only_a_directory_named_as_up_names_them_is_removed(tmp_path: Path, name: str) -> None:
    tmp = left_tmp(tmp_path, name)
    assert remove_stale_tmp(state(tmp_path, tmp, a_gone_pid(), "1")) is None
    assert tmp.exists()


def test_a_symlink_recorded_as_the_directory_is_not_followed(tmp_path: Path) -> None:
    target = left_tmp(tmp_path, "target")
    link = tmp_path / (UP_TMP_PREFIX + "link")
    link.symlink_to(target)
    assert remove_stale_tmp(state(tmp_path, link, a_gone_pid(), "1")) is None
    assert (target / "store-0-data").exists()


def test_a_state_file_without_a_directory_removes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"nodes": {}}))
    assert remove_stale_tmp(path) is None
    assert remove_stale_tmp(tmp_path / "missing.json") is None
