"""`sparkbus run` end to end on Spark local[2], in a subprocess, and its unhappy paths."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sparkbus.topologies import spark as runtime
from sparkbus.topologies.mainjob import Options, main_job
from sparkbus.topologies.schema import shipped

pytestmark = pytest.mark.spark

ROWS = 100_000
DOCS = Path(__file__).parents[2] / "docs" / "MAIN_JOB.md"
PNG = b"\x89PNG\r\n\x1a\n"


def sparkbus(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the CLI in its own process group; killed (group and all) if it outlives ``timeout``."""
    cmd = [sys.executable, "-m", "sparkbus.topologies.cli", *args]
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.timeout(400)
def test_main_job_matches_spark_sql_and_keeps_the_view_fresh(tmp_path: Path) -> None:
    done = sparkbus("run", "--rows", str(ROWS), cwd=tmp_path, timeout=380)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "sparkbus-report.json").read_text())
    assert report["rows"] == ROWS
    assert report["all_results_match"] is True
    names = [q["name"] for q in report["queries"]]
    assert names == [
        "point filter + count",
        "group-by aggregate",
        "top-k",
        "filter + projection",
        "count distinct",
    ]
    assert all(q["match"] and q["sparkbus_runs"] > 0 and q["spark_runs"] > 0 for q in report["queries"])
    assert report["min_speedup_vs_spark"] is not None
    view = report["view"]
    assert view["fresh"] is True
    assert view["rows_after_writes"] == ROWS + view["written_rows"] and view["written_rows"] > 0
    assert report["load"]["load_vs_toarrow"] > 0 and report["load"]["partitions"] == 8
    assert set(report["load"]) == documented_fields("load")
    assert set(report["exchange"]["p50_ms"]) == {"push", "binx", "http"}
    # the query itself ran with each exchange and gave the same rows
    assert set(report["exchange"]["query_p50_ms"]) == {"push", "binx", "http"}
    assert report["exchange"]["query_results_match"] is True
    assert {"load", "sparkbus_queries", "spark_queries", "view", "exchange", "total"} <= set(
        report["phases_s"]
    )
    assert (tmp_path / "sparkbus-report.png").read_bytes()[:8] == PNG
    assert "sparkbus-report.json" in done.stdout


def documented_fields(field: str) -> set[str]:
    """The names docs/MAIN_JOB.md's report table gives for ``field``, those in parentheses (what a name
    means) left out."""
    table = DOCS.read_text().split("\n| field | meaning |\n", 1)[1]
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| `{field}` |"))
    meaning = row.split("|")[2]
    while (shorter := re.sub(r"\([^()]*\)", "", meaning)) != meaning:
        meaning = shorter
    return set(re.findall(r"`([a-z_]+)`", meaning))


def one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("sparkbus run:")] == [
        next(ln for ln in done.stderr.splitlines() if expected in ln)
    ]


@pytest.mark.timeout(60)
def test_missing_data_path_is_a_clear_error(tmp_path: Path) -> None:
    done = sparkbus("run", "--data", str(tmp_path / "nope.parquet"), cwd=tmp_path, timeout=50)
    one_line_error(done, "nope.parquet: no such file or directory")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rows", ["0", "-5"])
def test_rows_must_be_positive(tmp_path: Path, rows: str) -> None:
    done = sparkbus("run", "--rows", rows, cwd=tmp_path, timeout=50)
    one_line_error(done, "--rows must be a positive number of rows")


@pytest.mark.timeout(120)
def test_csv_without_a_required_column_is_a_clear_error(tmp_path: Path) -> None:
    csv = tmp_path / "events.csv"
    csv.write_text("user_id,kind,ts\n1,click,2024-01-01 00:00:00\n")
    done = sparkbus("run", "--data", str(csv), cwd=tmp_path, timeout=110)
    one_line_error(done, "missing column(s) value")


@contextmanager
def held_ports(size: int) -> Iterator[int]:
    """The first of ``size`` consecutive ports of 127.0.0.1; meanwhile each of the others is held by a
    listening socket."""
    for first in range(47100, 60000, size):
        with ExitStack() as stack:
            held = []
            try:
                for port in range(first, first + size):
                    held.append(s := stack.enter_context(socket.socket()))
                    s.bind(("127.0.0.1", port))
                    s.listen()
            except OSError:
                continue
            held[0].close()  # the one port left free
            yield first
            return
    raise RuntimeError("no free range of ports")


@pytest.mark.timeout(180)
def test_a_driver_node_that_cannot_bind_ends_the_run_in_one_line(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process, on the test session's SparkSession. The runtime channel takes the one free port of
    # bus.ports, and the coordinator, which runs in the driver, finds none.
    monkeypatch.setattr(runtime, "embedded_session", lambda *_, **__: spark)
    topology = tmp_path / "busy.toml"
    with held_ports(12) as first:  # the least bus.ports validation takes for local.toml
        text = shipped("local.toml").read_text()
        topology.write_text(text.replace('ports = "ephemeral"', f'ports = "{first}-{first + 11}"', 1))
        opts = Options(topology=topology, rows=1000, report=tmp_path / "r.json", chart=tmp_path / "r.png")
        code = main_job(replace(opts, spark_reps=1))  # `sparkbus run`, with one timed run of each Spark query
    err = capsys.readouterr().err
    assert code == 1
    assert [ln for ln in err.splitlines() if ln.startswith("sparkbus run:")] == [
        f"sparkbus run: sparkbus node coordinator (driver) failed: NoFreePort: [Errno 98] node coordinator "
        f"(control): every port of bus.ports {first}-{first + 11} is in use; widen the range"
    ], err[-3000:]
