"""The bus-node adapter: BusConfig from the topology, roles from the registry, clear refusals."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.security import MissingKey
from sparkbus.topologies import load, loads, shipped
from sparkbus.topologies.busnode import (
    BusNodeFactory,
    RoleUnavailable,
    build_roles,
    bus_config,
    close_roles,
    unavailable,
)
from sparkbus.topologies.model import BusSettings
from sparkbus.topologies.registry import ROLES, Entry, Registry, RegistryError
from sparkbus.topologies.runtime import NodeRequest

ECHO_ONLY = """
[cluster]
name = "t"
tag = "x"
[bus]
heartbeat = "100ms"
peer_timeout = "1s"
batch_size = "64KiB"
initial_credit = "1MiB"
[bus.compression]
enabled = true
level = 3
[[nodes]]
name = "n"
placement = "host"
host = "127.0.0.1"
count = 2
services = ["echo"]
"""


def test_bus_config_follows_the_topology() -> None:
    cfg = bus_config(loads(ECHO_ONLY))
    assert cfg.cluster_tag == "t/x"
    assert cfg.heartbeat_interval == pytest.approx(0.1)
    assert cfg.peer_timeout == pytest.approx(1.0)
    assert cfg.batch_size == 64 * 1024
    assert cfg.initial_credit == 1 << 20
    assert cfg.compression is not None and cfg.compression.level == 3
    assert cfg.tune_allocator
    assert cfg.idle_spin == pytest.approx(200e-6)
    assert BusSettings().idle_spin == BusConfig().idle_spin  # a topology's default is the bus's own


def test_the_idle_spin_follows_the_topology() -> None:
    topo = loads(ECHO_ONLY.replace('initial_credit = "1MiB"', 'initial_credit = "1MiB"\nidle_spin = "0s"'))
    assert bus_config(topo).idle_spin == 0.0
    topo = loads(ECHO_ONLY.replace('initial_credit = "1MiB"', 'initial_credit = "1MiB"\nidle_spin = "50us"'))
    assert bus_config(topo).idle_spin == pytest.approx(50e-6)


def test_the_allocator_tuning_can_be_turned_off() -> None:
    topo = loads(
        ECHO_ONLY.replace('initial_credit = "1MiB"', 'initial_credit = "1MiB"\ntune_allocator = false')
    )
    assert topo.bus.tune_allocator is False
    assert bus_config(topo).tune_allocator is False


def test_unavailable_roles_are_refused_by_name() -> None:
    topo = load(shipped("processes.toml"))
    req = NodeRequest(node_id="store-0", topology=topo, advertise_host="127.0.0.1")
    # Every shipped family is installed, so break one entry: its module exists but not its factory.
    entries = {e.name: e for e in ROLES}
    entries["query"] = Entry(
        name="query", kind="role", target="sparkbus.roles.query:no_such_factory", summary="broken"
    )
    registry = Registry(entries)
    missing = unavailable(topo, "store-0", registry)
    assert list(missing) == ["query"]
    assert "no callable 'no_such_factory'" in missing["query"]
    with pytest.raises(RoleUnavailable, match="node store-0: cannot build query"):
        build_roles(req, registry=registry)
    roles = build_roles(req, registry=registry, skip_unavailable=True)
    close_roles(roles)  # as a node's stop does: the replication role's temporary directory goes
    names = [r.name for r in roles]
    assert "echo" in names
    assert "query" not in names
    assert unavailable(topo, "store-0") == {}


def test_echo_nodes_bind_and_stop_without_starting() -> None:
    topo = loads(ECHO_ONLY)
    handle = BusNodeFactory()(NodeRequest(node_id="n-0", topology=topo, advertise_host="127.0.0.1"))
    try:
        ep = handle.bind()
        assert ep.control.startswith("tcp://127.0.0.1:")
        assert handle.failure() is None
    finally:
        handle.stop()


def test_a_requests_data_dir_is_where_the_replicas_live_whatever_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Spark worker's environment is the JVM's at its start: maybe another job's directory, since removed.
    inherited = tmp_path / "inherited"
    monkeypatch.setenv("SPARKBUS_DATA_DIR", str(inherited))
    request = NodeRequest(
        node_id="store-0",
        topology=load(shipped("local.toml")),
        advertise_host="127.0.0.1",
        data_dir=str(tmp_path / "this-start"),
    )
    handle = BusNodeFactory()(request)
    try:
        assert sorted(p.name for p in (tmp_path / "this-start" / "local" / "store-0").iterdir()) == ["LOCK"]
        assert not inherited.exists()
        assert os.environ["SPARKBUS_DATA_DIR"] == str(inherited)  # as it was
    finally:
        handle.stop()


# Two replication nodes whose CURVE keys are missing: each builds its roles, then cannot bind.
NO_KEYS = """
[cluster]
name = "leak"
[bus.security]
mode = "curve"
key_dir = "{key_dir}"
[[nodes]]
name = "leaky"
placement = "host"
host = "127.0.0.1"
count = 2
roles = ["replication", "query"]
[tables.t]
partitions = 2
key = "k"
"""


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a replica without ``$SPARKBUS_DATA_DIR`` makes its temporary data directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.delenv("SPARKBUS_DATA_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_node_that_cannot_bind_closes_its_roles(tmp_path: Path, temp_dir: Path) -> None:
    topo = loads(NO_KEYS.format(key_dir=tmp_path / "missing-keys"))
    handle = BusNodeFactory()(NodeRequest(node_id="leaky-0", topology=topo, advertise_host="127.0.0.1"))
    assert [p.name.startswith("leaky-0-") for p in temp_dir.iterdir()] == [True]
    with pytest.raises(MissingKey, match="no secret key for node 'leaky-0'"):
        handle.bind()
    assert list(temp_dir.iterdir()) == []
    handle.stop()  # the caller's own stop afterwards is harmless


def test_roles_built_before_one_fails_are_closed(temp_dir: Path) -> None:
    topo = loads(NO_KEYS.format(key_dir="/nowhere"))
    entries = {e.name: e for e in ROLES}
    entries["query"] = Entry(name="query", kind="role", target="builtins:str", summary="returns no Role")
    request = NodeRequest(node_id="leaky-1", topology=topo, advertise_host="127.0.0.1")
    with pytest.raises(RegistryError, match="not a Role"):
        build_roles(request, registry=Registry(entries))  # replication was built first
    assert list(temp_dir.iterdir()) == []
