"""What a runtime (local processes or Spark) needs from a node, whichever node implementation it is.

Runtimes never construct the bus node directly: they call a ``NodeFactory`` with a ``NodeRequest`` and
drive the ``NodeHandle`` it returns through ``bind`` -> ``set_peers`` -> ``start`` -> ``wait_ready`` ->
``stop``. ``sparkbus.topologies.probe`` is a plain-ZeroMQ node that only checks every pair of nodes can
talk (a connectivity probe, and the stand-in until the bus node is wired in).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sparkbus.topologies.model import Problem, Topology, TopologyError
from sparkbus.topologies.registry import RoleContext

#: Bind addresses that mean "every interface": a node bound there advertises its machine's address.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "*", "::", ""})


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """Where a node can be reached: its control (messages) and data (stream batches) sockets, and its HTTP
    exchange server (``host:port``; "" when the node runs no ``binx.server``)."""

    control: str
    data: str
    http: str = ""

    def to_json(self) -> dict[str, str]:
        raw = {"control": self.control, "data": self.data}
        if self.http:
            raw["http"] = self.http
        return raw

    @classmethod
    def from_json(cls, raw: Any) -> Endpoints:
        """Parse what a peer published; raises ValueError naming what is wrong."""
        if not isinstance(raw, dict) or not {"control", "data"} <= set(raw) <= {"control", "data", "http"}:
            raise ValueError(
                f"endpoints must be an object with 'control', 'data' and optionally 'http', got {json.dumps(raw)}"
            )
        if not all(isinstance(raw[k], str) and "://" in raw[k] for k in ("control", "data")):
            raise ValueError(
                f"endpoints must be ZeroMQ addresses such as tcp://host:port, got {json.dumps(raw)}"
            )
        http = raw.get("http", "")
        if not isinstance(http, str) or (http and (":" not in http or "://" in http)):
            raise ValueError(f"the http endpoint must be host:port, got {json.dumps(raw)}")
        return cls(control=raw["control"], data=raw["data"], http=http)


@dataclass(frozen=True, kw_only=True)
class NodeRequest:
    """What a factory is told about the node to build.

    Attributes:
        node_id: the node's id in the topology.
        topology: the validated topology.
        advertise_host: the address peers should use to reach this node (the bind host, or this
            machine's address when the topology binds every interface).
        local_data: Arrow record batches this node loads, when they are all known before it is built
            (the Spark runtime instead builds and starts the node first and hands it its task's input
            with ``NodeHandle.feed`` as it arrives).
        data_dir: where the node keeps its data on disk (its replicas in ``<data_dir>/<cluster>/<node>``),
            in place of ``$SPARKBUS_DATA_DIR``; None: what that variable says. The Spark runtime gives each
            node a directory of its own that it removes, whatever the workers' environment holds.
    """

    node_id: str
    topology: Topology
    advertise_host: str
    local_data: tuple[Any, ...] = field(default=())
    data_dir: str | None = None

    def role_context(self) -> RoleContext:
        return RoleContext(
            node_id=self.node_id,
            spec=self.topology.spec_of(self.node_id),
            topology=self.topology,
            local_data=self.local_data,
            data_dir=self.data_dir,
        )


@runtime_checkable
class NodeHandle(Protocol):
    """A node as runtimes drive it. Every method may raise; the runtime reports the error with the node id."""

    node_id: str

    def bind(self) -> Endpoints:
        """Bind the node's sockets (ephemeral ports unless the topology fixes a range); return them."""
        ...

    def set_peers(self, peers: Mapping[str, Endpoints]) -> None:
        """Every other node of the topology and where it listens."""
        ...

    def start(self) -> None:
        """Start serving in the background and connect to the peers."""
        ...

    def wait_ready(self, timeout: float) -> None:
        """Return once every link has completed its handshake; raise TimeoutError naming the missing peers."""
        ...

    def feed(self, batches: Sequence[Any], *, last: bool) -> None:
        """Hand the started node more of its local data (Arrow record batches), as a runtime receives it;
        ``last`` on the final call (possibly with no batches). Returns without waiting for the rows to be
        written, except with ``last``, when it returns once the node has taken every row; raises if the
        node refused some (the cause named)."""
        ...

    def failure(self) -> str | None:
        """None while the node is healthy; the cause once it has died."""
        ...

    def counters(self) -> dict[str, Any]:
        """JSON-serialisable counters (messages, bytes, peers) for the runtime's report."""
        ...

    def stop(self) -> None:
        """Stop serving and release every socket; idempotent."""
        ...


NodeFactory = Callable[[NodeRequest], NodeHandle]


def advertise_host(bind_host: str, machine_address: str) -> str:
    """The address peers should dial for a node bound on ``bind_host`` on a machine at ``machine_address``."""
    return machine_address if bind_host in WILDCARD_HOSTS else bind_host


#: what ``topologies/cluster.example.toml`` holds where a value of the user's own goes
PLACEHOLDER = "FILL-IN"


def check_filled_in(topo: Topology) -> None:
    """Raise ``TopologyError`` naming each setting a cluster runs on that still holds ``PLACEHOLDER``
    (``spark.master``, ``bus.security.key_dir``; ``allow`` takes IP addresses only): the file loads, being of
    a valid shape, but Spark would spend a minute and more failing to reach a master named
    FILL-IN-MASTER-HOST."""
    values = [("spark.master", topo.spark.master if topo.spark else "", "your cluster's master URL")]
    values += [
        ("bus.security.key_dir", topo.bus.security.key_dir or "", "the directory of the cluster's keys")
    ]
    problems = [
        Problem(where, f"{value!r} is the example's placeholder; fill in {what}")
        for where, value, what in values
        if PLACEHOLDER in value.upper()
    ]
    if problems:
        raise TopologyError(topo.source, problems)
