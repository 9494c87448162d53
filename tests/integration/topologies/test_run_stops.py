"""``sparkbus run`` stopped by a signal: the cleanup of every phase still runs (the nodes' data directory is
removed) and the command ends with one line and the signal's exit status. Spark is replaced by a stand-in
that delivers the signal, so no JVM starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# ``sparkbus run`` with Spark's start replaced by SIGNAL, after run_job has made the nodes' data directory.
SCRIPT = """
import os, signal, sys, time
from sparkbus.topologies import mainjob, spark

signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, whatever we inherited

def interrupted(*_, **__):
    os.kill(os.getpid(), signal.{signal})
    time.sleep(60)

spark.embedded_session = interrupted
mainjob._check_java = lambda: None
from sparkbus.topologies.cli import main
sys.exit(main(["run", "--rows", "10"]))
"""


def stopped_run(tmp_path: Path, signal: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(signal=signal)],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, tmp


def test_sigterm_stops_the_job_through_its_cleanup(tmp_path: Path) -> None:
    done, tmp = stopped_run(tmp_path, "SIGTERM")
    assert done.returncode == 143, done.stderr
    assert done.stderr == "sparkbus run: stopped by SIGTERM; nodes stopped, temporary data removed\n"
    assert [p.name for p in tmp.iterdir()] == []  # no sparkbus-run-* left behind


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    done, tmp = stopped_run(tmp_path, "SIGINT")
    assert done.returncode == 130, done.stderr
    assert done.stderr == "sparkbus run: stopped by SIGINT; nodes stopped, temporary data removed\n"
    assert [p.name for p in tmp.iterdir()] == []
