"""``sparkbus up`` of a small plain topology (two echo nodes) where something is in the way: the same file
already running, and so on. Each ends in one line naming the cause, never in a traceback. Loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from sparkbus.bus.security import generate
from sparkbus.topologies.launcher import Launcher, state_file
from sparkbus.topologies.schema import load

from .test_up import READY_TIMEOUT, Up, cli

pytestmark = pytest.mark.integration

TWO = """
[cluster]
name = "two"
{bus}
[[nodes]]
name = "a"
placement = "host"
host = "127.0.0.1"
count = 2
services = ["echo"]
"""


def topology(tmp_path: Path, bus: str = "") -> Path:
    path = tmp_path / "two.toml"
    path.write_text(TWO.format(bus=bus))
    return path


@contextlib.contextmanager
def running(env: dict[str, str], path: Path) -> Iterator[Up]:
    up = Up(env, str(path))
    try:
        up.wait_for("state:", READY_TIMEOUT + 10)
        yield up
    finally:
        up.kill()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return {**os.environ, "XDG_RUNTIME_DIR": str(run), "COLUMNS": "200"}


def test_a_file_already_running_is_refused_and_keeps_its_state(tmp_path: Path, env: dict[str, str]) -> None:
    path = topology(tmp_path)
    with running(env, path) as first:
        second = cli(env, "up", str(path))
        assert second.returncode == 1, second.stderr
        assert second.stderr.startswith(
            f"{path}: cannot start: another `sparkbus up` of this file is running"
        )
        assert len(second.stderr.splitlines()) == 1, second.stderr
        status = cli(env, "status", str(path), "--json")
        assert status.returncode == 0, status.stderr
        first.proc.send_signal(signal.SIGINT)
        code, out = first.finish()
        assert code == 0, out
    again = cli(env, "status", str(path))
    assert again.returncode == 1 and "no running cluster recorded" in again.stderr


def test_a_node_that_cannot_start_is_named_with_its_cause(tmp_path: Path, env: dict[str, str]) -> None:
    keys = tmp_path / "kd"
    generate(keys, ["cluster"])
    shutil.rmtree(keys / "public")  # the nodes bind with the secret pair, then find no key for their peers
    path = topology(tmp_path, f'[bus.security]\nmode = "curve"\nkey_dir = "{keys}"')
    done = cli(env, "up", str(path), "--timeout", "20")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(
        r"sparkbus up: node a-[01] \(pid \d+\) exited with status 2: MissingKey: no public key for peer 'a-[01]'",
        done.stdout,
    ), done.stdout


def test_a_node_that_cannot_bind_leaves_no_data_directory(tmp_path: Path, env: dict[str, str]) -> None:
    tmp = tmp_path / "tmp"  # where replicas without $SPARKBUS_DATA_DIR make their temporary directories
    tmp.mkdir()
    path = tmp_path / "leak.toml"
    path.write_text(
        TWO.format(bus=f'[bus.security]\nmode = "curve"\nkey_dir = "{tmp_path / "missing-keys"}"')
        .replace('services = ["echo"]', 'roles = ["replication"]')
        .replace('name = "two"', 'name = "leak"')
        + '[tables.t]\npartitions = 2\nkey = "k"\n'
    )
    environment = {k: v for k, v in env.items() if k != "SPARKBUS_DATA_DIR"}
    done = cli({**environment, "TMPDIR": str(tmp)}, "up", str(path), "--timeout", "20")
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"node a-[01] \(pid \d+\) exited with status 2: MissingKey", done.stdout), done.stdout
    assert sorted(p.name for p in tmp.iterdir()) == []


@pytest.mark.parametrize("host", ["*", "0.0.0.0"])
def test_a_wildcard_bus_host_binds_everywhere_and_advertises_the_nodes_host(
    tmp_path: Path, env: dict[str, str], host: str
) -> None:
    path = topology(tmp_path, f'[bus]\nhost = "{host}"')
    with running(env, path):
        status = cli(env, "status", str(path), "--json")
        assert status.returncode == 0, status.stderr
        answers = json.loads(status.stdout)
        assert sorted(answers) == ["a-0", "a-1"]
        for node, ans in answers.items():
            assert ans["endpoints"]["control"].startswith("tcp://127.0.0.1:"), ans["endpoints"]
            assert all(p["up"] for p in ans["status"]["peers"].values()), (node, ans["status"]["peers"])


@pytest.mark.parametrize("command", ["up", "status"])
def test_a_run_directory_others_can_write_is_refused_in_one_line(
    tmp_path: Path, env: dict[str, str], command: str
) -> None:
    """Both name the directory and why, in one line: `up` before starting a node, `status` without a FILE
    while it looks for a running cluster there (not a traceback of the refusal raised twice)."""
    run = Path(env["XDG_RUNTIME_DIR"]) / f"sparkbus-{os.getuid()}"
    run.mkdir()
    run.chmod(0o777)
    args = ("up", str(topology(tmp_path))) if command == "up" else ("status",)
    done = cli(env, *args, cwd=tmp_path)  # no topologies/processes.toml there
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert f"refusing {run}: its mode 0777 lets other users write in it" in done.stderr
    start = (
        f"{args[1]}: cannot start: the run directory {run} is not usable: "
        if command == "up"
        else "sparkbus status: "
    )
    assert done.stderr.startswith(start), done.stderr


def test_a_run_directory_that_cannot_be_used_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    path = topology(tmp_path)
    blocked = tmp_path / "not-a-directory"
    blocked.touch()
    done = cli({**env, "XDG_RUNTIME_DIR": str(blocked)}, "up", str(path))
    assert done.returncode == 1
    assert done.stderr.startswith(f"{path}: cannot start: the run directory {blocked}/sparkbus-"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == "", done.stderr

    state = Path(env["XDG_RUNTIME_DIR"]) / f"sparkbus-{os.getuid()}"
    state.mkdir()
    (state / "keys-two").touch()  # where up would make the nodes' keys
    curve = topology(tmp_path, '[bus.security]\nmode = "curve"\nkey_dir = "{run_dir}/keys-two"')
    done = cli(env, "up", str(curve))
    assert done.returncode == 1
    assert done.stdout.startswith("sparkbus up: cannot create the CURVE keys: [Errno 17] File exists"), (
        done.stdout
    )
    assert len(done.stdout.splitlines()) == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_a_state_file_that_cannot_be_written_stops_the_nodes_in_one_line(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = topology(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
    state_file(path).mkdir(parents=True)  # a directory where the state file goes
    done = cli(env, "up", str(path))
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        "sparkbus up: cannot write the state file: [Errno 21] Is a directory"
    ), done.stdout
    assert done.stdout.splitlines()[-1].endswith("; stopping the other nodes"), done.stdout
    left = sorted(p.name for p in state_file(path).parent.iterdir() if p.suffix == ".tmp")
    assert left == [], left  # the temp file the write began is removed with it


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_before_every_node_is_ready_stops_them_with_exit_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sig: signal.Signals
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    path = topology(tmp_path)
    state = tmp_path / "state.json"
    up = Launcher(
        str(path), load(path), console=Console(width=200), ready_timeout=READY_TIMEOUT, state_path=state
    )
    spawn = up.spawn

    def spawn_then_signal() -> None:  # the signal arrives once the nodes exist, before any can be ready
        spawn()
        os.kill(os.getpid(), sig)

    monkeypatch.setattr(up, "spawn", spawn_then_signal)
    assert up.run() == 0  # was 1: "interrupted before every node was ready"
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"sparkbus up: {sig.name}: stopping 2 nodes (before every node was ready)"
    )
    assert sorted(up.children) == ["a-0", "a-1"]
    assert all(c.proc.poll() is not None for c in up.children.values())  # every node stopped and reaped
    assert not state.exists()
