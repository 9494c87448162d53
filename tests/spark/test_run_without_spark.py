"""``sparkbus run`` with Spark's start replaced: stopped by a signal, the cleanup of every phase still runs
(nothing is left in the temporary directory) and the command ends with one line and the signal's exit status;
a CURVE key the driver's nodes need is named before Spark starts; a Spark that does not start is one line
with its cause. No JVM starts, but ``sparkbus.topologies.spark`` imports pyspark, so these run where it is
installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from sparkbus.bus import security
from sparkbus.topologies import cli, mainjob, spark
from sparkbus.topologies.mainjob import JobError, check_keys
from sparkbus.topologies.schema import loads, shipped

pytestmark = pytest.mark.spark

# ``sparkbus run`` with Spark's start replaced by SIGNAL.
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
    assert [p.name for p in tmp.iterdir()] == []  # nothing left behind


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    done, tmp = stopped_run(tmp_path, "SIGINT")
    assert done.returncode == 130, done.stderr
    assert done.stderr == "sparkbus run: stopped by SIGINT; nodes stopped, temporary data removed\n"
    assert [p.name for p in tmp.iterdir()] == []


def test_run_names_a_missing_curve_key_in_one_line_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(spark, "embedded_session", no_spark)
    monkeypatch.setattr(mainjob, "_check_java", lambda: None)
    monkeypatch.chdir(tmp_path)
    keys = tmp_path / "keys"
    security.generate(keys, ["store-0", "store-1"])  # the driver node's pair is on another machine
    text = (
        shipped("local.toml")
        .read_text()
        .replace(', "http.client"', "")  # under CURVE no node serves the HTTP exchange
        .replace("[spark]\n", f'[bus.security]\nmode = "curve"\nkey_dir = "{keys}"\n\n[spark]\n', 1)
    )
    topo = tmp_path / "curve.toml"
    topo.write_text(text)
    assert cli.main(["run", str(topo), "--rows", "10"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sparkbus run: {topo}: no secret key for node 'coordinator' in {keys}/private")
    assert err.count("\n") == 1

    security.generate(keys, ["coordinator"])
    check_keys(loads(text))  # every pair the driver needs
    (keys / "public" / "store-1.key").unlink()
    with pytest.raises(JobError, match="no public key for peer 'store-1'"):
        check_keys(loads(text))


class _JavaError(Py4JJavaError):
    """What PySpark raises when the JVM refuses to make the session: Py4J's line, then the Java trace."""

    def __init__(self, trace: str) -> None:
        Exception.__init__(self, trace)
        self.trace = trace

    def __str__(self) -> str:
        return (
            f"An error occurred while calling None.org.apache.spark.sql.classic.SparkSession.\n: {self.trace}"
        )


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (
            _JavaError(
                "java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n"
                "\tat org.apache.spark.SparkContext.assertNotStopped(SparkContext.scala:122)\n"
                "Caused by: java.io.IOException: Failed to connect to FILL-IN-MASTER-HOST/<unresolved>:7077\n"
                "\t... 4 more\n"
                "Caused by: java.net.UnknownHostException: FILL-IN-MASTER-HOST\n"
                "\t... 1 more\n"
            ),
            "java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.; caused by "
            "java.net.UnknownHostException: FILL-IN-MASTER-HOST",
        ),
        (
            RuntimeError("Java gateway process exited\nbefore sending its port number"),
            "Java gateway process exited",
        ),
    ],
)
def test_a_spark_that_does_not_start_is_one_line_with_its_cause_and_master(
    raised: Exception,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    def refused(*_args: object, **_kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(mainjob, "_check_java", lambda: None)
    monkeypatch.setattr(spark, "embedded_session", refused)
    assert cli.main(["run", "--rows", "1", "--report", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert err == f"sparkbus run: Spark did not start (master local[2]): {line}\n"
