"""``sparkbus validate FILE``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sparkbus.topologies import cli, launcher
from sparkbus.topologies.launcher import status_table
from sparkbus.topologies.schema import SHIPPED, shipped


def filled_in_example(where: Path) -> Path:
    """``cluster.example.toml`` with its master filled in, as its first line asks."""
    path = where / "cluster.example.toml"
    path.write_text(shipped(path.name).read_text().replace("FILL-IN-MASTER-HOST", "spark-master.example"))
    return path


@pytest.mark.parametrize("name", SHIPPED)
def test_valid_files_print_a_summary(name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = filled_in_example(tmp_path) if name == "cluster.example.toml" else shipped(name)
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert f"{name}: valid topology" in out.out
    assert "coordinator" in out.out
    assert "nodes" in out.out


def test_summary_content(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(shipped("local.toml"))]) == 0
    out = capsys.readouterr().out
    assert "runs on: Spark local[2], application sparkbus-local" in out
    assert "heartbeat 250ms, peer timeout 5s; batches 512KiB, initial credit 4MiB" in out
    assert "store-0, store-1" in out
    assert "orders" in out and "customers" in out
    # echo is installed; the protocol families are flagged until they land
    assert "echo*" not in out
    assert "3 tables" in out


def test_processes_summary_escapes_markup(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(shipped("processes.toml"))]) == 0
    out = capsys.readouterr().out
    assert "runs on: plain processes (no [spark] section)" in out
    assert "1 table\n" in out


def test_invalid_file_prints_every_problem_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\nname = "x"\n[bus]\nheartbeet = "1s"\n')
    assert cli.main(["validate", str(bad)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [
        f"{bad}: invalid topology (2 problems)",
        f"{bad}: bus.heartbeet: unknown key; did you mean 'heartbeat'?",
        f"{bad}: nodes: missing: a topology needs at least one [[nodes]] entry",
    ]


def test_a_refused_heartbeat_is_the_one_problem_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[cluster]\nname = "x"\n[bus]\nheartbeat = "0.2"\npeer_timeout = "1s"\n'
        '[[nodes]]\nname = "a"\nplacement = "host"\nhost = "127.0.0.1"\nservices = ["echo"]\n'
    )
    assert cli.main(["validate", str(bad)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}: bus.heartbeat: '0.2' has no unit; write e.g. '0.2s' or '0.2ms'"
    ]


def test_an_absurd_count_is_refused_in_one_line_and_up_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_launch(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("sparkbus up started nodes of a topology it should refuse")

    monkeypatch.setattr(launcher, "Launcher", no_launch)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[cluster]\nname = "x"\n'
        '[[nodes]]\nname = "a"\nplacement = "host"\nhost = "127.0.0.1"\ncount = 100000\nservices = ["echo"]\n'
    )
    refused = [
        f"{bad}: nodes[0].count: must be at most 200 (each node opens 4 ZeroMQ sockets per peer, and a process "
        "holds at most 1023), got 100000"
    ]
    for command in ("validate", "up"):
        assert cli.main([command, str(bad)]) == 1
        out = capsys.readouterr()
        assert (out.out, out.err.splitlines()) == ("", refused), command


def test_the_examples_placeholders_are_refused_in_one_line_by_validate_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spark_must_not_start: None
) -> None:
    example = shipped("cluster.example.toml")
    master = f"{example}: spark.master: 'spark://FILL-IN-MASTER-HOST:7077' is the example's placeholder; "
    master += "fill in your cluster's master URL"
    assert cli.main(["validate", str(example)]) == 1
    assert capsys.readouterr() == ("", master + "\n")
    assert cli.main(["run", str(example), "--rows", "1", "--report", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert err == f"sparkbus run: {master} (sparkbus validate {example} lists every problem)\n"
    # A key directory still holding one is named too.
    text = filled_in_example(tmp_path).read_text().replace("/etc/sparkbus/keys", "/FILL-IN/keys")
    (tmp_path / "cl.toml").write_text(text)
    assert cli.main(["validate", str(tmp_path / "cl.toml")]) == 1
    assert capsys.readouterr().err == (
        f"{tmp_path}/cl.toml: bus.security.key_dir: '/FILL-IN/keys' is the example's placeholder; fill in "
        "the directory of the cluster's keys\n"
    )
    assert not (tmp_path / "r.json").exists()


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(tmp_path / "nope.toml")]) == 1
    assert "nope.toml: cannot read the file" in capsys.readouterr().err


def test_exit_status_from_a_real_process(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    done = subprocess.run(
        [sys.executable, "-m", "sparkbus.topologies.cli", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "not valid TOML" in done.stderr


def test_free_text_of_a_valid_file_is_printed_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the tag is any text (at most 128 characters), key columns and ipc_dir are not restricted either
    folder = tmp_path / "[x]"
    folder.mkdir()
    path = folder / "t.toml"
    path.write_text(
        "[cluster]\n"
        'name = "x"\n'
        'tag = "release [/v2] [red]prod"\n'
        "[bus]\n"
        'transport = "ipc"\n'
        'ipc_dir = "/tmp/[b]ipc"\n'
        "[[nodes]]\n"
        'name = "a"\n'
        'placement = "host"\n'
        'host = "127.0.0.1"\n'
        "count = 2\n"
        'roles = ["replication"]\n'
        "[tables.t]\n"
        "partitions = 2\n"
        'key = "[b]k"\n'
    )
    assert cli.main(["validate", str(path)]) == 0  # "[/v2]" was a MarkupError traceback
    out = capsys.readouterr().out
    assert f"{path}: valid topology x (release [/v2] [red]prod)" in out
    assert "ipc in /tmp/[b]ipc;" in out
    assert "[b]k" in out


def test_a_status_error_is_printed_as_it_is() -> None:
    console = Console(width=200, record=True)
    console.print(status_table({"a-0": "error: [/x] refused", "a-1": "unreachable: no answer from [y]"}))
    out = console.export_text()
    assert "error: [/x] refused" in out and "unreachable: no answer from [y]" in out


def test_status_counts_the_nodes_peers_apart_from_itself_and_its_clients() -> None:
    def peer(up: bool, outbound: str | None, inbound: bool, out: int = 0, into: int = 0) -> dict[str, Any]:
        return {
            "up": up,
            "outbound": outbound,
            "inbound_session": inbound,
            "streams_out": out,
            "streams_in": into,
        }

    peers = {
        "coordinator": peer(True, None, False, 1, 1),  # itself: a query streamed to its own fragment
        "client:ab12": peer(True, None, True),  # a thin client's session
        "store-0": peer(True, "established", True, 1, 0),
        "store-1": peer(False, "connecting", False),
    }
    answer = {"node": "coordinator", "status": {"peers": peers, "counters": {}}}
    console = Console(width=200, record=True)
    console.print(status_table({"coordinator": answer}))
    row = next(line for line in console.export_text().splitlines() if "coordinator" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    # peers up, sessions out/in, clients, streams out/in
    assert cells[1:5] == ["1/2", "1/1", "1", "2/1"], cells


def test_a_curve_topology_asking_for_the_http_exchange_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = filled_in_example(tmp_path)
    text = example.read_text().replace(
        '"binx.client", "client.gateway"]', '"binx.client", "http.client", "client.gateway"]'
    )
    assert "http.client" in text
    example.write_text(text)
    assert cli.main(["validate", str(example)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{example}: nodes[0].roles[4]: 'http.client' pulls over the HTTP exchange, which is plain HTTP, so "
        "under bus.security mode = 'curve' no node serves it; remove it (queries use 'binx' or 'push')"
    ]
