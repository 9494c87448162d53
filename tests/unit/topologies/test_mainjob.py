"""The main job's pure pieces: result comparison with Spark SQL, the report, the summary, the chart."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from rich.console import Console

from sparkbus.roles.replication import PARTITION_COLUMN, split_by_partition
from sparkbus.topologies import cli, mainjob
from sparkbus.topologies.mainjob import (
    QUERIES,
    JobError,
    KeyRouter,
    check_topology,
    client_keys,
    written_rows,
)
from sparkbus.topologies.mainjob_report import QueryResult, build_report, compare, print_summary, write_json
from sparkbus.topologies.partitioning import partition_of
from sparkbus.topologies.schema import load, loads, shipped


def t(**cols: list[object]) -> pa.Table:
    return pa.table(cols)


def test_unordered_results_match_in_any_order_and_within_float_tolerance() -> None:
    ours = t(kind=["a", "b"], n=[2, 3], s=[1.0000000001, 2.0])
    theirs = t(kind=["b", "a"], n=[3, 2], s=[2.0, 1.0])
    assert compare(ours, theirs, ordered=False) == (True, "")


def test_ordered_results_must_agree_row_by_row() -> None:
    ours, theirs = t(k=[1, 2]), t(k=[2, 1])
    match, detail = compare(ours, theirs, ordered=True)
    assert not match and detail == "row 0: sparkbus (1,), Spark SQL (2,)"


@pytest.mark.parametrize(
    ("ours", "theirs", "detail"),
    [
        (t(a=[1]), t(a=[1], b=[2]), "1 columns, Spark SQL has 2"),
        (t(a=[1, 2]), t(a=[1]), "2 rows, Spark SQL has 1"),
        (t(a=[1.0]), t(a=[1.1]), "row 0: sparkbus (1.0,), Spark SQL (1.1,)"),
        (t(a=[None]), t(a=[0]), "row 0: sparkbus (None,), Spark SQL (0,)"),
    ],
)
def test_differences_are_named(ours: pa.Table, theirs: pa.Table, detail: str) -> None:
    assert compare(ours, theirs, ordered=False) == (False, detail)


def test_ints_and_floats_of_the_same_value_match() -> None:
    assert compare(t(n=[3]), t(n=[3.0]), ordered=True)[0]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (1_999_999, 2_000_000),  # COUNT(*) of two million rows, one lost
        (5_000_003, 5_000_000),  # another event_id
        (1_000_000_000_001, 1_000_000_000_000),  # a key near 1e12
    ],
)
def test_integers_compare_exactly(ours: int, theirs: int) -> None:
    match, detail = compare(
        t(n=pa.array([ours], pa.int64())), t(n=pa.array([theirs], pa.int64())), ordered=False
    )
    assert not match and detail == f"row 0: sparkbus ({ours},), Spark SQL ({theirs},)"
    # A float on either side (a sum or an average of doubles) is compared within the tolerance.
    assert compare(t(n=[float(ours)]), t(n=pa.array([theirs], pa.int64())), ordered=False) == (True, "")


def test_nan_equals_nan_as_in_spark_sql_and_sorts_after_every_number() -> None:
    nan = float("nan")
    # SUM(value) of a group holding a NaN is NaN on both engines; the rows come in any order.
    ours = t(kind=["a", "b", "c", None], total=[nan, 2.0, nan, 1.0])
    theirs = t(kind=["c", None, "b", "a"], total=[nan, 1.0, 2.0, nan])
    assert compare(ours, theirs, ordered=False) == (True, "")
    assert compare(t(total=[nan, 1.0, None]), t(total=[1.0, None, nan]), ordered=False) == (True, "")
    assert compare(t(total=[nan]), t(total=[1.0]), ordered=False) == (
        False,
        "row 0: sparkbus (nan,), Spark SQL (1.0,)",
    )


def result(name: str, ours: float, theirs: float, match: bool = True) -> QueryResult:
    return QueryResult(
        name=name,
        sql="SELECT 1",
        ordered=False,
        match=match,
        detail="" if match else "row 0: ...",
        rows=1,
        sparkbus_ms=[ours, ours * 2, ours / 2],
        spark_ms=[theirs],
    )


def report(queries: list[QueryResult]) -> dict[str, object]:
    return build_report(
        rows=100,
        topology="local.toml",
        commit="abc1234",
        phases={"load": 1.23456, "total": 9.0},
        queries=queries,
        load={
            "rows_per_s": 10.0,
            "toarrow_rows_per_s": 20.0,
            "load_vs_toarrow": 0.5,
            "partitions": 8,
            "replication": 2,
        },
        view={"name": "v", "fresh": True, "written_rows": 10, "write_to_peek_p50_ms": 1.0},
        exchange={
            "query": "q",
            "bytes": 10,
            "pages": 1,
            "p50_ms": {"push": 1.0, "binx": 2.0, "http": 3.0},
            "query_p50_ms": {"push": 4.0, "binx": 5.0, "http": 6.0},
            "query_results_match": True,
        },
    )


def test_report_figures() -> None:
    r = report([result("a", 2.0, 100.0), result("b", 4.0, 40.0)])
    assert r["all_results_match"] is True
    assert r["min_speedup_vs_spark"] == 10.0
    assert r["phases_s"] == {"load": 1.235, "total": 9.0}
    assert [q["sparkbus_p50_ms"] for q in r["queries"]] == [2.0, 4.0]  # type: ignore[index]
    assert [q["speedup"] for q in r["queries"]] == [50.0, 10.0]  # type: ignore[index]


def test_one_mismatch_fails_the_report_and_no_query_is_not_a_match() -> None:
    assert report([result("a", 1.0, 2.0), result("b", 1.0, 2.0, match=False)])["all_results_match"] is False
    assert report([])["all_results_match"] is False


def test_report_is_json_and_the_summary_prints(tmp_path: Path) -> None:
    r = report([result("point", 2.0, 100.0)])
    write_json(r, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == 100
    out = io.StringIO()
    print_summary(r, Console(file=out, width=200))
    text = out.getvalue()
    assert "point" in text and "50.0x" in text and "all results match Spark SQL" in text
    assert "the query with push 4.00 ms, BinX 5.00 ms, HTTP 6.00 ms (same rows: yes)" in text


def test_written_rows_continue_the_ids() -> None:
    rows = written_rows(100, 5, users=3)
    assert rows.column("event_id").to_pylist() == [100, 101, 102, 103, 104]
    assert rows.column_names == ["event_id", "user_id", "kind", "value", "ts"]


def test_the_key_router_names_each_rows_partition_and_its_leaders_task() -> None:
    rows = written_rows(0, 1000, 10)
    batch = rows.to_batches()[0]
    expected = partition_of(rows, ["event_id"], 8)
    routed, tasks = KeyRouter(key="event_id", table="events", partitions=8)(batch, 2)
    assert routed.column_names == [*rows.column_names, PARTITION_COLUMN]
    names = routed.column(PARTITION_COLUMN).to_pylist()
    assert names == [f"events/{p}" for p in expected]
    assert tasks is not None and tasks.tolist() == (expected % 2).tolist()
    # The node splits the dictionary column back into partitions, in input order within each.
    parts = dict(split_by_partition(pa.Table.from_batches([routed])))
    assert sorted(parts) == sorted({f"events/{p}" for p in expected})
    for name, part in parts.items():
        ids = [i for i, p in enumerate(expected) if f"events/{p}" == name]
        assert part.column("event_id").to_pylist() == ids
    # Rows of one task only: the dictionary still lists all eight partitions, the split only theirs.
    mine = pa.Table.from_batches([routed]).filter(pa.array(tasks == 1))
    assert {name for name, _ in split_by_partition(mine)} == {f"events/{p}" for p in range(1, 8, 2)}
    # Without the exchange, rows stay where they are and only get their partition.
    stay, none = KeyRouter(key="event_id", table="events", partitions=8, exchange=False)(batch, 2)
    assert none is None and stay.equals(routed)


def test_the_key_router_refuses_rows_without_a_key_or_with_a_null_one() -> None:
    router = KeyRouter(key="event_id", table="events", partitions=8)
    with pytest.raises(ValueError, match="no key column event_id"):
        router(pa.record_batch({"id": [1]}), 2)
    with pytest.raises(ValueError, match="null value"):
        router(pa.record_batch({"event_id": pa.array([1, None], pa.int64())}), 2)


def test_every_reference_query_parses_in_sparkbus_sql() -> None:
    from sparkbus.roles.query import parse_sql

    for q in QUERIES:
        parse_sql(q.sql)
    assert any(q.ordered for q in QUERIES) and 5 <= len(QUERIES) <= 6


def test_local_toml_suits_the_main_job() -> None:
    assert check_topology(load(shipped("local.toml"))) == (2, 8, 2)


def test_a_topology_without_spark_or_events_is_refused() -> None:
    with pytest.raises(JobError, match=r"needs a topology with a \[spark\] section"):
        check_topology(load(shipped("processes.toml")))
    text = (
        shipped("local.toml")
        .read_text()
        .replace(
            'partitions = 8\nreplication = 2\nkey = "event_id"',
            'partitions = 3\nreplication = 2\nkey = "event_id"',
        )
    )
    with pytest.raises(JobError, match="must be a multiple of the 2 executor nodes"):
        check_topology(loads(text))


def test_the_job_needs_a_driver_node_it_can_reach_through_the_thin_client() -> None:
    text = shipped("local.toml").read_text().replace(', "client.gateway"]', "]")
    with pytest.raises(
        JobError, match=r"needs a driver node running client\.gateway, compute\.controller, query"
    ):
        check_topology(loads(text))


def test_every_query_node_needs_the_exchange_roles_the_last_phase_uses() -> None:
    assert check_topology(load(shipped("cluster.example.toml"))) == (4, 16, 2)
    text = (
        shipped("local.toml")
        .read_text()
        .replace(
            '"compute.controller", "binx.server", "binx.client", "http.client",',
            '"compute.controller", "binx.client",',
        )
        .replace('"query", "binx.server", "binx.client", "http.client",', '"query", "binx.server",')
    )
    with pytest.raises(JobError) as refused:
        check_topology(loads(text, "clusterlike.toml"))
    assert str(refused.value) == (
        "clusterlike.toml: sparkbus run queries with every exchange, so every node running query needs "
        "binx.client, binx.server, http.client: coordinator lacks binx.server, http.client; "
        "store lacks binx.client, http.client"
    )
    # Under CURVE the job runs no HTTP exchange (no node serves it), so http.client is not asked for.
    security = '[bus.security]\nmode = "curve"\nkey_dir = "keys"\n\n[spark]\n'
    with pytest.raises(JobError) as refused:
        check_topology(loads(text.replace("[spark]\n", security, 1), "clusterlike.toml"))
    assert str(refused.value).endswith(
        "needs binx.client, binx.server: coordinator lacks binx.server; store lacks binx.client"
    )


def test_the_summary_says_http_was_not_run_under_curve() -> None:
    from sparkbus.topologies.mainjob_exchange import HTTP_NOT_RUN

    r = report([result("point", 2.0, 100.0)])
    ex: dict[str, Any] = r["exchange"]  # type: ignore[assignment]
    for times in (ex["p50_ms"], ex["query_p50_ms"]):
        del times["http"]
    ex["not_run"] = ex["query_not_run"] = {"http": HTTP_NOT_RUN}
    out = io.StringIO()
    print_summary(r, Console(file=out, width=300))
    text = out.getvalue()
    assert f"BinX 5.00 ms, HTTP {HTTP_NOT_RUN} (same rows: yes)" in text
    assert f"BinX 2.00 ms, HTTP {HTTP_NOT_RUN}" in text


def test_run_refuses_bad_rows_and_bad_topologies_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--rows", "0"]) == 1
    assert capsys.readouterr().err == "sparkbus run: --rows must be a positive number of rows, got 0\n"
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[cluster]\nname = 'x'\n[[nodes]]\nname = 'a'\nplacement = 'host'\nhost = '127.0.0.1'\nroles = ['qeury']\n"
    )
    assert cli.main(["run", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sparkbus run: ") and err.count("\n") == 1 and "sparkbus validate" in err
    assert cli.main(["run", str(tmp_path / "missing.toml")]) == 1
    assert "cannot read the file" in capsys.readouterr().err


def test_run_leaves_the_sigterm_handler_as_it_found_it(capsys: pytest.CaptureFixture[str]) -> None:
    def mine(_signum: int, _frame: object) -> None:
        raise AssertionError("not delivered")

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli.main(["run", "--rows", "0"]) == 1
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
    assert capsys.readouterr().err.startswith("sparkbus run: --rows")


def test_the_job_speaks_curve_when_the_topology_does(tmp_path: Path) -> None:
    from sparkbus.bus import security

    assert client_keys(load(shipped("local.toml")), "tcp://127.0.0.1:1", "coordinator") is None
    keys = tmp_path / "keys"
    security.generate(keys, ["coordinator", "store-0", "store-1"])
    text = (
        shipped("local.toml")
        .read_text()
        .replace("[spark]\n", f'[bus.security]\nmode = "curve"\nkey_dir = "{keys}"\n\n[spark]\n', 1)
        .replace('"http.client", ', "")  # no node serves the HTTP exchange under CURVE
    )
    curve = client_keys(loads(text), "tcp://127.0.0.1:1", "coordinator")
    assert curve is not None  # no client pair in the directory: the coordinator's own
    assert curve.public == security.node_keys(keys, "coordinator").public
    assert curve.server_key("tcp://127.0.0.1:1") == security.server_key(keys, "coordinator")


def test_every_run_of_a_query_is_compared_and_the_one_that_differs_is_named() -> None:
    from sparkbus.topologies.mainjob import Options, _sparkbus_queries

    right, wrong = t(n=pa.array([7], pa.int64())), t(n=pa.array([6], pa.int64()))

    class OneWrongAnswer:
        """Right every time but the fifth call (the third timed run, after two warm-ups)."""

        calls = 0

        def sql(self, text: str, **_: object) -> pa.Table:
            self.calls += 1
            return wrong if self.calls == 5 else right

    theirs = {q.name: (right, [1.0]) for q in QUERIES}
    opts = Options(topology=Path("unused.toml"), sparkbus_reps=20)
    results = _sparkbus_queries(OneWrongAnswer(), theirs, opts, Console(file=io.StringIO()))  # type: ignore[arg-type]
    assert [(r.match, r.detail) for r in results] == [
        (False, "run 5 of 22: row 0: sparkbus (6,), Spark SQL (7,)"),
        *[(True, "")] * (len(QUERIES) - 1),
    ]
    assert all(len(r.sparkbus_ms) == 20 for r in results)


def test_the_view_check_counts_null_kinds_and_keeps_null_sums_as_spark_sql_does() -> None:
    from sparkbus.roles.compute.arrangement import DIFF, TIME
    from sparkbus.roles.compute.dataflow import Dataflow
    from sparkbus.topologies.mainjob import _expected_by_kind, _view_matches, events_view

    # --data with two events of no kind, and a kind whose values are all null (its SUM is NULL).
    events = t(
        kind=pa.array(["click", None, None, "view", "share"], pa.string()),
        value=pa.array([1.0, 2.0, 3.0, 4.0, None], pa.float64()),
    )
    updates = events.append_column(TIME, pa.array([0] * 5, pa.int64())).append_column(
        DIFF, pa.array([1] * 5, pa.int64())
    )
    peeked = Dataflow(events_view(), events.schema, 0, "test").feed(updates).drop_columns([TIME, DIFF])
    expected = _expected_by_kind(events)
    assert expected == {"click": (1, 1.0), None: (2, 5.0), "view": (1, 4.0), "share": (1, None)}
    assert _view_matches(peeked, expected)
    # A view that lost a row of the null group, or summed nothing to 0, is not fresh.
    assert not _view_matches(peeked, {**expected, None: (1, 5.0)})
    assert not _view_matches(peeked, {**expected, "share": (1, 0.0)})


def test_a_report_that_cannot_be_written_is_refused_in_one_line_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spark_must_not_start: None
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "r.png").mkdir()
    refused = {
        "out": f"--report {tmp_path}/out: the report {tmp_path}/out is a directory",
        "r.json": f"--report {tmp_path}/r.json: the chart {tmp_path}/r.png is a directory",
        "chart.png": f"--report {tmp_path}/chart.png: the PNG chart would overwrite the report; give the "
        "report another name (such as report.json)",
        "no/r.json": f"--report {tmp_path}/no/r.json: directory {tmp_path}/no does not exist",
    }
    for report_name, error in refused.items():
        assert cli.main(["run", "--rows", "10", "--report", str(tmp_path / report_name)]) == 1
        assert capsys.readouterr().err == f"sparkbus run: {error}\n"


@pytest.mark.parametrize(("report", "shown"), [(".", "."), ("", "."), ("/", "/")])
def test_a_report_that_names_no_file_is_a_directory_in_one_line(
    report: str,
    shown: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--rows", "1", "--report", report]) == 1
    assert capsys.readouterr().err == f"sparkbus run: --report {report}: the report {shown} is a directory\n"


def test_a_report_over_one_of_the_jobs_inputs_is_refused_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spark_must_not_start: None
) -> None:
    topology = tmp_path / "my.toml"
    topology.write_text(shipped("local.toml").read_text())
    data = tmp_path / "events.csv"
    data.write_text("event_id,user_id,kind,value,ts\n1,42,click,1.0,2024-01-01 00:00:00\n")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-0.csv").write_text(data.read_text())
    shot = tmp_path / "shot.png"
    shot.write_bytes(b"not a chart")
    refused = {
        ("--data", str(data), "--report", str(data)): f"the report would overwrite the --data file {data}",
        ("--data", str(shot), "--report", str(tmp_path / "shot.json")): (
            f"the chart would overwrite the --data file {shot}"
        ),
        ("--data", str(tmp_path / "parts"), "--report", str(tmp_path / "parts" / "r.json")): (
            f"the report would be written inside the --data directory {tmp_path / 'parts'}"
        ),
        (
            str(topology),
            "--rows",
            "1",
            "--report",
            str(topology),
        ): f"the report would overwrite the topology {topology}",
    }
    for args, error in refused.items():
        assert cli.main(["run", *args]) == 1
        assert capsys.readouterr().err == f"sparkbus run: --report {args[-1]}: {error}\n"
    assert data.read_text().startswith("event_id,") and shot.read_bytes() == b"not a chart"
    assert topology.read_text() == shipped("local.toml").read_text()


def test_the_java_check_follows_java_home_as_sparks_launcher_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkbus.topologies.mainjob import _check_java

    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\n")
    (jdk / "bin" / "java").chmod(0o755)
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "java").symlink_to(jdk / "bin" / "java")
    # JAVA_HOME set: Spark runs $JAVA_HOME/bin/java, whatever PATH holds.
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(JobError) as refused:
        _check_java()
    assert str(refused.value).startswith(f"JAVA_HOME is {tmp_path}/no-such-jdk, which has no bin/java;")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    _check_java()
    # Without it (or with it empty), java on PATH.
    monkeypatch.setenv("JAVA_HOME", "")
    with pytest.raises(JobError, match="Java not found"):
        _check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(on_path))
    _check_java()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_exception_spark_replaced_still_ends_the_run_by_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signum: signal.Signals
) -> None:
    """PySpark's cleanup can replace the exception a signal raised inside it (a Py4J error from a JVM going
    down too): the run still ends as stopped by that signal, in one line, not with the other error."""

    def run_job(_opts: object, _console: object) -> None:
        try:
            signal.raise_signal(signum)
        except BaseException as exc:
            raise RuntimeError("Py4JJavaError: An error occurred while calling o123.toArrow") from exc

    monkeypatch.setattr(mainjob, "run_job", run_job)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (not SIG_IGN)
    try:
        assert mainjob.main_job(cast(mainjob.Options, None)) == 128 + signum
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
    assert (
        capsys.readouterr().err
        == f"sparkbus run: stopped by {signum.name}; nodes stopped, temporary data removed\n"
    )


def test_a_run_in_the_background_leaves_sigint_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started with `&` from a script, SIGINT is ignored: the run must not start taking it."""
    seen: list[object] = []

    def run_job(_opts: object, _console: object) -> None:
        seen.append(signal.getsignal(signal.SIGINT))
        raise JobError("stand-in")

    monkeypatch.setattr(mainjob, "run_job", run_job)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert mainjob.main_job(cast(mainjob.Options, None)) == 1
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    ("first", "second", "sigint"),
    [
        pytest.param(signal.SIGINT, signal.SIGINT, signal.default_int_handler, id="INT-INT"),
        pytest.param(signal.SIGINT, signal.SIGTERM, signal.default_int_handler, id="INT-TERM"),
        pytest.param(signal.SIGTERM, signal.SIGINT, signal.default_int_handler, id="TERM-INT"),
        pytest.param(signal.SIGTERM, signal.SIGINT, signal.SIG_IGN, id="TERM-INT-in-the-background"),
    ],
)
def test_a_second_signal_does_not_cut_the_cleanup_short(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    first: signal.Signals,
    second: signal.Signals,
    sigint: Any,
) -> None:
    """Ctrl-C pressed twice, or SIGTERM during Ctrl-C's cleanup (or the other way round): the cleanup (nodes
    stopped, data directory removed) runs to its end, the run is reported stopped by the first signal, and
    both handlers are as before once it ends. Started in the background, SIGINT stays ignored throughout.
    SIGINT's handler is set by the test (a terminal's, or ignored), whatever the one running the tests has."""
    cleaned: list[object] = []

    def run_job(_opts: object, _console: object) -> None:
        try:
            signal.raise_signal(first)
        finally:
            signal.raise_signal(second)  # pressed again while the nodes stop
            cleaned.append(signal.getsignal(signal.SIGINT))

    monkeypatch.setattr(mainjob, "run_job", run_job)
    before_int = signal.signal(signal.SIGINT, sigint)
    before_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        code = mainjob.main_job(cast(mainjob.Options, None))
        after = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    finally:
        signal.signal(signal.SIGINT, before_int)
        signal.signal(signal.SIGTERM, before_term)
    assert cleaned == [signal.SIG_IGN]
    assert (code, capsys.readouterr().err) == (
        128 + first,
        f"sparkbus run: stopped by {first.name}; nodes stopped, temporary data removed\n",
    )
    assert after == (sigint, signal.SIG_DFL)


def test_an_error_without_a_signal_is_not_taken_for_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run_job(_opts: object, _console: object) -> None:
        raise JobError("the thin client: refused")

    monkeypatch.setattr(mainjob, "run_job", run_job)
    assert mainjob.main_job(cast(mainjob.Options, None)) == 1
    assert capsys.readouterr().err == "sparkbus run: the thin client: refused\n"
