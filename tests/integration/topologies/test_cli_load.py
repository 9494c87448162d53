"""``sparkbus load`` and ``sparkbus sql`` by ``--address`` against a real ``sparkbus up processes.toml`` (CURVE,
a pair per node as ``up`` makes them, and a ``client`` pair): an address named by its node reaches a node with
per-node keys, a declared table loaded by address and topology goes to its partitions' leaders, and a
``--replace`` the compute controller's table refuses changes nothing. Loopback only; one cluster for the
module."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.topologies import shipped

from ..client.test_up import stop
from .test_up import READY_TIMEOUT, Up, cli

# One cluster of four node processes (up to READY_TIMEOUT + 10 s), then `sparkbus` processes, each importing
# pyarrow and the client: every step has its own deadline, this bounds their sum.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPOLOGY = str(shipped("processes.toml"))
TAG = "processes/dev"


@dataclass
class Cluster:
    up: Up
    keys: Path  # the run directory's key directory: a pair per node and a client pair
    control: dict[str, str]  # node -> its control endpoint

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(
            {**self.up.env, "COLUMNS": "200"}, *args, "--connect-timeout", "20", "--timeout", "30", timeout=90
        )

    def by_address(self, node: str) -> list[str]:
        address = f"{node}={self.control[node]}"
        return ["--address", address, "--cluster-tag", TAG, "--key-dir", str(self.keys)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    where = tmp_path_factory.mktemp("load")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(where)}
    keys = where / f"sparkbus-{os.getuid()}" / "keys-processes"
    # the pairs `up` would make, and the client pair the nodes then admit
    for extra in (("--topology", TOPOLOGY), ("--names", "client")):
        made = cli(env, "keys", "generate", str(keys), *extra)
        assert made.returncode == 0, made.stderr
    running = Up(env)
    try:
        running.wait_for("ready (4 nodes)", READY_TIMEOUT + 10)
        running.wait_for("state:", 10)
        state = next((where / f"sparkbus-{os.getuid()}").glob("up-processes-*.json"))
        nodes = json.loads(state.read_text())["nodes"]
        yield Cluster(running, keys, {node: info["control"] for node, info in nodes.items()})
    finally:
        stop(running)


def test_an_address_named_by_its_node_reaches_a_node_with_its_own_keys(cluster: Cluster) -> None:
    query = "SELECT COUNT(*) AS n FROM sparkbus_replicas"
    done = cluster.run("sql", query, "--json", *cluster.by_address("coordinator"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] > 0
    unnamed = cluster.by_address("coordinator")
    unnamed[1] = cluster.control["coordinator"]
    refused = cluster.run("sql", query, *unnamed)
    assert refused.returncode == 1
    assert "has no public/cluster.key and the node id of tcp://" in refused.stderr, refused.stderr
    assert "--address NODE=" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


def test_a_declared_table_by_address_and_topology_goes_to_its_partitions(
    cluster: Cluster, tmp_path: Path
) -> None:
    # the command enters at the address given (a store node here); each partition's rows go to its leader
    data = tmp_path / "orders.parquet"
    pq.write_table(pa.table({"order_id": pa.array(range(300), pa.int64()), "amount": [1.0] * 300}), data)
    for entry in ("store-0", "coordinator"):
        where = [*cluster.by_address(entry), "--topology", TOPOLOGY]
        done = cluster.run("load", "orders", str(data), "--no-views", *where)
        assert done.returncode == 0, done.stderr
        assert "6 of 6 partitions written through their leaders" in done.stdout, done.stdout
    count = cluster.run("sql", "SELECT COUNT(*) AS n FROM orders", "--json", "--topology", TOPOLOGY)
    assert count.returncode == 0, count.stderr
    assert json.loads(count.stdout) == {"n": 300}  # upserted by order_id: loaded twice, counted once


def test_replace_refused_by_the_views_table_leaves_the_sql_table_as_it_was(
    cluster: Cluster, tmp_path: Path
) -> None:
    first = tmp_path / "a.csv"
    first.write_text("event_id,kind,value\n1,click,1.5\n2,view,2.5\n3,buy,3.5\n")
    loaded = cluster.run("load", "ev", str(first), "--topology", TOPOLOGY)
    assert loaded.returncode == 0, loaded.stderr

    def sql_rows() -> int:
        count = cluster.run("sql", "SELECT COUNT(*) AS n FROM ev", "--json", "--topology", TOPOLOGY)
        assert count.returncode == 0, count.stderr
        return int(json.loads(count.stdout)["n"])

    other = tmp_path / "b.csv"
    other.write_text("event_id,kind,value,colour\n9,click,7,red\n")
    refused = cluster.run("load", "ev", str(other), "--replace", "--topology", TOPOLOGY)
    assert refused.returncode == 1
    assert "not those of the compute controller's table ev" in refused.stderr, refused.stderr
    assert sql_rows() == 3  # nothing was written
    # `value` reads as int64 from this file: the views' table takes it cast to its double
    ints = tmp_path / "c.csv"
    ints.write_text("event_id,kind,value\n9,click,7\n")
    replaced = cluster.run("load", "ev", str(ints), "--replace", "--topology", TOPOLOGY)
    assert replaced.returncode == 0, replaced.stderr
    assert sql_rows() == 1
    peek = cluster.run("view", "peek", "ev", "--json", "--topology", TOPOLOGY)
    assert peek.returncode == 0, peek.stderr
    assert sorted(json.loads(line)["value"] for line in peek.stdout.splitlines()) == [1.5, 2.5, 3.5, 7.0]
