"""The real bus node behind the runtimes' ``NodeHandle``: roles from the registry, settings from the topology.

``BusNodeFactory`` is the ``NodeFactory`` that ``sparkbus up`` and the Spark runtime use to run a
topology for real: for each node it builds every role and service the node lists (``ROLES``), derives a
``BusConfig`` from ``[cluster]`` and ``[bus]``, and wraps a ``sparkbus.bus.node.Node``.

A role whose family is not installed yet cannot be built: ``build_roles`` raises ``RoleUnavailable``
naming the node and every such role, unless ``skip_unavailable`` asks to run only what resolves.

Roles may hold what outlives the process unless they are closed (a replica's temporary data directory), so a
node that fails before it runs closes what it built: ``build_roles`` the roles built before one failed,
``BusNodeHandle`` its roles when the bus node cannot be made, and ``bind`` the whole node when it cannot bind
(a missing CURVE key, no free port).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.node import Endpoints as BusEndpoints
from sparkbus.bus.node import Node
from sparkbus.codecs import Compression
from sparkbus.topologies.keys import curve_settings
from sparkbus.topologies.model import Topology
from sparkbus.topologies.registry import ROLES, Registry, RegistryError
from sparkbus.topologies.runtime import Endpoints, NodeHandle, NodeRequest

_log = logging.getLogger(__name__)

#: How long a HELLO goes unanswered before it is sent again, at most (the bus default).
_HANDSHAKE_TIMEOUT = 1.0


class RoleUnavailable(RuntimeError):
    """A node lists roles or services whose implementation cannot be loaded."""


def bus_config(topology: Topology) -> BusConfig:
    """The ``BusConfig`` a topology's ``[cluster]`` and ``[bus]`` sections describe."""
    bus = topology.bus
    tag = topology.cluster.name + (f"/{topology.cluster.tag}" if topology.cluster.tag else "")
    comp = bus.compression
    compression = (
        Compression(level=comp.level, min_size=comp.min_size, enabled=True) if comp.enabled else None
    )
    return BusConfig(
        cluster_tag=tag,
        heartbeat_interval=bus.heartbeat,
        peer_timeout=bus.peer_timeout,
        handshake_timeout=min(_HANDSHAKE_TIMEOUT, bus.peer_timeout / 2),
        batch_size=bus.batch_size,
        initial_credit=bus.initial_credit,
        compression=compression,
        tune_allocator=bus.tune_allocator,
        idle_spin=bus.idle_spin,
        curve=curve_settings(topology),
    )


def unavailable(topology: Topology, node_id: str, registry: Registry = ROLES) -> dict[str, str]:
    """Roles and services of ``node_id`` that cannot be built now, each with the reason."""
    spec = topology.spec_of(node_id)
    missing: dict[str, str] = {}
    for name in (*spec.roles, *spec.services):
        try:
            registry.resolve(name)
        except RegistryError as exc:
            missing[name] = str(exc)
    return missing


