"""What a validated topology is: frozen dataclasses, and the error that lists a file's problems.

``sparkbus.topologies.schema`` builds these from TOML; ``docs/TOPOLOGIES.md`` describes every key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Transport = Literal["tcp", "ipc"]
Placement = Literal["driver", "executor", "host"]
SecurityMode = Literal["none", "curve"]

KiB = 1024
MiB = 1024 * KiB
#: A batch must fit one envelope frame (codecs' default frame limit).
MAX_BATCH_SIZE = 64 * MiB
#: Each node binds a control socket and a data socket.
PORTS_PER_NODE = 2
#: The most nodes a topology holds (and so a ``count``). Every node links to every other, opening 4 ZeroMQ
#: sockets per peer (a DEALER, a PUSH, and the two of the DEALER's monitor), and libzmq holds at most 1023
#: sockets per process by default (``ZMQ_MAX_SOCKETS``): a node with 260 peers fails to start with "Too many
#: open files". 200 leaves room for the node's own sockets (ROUTER, PULL, wake-up pair, CURVE monitors).
MAX_NODES = 200
#: Why ``MAX_NODES``, in the problem refusing a larger count.
MAX_NODES_WHY = "each node opens 4 ZeroMQ sockets per peer, and a process holds at most 1023"

LOCAL_MASTER = re.compile(r"^local(?:\[(?P<n>\*|[1-9][0-9]*)(?:,\s*[0-9]+)?\])?$")


# ---------------------------------------------------------------- the dataclasses


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """``[cluster]``: what this deployment is called."""

    name: str
    tag: str = ""


@dataclass(frozen=True, kw_only=True)
class PortRange:
    """An inclusive range of TCP ports (``"7100-7199"``)."""

    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True, kw_only=True)
class CompressionSettings:
    """``[bus.compression]``: zstd on payload frames (off by default: it costs more than it saves on
    loopback and fast links, see docs/ARCHITECTURE.md)."""

    enabled: bool = False
    level: int = 1
    min_size: int = 4 * KiB


@dataclass(frozen=True, kw_only=True)
class SecuritySettings:
    """``[bus.security]``: CURVE encryption and who may connect.

    Attributes:
        mode: ``"none"`` or ``"curve"``.
        key_dir: directory with this cluster's CURVE certificates (relative paths are resolved against
            the topology file's folder). Required with ``curve``.
        allow: IP addresses allowed to connect; empty means any address.
    """

    mode: SecurityMode = "none"
    key_dir: str | None = None
    allow: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class BusSettings:
    """``[bus]``: how nodes talk to each other. Durations are in seconds, sizes in bytes."""

    transport: Transport = "tcp"
    host: str = "127.0.0.1"
    ports: PortRange | None = None
    ipc_dir: str | None = None
    heartbeat: float = 1.0
    peer_timeout: float = 5.0
    batch_size: int = 512 * KiB
    initial_credit: int = 4 * MiB
    tune_allocator: bool = True
    idle_spin: float = 200e-6
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)


@dataclass(frozen=True, kw_only=True)
class SparkSettings:
    """``[spark]``: where executor-placed nodes run.

    Attributes:
        master: the Spark master URL; ``local[2]`` is the embedded default.
        app_name: the Spark application name (default ``sparkbus-<cluster name>``).
        barrier_timeout: how long a barrier task waits for the others at the rendezvous before the stage
            fails (``spark.barrier.sync.timeout``; Spark's own default is a year).
        conf: extra Spark settings as (key, value) pairs, values as Spark strings.
    """

    master: str = "local[2]"
    app_name: str = ""
    barrier_timeout: float = 30.0
    conf: tuple[tuple[str, str], ...] = ()

    @property
    def local_slots(self) -> int | None:
        """Task slots of a ``local[N]`` master; None for ``local[*]`` and cluster masters."""
        match = LOCAL_MASTER.match(self.master)
        if match is None:
            return None
        n = match["n"]
        if n is None:
            return 1
        return None if n == "*" else int(n)

    @property
    def is_local(self) -> bool:
        return LOCAL_MASTER.match(self.master) is not None


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One ``[[nodes]]`` entry: a node, or ``count`` alike nodes.

    Attributes:
        name: the entry's name; node ids are ``name`` without ``count``, else ``name-0`` .. ``name-<count-1>``.
        placement: ``driver`` (in the Spark driver process), ``executor`` (one barrier task each) or
            ``host`` (a process on ``host``).
        count: how many nodes this entry makes, or None when ``count`` is not written (one node).
        host: the machine for ``host`` placement.
        roles: protocol roles this node runs, by registry name.
        services: helper services this node runs, by registry name.
    """

    name: str
    placement: Placement
    count: int | None = None
    host: str | None = None
    roles: tuple[str, ...] = ()
    services: tuple[str, ...] = ()

    @property
    def node_ids(self) -> tuple[str, ...]:
        if self.count is None:
            return (self.name,)
        return tuple(f"{self.name}-{i}" for i in range(self.count))

    @property
    def runs(self) -> tuple[str, ...]:
        """Roles then services."""
        return self.roles + self.services


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One ``[tables.<name>]`` entry."""

    name: str
    partitions: int
    replication: int
    key: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A validated topology file."""

    source: str
    cluster: Cluster
    bus: BusSettings
    spark: SparkSettings | None
    nodes: tuple[NodeSpec, ...]
    tables: tuple[TableSpec, ...] = ()

    def node_ids(self) -> list[str]:
        return [nid for spec in self.nodes for nid in spec.node_ids]

    def placed(self, placement: Placement) -> list[tuple[str, NodeSpec]]:
        """(node id, spec) of every node with ``placement``, in file order."""
        return [(nid, spec) for spec in self.nodes if spec.placement == placement for nid in spec.node_ids]

    def spec_of(self, node_id: str) -> NodeSpec:
        for spec in self.nodes:
            if node_id in spec.node_ids:
                return spec
        raise KeyError(f"{self.source}: no node {node_id!r}; nodes are {', '.join(self.node_ids())}")

    def hosting(self, name: str) -> list[str]:
        """Ids of the nodes that run the role or service ``name``."""
        return [nid for spec in self.nodes if name in spec.runs for nid in spec.node_ids]


# ---------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a topology: where (a key path) and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class TopologyError(ValueError):
    """A topology file is unreadable or invalid; ``problems`` lists every finding."""

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = [f"{source}: {p}" for p in self.problems]
        head = f"{source}: invalid topology ({len(self.problems)} problem{'s' * (len(self.problems) != 1)})"
        super().__init__("\n".join([head, *lines]) if len(lines) > 1 else lines[0])
