"""The Spark runtime's channel: the driver's ROUTER that every barrier task's DEALER dials.

The tasks report on it (``bound``, ``rows``, ``ready``, ``failed``, ``ended``) and the driver answers
(``peers``, ``rows``, ``abort``, ``stop``): two frames each way, an event and a JSON object. The driver
binds it on a port of ``bus.ports`` (the range opened between the executors and the driver), like its
nodes. In a CURVE topology it is a CURVE server with the key pair of the driver's first node (or the
shared ``cluster`` pair when no node runs in the driver), under a ZAP domain of its own with the bus's key
directory and ``bus.security.allow``, and each task's DEALER a CURVE client with its node's key pair: only
the topology's keys, from allowed addresses, reach it, and a connection may speak for its own node only.

A message that is not an event and a JSON object from one of the stage's nodes is dropped and logged,
never raised: whoever can reach the port cannot end a start with a malformed message.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import zmq

from sparkbus.bus import security, sockets
from sparkbus.topologies.keys import curve_settings
from sparkbus.topologies.model import Topology

log = logging.getLogger(__name__)

#: what a task tells the driver
TASK_EVENTS = frozenset({"bound", "rows", "ready", "failed", "ended"})


def server_name(topology: Topology) -> str:
    """Whose key pair the channel uses under CURVE: the first driver-placed node's, else ``cluster``."""
    driver = [nid for nid, _ in topology.placed("driver")]
    return driver[0] if driver else security.SHARED_NAME


class DriverChannel:
    """The driver's end: bound at once on ``bind_host``, reached by the tasks at ``endpoint``.

    Raises ``OSError`` (``NoFreePort``) when no port of ``bus.ports`` is free, ``MissingKey`` when a CURVE
    key is missing.
    """

    def __init__(self, topology: Topology, node_ids: tuple[str, ...], bind_host: str, advertise: str) -> None:
        self.node_ids = frozenset(node_ids)
        self._ctx = sockets.context()  # the process's: its ZAP handler serves the driver's nodes too
        self._domain: str | None = None
        self._owned: frozenset[bytes] = frozenset()
        self.sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            curve = curve_settings(topology)
            if curve is not None:
                keys = security.node_keys(curve.key_dir, server_name(topology))
                domain = f"sparkbus/runtime-channel/{id(self):x}"
                names = security.register(self._ctx, domain, curve, self._refused)
                self._domain = domain
                self._owned = frozenset(n.encode() for n in names.values() if n != security.SHARED_NAME)
                security.apply_server(self.sock, keys, domain)
            ports = topology.bus.ports
            bound = sockets.bind_tcp(
                self.sock,
                bind_host,
                None if ports is None else (ports.first, ports.last),
                "the runtime channel",
            )
        except BaseException:
            self.close()
            raise
        self.endpoint = f"tcp://{advertise}:{bound.rsplit(':', 1)[1]}"

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.sock.poll(timeout_ms))

    def receive(self) -> tuple[str, str, dict[str, Any]] | None:
        """The next message (after ``poll``): (node id, event, body), or None for one dropped."""
        frames = self.sock.recv_multipart(copy=False)
        rid = frames[0].bytes
        sender = rid.decode("utf-8", "replace")
        if len(frames) != 3:
            return self._drop(sender, f"{len(frames) - 1} frames, not 2 (an event and a JSON object)")
        if sender not in self.node_ids:
            return self._drop(sender, "not a node of this stage")
        if self._domain is not None and rid in self._owned:
            key = security.user_id(frames[0])
            if not security.key_owner(rid, key, self._owned):
                return self._drop(sender, f"sent on a connection with the key of {key!r}")
        event = frames[1].bytes.decode("utf-8", "replace")
        if event not in TASK_EVENTS:
            return self._drop(sender, f"unknown event {event!r}")
        try:
            body = json.loads(frames[2].bytes)
        except ValueError as exc:
            return self._drop(sender, f"'{event}' whose body is not JSON: {exc}")
        if not isinstance(body, dict):
            return self._drop(sender, f"'{event}' whose body is not a JSON object")
        return sender, event, body

    def send(self, node_id: str, event: str, body: dict[str, Any]) -> None:
        self.sock.send_multipart([node_id.encode(), event.encode(), json.dumps(body).encode()])

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._domain is not None:
            security.unregister(self._ctx, self._domain)
            self._domain = None

    @staticmethod
    def _drop(sender: str, why: str) -> None:
        log.warning("the runtime channel dropped a message from %r: %s", sender, why)

    @staticmethod
    def _refused(address: str, reason: str) -> None:
        log.warning("the runtime channel refused a connection from %s: %s", address, reason)


def task_socket(ctx: zmq.Context[zmq.Socket[bytes]], topology: Topology, node_id: str) -> zmq.Socket[bytes]:
    """A task's DEALER to the driver's channel (not connected yet): a CURVE client with its node's key pair
    in a CURVE topology."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.IDENTITY, node_id.encode())
    curve = curve_settings(topology)
    if curve is not None:
        try:
            keys = security.node_keys(curve.key_dir, node_id)
            security.apply_client(sock, keys, security.server_key(curve.key_dir, server_name(topology)))
        except BaseException:
            sock.close(linger=0)
            raise
    return sock
