"""The cluster commands against a real ``sparkbus up processes.toml`` (CURVE, keys made by ``up`` in the run
directory): ``sparkbus load``, ``sql``, ``view create`` / ``peek`` / ``drop`` and ``status`` as subprocesses,
their output and exit status. Loopback only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from sparkbus.topologies import shipped
from sparkbus.topologies.partitioning import split

from ..client.test_up import stop
from .test_up import READY_TIMEOUT, Up, cli

# Each test starts a cluster of four node processes (up to READY_TIMEOUT + 10 s) and then runs a `sparkbus`
# process a command, each importing pyarrow and the client (seconds of CPU on a loaded machine, where half a
# dozen of them outlast the suite's default 60 s): every step has its own deadline, this bounds their sum.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPOLOGY = str(shipped("processes.toml"))


def sparkbus(up: Up, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """One ``sparkbus`` command against the running cluster (its run directory), reaped on timeout."""
    return cli({**up.env, "COLUMNS": "200"}, *args, timeout=timeout)


def client(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    return sparkbus(up, *args, "--topology", TOPOLOGY, "--connect-timeout", "20", "--timeout", "30")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up({**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        running.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
        running.wait_for("state:", 10)
        yield running
    finally:
        stop(running)


def events(n: int) -> pa.Table:
    return pa.table(
        {
            "event_id": pa.array(range(n), pa.int64()),
            "kind": pa.array([("view", "click", "buy")[i % 3] for i in range(n)]),
            "value": pa.array([float(i) for i in range(n)]),
        }
    )


def test_load_sql_views_and_status_against_a_running_cluster(up: Up, tmp_path: Path) -> None:
    data = events(3000)
    parquet = tmp_path / "events.parquet"
    pq.write_table(data, parquet, row_group_size=1000)  # read back in 3 chunks: sent as one batch a request
    csv = tmp_path / "more.csv"
    pcsv.write_csv(events(30), csv)

    loaded = client(up, "load", "events", str(parquet))
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded 3,000 rows into events" in loaded.stdout

    counted = client(up, "sql", "SELECT kind, COUNT(*) AS n, SUM(value) AS total FROM events GROUP BY kind")
    assert counted.returncode == 0, counted.stderr
    for kind in ("view", "click", "buy"):
        assert kind in counted.stdout and "1000" in counted.stdout
    assert "(3 rows)" in counted.stdout

    as_json = client(up, "sql", "SELECT COUNT(*) AS n FROM events WHERE value >= 2990", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == [{"n": 10}]

    created = client(
        up, "view", "create", "by_kind", "--source", "events", "--group-by", "kind", "--agg", "n=count(*)"
    )
    assert created.returncode == 0, created.stderr
    assert "view by_kind created" in created.stdout

    more = client(up, "load", "events", str(csv), "--no-views")
    assert more.returncode == 0, more.stderr
    peeked = client(up, "view", "peek", "by_kind", "--json")
    assert peeked.returncode == 0, peeked.stderr
    rows = {r["kind"]: r["n"] for r in map(json.loads, peeked.stdout.splitlines())}
    assert rows == {"view": 1000, "click": 1000, "buy": 1000}  # --no-views left the view's table alone
    table = client(up, "view", "peek", "by_kind")
    assert table.returncode == 0 and "by_kind" in table.stdout and "1000" in table.stdout

    again = client(up, "sql", "SELECT COUNT(*) AS n FROM events", "--json")
    assert json.loads(again.stdout) == {"n": 3030}

    status = sparkbus(up, "status", TOPOLOGY, "--json")
    assert status.returncode == 0, status.stderr
    assert sorted(json.loads(status.stdout)) == ["coordinator", "store-0", "store-1", "store-2"]


def test_errors_are_one_clear_line_and_exit_1(up: Up, tmp_path: Path) -> None:
    bad = client(up, "sql", "SELEC nonsense")
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert bad.stderr.startswith("sparkbus sql: ") and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    missing = client(up, "sql", "SELECT COUNT(*) AS n FROM no_such_table")
    assert missing.returncode == 1 and "no_such_table" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr

    nofile = client(up, "load", "t", str(tmp_path / "absent.parquet"))
    assert nofile.returncode == 1 and "no such file" in nofile.stderr

    noview = client(up, "view", "peek", "no_such_view")
    assert noview.returncode == 1 and "no_such_view" in noview.stderr
    assert len(noview.stderr.strip().splitlines()) == 1, noview.stderr

    badagg = client(up, "view", "create", "v", "--source", "events", "--agg", "total=sum")
    assert badagg.returncode == 1 and "NAME=FUNC(COLUMN)" in badagg.stderr


def test_a_view_that_failed_on_its_data_is_dropped_and_its_name_taken_again(up: Up, tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    pcsv.write_csv(pa.table({"x": pa.array([2**62, 2**62], pa.int64())}), big)
    loaded = client(up, "load", "big", str(big))
    assert loaded.returncode == 0, loaded.stderr
    overflowing = ("--source", "big", "--agg", "s=sum(x)")  # 2**63 is beyond int64
    created = client(up, "view", "create", "totals", *overflowing)
    assert created.returncode == 0, created.stderr

    failed = client(up, "view", "peek", "totals")
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("sparkbus view peek: ") and "drop and create it again" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    taken = client(up, "view", "create", "totals", *overflowing)
    assert taken.returncode == 1 and "'totals' already exists" in taken.stderr

    dropped = client(up, "view", "drop", "totals")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout == "view totals dropped\n"
    again = client(up, "view", "drop", "totals")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("sparkbus view drop: ") and "no view named 'totals'" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr

    # The name is free: a view over the same rows that does not overflow is created and peeked.
    counted = client(up, "view", "create", "totals", "--source", "big", "--agg", "n=count(*)")
    assert counted.returncode == 0, counted.stderr
    peeked = client(up, "view", "peek", "totals", "--json")
    assert peeked.returncode == 0, peeked.stderr
    assert json.loads(peeked.stdout) == {"n": 2}

    # A declared table (processes.toml's orders) with no rows yet has no columns for a view to take.
    empty = client(up, "view", "create", "by_customer", "--source", "orders", "--agg", "n=count(*)")
    assert empty.returncode == 1 and empty.stdout == ""
    assert empty.stderr.startswith("sparkbus view create: table orders holds no rows on any node yet"), (
        empty.stderr
    )
    assert "sparkbus load orders FILE" in empty.stderr and len(empty.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [("sql", "SELECT 1"), ("view", "drop", "v")], ids=["sql", "view drop"])
def test_without_a_running_cluster_the_commands_say_so(tmp_path: Path, command: tuple[str, ...]) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "sparkbus.topologies.cli", *command, "--topology", TOPOLOGY],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1
    assert "no running cluster recorded" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith(f"sparkbus {' '.join(command[:-1])}: ")


def test_load_routes_a_topology_table_to_its_partition_leaders(up: Up, tmp_path: Path) -> None:
    n = 3000
    rows = pa.table(
        {
            "order_id": pa.array(range(n), pa.int64()),
            "customer": pa.array([f"c{i % 97}" for i in range(n)]),
            "amount": pa.array([i * 0.5 for i in range(n)]),
        }
    )
    csv = tmp_path / "orders.csv"
    pcsv.write_csv(rows, csv)

    loaded = client(up, "load", "orders", str(csv))
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded 3,000 rows into orders: 6 of 6 partitions written through their leaders" in loaded.stdout

    def count() -> dict[str, int]:
        res = client(up, "sql", "SELECT COUNT(*) AS n, COUNT(DISTINCT order_id) AS d FROM orders", "--json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    assert count() == {"n": n, "d": n}  # every row once: each store node serves the partitions it leads

    replicas = client(
        up, "sql", "SELECT node, partition, leader, rows, replicated FROM sparkbus_replicas", "--json"
    )
    assert replicas.returncode == 0, replicas.stderr
    table = [json.loads(line) for line in replicas.stdout.splitlines()]
    ours = [r for r in table if r["partition"].startswith("orders/")]
    assert sorted({r["partition"] for r in ours}) == [f"orders/{p}" for p in range(6)]
    assert all(sum(1 for r in ours if r["partition"] == p) == 2 for p in {r["partition"] for r in ours})
    leaders = {r["partition"]: r for r in ours if r["leader"] == 1}
    assert all(r["replicated"] == 1 for r in leaders.values())
    # Each partition holds exactly the rows Spark's pmod(hash(order_id), 6) gives it, on both replicas.
    expected = {f"orders/{p}": t.num_rows for p, t in split(rows, ["order_id"], 6).items()}
    assert {p: r["rows"] for p, r in leaders.items()} == expected
    assert {r["partition"]: r["rows"] for r in ours if r["leader"] == 0} == expected

    created = client(
        up, "view", "create", "order_totals", "--source", "orders", "--agg", "n=count(*)", "--agg",
        "total=sum(amount)",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    def totals() -> dict[str, float]:
        res = client(up, "view", "peek", "order_totals", "--json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    assert totals() == {"n": n, "total": sum(i * 0.5 for i in range(n))}

    # The same keys with new amounts: upserted by key in the store and in the view's table alike.
    pcsv.write_csv(rows.set_column(2, "amount", pa.array([float(i) for i in range(n)])), csv)
    again = client(up, "load", "orders", str(csv))
    assert again.returncode == 0, again.stderr
    assert "for views (upserted by order_id)" in again.stdout
    assert count() == {"n": n, "d": n}  # upserted by key: no duplicates
    assert totals() == {"n": n, "total": float(sum(range(n)))}

    nulls = tmp_path / "nulls.csv"
    nulls.write_text("order_id,customer,amount\n1,a,1.0\n,b,2.0\n")
    refused = client(up, "load", "orders", str(nulls))
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"sparkbus load: {nulls}: key column order_id has 1 null value"


def test_a_file_whose_columns_differ_from_the_tables_leaves_it_queryable(up: Up, tmp_path: Path) -> None:
    n = 600
    rows = pa.table(
        {
            "order_id": pa.array(range(n), pa.int64()),
            "customer": pa.array([f"c{i % 7}" for i in range(n)]),
            "amount": pa.array([float(i) for i in range(n)]),
        }
    )
    # The first load fills one partition only: the others take the schema of whatever comes next.
    first = tmp_path / "first.parquet"
    pq.write_table(split(rows, ["order_id"], 6)[5], first)
    loaded = client(up, "load", "orders", str(first), "--no-views")
    assert loaded.returncode == 0, loaded.stderr

    def count() -> int:
        res = client(up, "sql", "SELECT COUNT(*) AS n FROM orders", "--json")
        assert res.returncode == 0, f"the table can no longer be queried: {res.stderr}"
        return int(json.loads(res.stdout)["n"])

    extra = tmp_path / "extra.parquet"
    pq.write_table(rows.append_column("note", pa.array(["x"] * n)), extra)
    refused = client(up, "load", "orders", str(extra), "--no-views")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "sparkbus load: the file's columns (order_id, customer, amount, note) are not those of table "
        "orders (order_id, customer, amount): not in the table: note"
    )
    assert count() == split(rows, ["order_id"], 6)[5].num_rows  # refused before anything was written

    swapped = tmp_path / "swapped.parquet"
    pq.write_table(rows.select(["amount", "order_id", "customer"]), swapped)
    again = client(up, "load", "orders", str(swapped), "--no-views")
    assert again.returncode == 0, again.stderr  # in the table's column order, whatever the file's
    total = client(up, "sql", "SELECT COUNT(*) AS n, SUM(amount) AS s FROM orders", "--json")
    assert total.returncode == 0, total.stderr
    assert json.loads(total.stdout) == {"n": n, "s": float(sum(range(n)))}


def test_a_topology_file_of_any_name_is_read_as_one(tmp_path: Path) -> None:
    # `sparkbus up` and `status` take any file name; so does --topology (not only *.toml)
    topology = tmp_path / "processes.topo"
    topology.write_text(Path(TOPOLOGY).read_text())
    running = Up({**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}, str(topology))
    try:
        running.wait_for("state:", READY_TIMEOUT + 10)
        rows = tmp_path / "orders.csv"
        pcsv.write_csv(
            pa.table({"order_id": list(range(60)), "customer": ["c"] * 60, "amount": [1.0] * 60}), rows
        )
        where = ("--topology", str(topology), "--connect-timeout", "20", "--timeout", "30")
        loaded = sparkbus(running, "load", "orders", str(rows), *where)  # through each partition's leader
        assert loaded.returncode == 0, loaded.stderr
        counted = sparkbus(running, "sql", "SELECT COUNT(*) AS n FROM orders", "--json", *where)
        assert counted.returncode == 0, counted.stderr
        assert json.loads(counted.stdout) == {"n": 60}
    finally:
        stop(running)