def close_roles(roles: Iterable[c.Role]) -> None:
    """Let each role go of what it holds (``Role.close``), as a stopped node does; a failure is logged and
    the others are still closed."""
    for role in roles:
        close = getattr(role, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                _log.exception("closing role %s", getattr(role, "name", role))


def build_roles(
    request: NodeRequest, *, registry: Registry = ROLES, skip_unavailable: bool = False
) -> list[c.Role]:
    """Every role and service of the node, built by the registry.

    Raises:
        RoleUnavailable: some cannot be loaded (and ``skip_unavailable`` is false), or nothing is left
            to run.
    """
    missing = unavailable(request.topology, request.node_id, registry)
    if missing and not skip_unavailable:
        raise RoleUnavailable(
            f"node {request.node_id}: cannot build {', '.join(sorted(missing))} "
            f"(their protocol families are not installed yet): "
            + "; ".join(missing[n] for n in sorted(missing))
        )
    spec = request.topology.spec_of(request.node_id)
    # One catalog per node, shared by all its roles: what replication applies is what queries scan.
    from sparkbus.roles.query.catalog import TableCatalog  # noqa: PLC0415 (building a node loads families)

    ctx = replace(request.role_context(), catalog=TableCatalog())
    roles: list[c.Role] = []
    try:
        for n in (*spec.roles, *spec.services):
            if n not in missing:
                roles.append(registry.build(n, ctx))
    except BaseException:
        close_roles(roles)
        raise
    if not roles:
        raise RoleUnavailable(f"node {request.node_id}: none of its roles or services can be built")
    return roles


@dataclass(frozen=True)
class BusNodeFactory:
    """A ``NodeFactory`` making ``BusNodeHandle``s.

    Args:
        skip_unavailable: run only the roles that resolve instead of refusing the node.
        registry: where names are looked up (``ROLES``).
    """

    skip_unavailable: bool = False
    registry: Registry = ROLES

    def __call__(self, request: NodeRequest) -> NodeHandle:
        return BusNodeHandle(request, skip_unavailable=self.skip_unavailable, registry=self.registry)


class BusNodeHandle:
    """A ``sparkbus.bus.node.Node`` driven as a runtime ``NodeHandle``."""

    def __init__(
        self, request: NodeRequest, *, skip_unavailable: bool = False, registry: Registry = ROLES
    ) -> None:
        self.node_id = request.node_id
        topo = request.topology
        self.roles = build_roles(request, registry=registry, skip_unavailable=skip_unavailable)
        self.skipped = sorted(unavailable(topo, self.node_id, registry)) if skip_unavailable else []
        self._advertise = request.advertise_host
        try:
            self.node = Node(
                self.node_id,
                bus_config(topo),
                self.roles,
                host=topo.bus.host if topo.bus.host != "*" else "0.0.0.0",
                transport=topo.bus.transport,
                ipc_dir=topo.bus.ipc_dir,
                ports=None if topo.bus.ports is None else (topo.bus.ports.first, topo.bus.ports.last),
            )
        except BaseException:
            close_roles(self.roles)
            raise
        self._peers: dict[str, BusEndpoints] = {}
        self._feeds: list[Future[Any]] = []
        self._started = False
        self._stopped = False

    def bind(self) -> Endpoints:
        """Bind the node's sockets. A node that cannot bind (a missing CURVE key, no free port) is stopped
        before the error is raised: its sockets closed, its roles closed."""
        try:
            ep = self.node.bind()
        except BaseException:
            try:
                self.stop()
            except Exception:  # the bind's error is the one to report
                _log.exception("node %s: stopping it after its bind failed", self.node_id)
            raise
        http = f"{self._advertise}:{ep.http.rsplit(':', 1)[1]}" if ep.http else ""
        return Endpoints(control=self._advertised(ep.control), data=self._advertised(ep.data), http=http)

    def _advertised(self, address: str) -> str:
        if not address.startswith("tcp://"):
            return address
        port = address.rsplit(":", 1)[1]
        return f"tcp://{self._advertise}:{port}"

    def set_peers(self, peers: Mapping[str, Endpoints]) -> None:
        self._peers = {
            k: BusEndpoints(control=v.control, data=v.data, http=v.http)
            for k, v in peers.items()
            if k != self.node_id
        }

    def start(self) -> None:
        self.node.start(self._peers)
        self._started = True

    def wait_ready(self, timeout: float) -> None:
        if not self._peers:
            return
        self.node.wait_ready(timeout)

    def feed(self, batches: Sequence[Any], *, last: bool, timeout: float = 60.0) -> None:
        """Hand the batches to every role that takes local rows after the start (``local_rows_call``);
        with ``last``, wait until each has taken all of them. Raises ``RuntimeError`` with a role's refusal
        (the first one seen, also on a later call than the one refused)."""
        for role in self.roles:
            name = getattr(role, "local_rows_call", None)
            if name is not None:
                self._feeds.append(
                    self.node.call_async(role.name, name, {"batches": tuple(batches), "last": last})
                )
        pending = []
        for fut in self._feeds:
            if last or fut.done():
                fut.result(timeout=timeout)  # raises the role's refusal
            else:
                pending.append(fut)
        self._feeds = pending

    def failure(self) -> str | None:
        err = self.node.error
        return None if err is None else f"bus loop failed: {type(err).__name__}: {err}"

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The bus node's status (peers, sessions, streams, counters, refusals, drops)."""
        st = self.node.status(timeout=timeout)
        st["skipped_roles"] = self.skipped
        return st

    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        """A local call into one of the node's roles."""
        return self.node.call(role, name, args, timeout=timeout)

    def counters(self) -> dict[str, Any]:
        if not self._started or self._stopped or self.node.error is not None:
            return {"peers": len(self._peers)}
        try:
            st = self.node.status(timeout=2.0)
        except Exception:  # a node that cannot answer has no counters to report
            return {"peers": len(self._peers)}
        return {
            **st["counters"],
            "peers": len(st["peers"]),
            "peers_up": sum(1 for p in st["peers"].values() if p["up"]),
        }

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.node.stop()
