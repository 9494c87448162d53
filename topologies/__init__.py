"""Topology files, the local launcher, the Spark runtime and the command line.

``sparkbus.topologies.spark`` (the Spark runtime) is not imported here: it needs the ``spark`` extra.
"""

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
