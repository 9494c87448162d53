"""What a node's CURVE handshakes refused, and what refused it: counts, logs, and when to dial again.

Three sources report here, for ``Node`` (``bus/node.py``):

* the ZAP handler (its own thread) turning a client's key or address down: ``denied``;
* the monitors of our ROUTER and PULL, for handshakes that fail before ZAP is asked (a plain client,
  another mechanism, a broken handshake): ``server_event``;
* the monitor of our DEALER to a peer, whose handshake the peer refused (``refused_by``) or completed
  (``admitted``).

A peer that refused us is listed (``status()["refused"]``) until a handshake with it succeeds. libzmq 4.3
never dials an endpoint again after a failed handshake (the connecting session ends on the error), so a
refused peer is dialled again by the node (``due`` names it): after ``REDIAL_FIRST`` seconds, doubling to
``REDIAL_MAX``. Once the refusing node admits our key (restarted with the fixed key directory), the link
comes up without restarting this node.
"""

from __future__ import annotations

import logging
import threading

import zmq

from sparkbus.bus import sockets

log = logging.getLogger("sparkbus.bus")

#: Seconds before a refused peer is dialled again, doubling after each refusal up to ``REDIAL_MAX``.
REDIAL_FIRST = 1.0
REDIAL_MAX = 30.0
#: At most this many addresses and connections are remembered (one warning per address).
MAX_TRACKED = 1024


class CurveRefusals:
    """Counts (``counts``) and refusals by peer (``by_peer``) for ``status()``, guarded by one lock: the
    ZAP handler's thread writes them, the node's loop too, and ``status()`` reads them on the loop."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.by_peer: dict[str, str] = {}
        self._denied_addresses: set[str] = set()
        # Server side: the peer address of each connection our ROUTER or PULL accepted (by socket name
        # and file descriptor), and a handshake failure waiting for the DISCONNECTED that names its
        # connection.
        self._accepted: dict[tuple[str, int], str] = {}
        self._failed_handshake: dict[str, str] = {}
        self._failed_addresses: set[str] = set()
        # Client side (the loop only): when each refused peer is dialled again, and the wait after that.
        self._redial: dict[str, tuple[float, float]] = {}

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def snapshot(self) -> tuple[dict[str, int], dict[str, str]]:
        with self.lock:
            return dict(self.counts), dict(self.by_peer)

    # ------------------------------------------------------------------ our servers

    def denied(self, address: str, reason: str) -> None:
        """A client failed ZAP (runs on the authenticator's thread)."""
        with self.lock:
            self.counts["curve_denied"] = self.counts.get("curve_denied", 0) + 1
            first = address not in self._denied_addresses
            if first and len(self._denied_addresses) < MAX_TRACKED:  # bounded: one warning per address
                self._denied_addresses.add(address)
        (log.warning if first else log.debug)(
            "node %s: refused a CURVE client from %s: %s", self.node_id, address, reason
        )

    def server_event(self, name: str, event: int, value: int) -> None:
        """An event of the monitor of our server socket ``name`` ("control" or "data").

        libzmq 4.3's monitor does not name the peer of a failed handshake (the v2 monitor that does is a
        draft API, not built into pyzmq's wheels): ACCEPTED carries the connection's file descriptor,
        HANDSHAKE_FAILED_* only the reason, and the DISCONNECTED that follows names the descriptor. One
        I/O thread emits a connection's failure and its disconnect back to back, so the failure belongs to
        that DISCONNECTED's connection, whose peer address was read when ACCEPTED was handled. A handshake
        that fails at once (a plain client) has often closed its descriptor by then: such failures are
        still counted, and logged once per socket and reason as coming from an unknown address.
        """
        if event == zmq.EVENT_ACCEPTED:
            if len(self._accepted) < MAX_TRACKED:
                self._accepted[(name, value)] = sockets.peer_address(value)
        elif event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            self._count("curve_handshake_failed")
            self._failed_handshake[name] = (
                f"protocol error {value:#x}"
                if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                else f"error {value} before the handshake completed"
            )
        elif event == zmq.EVENT_DISCONNECTED:
            address = self._accepted.pop((name, value), sockets.UNKNOWN)
            reason = self._failed_handshake.pop(name, None)
            if reason is not None:
                self._log_failed_handshake(name, address, reason)

    def _log_failed_handshake(self, name: str, address: str, reason: str) -> None:
        key = f"{name}: {reason}" if address == sockets.UNKNOWN else address
        first = key not in self._failed_addresses
        if first and len(self._failed_addresses) < MAX_TRACKED:  # bounded: one warning per address
            self._failed_addresses.add(key)
        (log.warning if first else log.debug)(
            "node %s: refused a client from %s on its %s socket: the CURVE handshake failed (%s; a plain "
            "or misconfigured client)",
            self.node_id,
            address,
            name,
            reason,
        )

    # ------------------------------------------------------------------ our clients

    def refused_by(self, peer: str, event: int, value: int, now: float) -> None:
        """The peer's ZAP handler turned our key down, or the CURVE handshake with it failed."""
        what = (
            f"CURVE: {peer} refused our key (ZAP status {value})"
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
            else f"CURVE handshake with {peer} failed (protocol error {value:#x})"
        )
        with self.lock:
            self.counts["curve_refused_by_peer"] = self.counts.get("curve_refused_by_peer", 0) + 1
            first = peer not in self.by_peer
            self.by_peer[peer] = what
        _, wait = self._redial.get(peer, (0.0, REDIAL_FIRST / 2))
        wait = min(REDIAL_MAX, 2 * wait)
        self._redial[peer] = (now + wait, wait)
        if first:
            log.warning("node %s: %s (dialling it again every %g s or less)", self.node_id, what, REDIAL_MAX)

    def admitted(self, peer: str) -> None:
        """A handshake with ``peer`` succeeded: it is no longer refused (the refusals stay counted)."""
        self._redial.pop(peer, None)
        with self.lock:
            was = self.by_peer.pop(peer, None)
        if was is not None:
            log.info("node %s: CURVE: %s admits our key now", self.node_id, peer)

    def due(self, now: float) -> list[str]:
        """The refused peers to dial again now (each is due again only after its next refusal)."""
        if not self._redial:
            return []
        out = [p for p, (at, _) in self._redial.items() if at <= now]
        for p in out:
            self._redial[p] = (float("inf"), self._redial[p][1])
        return out
