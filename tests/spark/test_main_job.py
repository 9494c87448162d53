"""`sparkbus run` end to end on Spark local[2], in a subprocess, and its unhappy paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROWS = 100_000
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
    assert set(report["exchange"]["p50_ms"]) == {"push", "binx", "http"}
    # the query itself ran with each exchange and gave the same rows
    assert set(report["exchange"]["query_p50_ms"]) == {"push", "binx", "http"}
    assert report["exchange"]["query_results_match"] is True
    assert {"load", "sparkbus_queries", "spark_queries", "view", "exchange", "total"} <= set(
        report["phases_s"]
    )
    assert (tmp_path / "sparkbus-report.png").read_bytes()[:8] == PNG
    assert "sparkbus-report.json" in done.stdout


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
