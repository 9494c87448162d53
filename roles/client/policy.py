"""Pure policies of the thin client: retries (IEP-82), keepalive (IEP-83) and address order (IEP-90)."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client.errors import ClientConnectionError, ClientError
from sparkbus.roles.client.messages import READ_OPS

#: IEP-82 ``RetryLimitPolicy.DFLT_RETRY_LIMIT``
DEFAULT_RETRY_LIMIT = 16
#: IEP-83 client defaults (seconds)
DEFAULT_HEARTBEAT_INTERVAL = 30.0
DEFAULT_HEARTBEAT_TIMEOUT = 5.0
#: IEP-83: the effective heartbeat interval is never below this (apache/ignite-3#737)
MIN_HEARTBEAT_INTERVAL = 0.5


class RetryPolicy(Protocol):
    """Decides whether an operation that failed with ``error`` is sent again (``attempt`` is 1 for the
    first retry)."""

    def should_retry(self, op: int, attempt: int, error: ClientError) -> bool: ...


def _retryable(error: ClientError) -> bool:
    # Only a lost connection is worth another try; a cluster mismatch never is (IEP-82).
    return isinstance(error, ClientConnectionError) and error.code != ErrorCode.CLUSTER_ID_MISMATCH


@dataclass(frozen=True)
class RetryReadPolicy:
    """The default: retry reads (``READ_OPS``) after a connection error, up to ``limit`` times (negative:
    without limit); never writes."""

    limit: int = DEFAULT_RETRY_LIMIT

    def should_retry(self, op: int, attempt: int, error: ClientError) -> bool:
        return op in READ_OPS and _retryable(error) and (self.limit < 0 or attempt <= self.limit)


@dataclass(frozen=True)
class RetryLimitPolicy:
    """Retry every operation, writes included, up to ``limit`` times (0: never; negative: no limit)."""

    limit: int = DEFAULT_RETRY_LIMIT

    def should_retry(self, op: int, attempt: int, error: ClientError) -> bool:
        return _retryable(error) and (self.limit < 0 or attempt <= self.limit)


#: Never retry anything.
RETRY_NONE = RetryLimitPolicy(0)


def keepalive_interval(configured: float, server_idle_timeout: float) -> float | None:
    """IEP-83: ``min(configured, idle timeout / 3)``, at least 0.5 s; None when the server has no idle
    timeout (then no heartbeat is needed)."""
    if server_idle_timeout <= 0:
        return None
    return max(MIN_HEARTBEAT_INTERVAL, min(configured, server_idle_timeout / 3))


@dataclass
class Keepalive:
    """When to send a heartbeat on one node connection, and when it is dead.

    A heartbeat is due only when nothing was sent for ``interval``. The connection is dead when a heartbeat
    went unanswered for ``timeout`` and nothing at all arrived since it was sent.
    """

    interval: float | None
    timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    last_sent: float = 0.0
    last_received: float = 0.0
    ping_at: float | None = None

    def sent(self, now: float) -> None:
        self.last_sent = now

    def received(self, now: float) -> None:
        self.last_received = now
        self.ping_at = None

    def heartbeat_due(self, now: float) -> bool:
        return self.interval is not None and now >= self.last_sent + self.interval

    def pinged(self, now: float) -> None:
        self.last_sent = now
        if self.ping_at is None:
            self.ping_at = now

    def dead(self, now: float) -> bool:
        return (
            self.ping_at is not None
            and now >= self.ping_at + self.timeout
            and self.last_received < self.ping_at
        )

    def next_deadline(self) -> float | None:
        cands = []
        if self.interval is not None:
            cands.append(self.last_sent + self.interval)
        if self.ping_at is not None:
            cands.append(self.ping_at + self.timeout)
        return min(cands) if cands else None


Resolver = Callable[[str, int], Sequence[str]]


def literal_resolver(host: str, port: int) -> list[str]:
    """Resolves IP literals only (roles do no I/O); the ZeroMQ driver passes ``socket.getaddrinfo``'s."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise OSError(f"{host} is not an IP address and no resolver was given") from None
    return [f"tcp://[{ip}]:{port}" if ip.version == 6 else f"tcp://{ip}:{port}"]


def parse_address(address: str) -> tuple[str, int]:
    """``tcp://host:port``, ``host:port`` or ``[v6]:port`` -> (host, port)."""
    text = address.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "tcp":
            raise ValueError(f"address {address!r}: only tcp:// is supported")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port_text)


def resolve_order(address: str, rng: random.Random, resolver: Resolver = literal_resolver) -> list[str]:
    """IEP-90: the transport addresses of one node address, in a random order (a new one each call).

    Raises:
        ValueError: the address is malformed.
        OSError: it does not resolve (``socket.gaierror``), or resolves to nothing.
    """
    host, port = parse_address(address)
    found = list(resolver(host, port))
    if not found:
        raise OSError(f"{address} resolves to no address")
    rng.shuffle(found)
    return found


def node_order(addresses: Sequence[str], rng: random.Random) -> list[str]:
    """The node addresses in the order to try them: random, so clients spread over the nodes."""
    out = list(dict.fromkeys(addresses))
    rng.shuffle(out)
    return out
