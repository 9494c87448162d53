"""The thin client's sans-IO core: node connections, handshakes, the pending-operation table, retries
and logical connection restore (IEP-90, IEP-82, IEP-83).

The driver (``sparkbus.topologies.client``, or a simulator) owns one socket per node connection and does
what the core's outputs say: ``Open`` a socket to a transport address, ``Close`` it, ``Transmit`` frames on
it, report ``Done`` operations to their callers. It feeds back what arrives (``on_frames``), socket
events (``on_connected``, ``on_disconnected``) and the time (``tick``). The core never reads a clock.

Per node address the core keeps a ``Link``:

===========  ==========================================  ==========================================
state        event                                       next
===========  ==========================================  ==========================================
idle         connect                                     hello_sent (first transport address)
hello_sent   WELCOME, no logical connection yet           up
hello_sent   WELCOME of a version not offered             failed
hello_sent   WELCOME, a logical connection to restore     restoring (RESTORE sent)
hello_sent   REJECT PROTOCOL_COMPATIBILITY, version left  hello_sent (HELLO again, ``retry_version``)
hello_sent   REJECT, or no answer after TCP connected     failed (other addresses of the node skipped)
hello_sent   no TCP connection within handshake timeout   hello_sent on the next address, or failed
restoring    RESTORED                                    up (held results follow)
restoring    RESTORE_REFUSED                             up, a new logical connection; ops failed
restoring    no answer within ``heartbeat_timeout``       waiting (reconnect and restore again)
up           disconnect, sequence gap, heartbeat timeout  hello_sent again after a back-off (restore)
hello_sent   reconnect failed within ``restore_window``   waiting (reads moved to a connection up)
any          REJECT CLUSTER_ID_MISMATCH / HANDSHAKE_HEADER refused (final: never retried)
any          security handshake refused (``on_auth_failed``) refused (final: never retried)
===========  ==========================================  ==========================================
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from sparkbus.bus.config import ALL_FEATURES, SUPPORTED_VERSIONS
from sparkbus.bus.messages import (
    FINAL_CODES,
    MAGIC,
    SESSION_ENDING_CODES,
    Error,
    ErrorCode,
    Hello,
    Reject,
    Welcome,
    features_to_bits,
    retry_version,
    version_text,
)
from sparkbus.codecs import REGISTRY, Buffer, DecodeError, EncodeError, EnvelopeCodec, LimitExceeded, Limits
from sparkbus.roles.client.chunks import ArrowParts
from sparkbus.roles.client.errors import (
    AuthenticationError,
    ClientConnectionError,
    ClientError,
    ClusterMismatchError,
    ConnectionUnknownError,
    OperationError,
)
from sparkbus.roles.client.messages import (
    DEFAULT_WINDOW,
    READ_OPS,
    Ack,
    Op,
    Request,
    Response,
    Restore,
    Restored,
    RestoreRefused,
)
from sparkbus.roles.client.policy import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    Keepalive,
    Resolver,
    RetryPolicy,
    RetryReadPolicy,
    keepalive_interval,
    literal_resolver,
    node_order,
    resolve_order,
)

log = logging.getLogger("sparkbus.roles.client")

#: The most recent errors a node connection keeps (``Link.errors``, for ``attempts`` and status).
MAX_LINK_ERRORS = 20


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Client settings (seconds).

    Attributes:
        cluster_tag: the cluster to join; nodes of another cluster are refused.
        handshake_timeout: per transport address: no TCP connection within it moves to the next address;
            a connection that does not answer HELLO within it fails the node.
        heartbeat_interval: IEP-83 configured interval (the effective one is also bounded by the server).
        heartbeat_timeout: IEP-83 heartbeat timeout.
        reconnect_min, reconnect_max: back-off between attempts to reconnect a broken node connection.
        background_interval: how often nodes that failed are tried again (0: never).
        restore_window: how long a broken node connection with a logical connection is reconnected before
            its operations fail (longer than the gateways' restore timeout, so the server decides).
        retry: the retry policy (default: reads only, up to 16 times).
        window: response chunks the gateway may send beyond those this client consumed (per request).
        versions: protocol versions offered, newest first.
        limits: decoder limits for what nodes send.
    """

    cluster_tag: str
    handshake_timeout: float = 1.0
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    reconnect_min: float = 0.02
    reconnect_max: float = 1.0
    background_interval: float = 30.0
    restore_window: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryReadPolicy)
    window: int = DEFAULT_WINDOW
    versions: tuple[tuple[int, int, int], ...] = SUPPORTED_VERSIONS
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not self.cluster_tag:
            raise ValueError("ClientConfig.cluster_tag must not be empty")
        if (
            min(self.handshake_timeout, self.heartbeat_interval, self.heartbeat_timeout, self.reconnect_min)
            <= 0
        ):
            raise ValueError("client timeouts and intervals must be positive")
        if not self.versions:
            raise ValueError("ClientConfig.versions must name at least one version")
        if self.window < 1:
            raise ValueError("ClientConfig.window must be at least 1")


