"""Where a thin client connects, and with which keys: a node address's transport addresses
(``system_resolver``), the gateway nodes of a cluster ``sparkbus up`` started from a topology file
(``topology_target``, read from its state file) and the client's CURVE keys (``ClientCurve``).

Nothing here opens a socket; ``sparkbus.topologies.client`` (which re-exports these names) does.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkbus.bus import security
from sparkbus.roles.client import AuthenticationError, ConnectTimeoutError
from sparkbus.topologies.busnode import bus_config
from sparkbus.topologies.keys import RUN_DIR
from sparkbus.topologies.keys import key_dir as topology_key_dir
from sparkbus.topologies.launcher import state_file
from sparkbus.topologies.schema import load

#: The key pair a client looks for in a key directory (``private/client.key_secret``; the shared
#: ``cluster`` pair when there is none).
CLIENT_KEY_NAME = "client"


def system_resolver(host: str, port: int) -> list[str]:
    """The host's transport addresses (``socket.getaddrinfo``), de-duplicated, in the system's order."""
    out: list[str] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = str(sockaddr[0])
        addr = f"tcp://[{ip}]:{port}" if family == socket.AF_INET6 else f"tcp://{ip}:{port}"
        if addr not in out:
            out.append(addr)
    return out


GATEWAY = "client.gateway"


@dataclass(frozen=True)
class ClientCurve:
    """CURVE settings of a thin client: its own key pair and the public key of each node's control ROUTER.

    Attributes:
        public, secret: the client's Z85 key pair; the public key must be in the nodes' ``public/``
            directory (their allow-list, read when a node starts).
        server_keys: node address (as given to ``connect``) -> that node's Z85 public key.
        default_server_key: the key of any address not in ``server_keys`` (a cluster's shared pair).
    """

    public: bytes
    secret: bytes
    server_keys: Mapping[str, bytes] = field(default_factory=dict)
    default_server_key: bytes | None = None

    def server_key(self, address: str) -> bytes:
        key = self.server_keys.get(address, self.default_server_key)
        if key is None:
            raise AuthenticationError(f"no CURVE server key for {address} (give server_keys or a key_dir)")
        return key

    @classmethod
    def from_key_dir(
        cls,
        key_dir: str | os.PathLike[str],
        *,
        name: str = CLIENT_KEY_NAME,
        nodes: Mapping[str, str] | None = None,
        fallback_names: Sequence[str] = (),
        addresses: Sequence[str] = (),
    ) -> ClientCurve:
        """Keys from a key directory laid out as ``sparkbus keys generate`` writes it.

        Args:
            key_dir: the directory (``public/``, ``private/``).
            name: the client's pair: ``private/<name>.key_secret``, else the shared ``cluster`` pair,
                else the first of ``fallback_names`` that has a pair.
            nodes: node address -> node id, for nodes with pairs of their own (``public/<node id>.key``);
                other addresses use the shared ``public/cluster.key``.
            fallback_names: further pairs the client may use (``connect`` by topology file: the gateway
                nodes' own pairs in a key directory ``sparkbus up`` made for this user).
            addresses: the addresses the client will connect to; each needs a server key now: its node's
                (in ``nodes``) or the shared one.

        Raises:
            AuthenticationError: no usable client pair, or no server key for a node: among ``addresses``,
                one whose node id is unknown when the directory has no shared ``public/cluster.key``.
        """
        pair: security.KeyPair | None = None
        tried = [name, security.SHARED_NAME, *fallback_names]
        for candidate in (name, *fallback_names):
            try:
                pair = security.node_keys(key_dir, candidate)
                break
            except security.MissingKey:
                continue
        if pair is None:
            raise AuthenticationError(
                f"no client key pair in {key_dir}/private (looked for {', '.join(tried)}); make one with "
                f"`sparkbus keys generate {key_dir} --names {name}` and restart the nodes so they admit it"
            )
        servers: dict[str, bytes] = {}
        for address, node_id in (nodes or {}).items():
            try:
                servers[address] = security.server_key(key_dir, node_id)
            except security.MissingKey as exc:
                raise AuthenticationError(f"{address}: {exc}") from None
        try:
            default: bytes | None = security.server_key(key_dir, security.SHARED_NAME)
        except security.MissingKey:
            default = None
        unnamed = [address for address in addresses if address not in servers]
        if unnamed and default is None:
            raise AuthenticationError(
                f"{key_dir} has no public/{security.SHARED_NAME}.key and the node id of {unnamed[0]} is "
                "unknown: name its node (connect({NODE: ADDRESS}, ...), sparkbus --address NODE=ADDRESS), or "
                "connect by topology file"
            )
        return cls(public=pair.public, secret=pair.secret, server_keys=servers, default_server_key=default)


@dataclass(frozen=True)
class TopologyTarget:
    """What ``connect`` needs from a topology file and its running cluster."""

    addresses: list[str]  # the entry gateways' control endpoints (see ``topology_target``)
    cluster_tag: str
    nodes: dict[str, str]  # address -> node id, of every running gateway node
    key_dir: Path | None  # the topology's CURVE key directory (None: plain)
    run_dir_keys: bool  # the key directory is one ``sparkbus up`` made in the run directory
    gateways: dict[str, str] = field(default_factory=dict)  # node id -> control endpoint, every gateway


def topology_target(path: str | os.PathLike[str]) -> TopologyTarget:
    """The nodes running ``client.gateway`` in the cluster ``sparkbus up`` started from topology file
    ``path`` (read from its state file), its cluster tag and its CURVE key directory.

    ``addresses`` are the entry gateways a client connects to: those of nodes that hold no replicas
    (``replication``), where the query initiator and the compute controller run, or every gateway when
    all nodes hold replicas. ``gateways`` names every gateway node's endpoint, for requests that must run
    on one node (a partition leader's ``WRITE``: ``connect(path, node=...)``)."""
    topo = load(Path(path))
    gateway_specs = [spec for spec in topo.nodes if GATEWAY in spec.roles]
    gateways = {node_id for spec in gateway_specs for node_id in spec.node_ids}
    stores = {node_id for spec in gateway_specs if "replication" in spec.roles for node_id in spec.node_ids}
    state = state_file(path)
    if not state.exists():
        raise ConnectTimeoutError(
            f"no running cluster recorded for {path} (looked for {state}); is `sparkbus up` running?"
        )
    nodes: dict[str, dict[str, Any]] = json.loads(state.read_text())["nodes"]
    found = {
        info["control"]: node
        for node, info in sorted(nodes.items())
        if node in gateways and info.get("control")
    }
    if not found:
        raise ConnectTimeoutError(f"{path}: no running node has the {GATEWAY} role (nodes: {sorted(nodes)})")
    entry = [address for address, node in found.items() if node not in stores] or list(found)
    raw = topo.bus.security.key_dir or ""
    return TopologyTarget(
        addresses=entry,
        cluster_tag=bus_config(topo).cluster_tag,  # the nodes' bus tag: "<name>/<tag>"
        nodes=found,
        key_dir=topology_key_dir(topo),
        run_dir_keys=raw.startswith(RUN_DIR),
        gateways={node: address for address, node in found.items()},
    )


def topology_addresses(path: str | os.PathLike[str]) -> tuple[list[str], str]:
    """The gateway nodes' control endpoints of the cluster started from ``path``, and its cluster tag."""
    target = topology_target(path)
    return target.addresses, target.cluster_tag
