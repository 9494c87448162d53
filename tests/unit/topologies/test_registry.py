from __future__ import annotations

import pytest

from sparkbus.bus.contract import Role
from sparkbus.topologies.registry import ROLES, Registry, RegistryError, RoleContext
from sparkbus.topologies.schema import load, shipped


def test_known_names() -> None:
    assert ROLES.names("role") == [
        "binx.client",
        "binx.server",
        "client.gateway",
        "compute.controller",
        "compute.replica",
        "http.client",
        "query",
        "replication",
    ]
    assert ROLES.names("service") == ["echo"]


def test_echo_resolves_and_builds_a_role() -> None:
    topo = load(shipped("processes.toml"))
    ctx = RoleContext(node_id="store-0", spec=topo.spec_of("store-0"), topology=topo)
    role = ROLES.build("echo", ctx)
    assert isinstance(role, Role)
    assert role.name == "echo"


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(RegistryError, match=r"unknown role or service 'qeury'; known: binx.client, .*echo"):
        ROLES.resolve("qeury")


def test_missing_family_is_reported_not_imported_at_load() -> None:
    reg = Registry()
    reg.register("ghost", "role", "sparkbus.roles.nonexistent_family:make_role", "not there")
    assert not reg.available("ghost")
    with pytest.raises(RegistryError, match=r"ghost.*sparkbus.roles.nonexistent_family cannot be imported"):
        reg.resolve("ghost")
    reg.register("hollow", "role", "sparkbus.topologies.units:no_such_factory", "module without the factory")
    with pytest.raises(RegistryError, match="has no callable 'no_such_factory'"):
        reg.resolve("hollow")


def test_register_conflicts_and_bad_targets() -> None:
    reg = Registry()
    reg.register("x", "service", "a.b:c", "one")
    reg.register("x", "service", "a.b:c", "one")  # the same entry again is fine
    with pytest.raises(RegistryError, match=r"already registered to a\.b:c"):
        reg.register("x", "service", "a.b:d", "two")
    with pytest.raises(ValueError, match="must be 'module:attribute'"):
        reg.register("y", "role", "a.b.c", "no colon")


def test_factory_must_return_a_role() -> None:
    reg = Registry()
    reg.register("notarole", "service", "sparkbus.topologies.units:format_size", "returns a str")
    topo = load(shipped("processes.toml"))
    ctx = RoleContext(node_id="store-0", spec=topo.spec_of("store-0"), topology=topo)
    with pytest.raises((RegistryError, TypeError)):
        reg.build("notarole", ctx)
