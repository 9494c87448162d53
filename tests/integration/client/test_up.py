"""``sparkbus.connect("processes.toml")`` against a real ``sparkbus up processes.toml`` (CURVE on, keys made
by ``up`` in the run directory): the client finds the gateway and the keys from the topology file and its
run directory, and a query goes end to end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import sparkbus
from sparkbus.roles.client import ClientError
from sparkbus.topologies import shipped

from ..topologies.test_up import READY_TIMEOUT, Up

pytestmark = pytest.mark.integration


def stop(running: Up) -> None:
    """SIGTERM to the whole process group (``up`` stops its nodes), SIGKILL if it does not end."""
    proc = running.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture
def up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Up]:
    # The run directory (state file, generated keys) of both the cluster and this test's client.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    running = Up({**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        running.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
        running.wait_for("state:", 10)
        yield running
    finally:
        stop(running)


def test_connect_by_topology_file_runs_a_query_end_to_end(up: Up, tmp_path: Path) -> None:
    assert list(tmp_path.glob("sparkbus-*/keys-processes/public/*.key"))  # CURVE keys made by `up`
    with sparkbus.connect(shipped("processes.toml"), connect_timeout=20) as client:
        status = client.status()
        assert status["node"] == "coordinator"
        assert sorted(status["nodes_up"]) == ["store-0", "store-1", "store-2"]
        # The SQL request goes through the gateway to the coordinator's query role, which initiates it on
        # every node up; the clear error of a missing table comes back.
        with pytest.raises(ClientError, match="no_such_table"):
            client.sql("SELECT COUNT(*) AS n FROM no_such_table", timeout=20)
        # The compute controller does run there: a peek of a view nobody defined is its own error.
        with pytest.raises(ClientError, match="no_such_view"):
            client.peek("no_such_view")
        assert client.status()["node"] == "coordinator"  # the session serves on after both errors
