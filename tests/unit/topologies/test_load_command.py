"""``sparkbus load`` as a whole (``cli._load`` and the clients ``_connect`` opens): which node each request
goes to. No cluster (the real one: tests/integration/topologies/test_cli_load.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkbus.topologies import cli, shipped
from sparkbus.topologies import client as client_module
from sparkbus.topologies.client import TopologyTarget

TOPOLOGY = str(shipped("processes.toml"))


def test_a_declared_table_by_address_and_topology_goes_to_each_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --address is where the command enters; a partition's rows go to its leader's gateway, found by topology
    found = TopologyTarget(
        addresses=["tcp://c"],
        cluster_tag="processes/dev",
        nodes={"tcp://c": "coordinator", "tcp://s1": "store-1"},
        key_dir=None,
        run_dir_keys=False,
        gateways={"coordinator": "tcp://c", "store-1": "tcp://s1"},
    )
    opened: list[tuple[Any, str]] = []

    def client(addresses: list[str], **kw: Any) -> str:
        opened.append((addresses, kw["cluster_tag"]))
        return "leader"

    def connect(target: Any, **kw: Any) -> str:
        opened.append((target, kw["cluster_tag"]))
        return "entry"

    monkeypatch.setattr(client_module, "topology_target", lambda path: found)
    monkeypatch.setattr(client_module, "Client", client)
    monkeypatch.setattr(client_module, "connect", connect)
    where = ["--address", "tcp://c", "--cluster-tag", "processes/dev", "--topology", TOPOLOGY]
    args = cli.build_parser().parse_args(["load", "orders", "x.csv", *where])
    assert cli._topology_table(args) is not None  # orders is declared: routed
    assert cli._connect(args) == "entry"
    assert cli.partial_connect(args)("store-1") == "leader"
    assert opened == [("tcp://c", "processes/dev"), (["tcp://s1"], "processes/dev")]


def test_a_declared_table_by_address_needs_the_topologys_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no cluster recorded as running here
    where = ["--address", "tcp://c", "--cluster-tag", "processes/dev", "--topology", TOPOLOGY]
    args = cli.build_parser().parse_args(["load", "orders", "x.csv", *where])
    with pytest.raises(cli.CommandError, match=r"table orders is declared in .*no running cluster recorded"):
        cli.partial_connect(args)