# ---------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class Open:
    """Open a new socket for node ``key`` connected to ``transport`` (closing any previous one)."""

    key: str
    transport: str


@dataclass(frozen=True, slots=True)
class Close:
    key: str


@dataclass(frozen=True, slots=True)
class Send:
    key: str
    frames: list[Buffer]


@dataclass(frozen=True, slots=True)
class Done:
    """Operation ``handle`` finished: ``error`` None means success with ``result``."""

    handle: int
    result: Any
    error: ClientError | None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a streamed operation's result, in order and exactly once: ``payload`` is an Arrow IPC
    stream (``arrow``) or a piece of the msgpack result. Tell the core when it is consumed
    (``consumed``); ``Done`` follows the last chunk."""

    handle: int
    index: int
    payload: bytes
    arrow: bool


Output = Open | Close | Send | Done | Chunk


@dataclass
class _Op:
    handle: int
    op: int
    args: dict[str, Any]
    stream: bool = False
    attempt: int = 0
    link: str | None = None
    request_id: int = -1
    parts: list[bytes] = field(default_factory=list)  # a whole (not streamed) result's chunks so far
    arrow: bool = False
    received: int = 0  # chunks received of the current request
    consumed: int = 0  # chunks consumed (streams: by the caller; otherwise on arrival)
    acked: int = 0  # consumed count last told to the gateway


@dataclass
class Link:
    """One node connection and the logical connection it carries."""

    key: str
    state: str = "idle"  # idle, hello_sent, restoring, up, waiting (to reconnect), failed, refused
    transports: list[str] = field(default_factory=list)
    index: int = 0
    connected: bool = False
    deadline: float = 0.0
    attempt: int = 0
    offered: tuple[int, int, int] | None = None
    session: int = 0
    seq: int = 0
    recv_seq: int = 0
    node_id: str = ""
    connection_id: str = ""  # the logical connection (kept across restores)
    session_connection_id: str = ""  # the one WELCOME gave this session
    idle_timeout: float = 0.0
    keepalive: Keepalive = field(default_factory=lambda: Keepalive(None))
    requests: dict[int, int] = field(default_factory=dict)  # request id -> op handle
    acks: list[int] = field(default_factory=list)
    pings: set[int] = field(default_factory=set)
    backoff: float = 0.0
    errors: list[str] = field(default_factory=list)  # the last ``MAX_LINK_ERRORS``
    restores: int = 0
    broken_at: float | None = None  # the first break since the connection last took a message while up
    undecodable: tuple[str, str] = ("", "")  # (logical connection, error) of the last message not decoded
    refusal: ClientError | None = None  # why the node was refused (final)

    def note(self, error: str) -> None:
        self.errors.append(error)
        del self.errors[:-MAX_LINK_ERRORS]


class ClientCore:
    """Everything a thin client decides, with no I/O.

    Args:
        addresses: node addresses (``tcp://host:port`` or ``host:port`` of each node's control ROUTER).
        config: settings.
        rng: decides address order (seed it for tests).
        resolver: host, port -> transport addresses (``socket.getaddrinfo`` by default).
        name: the client's name in HELLO.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        config: ClientConfig,
        *,
        rng: random.Random | None = None,
        resolver: Resolver = literal_resolver,
        name: str = "client",
    ) -> None:
        if not addresses:
            raise ValueError("connect needs at least one node address")
        self.config = config
        self.rng = rng or random.Random()
        self.resolver = resolver
        self.name = name
        self.codec = EnvelopeCodec(REGISTRY, limits=config.limits)
        self.order = node_order(addresses, self.rng)
        self.links: dict[str, Link] = {k: Link(key=k) for k in self.order}
        self.cluster_tag: str | None = None  # fixed by the first successful handshake
        self.ops: dict[int, _Op] = {}
        self.queued: list[int] = []
        self.out: list[Output] = []
        self._next_handle = 1
        self._next_request = 1
        self._rr = 0
        self._initial = True
        self._features = features_to_bits(ALL_FEATURES)

    # ------------------------------------------------------------------ driver API

    def start(self, now: float) -> None:
        """Begin the initial connection: nodes one after another until a handshake succeeds."""
        self._try_next_node(now)

    def take(self) -> list[Output]:
        out, self.out = self.out, []
        return out

    @property
    def connected(self) -> bool:
        return any(link.state == "up" for link in self.links.values())

    @property
    def gave_up(self) -> bool:
        """The initial connection failed on every node (the driver reports ``attempts()``)."""
        return self._initial and all(link.state in ("failed", "refused") for link in self.links.values())

    def refusal(self) -> AuthenticationError | ClusterMismatchError | None:
        """After ``gave_up``: the clearest final reason to give: an ``AuthenticationError`` if a node refused
        this client's credentials, else a ``ClusterMismatchError`` if a node is in another cluster (IEP-90: a
        user error, not worth trying again), otherwise None."""
        refusals = [self.links[key].refusal for key in self.order]
        for kind in (AuthenticationError, ClusterMismatchError):
            for refusal in refusals:
                if isinstance(refusal, kind):
                    return refusal
        return None

    def attempts(self) -> str:
        """What was tried and why each failed, for a connect error."""
        lines = []
        for key in self.order:
            link = self.links[key]
            lines.append(f"{key}: " + ("; ".join(link.errors) or link.state))
        return "\n".join(lines)

    def submit(self, op: int, args: dict[str, Any], now: float, *, stream: bool = False) -> int:
        """Start an operation; its ``Done(handle)`` comes out of ``take`` later. With ``stream`` its result
        comes as ``Chunk`` outputs first, at most ``config.window`` beyond those reported ``consumed``."""
        handle = self._next_handle
        self._next_handle += 1
        self.ops[handle] = _Op(handle=handle, op=op, args=args, stream=stream)
        self._dispatch(handle, now)
        return handle

    def consumed(self, handle: int, count: int, now: float) -> None:
        """The caller has consumed chunks ``0 .. count-1`` of streamed operation ``handle``."""
        op = self.ops.get(handle)
        if op is None or op.link is None:
            return
        op.consumed = max(op.consumed, min(count, op.received))
        link = self.links[op.link]
        if link.state == "up":
            self._maybe_ack(link, op, now)

    def cancel(self, handle: int, now: float) -> None:
        """Forget an operation (its caller stopped waiting); a late result is dropped, and the gateway is
        told (with the next message) to stop holding it. An SQL query that has not answered yet is
        cancelled on its node at once (QUERY_CANCEL by its request id, whose own answer is dropped), so it
        stops taking the cluster's time; over a connection that is not up it runs on to its end."""
        op = self.ops.pop(handle, None)
        if op is None:
            return
        if op.link is None:
            self.queued = [h for h in self.queued if h != handle]  # never sent
            return
        link = self.links[op.link]
        if link.requests.pop(op.request_id, None) is None:
            return
        if op.received:
            link.acks.append(op.request_id)
        elif op.op == Op.SQL and link.state == "up":
            rid = self._next_request
            self._next_request += 1
            self._request(link, rid, Op.QUERY_CANCEL, {"request_id": op.request_id}, now)

    def on_connected(self, key: str, now: float) -> None:
        """The socket of ``key`` has a TCP connection (a socket monitor event)."""
        link = self.links.get(key)
        if link is not None and link.state == "hello_sent":
            link.connected = True

    def on_disconnected(self, key: str, now: float, reason: str = "disconnected") -> None:
        """The socket of ``key`` lost its TCP connection."""
        link = self.links.get(key)
        if link is not None and link.state in ("up", "restoring"):
            self._broken(link, reason, now)

    def on_auth_failed(self, key: str, reason: str, now: float) -> None:
        """The node's security layer refused this client (ZeroMQ's ZAP/CURVE handshake failed): the node
        is refused for good, and what ran on it fails with an ``AuthenticationError``."""
        link = self.links.get(key)
        if link is None or link.state in ("refused", "idle"):
            return
        transport = link.transports[link.index] if link.index < len(link.transports) else key
        text = f"authentication failed at {key} ({transport}): {reason}"
        self._refused(link, text, now, AuthenticationError(text))

    def on_frames(self, key: str, frames: Sequence[Buffer], now: float) -> None:
        link = self.links.get(key)
        if link is None or link.state in ("idle", "waiting", "failed", "refused"):
            return
        try:
            env = self.codec.decode(frames)
        except DecodeError as exc:
            self._undecodable(link, exc, now)
            return
        msg, header = env.message, env.header
        link.keepalive.received(now)
        if isinstance(msg, Welcome | Reject) and link.state == "hello_sent":
            self._on_handshake(link, msg, now)
            return
        if isinstance(msg, Reject):
            if msg.code in FINAL_CODES:
                self._refused(link, f"{msg.code.name}: {msg.message}", now)
            elif msg.code in SESSION_ENDING_CODES and header.session == link.session:
                self._broken(link, f"node ended the session: {msg.code.name}: {msg.message}", now)
            else:  # a message refused, or an old session's end: this session goes on
                self._refusal_noted(link, msg.code, msg.message)
            return
        if isinstance(msg, Error):
            if msg.code == ErrorCode.NO_ROLE:
                self._refused(link, f"node {link.node_id} runs no client.gateway role: {msg.message}", now)
            else:
                self._refusal_noted(link, msg.code, msg.message)
            return
        if link.state not in ("up", "restoring"):
            return
        if header.session != link.session or header.seq != link.recv_seq + 1:
            self._broken(
                link, f"sequence gap from {link.node_id}: expected {link.recv_seq + 1}, got {header.seq}", now
            )
            return
        link.recv_seq = header.seq
        if link.state == "up":  # a message taken after any restore: the next break starts a new series
            link.broken_at, link.backoff = None, 0.0
        if isinstance(msg, Response):
            self._on_response(link, msg, now)
        elif isinstance(msg, Restored) and link.state == "restoring":
            self._on_restored(link, msg, now)
        elif isinstance(msg, RestoreRefused) and link.state == "restoring":
            self._on_restore_refused(link, msg, now)

    @staticmethod
    def _refusal_noted(link: Link, code: ErrorCode, text: str) -> None:
        """The node refused a message of this session and serves on; a REQUEST it refused is answered on
        its own, as an error result (docs/CLIENT.md)."""
        log.warning("client: node %s refused a message: %s: %s", link.node_id, code.name, text)
        link.note(f"refused: {code.name}: {text}")

    def _undecodable(self, link: Link, exc: DecodeError, now: float) -> None:
        """A message from ``link``'s node does not decode (over this client's limits, or malformed)."""
        text = f"malformed message from {link.key}: {exc}"
        if link.state == "hello_sent":
            self._failed(link, text, now)  # the handshake's answer: this node cannot be spoken to
            return
        if link.undecodable != (link.connection_id, text):
            link.undecodable = (link.connection_id, text)
            self._broken(link, text, now)  # perhaps a session's accident: restore
            return
        # The same message again after a restore: the gateway sends it on every restore, so restoring
        # cannot get past it. The operations waiting on this logical connection fail (one of them is the
        # message's, which cannot be told) and the next session starts a new logical connection.
        code = ErrorCode.LIMIT_EXCEEDED if isinstance(exc, LimitExceeded) else ErrorCode.MALFORMED
        link.connection_id = ""
        self._lose_requests(link, ClientError(code, f"{text} (sent again after a restore)"), now)
        self._broken(link, f"{text} (again: a new logical connection)", now)

    def tick(self, now: float) -> None:
        for link in self.links.values():
            if link.state == "hello_sent" and now >= link.deadline:
                if link.connected:
                    self._failed(link, f"{link.transports[link.index]}: no answer to HELLO", now)
                else:
                    link.note(f"{link.transports[link.index]}: no connection")
                    link.index += 1
                    self._try_transport(link, now)
            elif link.state == "restoring" and now >= link.deadline:
                self._broken(link, f"no answer to RESTORE within {self.config.heartbeat_timeout:g} s", now)
            elif link.state == "waiting" and now >= link.deadline:
                self._connect(link, now)
            elif link.state == "failed" and self.config.background_interval > 0 and now >= link.deadline:
                if not self._initial:
                    self._connect(link, now)
            elif link.state == "up":
                if link.keepalive.dead(now):
                    self._broken(link, f"heartbeat timeout ({link.keepalive.timeout:g} s)", now)
                elif link.keepalive.heartbeat_due(now):
                    self._ping(link, now)

    def next_deadline(self) -> float | None:
        cands: list[float] = []
        for link in self.links.values():
            background = link.state == "failed" and not self._initial and self.config.background_interval > 0
            if link.state in ("hello_sent", "restoring", "waiting") or background:
                cands.append(link.deadline)
            elif link.state == "up":
                d = link.keepalive.next_deadline()
                if d is not None:
                    cands.append(d)
        return min(cands) if cands else None

    # ------------------------------------------------------------------ connecting

    def _try_next_node(self, now: float) -> None:
        for key in self.order:
            if self.links[key].state == "idle":
                self._connect(self.links[key], now)
                return

    def _connect(self, link: Link, now: float) -> None:
        try:
            link.transports = resolve_order(link.key, self.rng, self.resolver)
        except (OSError, ValueError) as exc:
            self._failed(link, f"cannot resolve: {exc}", now)
            return
        link.index = 0
        self._try_transport(link, now)

    def _try_transport(self, link: Link, now: float) -> None:
        if link.index >= len(link.transports):
            self._failed(link, "no transport address answered", now)
            return
        link.state = "hello_sent"
        link.connected = False
        link.offered = None
        self.out.append(Open(link.key, link.transports[link.index]))
        self._hello(link, now)

    def _offered(self, link: Link) -> tuple[int, int, int]:
        """The version this link's HELLOs offer: our newest, or the one negotiation chose."""
        return link.offered or self.config.versions[0]

    def _hello(self, link: Link, now: float) -> None:
        link.attempt += 1
        link.deadline = now + self.config.handshake_timeout
        hello = Hello(
            magic=MAGIC,
            version=self._offered(link),
            features=self._features,
            cluster_tag=self.cluster_tag or self.config.cluster_tag,
            node_id=self.name,
            kind="client",
            attempt=link.attempt,
        )
        self.out.append(Send(link.key, self.codec.encode(hello)))

    def _on_handshake(self, link: Link, msg: Welcome | Reject, now: float) -> None:
        if msg.attempt != link.attempt:
            return  # an answer to an earlier HELLO
        link.connected = True
        if isinstance(msg, Reject):
            if msg.code in FINAL_CODES:
                self._refused(link, f"{msg.code.name}: {msg.message}", now)
            elif msg.code == ErrorCode.PROTOCOL_COMPATIBILITY and (
                again := retry_version(self.config.versions, self._offered(link), msg.version)
            ):
                link.offered = again  # IEP-90: try again with the server's version, or an older one of ours
                self._hello(link, now)
            else:
                self._failed(link, f"handshake refused: {msg.code.name}: {msg.message}", now)
            return
        if msg.version != self._offered(link):
            v, o = version_text(msg.version), version_text(self._offered(link))
            self._failed(link, f"the node welcomed version {v}, but this client offered {o}", now)
            return
        tag = self.cluster_tag or self.config.cluster_tag
        if msg.cluster_tag != tag:
            self._refused(
                link, f"CLUSTER_ID_MISMATCH: expected cluster {tag!r}, node is in {msg.cluster_tag!r}", now
            )
            return
        self.cluster_tag = tag
        link.session, link.seq, link.recv_seq = msg.session, 0, 0
        link.node_id = msg.node_id
        link.session_connection_id = msg.connection_id
        link.idle_timeout = msg.idle_timeout_ms / 1000
        link.keepalive = Keepalive(
            keepalive_interval(self.config.heartbeat_interval, link.idle_timeout),
            self.config.heartbeat_timeout,
            last_sent=now,
            last_received=now,
        )
        if link.connection_id:
            link.state = "restoring"
            link.deadline = now + self.config.heartbeat_timeout  # RESTORED or RESTORE_REFUSED by then
            # The gateway resumes each result after the chunks we have, and frees those we consumed.
            progress = [self.ops[h] for h in link.requests.values() if h in self.ops]
            for op in progress:
                op.acked = op.consumed
            restore = Restore(
                connection_id=link.connection_id,
                waiting=tuple(sorted(link.requests)),
                consumed={op.request_id: op.consumed for op in progress if op.consumed},
                received={op.request_id: op.received for op in progress if op.received},
            )
            self._send(link, restore, now)
            return
        link.connection_id = msg.connection_id
        self._up(link, now)

    def _up(self, link: Link, now: float) -> None:
        link.state = "up"
        if self._initial:
            self._initial = False
            for other in self.links.values():  # further node connections, in the background
                if other.state == "idle":
                    self._connect(other, now)
                elif other.state == "failed":
                    other.deadline = now + self.config.background_interval
        queued, self.queued = self.queued, []
        for handle in queued:
            self._dispatch(handle, now)

    def _failed(self, link: Link, reason: str, now: float) -> None:
        """The node connection could not be established (a handshake error stops this node's attempt)."""
        link.note(reason)
        broken_at = now if link.broken_at is None else link.broken_at
        if link.connection_id and now < broken_at + self.config.restore_window:
            self._move_reads(link, reason, now)
            self._retry_later(link, now)  # keep trying to restore: the gateway holds the context
            return
        link.state = "failed"
        link.deadline = now + self.config.background_interval
        self.out.append(Close(link.key))
        if link.connection_id:
            self._lose_requests(
                link, ClientConnectionError(f"node connection to {link.key} failed: {reason}"), now
            )
            link.connection_id = ""
        if self._initial:
            self._try_next_node(now)

    def _move_reads(self, link: Link, reason: str, now: float) -> None:
        """A reconnect of broken ``link`` failed while another node connection is up: the reads waiting on
        it that the retry policy sends again go there now, not after the restore window (longer than the
        callers wait). A late restore's answer to them is dropped by request id, as after a cancel; the
        other operations wait for the restore, so none is applied twice."""
        if not any(other.state == "up" for other in self.links.values()):
            return
        error = ClientConnectionError(f"node connection to {link.key} lost; reconnecting failed: {reason}")
        for rid, handle in list(link.requests.items()):
            op = self.ops.get(handle)
            if (
                op is not None
                and op.op in READ_OPS
                and not (op.stream and op.received)
                and self.config.retry.should_retry(op.op, op.attempt + 1, error)
            ):
                del link.requests[rid]
                self._fail_or_retry(handle, error, now)

    def _refused(self, link: Link, reason: str, now: float, error: ClientError | None = None) -> None:
        link.note(reason)
        link.state = "refused"
        self.out.append(Close(link.key))
        if error is None:
            error = (
                ClusterMismatchError(reason)
                if "CLUSTER_ID_MISMATCH" in reason
                else ClientError(ErrorCode.HANDSHAKE_HEADER, reason)
            )
        link.refusal = error
        link.connection_id = ""
        self._lose_requests(link, error, now)
        if self._initial:
            self._try_next_node(now)

    def _broken(self, link: Link, reason: str, now: float) -> None:
        """An established node connection broke: reconnect and restore its logical connection."""
        log.info("client: connection to %s broke: %s", link.key, reason)
        link.note(f"broken: {reason}")
        if link.broken_at is None:  # a break of a series does not start the restore window again
            link.broken_at = now
        link.pings.clear()
        self._retry_later(link, now)

    def _retry_later(self, link: Link, now: float) -> None:
        self.out.append(Close(link.key))
        link.state = "waiting"
        link.backoff = min(self.config.reconnect_max, max(self.config.reconnect_min, link.backoff * 2))
        link.deadline = now + link.backoff

    # ------------------------------------------------------------------ operations

    def _dispatch(self, handle: int, now: float) -> None:
        op = self.ops[handle]
        up = [k for k in self.order if self.links[k].state == "up"]
        if not up:
            self.queued.append(handle)  # postponed until a node connection is up (IEP-90)
            return
        key = up[self._rr % len(up)]
        self._rr += 1
        link = self.links[key]
        rid = self._next_request
        self._next_request += 1
        request = Request(
            request_id=rid, op=op.op, args=op.args, ack=tuple(link.acks), window=self.config.window
        )
        name = Op(op.op).name if op.op in Op._value2member_map_ else str(op.op)
        try:
            names = [k for k in op.args if type(k) is not str]
            if names:  # msgpack carries it; a node takes argument names as str only
                raise TypeError(f"argument names are str, got {names[0]!r}")
            frames = self.codec.encode(request, session=link.session, seq=link.seq + 1)
        except (EncodeError, TypeError, ValueError, OverflowError) as exc:
            # A caller's argument msgpack cannot carry (a numpy scalar, an object): that call fails.
            text = f"request {name}: an argument cannot be sent: {exc}"
            self._unsent(handle, ClientError(ErrorCode.MALFORMED, text))
            return
        size, limits = sum(len(f) for f in frames), self.config.limits
        if size > limits.max_message_bytes or max(len(f) for f in frames) > limits.max_frame_bytes:
            limit = min(limits.max_message_bytes, limits.max_frame_bytes)
            text = (
                f"request {name} is {size} bytes, over the {limit}-byte limit of one message; requests "
                "are not chunked: split the rows into several writes or loads"
            )
            self._unsent(handle, ClientError(ErrorCode.LIMIT_EXCEEDED, text))
            return
        link.acks = []
        op.link, op.request_id = key, rid
        op.parts, op.arrow, op.received, op.consumed, op.acked = [], False, 0, 0, 0
        link.requests[rid] = handle
        link.seq += 1
        link.keepalive.sent(now)
        self.out.append(Send(link.key, frames))

    def _unsent(self, handle: int, error: ClientError) -> None:
        """Operation ``handle`` cannot be sent at all: it fails, and nothing was sent for it."""
        del self.ops[handle]
        self.out.append(Done(handle, None, error))

    def _request(self, link: Link, request_id: int, op: int, args: dict[str, Any], now: float) -> None:
        acks, link.acks = tuple(link.acks), []
        self._send(link, Request(request_id=request_id, op=op, args=args, ack=acks), now)

    def _maybe_ack(self, link: Link, op: _Op, now: float) -> None:
        """Tell the gateway what was consumed once half a window has been (so it never waits for us)."""
        if op.consumed - op.acked >= max(1, self.config.window // 2):
            op.acked = op.consumed
            self._send(link, Ack(consumed={op.request_id: op.consumed}), now)

    def _ping(self, link: Link, now: float) -> None:
        rid = self._next_request
        self._next_request += 1
        link.pings.add(rid)
        self._request(link, rid, Op.PING, {}, now)
        link.keepalive.pinged(now)

    def _send(self, link: Link, msg: Any, now: float) -> None:
        link.seq += 1
        link.keepalive.sent(now)
        self.out.append(Send(link.key, self.codec.encode(msg, session=link.session, seq=link.seq)))

    def _on_response(self, link: Link, msg: Response, now: float) -> None:
        rid = msg.request_id
        if rid in link.pings:
            link.pings.discard(rid)
            return
        handle = link.requests.get(rid)
        op = self.ops.get(handle) if handle is not None else None
        if handle is None or op is None:
            if rid not in link.acks:
                link.acks.append(rid)  # delivered already, or its caller left: let the gateway drop it
            return
        if msg.chunk < op.received:
            return  # sent again after a restore: we have it
        if msg.chunk > op.received:
            self._broken(link, f"response {rid}: chunk {msg.chunk}, expected {op.received}", now)
            return
        op.received += 1
        if msg.code:
            self._finish(link, op, msg, Done(handle, None, OperationError(msg.code, msg.error)), now)
            return
        if op.stream:
            self.out.append(Chunk(handle, msg.chunk, msg.payload, msg.arrow))
        else:
            op.parts.append(msg.payload)
            op.arrow = msg.arrow
            op.consumed = op.received
        if not msg.last:
            self._maybe_ack(link, op, now)
            return
        if op.stream:
            done = Done(handle, None, None)
        elif op.arrow:
            done = Done(handle, ArrowParts(tuple(op.parts)), None)
        else:
            try:
                done = Done(handle, msgpack.unpackb(b"".join(op.parts), raw=False), None)
            except (ValueError, msgpack.UnpackException) as exc:
                done = Done(handle, None, ClientError(ErrorCode.MALFORMED, f"bad result: {exc}"))
        self._finish(link, op, msg, done, now)

    def _finish(self, link: Link, op: _Op, msg: Response, done: Done, now: float) -> None:
        """The last chunk of ``op``'s result arrived: release it on the gateway, report ``done``."""
        del link.requests[op.request_id]
        del self.ops[op.handle]
        op.parts = []
        if msg.chunk:
            self._send(link, Ack(release=(op.request_id,)), now)  # a long result: free it now
        else:
            link.acks.append(op.request_id)  # one chunk: with our next message
        self.out.append(done)

    def _on_restored(self, link: Link, msg: Restored, now: float) -> None:
        link.restores += 1
        known = set(msg.known)
        lost = [rid for rid in link.requests if rid not in known]
        link.state = "up"
        for rid, handle in list(link.requests.items()):
            op = self.ops.get(handle)
            if rid in known and op is not None:
                self._maybe_ack(link, op, now)  # consumed while the restore was on its way
        for rid in lost:
            handle = link.requests.pop(rid)
            self._fail_or_retry(
                handle,
                ClientConnectionError(f"request {rid} was lost with the connection to {link.key}"),
                now,
            )
        self._up(link, now)

    def _on_restore_refused(self, link: Link, msg: RestoreRefused, now: float) -> None:
        old = link.connection_id
        link.connection_id = link.session_connection_id  # this session is a new logical connection
        link.state = "up"
        text = f"connection unknown: node {link.node_id} no longer knows logical connection {old[:8]}...: {msg.message}"
        self._lose_requests(link, ConnectionUnknownError(text), now)
        self._up(link, now)

    def _lose_requests(self, link: Link, error: ClientError, now: float) -> None:
        handles = list(link.requests.values())
        link.requests.clear()
        for handle in handles:
            self._fail_or_retry(handle, error, now)

    def _fail_or_retry(self, handle: int, error: ClientError, now: float) -> None:
        op = self.ops.get(handle)
        if op is None:
            return
        op.attempt += 1
        op.link = None
        # A stream the caller has begun to read cannot start again from its first chunk.
        if not (op.stream and op.received) and self.config.retry.should_retry(op.op, op.attempt, error):
            self._dispatch(handle, now)
            return
        del self.ops[handle]
        self.out.append(Done(handle, None, error))
