"""Human-readable summaries of a topology (``sparkbus validate``).

Everything printed from the file (its path, the cluster's tag, hosts, directories, key columns) goes to Rich as
``Text``, never as a markup string: a tag such as ``release [/v2]`` is printed as it is.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkbus.topologies.model import Topology
from sparkbus.topologies.registry import ROLES, Registry
from sparkbus.topologies.units import format_duration, format_size


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _where(topo: Topology) -> str:
    if topo.spark is None:
        return "plain processes (no [spark] section)"
    return f"Spark {topo.spark.master}, application {topo.spark.app_name}"


def _bus_line(topo: Topology) -> str:
    bus = topo.bus
    if bus.transport == "ipc":
        at = f"ipc in {bus.ipc_dir or 'a temporary directory'}"
    else:
        at = f"tcp on {bus.host}, ports {bus.ports or 'ephemeral'}"
    security = "CURVE" if bus.security.mode == "curve" else "no encryption"
    if bus.security.allow:
        security += f", {len(bus.security.allow)} allowed addresses"
    compression = f"zstd level {bus.compression.level}" if bus.compression.enabled else "no compression"
    return (
        f"{at}; heartbeat {format_duration(bus.heartbeat)}, peer timeout {format_duration(bus.peer_timeout)}; "
        f"batches {format_size(bus.batch_size)}, initial credit {format_size(bus.initial_credit)}; "
        f"{compression}; {security}"
    )


def _names(names: tuple[str, ...], registry: Registry) -> str:
    return ", ".join(n if registry.available(n) else f"{n}*" for n in names) or "-"


def print_summary(topo: Topology, console: Console, registry: Registry = ROLES) -> None:
    """Print the cluster, where it runs, the bus settings, the nodes and the tables."""
    tag = f" ({topo.cluster.tag})" if topo.cluster.tag else ""
    console.print(
        Text.assemble((str(topo.source), "bold"), ": valid topology ", (topo.cluster.name, "bold"), tag)
    )
    console.print(Text(f"runs on: {_where(topo)}"))
    console.print(Text(f"bus: {_bus_line(topo)}"))
    nodes = Table(title=_count(len(topo.node_ids()), "node"), title_justify="left")
    for column in ("node", "placement", "roles", "services"):
        nodes.add_column(column)
    for spec in topo.nodes:
        ids = ", ".join(spec.node_ids)
        placement = spec.placement if spec.placement != "host" else f"host {spec.host}"
        cells = (ids, placement, _names(spec.roles, registry), _names(spec.services, registry))
        nodes.add_row(*map(Text, cells))
    console.print(nodes)
    # A role whose family is not installed validates, but its node cannot start: say so.
    missing = sorted({n for spec in topo.nodes for n in spec.runs if not registry.available(n)})
    if missing:
        console.print(Text(f"* not installed here, so these nodes cannot start yet: {', '.join(missing)}"))
    if not topo.tables:
        console.print("tables: none")
        return
    tables = Table(title=_count(len(topo.tables), "table"), title_justify="left")
    for column in ("table", "partitions", "replication", "key", "stored on"):
        tables.add_column(column)
    stores = ", ".join(topo.hosting("replication"))
    for t in topo.tables:
        tables.add_row(*map(Text, (t.name, str(t.partitions), str(t.replication), ", ".join(t.key), stores)))
    console.print(tables)
