from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from sparkbus.topologies import cli, client
from sparkbus.topologies.keys import run_dir


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ok:
        cli.main(["--version"])
    assert ok.value.code == 0
    assert capsys.readouterr().out.startswith("sparkbus 0.")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run" in capsys.readouterr().out


def test_unknown_command_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["frobnicate"])
    assert err.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_entry_point_is_installed() -> None:
    beside = Path(sys.executable).with_name("sparkbus")
    exe = str(beside) if beside.exists() else shutil.which("sparkbus")
    assert exe is not None, "the sparkbus console script is not on PATH"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.startswith("sparkbus ")


def test_every_command_is_offered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("run", "validate", "up", "status", "load", "sql", "view", "keys"):
        assert command in out


def test_a_view_definition_from_the_command_line() -> None:
    args = cli.build_parser().parse_args(
        [
            "view",
            "create",
            "big_by_kind",
            "--source",
            "events",
            "--where",
            "value >= 2.5",
            "--where",
            "kind != 'x y'",
            "--group-by",
            "kind",
            "--agg",
            "n=count(*)",
            "--agg",
            "total=SUM(value)",
        ]
    )
    view = cli._view_def(args)
    assert view.source == "events" and view.group_by == ("kind",)
    assert [(p.column, p.op, p.value) for p in view.filters] == [("value", "ge", 2.5), ("kind", "ne", "x y")]
    assert [(a.func, a.column, a.name) for a in view.aggregates] == [
        ("count", None, "n"),
        ("sum", "value", "total"),
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--agg", "total=sum"], "expected NAME=FUNC(COLUMN)"),
        (["--agg", "t=median(value)"], "median is not one of count, sum, avg, min, max"),
        (["--where", "value ~ 3"], "expected COLUMN OP VALUE"),
        (["--group-by", "kind,kind"], "names a column twice"),
    ],
)
def test_a_bad_view_definition_is_one_line_and_needs_no_cluster(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["view", "create", "v", "--source", "events", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sparkbus view create: ") and message in err and err.count("\n") == 1


def test_address_needs_a_cluster_tag_and_a_missing_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sql", "SELECT 1", "--address", "tcp://127.0.0.1:1"]) == 1
    assert "--address needs --cluster-tag" in capsys.readouterr().err
    assert cli.main(["sql", "SELECT 1", "--topology", str(tmp_path / "none.toml")]) == 1
    assert "no such topology file" in capsys.readouterr().err


def test_an_address_may_name_its_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    targets: list[object] = []
    monkeypatch.setattr(client, "connect", lambda target, **kw: targets.append(target) or "client")
    where = ["--cluster-tag", "processes/dev", "--key-dir", "/k"]
    for address in ("store-0=tcp://127.0.0.1:1", "tcp://127.0.0.1:1"):
        assert cli._connect(cli.build_parser().parse_args(["sql", "SELECT 1", "--address", address, *where]))
    assert targets == [{"store-0": "tcp://127.0.0.1:1"}, "tcp://127.0.0.1:1"]  # a node id, for its own key
    assert cli.main(["sql", "SELECT 1", "--address", "=tcp://127.0.0.1:1", *where]) == 1
    assert "--address =tcp://127.0.0.1:1: expected [NODE=]tcp://HOST:PORT" in capsys.readouterr().err


def test_without_a_topology_the_one_running_cluster_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.chdir(tmp_path)  # no topologies/processes.toml here
    state = run_dir()
    state.mkdir(parents=True)
    args = cli.build_parser().parse_args(["sql", "SELECT 1"])

    with pytest.raises(cli.CommandError, match="no cluster started by `sparkbus up` is running"):
        cli._topology_path(args)
    # status takes a FILE or tcp:// argument, no --topology or --address (an unrecognised argument there)
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == (
        "sparkbus status: no FILE, no topologies/processes.toml here, and no cluster started by `sparkbus up` "
        "is running (give FILE or tcp://HOST:PORT)\n"
    )

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, timeout=30, check=True
    )
    stale = {"topology": "/gone/old.toml", "launcher_pid": int(dead.stdout), "nodes": {}}
    (state / "up-old-0.json").write_text(json.dumps(stale))  # its launcher was killed: skipped
    (state / "up-torn-1.json").write_text('{"topology": "/half')  # half-written: skipped
    no_topology = {"launcher_pid": os.getpid(), "nodes": {}}
    (state / "up-odd-4.json").write_text(json.dumps(no_topology))  # not a state file of ours: skipped
    live = {"topology": "/there/processes.toml", "launcher_pid": os.getpid(), "nodes": {}}
    (state / "up-processes-2.json").write_text(json.dumps(live))
    assert cli._topology_path(args) == "/there/processes.toml"

    (state / "up-b-3.json").write_text(json.dumps({**live, "topology": "/there/b.toml"}))
    with pytest.raises(
        cli.CommandError, match=r"2 clusters are running: .*/there/b\.toml, /there/processes\.toml"
    ):
        cli._topology_path(args)
    assert cli.main(["sql", "SELECT 1"]) == 1
    assert "give --topology" in capsys.readouterr().err
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == (
        "sparkbus status: no FILE, and 2 clusters are running: give one of /there/b.toml, /there/processes.toml\n"
    )

    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "processes.toml").write_text("")
    assert cli._topology_path(args) == "topologies/processes.toml"  # the checkout's file comes first
    explicit = cli.build_parser().parse_args(["sql", "SELECT 1", "--topology", "/x.toml"])
    assert cli._topology_path(explicit) == "/x.toml"


def test_a_result_table_prints_its_strings_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table({"[b]msg": ["[info] server started", "see [/x] here", None]})
    cli._print_table(table, argparse.Namespace(json=False, max_rows=100), "view [/v]")
    out = capsys.readouterr().out
    for text in ("[b]msg", "[info] server started", "see [/x] here", "NULL", "view [/v]", "(3 rows)"):
        assert text in out


def test_a_topology_file_of_any_name_is_read_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    path = tmp_path / "cluster.topo"
    path.write_text(
        '[cluster]\nname = "x"\n[[nodes]]\nname = "a"\nplacement = "host"\nhost = "127.0.0.1"\n'
        'roles = ["query", "client.gateway"]\n'
    )
    assert cli.main(["sql", "SELECT 1", "--topology", str(path), "--connect-timeout", "1"]) == 1
    err = capsys.readouterr().err  # as for cluster.toml: the file names its cluster, which is not running
    assert "no running cluster recorded for" in err and err.count("\n") == 1, err
