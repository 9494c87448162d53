"""Topology files, the local launcher, the Spark runtime and the command line.

The names below are imported on first use, so ``import sparkbus.topologies.cli`` (every ``sparkbus``
command) does not import the echo role and the bus with them. ``sparkbus.topologies.spark`` (the Spark
runtime) is not among them: it needs the ``spark`` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkbus.topologies.echo import EchoRole
    from sparkbus.topologies.registry import ROLES, Registry, RegistryError, RoleContext, RoleFactory
    from sparkbus.topologies.schema import (
        SHIPPED,
        BusSettings,
        Cluster,
        CompressionSettings,
        NodeSpec,
        PortRange,
        Problem,
        SecuritySettings,
        SparkSettings,
        TableSpec,
        Topology,
        TopologyError,
        load,
        loads,
        shipped,
    )
    from sparkbus.topologies.units import parse_duration, parse_size

#: where each name is, the others being ``sparkbus.topologies.schema``'s (its ``__all__``)
_ELSEWHERE = {
    "EchoRole": "sparkbus.topologies.echo",
    "parse_duration": "sparkbus.topologies.units",
    "parse_size": "sparkbus.topologies.units",
    **dict.fromkeys(
        ("ROLES", "Registry", "RegistryError", "RoleContext", "RoleFactory"), "sparkbus.topologies.registry"
    ),
}

__all__ = [
    "ROLES",
    "SHIPPED",
    "BusSettings",
    "Cluster",
    "CompressionSettings",
    "EchoRole",
    "NodeSpec",
    "PortRange",
    "Problem",
    "Registry",
    "RegistryError",
    "RoleContext",
    "RoleFactory",
    "SecuritySettings",
    "SparkSettings",
    "TableSpec",
    "Topology",
    "TopologyError",
    "load",
    "loads",
    "parse_duration",
    "parse_size",
    "shipped",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'sparkbus.topologies' has no attribute {name!r}")
    return getattr(importlib.import_module(_ELSEWHERE.get(name, "sparkbus.topologies.schema")), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
