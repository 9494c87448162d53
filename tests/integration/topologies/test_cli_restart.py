"""Views after the cluster starts again on the same ``SPARKBUS_DATA_DIR``: the partitions open their rows from
disk, while the compute controller starts with no table and no view. The first ``load`` or ``view create``
of a declared table then fills the controller's table with every stored row, so a view counts what SQL
counts. Loopback only; real ``sparkbus up processes.toml`` processes, one cluster at a time."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbus.topologies import shipped

from ..client.test_up import stop
from .test_up import READY_TIMEOUT, Up, cli

# Two clusters one after the other (up to READY_TIMEOUT + 10 s each) and several `sparkbus` processes,
# each step bounded on its own.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPOLOGY = str(shipped("processes.toml"))
COUNT_BY_KIND = "SELECT kind, COUNT(*) AS n FROM orders GROUP BY kind"


def run(env: dict[str, str], *args: str) -> str:
    done = cli(
        {**env, "COLUMNS": "200"},
        *args,
        "--topology",
        TOPOLOGY,
        "--connect-timeout",
        "20",
        "--timeout",
        "30",
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rows(out: str) -> dict[str, int]:
    return {r["kind"]: r["n"] for r in map(json.loads, out.splitlines())}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "run").mkdir()
    return {
        **os.environ,
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "SPARKBUS_DATA_DIR": str(tmp_path / "data"),
    }


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {
        "first": "order_id,kind,value\n1,a,10\n2,b,20\n3,a,30\n4,c,40\n",
        "second": "order_id,kind,value\n11,a,5\n",
    }
    for name, text in made.items():
        (tmp_path / f"{name}.csv").write_text(text)
    return {name: tmp_path / f"{name}.csv" for name in made}


def started(env: dict[str, str]) -> Up:
    running = Up(env)
    try:
        running.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
        running.wait_for("state:", 10)
    except BaseException:
        stop(running)
        raise
    return running


@pytest.fixture
def restarted(env: dict[str, str], files: dict[str, Path]) -> Iterator[dict[str, str]]:
    """A cluster that held ``first.csv`` in ``orders`` (and a view over it), stopped, and started again."""
    first = started(env)
    try:
        run(env, "load", "orders", str(files["first"]))
        run(
            env,
            "view",
            "create",
            "by_kind",
            "--source",
            "orders",
            "--group-by",
            "kind",
            "--agg",
            "n=count(*)",
        )
    finally:
        stop(first)
    again = started(env)
    try:
        yield env
    finally:
        stop(again)


def test_the_first_load_after_a_restart_gives_the_views_every_stored_row(
    restarted: dict[str, str], files: dict[str, Path]
) -> None:
    env = restarted
    loaded = run(env, "load", "orders", str(files["second"]))
    assert "with every stored row" in loaded
    run(env, "view", "create", "by_kind", "--source", "orders", "--group-by", "kind", "--agg", "n=count(*)")
    expected = {"a": 3, "b": 1, "c": 1}
    assert rows(run(env, "sql", COUNT_BY_KIND, "--json")) == expected
    assert rows(run(env, "view", "peek", "by_kind", "--json")) == expected
    # A load into the table the controller now has adds the file's rows alone, upserted by key.
    assert "with every stored row" not in run(env, "load", "orders", str(files["second"]))
    assert rows(run(env, "view", "peek", "by_kind", "--json")) == expected


def test_a_view_created_after_a_restart_with_no_load_reads_every_stored_row(
    restarted: dict[str, str],
) -> None:
    env = restarted
    made = run(
        env, "view", "create", "by_kind", "--source", "orders", "--group-by", "kind", "--agg", "n=count(*)"
    )
    assert "created with every stored row" in made
    expected = {"a": 2, "b": 1, "c": 1}
    assert rows(run(env, "view", "peek", "by_kind", "--json")) == expected
    assert rows(run(env, "sql", COUNT_BY_KIND, "--json")) == expected


def test_a_view_over_a_table_nobody_declared_or_loaded_is_still_refused(env: dict[str, str]) -> None:
    running = started(env)
    try:
        done: subprocess.CompletedProcess[str] = cli(
            env, "view", "create", "v", "--source", "nothing", "--topology", TOPOLOGY, timeout=90
        )
        assert done.returncode == 1
        assert "nothing" in done.stderr and "Traceback" not in done.stderr
    finally:
        stop(running)
