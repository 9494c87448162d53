"""``topology_target`` / ``connect(path, node=...)`` against a state file like the one ``sparkbus up
processes.toml`` writes (no nodes run): the entry gateway is the coordinator, every gateway is known by
node id, and a node without a gateway is refused by name before anything connects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkbus.roles.client import ConnectTimeoutError
from sparkbus.topologies import shipped
from sparkbus.topologies.client import connect, topology_target
from sparkbus.topologies.launcher import state_file

NODES = ("coordinator", "store-0", "store-1", "store-2")


def write_state(path: Path, nodes: tuple[str, ...]) -> None:
    body = {
        "nodes": {
            node: {
                "pid": 1,
                "status": f"tcp://127.0.0.1:{7000 + i}",
                "control": f"tcp://127.0.0.1:{6000 + i}",
            }
            for i, node in enumerate(nodes)
        }
    }
    state = state_file(path)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(body))


@pytest.fixture
def topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return Path(shipped("processes.toml"))


def test_the_coordinator_is_the_entry_and_every_gateway_is_known(topology: Path) -> None:
    write_state(topology, NODES)
    found = topology_target(topology)
    assert found.addresses == ["tcp://127.0.0.1:6000"]  # the node holding no replicas
    assert found.gateways == {node: f"tcp://127.0.0.1:{6000 + i}" for i, node in enumerate(NODES)}
    assert found.nodes == {address: node for node, address in found.gateways.items()}


def test_without_the_coordinator_every_gateway_is_an_entry(topology: Path) -> None:
    write_state(topology, NODES[1:])
    assert topology_target(topology).addresses == [
        "tcp://127.0.0.1:6000",
        "tcp://127.0.0.1:6001",
        "tcp://127.0.0.1:6002",
    ]


def test_connect_to_a_node_without_a_gateway_names_it(topology: Path) -> None:
    write_state(topology, NODES)
    with pytest.raises(
        ConnectTimeoutError, match=r"node store-7 runs no client.gateway \(running gateways: "
    ):
        connect(topology, node="store-7")
    with pytest.raises(ValueError, match="needs a topology file"):
        connect("tcp://127.0.0.1:6000", cluster_tag="processes/dev", node="store-0")


def test_a_topology_file_of_any_name_is_read_as_one(topology: Path, tmp_path: Path) -> None:
    # `sparkbus up FILE` takes any file name; connect reads such a file as a topology, not an address
    conf = tmp_path / "cluster.conf"
    conf.write_text(topology.read_text())
    with pytest.raises(ConnectTimeoutError, match=r"no running cluster recorded for .*cluster\.conf"):
        connect(str(conf), connect_timeout=1)
    write_state(conf, NODES)
    with pytest.raises(ConnectTimeoutError, match=r"node store-7 runs no client.gateway"):
        connect(conf, node="store-7")
