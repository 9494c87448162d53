"""The node core: sessions, liveness, credit streams, timers and role dispatch, with no I/O.

One ``NodeCore`` per node. Its drivers (the ZeroMQ node loop in ``bus/node.py`` and the simulator in
``bus/sim.py``) feed it what arrives on each socket and the current time, and carry out the
``Transmit`` outputs it produces. Because the core never touches a socket or a clock, the simulator runs
exactly the code that production runs.

Channels, one ZeroMQ pipe each per pair of nodes and direction (DESIGN.md section 4):

* ``ctl``: our DEALER to the peer's ROUTER. Our HELLO, then our sequenced control messages.
* ``reply``: our ROUTER back to a routing id. WELCOME / REJECT / ERROR answers on the same pipe; for a thin
  client (which binds nothing) every message to it.
* ``data``: our PUSH to the peer's PULL. Sequenced stream batches.

A peer is *up* when both directions have a session and the peer's has been confirmed by its first message
(so the peer has our WELCOME; for a client: when its session exists). A gap in a
sequence (also at its end: batches a HEARTBEAT counted that stop arriving), a stale session, a socket
disconnect, or silence past ``peer_timeout`` breaks the link: roles get
``PeerLost`` at once, every stream with the peer is dropped, and a new handshake starts (a new session and,
when it completes, a new ``PeerUp``). Nothing resumes silently.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.credit import CreditSender, check_receiver_credit
from sparkbus.bus.links import MAX_REFUSAL_TEXT, LinkLayer
from sparkbus.bus.messages import (
    Bye,
    Error,
    ErrorCode,
    FlowControl,
    Heartbeat,
    Hello,
    Reject,
    StreamBatch,
    Welcome,
    features_to_bits,
)
from sparkbus.bus.state import Completed, Output, Transmit, _Inbound, _Outbound, _Peer
from sparkbus.bus.streams import StreamLayer
from sparkbus.codecs import REGISTRY, Buffer, DecodeError, EnvelopeCodec, LimitExceeded
from sparkbus.codecs.errors import clip
from sparkbus.codecs.limits import too_many_frames

log = logging.getLogger("sparkbus.bus")

_HELLO = REGISTRY.code_of(Hello)
_NEVER = float("inf")
_BUS_MESSAGES = frozenset({Hello, Welcome, Reject, Heartbeat, Error, Bye, StreamBatch, FlowControl})


class NodeCore(LinkLayer, StreamLayer):
    """Sessions, liveness, streams and role dispatch for one node.

    Args:
        node_id: this node's id (also its DEALER routing id).
        config: bus settings.
        roles: the roles this node runs (names unique).
        entropy: ``entropy(bits)`` returns a random non-negative int; ``secrets.randbits`` in production,
            a seeded generator in the simulator.
    """

    def __init__(
        self,
        node_id: str,
        config: BusConfig,
        roles: Sequence[c.Role],
        entropy: Callable[[int], int],
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.codec = EnvelopeCodec(REGISTRY, limits=config.limits, compression=config.compression)
        self.roles: dict[str, c.Role] = {}
        self._by_message: dict[type, c.Role] = {}
        for role in roles:
            if role.name in self.roles:
                raise ValueError(f"two roles named {role.name!r} on node {node_id}")
            self.roles[role.name] = role
            for cls in role.messages:
                if cls in _BUS_MESSAGES:
                    raise ValueError(f"role {role.name} cannot take the bus's own {cls.__name__}")
                if cls in self._by_message:
                    raise ValueError(
                        f"{cls.__name__} is routed to both {self._by_message[cls].name} and {role.name}"
                    )
                self._by_message[cls] = role
        # What a thin client's session may send: the messages of the roles that serve thin clients (the
        # client.gateway). Any other role's message from a client is refused; its batches too.
        self._client_messages = frozenset(
            cls for role in roles if getattr(role, "serves_clients", False) for cls in role.messages
        )
        self._entropy = entropy
        self._incarnation = entropy(63) or 1  # this process, named in every HELLO (``INCARNATION``)
        self._features = features_to_bits(config.features)
        # Where the driver dials each peer (its control endpoint), for messages that name it.
        self.peer_addresses: dict[str, str] = {}
        self._outbound: dict[str, _Outbound] = {}
        self._inbound: dict[str, _Inbound] = {}
        self._by_rid: dict[bytes, _Inbound] = {}
        self._by_session: dict[int, _Inbound] = {}
        self._peers: dict[str, _Peer] = {}
        self._timers: dict[tuple[str, str], float] = {}
        self._timer_heap: list[tuple[float, str, str]] = []
        self._local: deque[tuple[c.Role, c.Event]] = deque()
        self._next_call = 1
        self._role_calls: dict[int, tuple[str, str]] = {}  # call id -> (calling role, tag)
        self.out: list[Output] = []
        self._counts: Counter[str] = Counter()
        # The counters of every message, as plain ints: a Counter increment costs several times more, and
        # these move on every message. ``counters`` shows them with the rest.
        self._n_ctl_in = self._n_data_in = self._n_bytes_in = self._n_bytes_out = 0
        self._n_messages_in = self._n_messages_out = 0
        self._n_batches_in = self._n_batches_out = self._n_stream_bytes_in = self._n_stream_bytes_out = 0
        self._n_flow_control_in = self._n_flow_control_out = 0
        self._n_out = {"ctl": 0, "reply": 0, "data": 0}
        self.refusals: Counter[str] = Counter()
        self.stopped = False
        self._read_header = self.codec.read_header
        self._read_body = self.codec.read_body
        self._encode = self.codec.encode

    @property
    def counters(self) -> Counter[str]:
        """Messages, bytes, sessions, drops and errors so far (a snapshot; keys appear once non-zero)."""
        counts = Counter(self._counts)
        for key, value in (
            ("ctl_in", self._n_ctl_in),
            ("data_in", self._n_data_in),
            ("bytes_in", self._n_bytes_in),
            ("bytes_out", self._n_bytes_out),
            ("messages_in", self._n_messages_in),
            ("messages_out", self._n_messages_out),
            ("batches_in", self._n_batches_in),
            ("batches_out", self._n_batches_out),
            ("stream_bytes_in", self._n_stream_bytes_in),
            ("stream_bytes_out", self._n_stream_bytes_out),
            ("flow_control_in", self._n_flow_control_in),
            ("flow_control_out", self._n_flow_control_out),
            *((f"{channel}_out", n) for channel, n in self._n_out.items()),
        ):
            if value:
                counts[key] += value
        return counts

    # ------------------------------------------------------------------ driver API

    def add_peer(self, peer: str, now: float) -> None:
        """A node this one links to (from the topology): start the handshake towards it."""
        if peer == self.node_id or peer in self._outbound:
            return
        # The attempt numbers of our HELLOs start at random: a nonce per node incarnation.
        self._outbound[peer] = _Outbound(peer=peer, attempt=self._entropy(31))
        self._peers.setdefault(peer, _Peer())
        self._send_hello(self._outbound[peer], now)

    @property
    def handled(self) -> int:
        """Messages handed to this core so far, from every socket: a driver tells by it whether a turn
        served input or only woke up (a ZeroMQ socket's FD also signals after a send)."""
        return self._n_ctl_in + self._n_data_in + self._counts["reply_in"]

    def peers_up(self) -> list[str]:
        return sorted(p for p, st in self._peers.items() if st.up)

    def is_up(self, peer: str) -> bool:
        st = self._peers.get(peer)
        return st is not None and st.up

    def is_refused(self, peer: str) -> bool:
        """Whether our link to ``peer`` was refused for good (``refused``)."""
        out = self._outbound.get(peer)
        return out is not None and out.state == "refused"

    def refused(self) -> dict[str, str]:
        """Peers whose handshake was refused for good, with the reason."""
        return {p: o.refused for p, o in self._outbound.items() if o.state == "refused"}

    def on_control(self, rid: bytes, frames: Sequence[Buffer], now: float) -> None:
        """Frames that arrived on our ROUTER from routing id ``rid``."""
        self._n_ctl_in += 1
        try:
            code, session, seq, stream, zmask, size = self._read_header(frames)
        except DecodeError as exc:
            self._n_bytes_in += sum(map(len, frames))
            self._header_refused(rid, frames, exc, now)
            return
        self._n_bytes_in += size
        inbound = self._by_rid.get(rid)
        if inbound is None or seq != inbound.seq + 1 or session != inbound.session or code == _HELLO:
            self._off_sequence(rid, inbound, code, session, seq, frames, now)
            return
        inbound.seq = seq
        inbound.last_recv = now
        if not inbound.confirmed:
            self._confirm(inbound, now)
        try:
            # Blobs as they came: the node keeps a large one as a view on ZeroMQ's buffer (no second copy).
            msg = self._read_body(frames, code, zmask, copy_blobs=False)
        except DecodeError as exc:
            self._body_refused(inbound, code, exc, now)
            if inbound.kind == "client":
                self._client_refused(inbound, code, exc, frames, now)
            return
        role = self._by_message.get(type(msg))
        peer = inbound.peer
        if (  # the hot path: a role's message on an open link (a thin client's: to a role serving clients)
            role is not None
            and self._peers[peer].up
            and (inbound.kind == "node" or type(msg) in self._client_messages)
        ):
            self._n_messages_in += 1
            self._dispatch(role, c.MessageReceived(peer=peer, message=msg), now)
        else:
            self._on_session_message(inbound, stream, msg, now)
        if self._local:
            self._drain_local(now)

    def _header_refused(self, rid: bytes, frames: Sequence[Buffer], exc: DecodeError, now: float) -> None:
        if not self._refused_in_session(rid, frames, exc, now):
            self._refuse_rid(rid, _refusal_code(exc), str(exc), now)

    def on_too_many_frames(
        self, channel: str, source: str | bytes, frames: Sequence[Buffer], count: int, size: int, now: float
    ) -> None:
        """A message of ``count`` frames and ``size`` bytes, more frames than ``limits.max_frames``, of
        which the driver kept only the first ``frames`` (it dropped the rest as it read them, so that no
        message past the limit is copied): refused as ``on_control``, ``on_data`` or ``on_reply``
        (``channel`` "ctl", "data" or "reply"; ``source`` the routing id or the peer) refuse a message
        over a limit."""
        exc = too_many_frames(count, self.codec.limits)
        self._n_bytes_in += size
        if channel == "ctl":
            self._n_ctl_in += 1
            self._header_refused(source if isinstance(source, bytes) else source.encode(), frames, exc, now)
        elif channel == "data":
            self._n_data_in += 1
            self._data_refused(exc)
        else:
            self._counts["reply_in"] += 1
            out = self._outbound.get(source if isinstance(source, str) else source.decode())
            if out is None:
                self._counts["dropped_unknown_peer"] += 1
                return
            self._refuse_outbound(out, f"malformed answer from {out.peer}: {exc}", now)

    def on_wrong_key(self, rid: bytes, frames: Sequence[Buffer], key: str, now: float) -> None:
        """A control message from routing id ``rid`` (a node id with a CURVE key of its own) on a connection
        whose key is another's (named ``key``): nothing it says is taken. A HELLO is refused
        ``AUTHENTICATION``, which its sender takes for good only as the answer to its current attempt, as
        ``DUPLICATE_NODE``: with ZeroMQ's handover the answer may reach the node's own process."""
        self._n_ctl_in += 1
        self._n_bytes_in += sum(map(len, frames))
        self._counts["wrong_key_refused"] += 1
        node = rid.decode("utf-8", "replace")
        text = (
            f"node id {node!r} has a CURVE key of its own (public/{node}.key) and this connection's key is "
            f"{key!r}: give the process the node's own pair, or run it under another node id"
        )
        try:
            hello = self.codec.decode(frames).message if self._read_header(frames)[0] == _HELLO else None
        except DecodeError:
            hello = None
        if isinstance(hello, Hello):
            self._refuse_rid(rid, ErrorCode.AUTHENTICATION, text, now, hello.attempt)
        else:
            self._refusal(ErrorCode.AUTHENTICATION)
        if self._counts["wrong_key_refused"] == 1:
            log.warning("node %s: refused a message: %s", self.node_id, text)
        else:
            log.debug("node %s: refused a message: %s", self.node_id, text)

    def _off_sequence(
        self,
        rid: bytes,
        inbound: _Inbound | None,
        code: int,
        session: int,
        seq: int,
        frames: Sequence[Buffer],
        now: float,
    ) -> None:
        """A control message that is not the next one on its sender's session: a HELLO, or a refusal."""
        if code == _HELLO:
            self._on_hello(rid, frames, now)
            self._drain_local(now)
            return
        if inbound is None and session == 0:
            self._refuse_rid(rid, ErrorCode.HANDSHAKE_HEADER, "expected HELLO before any other message", now)
            return
        if inbound is None or session != inbound.session:
            # A session we no longer have (we lost the link, or restarted): the sender must handshake
            # again. Not final, unlike a peer that never said HELLO at all.
            self._refuse_rid(rid, ErrorCode.STALE_SESSION, f"unknown session {session}", now, session=session)
            return
        reason = f"sequence gap on control from {inbound.peer}: expected {inbound.seq + 1}, got {seq}"
        self._refuse_rid(rid, ErrorCode.SEQUENCE_GAP, reason, now, session=session)
        self._link_lost(inbound.peer, reason, now)

    def _body_refused(self, inbound: _Inbound, code: int, exc: DecodeError, now: float) -> None:
        self._error_to(
            inbound,
            _refusal_code(exc) if REGISTRY.class_of(code) is not None else ErrorCode.UNKNOWN_MESSAGE,
            str(exc),
            code,
            now,
        )

    def _refused_in_session(self, rid: bytes, frames: Sequence[Buffer], exc: DecodeError, now: float) -> bool:
        """A thin client's message over this node's limits whose header (a frame of its own) is the next on
        the client's session: refused as a message whose body does not decode, and the session goes on (a
        client cannot know a node's limits, which may be below its own). Anything else: False."""
        inbound = self._by_rid.get(rid)
        if inbound is None or inbound.kind != "client" or not frames:
            return False
        try:
            code, session, seq, _, _, _ = self._read_header(frames[:1])
        except DecodeError:
            return False
        if code == _HELLO or session != inbound.session or seq != inbound.seq + 1:
            return False
        inbound.seq = seq
        inbound.last_recv = now
        cls = REGISTRY.class_of(code)
        if exc.message_type == "?" and cls is not None:  # named now that its header was read
            exc = type(exc)(cls.__name__, exc.field, exc.reason)
        self._body_refused(inbound, code, exc, now)
        self._client_refused(inbound, code, exc, frames, now)
        return True

    def _client_refused(
        self, inbound: _Inbound, code: int, exc: DecodeError, frames: Sequence[Buffer], now: float
    ) -> None:
        """The role serving thin clients that takes this refused message hears of it (a ``RefusedMessage``),
        so that it can end what the message asked for with its own answer (the gateway: a REQUEST's error
        RESPONSE)."""
        cls = REGISTRY.class_of(code)
        if cls not in self._client_messages or not self._peers[inbound.peer].up:
            return
        refused = c.RefusedMessage(
            type_code=code, code=_refusal_code(exc), reason=str(exc), fields=_int_fields(frames)
        )
        self._dispatch(self._by_message[cls], c.MessageReceived(peer=inbound.peer, message=refused), now)
        self._drain_local(now)

    def on_reply(self, peer: str, frames: Sequence[Buffer], now: float) -> None:
        """Frames that arrived on our DEALER towards ``peer`` (answers to our HELLO, errors)."""
        self._counts["reply_in"] += 1
        out = self._outbound.get(peer)
        if out is None:
            self._counts["dropped_unknown_peer"] += 1
            return
        try:
            env = self.codec.decode(frames)
        except DecodeError as exc:
            # A peer that answers garbage is not ours: stop talking to it.
            self._refuse_outbound(out, f"malformed answer from {peer}: {exc}", now)
            return
        msg = env.message
        if isinstance(msg, Welcome):
            self._on_welcome(out, msg, now)
        elif isinstance(msg, Reject):
            self._on_reject(out, msg, env.header.session, now)
        elif isinstance(msg, Error):
            self._counts["errors_from_peers"] += 1
            log.warning(
                "node %s: peer %s refused a message: %s (%s)", self.node_id, peer, msg.message, msg.code.name
            )
        else:
            self._counts["dropped_out_of_state"] += 1
        self._drain_local(now)

    def on_data(self, frames: Sequence[Buffer], now: float) -> None:
        """Frames that arrived on our PULL."""
        self._n_data_in += 1
        try:
            code, session, seq, stream, zmask, size = self._read_header(frames)
            self._n_bytes_in += size
            msg = self._read_body(frames, code, zmask, copy_blobs=False)
        except DecodeError as exc:
            self._data_refused(exc)
            return
        inbound = self._by_session.get(session)
        if inbound is None or type(msg) is not StreamBatch or stream is None:
            self._refusal(ErrorCode.STALE_SESSION if inbound is None else ErrorCode.UNKNOWN_MESSAGE)
            return
        if inbound.kind == "client":
            # A thin client has no streams: it speaks to the gateway on ctl only.
            self._refusal(ErrorCode.OUT_OF_STATE)
            log.info("node %s: dropped a stream batch from thin client %s", self.node_id, inbound.peer)
            return
        if seq != inbound.data_seq + 1:
            reason = f"sequence gap on data from {inbound.peer}: expected {inbound.data_seq + 1}, got {seq}"
            # Answered as a gap on ctl is (the PULL cannot answer: the REJECT goes back on our ROUTER).
            self._refuse_rid(inbound.rid, ErrorCode.SEQUENCE_GAP, reason, now, session=session)
            self._link_lost(inbound.peer, reason, now)
            return
        inbound.data_seq = seq
        inbound.last_recv = now
        if inbound.data_due:
            if seq >= inbound.data_due:
                inbound.data_due = 0
                inbound.data_due_since = _NEVER
            else:
                inbound.data_due_since = now  # they are coming (a backlog drains): wait on from here
        if not inbound.confirmed:
            self._confirm(inbound, now)
        self._on_batch(inbound.peer, stream, msg, now)
        if self._local:
            self._drain_local(now)

    def _data_refused(self, exc: DecodeError) -> None:
        self._refusal(_refusal_code(exc))
        log.info("node %s: dropped malformed data message: %s", self.node_id, exc)

    def on_transport_down(self, peer: str, now: float, reason: str = "disconnected") -> None:
        """The socket towards ``peer`` reported a disconnect (fail-fast, no waiting for a timeout)."""
        st = self._peers.get(peer)
        out = self._outbound.get(peer)
        if (st is not None and st.up) or (out is not None and out.state == "established"):
            self._link_lost(peer, reason, now)
            self._drain_local(now)

    def on_transport_ready(self, peer: str, now: float) -> None:
        """The socket towards ``peer`` can carry messages again after it refused one (it was not connected).

        A HELLO that the socket refused never left: send the next one now rather than a whole
        ``handshake_timeout`` later (on a fresh start that was about half of all links).
        """
        out = self._outbound.get(peer)
        if out is not None and out.state in ("idle", "hello_sent"):
            self._send_hello(out, now)

    def tick(self, now: float) -> None:
        """Heartbeats, liveness, handshake retries and role timers due at ``now``."""
        cfg = self.config
        for out in self._outbound.values():
            if out.state == "established" and now >= out.last_sent + out.heartbeat:
                # The header's stream slot says how many batches this session has sent on data: the
                # peer finds out if the last of them were lost (docs/PROTOCOL.md section 4).
                self._send_ctl(out, Heartbeat(), now, str(out.data_seq) if out.data_seq else None)
                self._counts["heartbeats_out"] += 1
            elif out.state in ("idle", "hello_sent") and now >= out.hello_at + cfg.handshake_timeout:
                self._send_hello(out, now)
        for inbound in list(self._inbound.values()):
            if now >= inbound.last_recv + cfg.peer_timeout:
                self._link_lost(
                    inbound.peer,
                    f"silent for {now - inbound.last_recv:.3f} s (timeout {cfg.peer_timeout} s)",
                    now,
                )
            elif now >= inbound.data_due_since + cfg.peer_timeout:
                self._data_lost(inbound, now)
        while self._timer_heap and self._timer_heap[0][0] <= now:
            at, role_name, key = heapq.heappop(self._timer_heap)
            if self._timers.get((role_name, key)) != at:
                continue  # moved or cancelled
            del self._timers[(role_name, key)]
            role = self.roles.get(role_name)
            if role is not None:
                self._dispatch(role, c.TimerFired(key=key), now)
        self._drain_local(now)

    def next_deadline(self) -> float | None:
        """When ``tick`` next has something to do (for the loop's poll timeout).

        Asked once per loop turn: plain loops and comparisons, no list or generator to build.
        """
        cfg = self.config
        best = _NEVER
        for out in self._outbound.values():
            state = out.state
            if state == "established":
                at = out.last_sent + out.heartbeat
            elif state in {"hello_sent", "idle"}:
                at = out.hello_at + cfg.handshake_timeout
            else:
                continue
            if at < best:  # noqa: PLR1730 (a comparison, where min() is a call: this runs every loop turn)
                best = at
        if self._inbound:
            timeout = cfg.peer_timeout
            for inbound in self._inbound.values():
                at = inbound.last_recv
                if inbound.data_due_since < at:  # noqa: PLR1730
                    at = inbound.data_due_since
                at += timeout
                if at < best:  # noqa: PLR1730
                    best = at
        heap = self._timer_heap
        if heap:
            timers = self._timers
            while heap and timers.get((heap[0][1], heap[0][2])) != heap[0][0]:
                heapq.heappop(heap)
            if heap and heap[0][0] < best:
                best = heap[0][0]
        return None if best == _NEVER else best

    def call(self, role: str, name: str, args: dict[str, Any], now: float) -> int:
        """Deliver a ``LocalCall``; the answer appears as a ``Completed`` output."""
        call_id = self._next_call
        self._next_call += 1
        target = self.roles.get(role)
        if target is None:
            self.out.append(
                Completed(
                    call_id, None, f"node {self.node_id} runs no role {role!r} (it runs {sorted(self.roles)})"
                )
            )
            return call_id
        self._dispatch(target, c.LocalCall(call_id=call_id, name=name, args=args), now)
        self._drain_local(now)
        return call_id

    def stop(self, now: float) -> None:
        """Say BYE on every established direction so peers report us lost at once."""
        for out in self._outbound.values():
            if out.state == "established":
                self._send_ctl(out, Bye(reason="node stopping"), now)
        self.stopped = True

    def take(self) -> list[Output]:
        out, self.out = self.out, []
        return out

    def status(self) -> dict[str, Any]:
        """Peers, sessions, streams and counters, for ``sparkbus status``."""
        return {
            "node": self.node_id,
            "peers": {
                p: {
                    "up": st.up,
                    "outbound": self._outbound[p].state if p in self._outbound else None,
                    "inbound_session": p in self._inbound,
                    "streams_out": len(st.senders),
                    "streams_in": len(st.receivers),
                }
                for p, st in sorted(self._peers.items())
            },
            "refused": self.refused(),
            "misdirected": {p: o.misdirected for p, o in self._outbound.items() if o.misdirected},
            "counters": dict(self.counters),
            "refusals": dict(self.refusals),
        }

    # ------------------------------------------------------------------ sessions

    def _on_session_message(self, inbound: _Inbound, stream: str | None, msg: Any, now: float) -> None:
        """A message on an open session other than a role's message on a link that is up."""
        peer = inbound.peer
        if isinstance(msg, Heartbeat):
            self._counts["heartbeats_in"] += 1
            if stream is not None:
                self._on_data_count(inbound, stream, now)
            return
        if isinstance(msg, Bye):
            self._link_lost(
                peer, f"peer said goodbye: {msg.reason}" if msg.reason else "peer said goodbye", now
            )
            return
        if isinstance(msg, FlowControl):
            self._on_flow_control(inbound, stream, msg, now)
            return
        if isinstance(msg, Hello | Welcome | Reject | Error | StreamBatch):
            self._error_to(
                inbound,
                ErrorCode.OUT_OF_STATE,
                f"{type(msg).__name__} is not valid on an open control session",
                REGISTRY.code_of(type(msg)),
                now,
            )
            return
        if type(msg) not in self._by_message:
            self._error_to(
                inbound,
                ErrorCode.NO_ROLE,
                f"node {self.node_id} runs no role for {type(msg).__name__}",
                REGISTRY.code_of(type(msg)),
                now,
            )
            return
        if inbound.kind == "client":
            # Not an error of the session: the node answers ERROR and serves the client on.
            self._error_to(
                inbound,
                ErrorCode.OUT_OF_STATE,
                f"{type(msg).__name__} is not a thin-client message: a client session speaks only to the "
                "roles that serve thin clients (the client.gateway)",
                REGISTRY.code_of(type(msg)),
                now,
            )
            return
        self._refuse_early(inbound, type(msg), now)

    def _on_data_count(self, inbound: _Inbound, count: str, now: float) -> None:
        """A HEARTBEAT says its sender has sent ``count`` batches on its data session so far.

        Fewer arrived: the rest may still be on their way (data travel on their own pipe, and may trail
        the heartbeat under load), so they are awaited until ``peer_timeout`` passes with none of them
        arriving (from now, or from the latest that came: a slow backlog is not a loss). A cut that loses
        the last batches of a stream leaves no gap in either sequence (the sender waits for credit, and
        sends nothing more on data); this count is what shows it.
        """
        if not (count.isascii() and count.isdigit() and len(count) <= 20):
            self._error_to(
                inbound,
                ErrorCode.MALFORMED,
                f"HEARTBEAT: the data count in the header's stream slot must be decimal digits, got {count!r}",
                REGISTRY.code_of(Heartbeat),
                now,
            )
            return
        sent = int(count)
        if sent > inbound.data_seq and not inbound.data_due:
            # One count awaited at a time: once it is met, the next HEARTBEAT (one interval later on a
            # direction still idle) sets the next, so a loss shows within peer_timeout plus an interval.
            inbound.data_due = sent
            inbound.data_due_since = now

    def _data_lost(self, inbound: _Inbound, now: float) -> None:
        """Batches a HEARTBEAT counted stopped arriving for ``peer_timeout``: a sequence gap at the end."""
        missing = inbound.data_due - inbound.data_seq
        reason = (
            f"sequence gap on data from {inbound.peer}: its heartbeat counted {inbound.data_due} batches "
            f"sent, {inbound.data_seq} arrived, none for {self.config.peer_timeout} s ({missing} lost)"
        )
        self._refuse_rid(inbound.rid, ErrorCode.SEQUENCE_GAP, reason, now, session=inbound.session)
        self._link_lost(inbound.peer, reason, now)

    def _error_to(self, inbound: _Inbound, code: ErrorCode, text: str, ref_type: int, now: float) -> None:
        text = clip(text, MAX_REFUSAL_TEXT)
        self._refusal(code)
        log.info("node %s: refused a message from %s: %s", self.node_id, inbound.peer, text)
        self._reply(inbound.rid, Error(code=code, message=text, ref_type=ref_type), now)

    def _refuse_rid(
        self,
        rid: bytes,
        code: ErrorCode,
        text: str,
        now: float,
        attempt: int = 0,
        session: int = 0,
        version: tuple[int, int, int] | None = None,
    ) -> None:
        """REJECT to ``rid``: a HELLO (echoing its ``attempt``), or a message on ``session``, which ends.
        ``version``: the one to offer back (default: our newest)."""
        text = clip(text, MAX_REFUSAL_TEXT)
        self._refusal(code)
        log.info("node %s: refused routing id %s: %s", self.node_id, rid.hex(), text)
        self._reply(
            rid,
            Reject(code=code, message=text, version=version or self.config.versions[0], attempt=attempt),
            now,
            session=session,
        )

    def _refusal(self, code: ErrorCode) -> None:
        self._counts["refused"] += 1
        self.refusals[code.name] += 1

    def _reply(self, rid: bytes, msg: Any, now: float, session: int = 0) -> None:
        self._emit("reply", rid, self._encode(msg, session=session))

    def _send_ctl(self, out: _Outbound, msg: Any, now: float, stream: str | None = None) -> None:
        # Encoded before the sequence number moves on: a message that cannot be encoded must not leave a
        # gap, which the peer would take for a lost message and break the link over.
        frames = self._encode(msg, session=out.session, seq=out.seq + 1, stream=stream)
        out.seq += 1
        out.last_sent = now
        self._emit("ctl", out.peer, frames)

    def _emit(self, channel: str, to: str | bytes, frames: list[Buffer]) -> None:
        self._n_out[channel] += 1
        self._n_bytes_out += sum(map(len, frames))
        self.out.append(Transmit(channel, to, frames))

    # ------------------------------------------------------------------ streams

    # ------------------------------------------------------------------ roles

    def _dispatch(self, role: c.Role, event: c.Event, now: float) -> None:
        try:
            actions = list(role.handle(event, now))
        except Exception as exc:
            if isinstance(event, c.LocalCall) and event.call_id in self._role_calls:
                # A role's call must always be answered, or its caller would wait for ever.
                self._call_answered(
                    event.call_id, None, f"role {role.name} failed: {type(exc).__name__}: {exc}"
                )
            self._role_failed(role, event, exc, now)
            return
        for action in actions:
            try:
                if type(action) is c.Send:  # the most common action, without _act's chain of isinstance
                    self._act_send(action, now)
                else:
                    self._act(role, action, now)
            except Exception as exc:
                self._role_failed(role, action, exc, now)

    def _role_failed(self, role: c.Role, event: Any, exc: Exception, now: float) -> None:
        self._counts["role_errors"] += 1
        text = f"{type(exc).__name__}: {exc}"
        log.error(
            "node %s: role %s failed on %r: %s",
            self.node_id,
            role.name,
            event,
            text,
            exc_info=not isinstance(exc, c.LocalProtocolError | c.RemoteProtocolError),
        )
        if isinstance(event, c.HandlerFailed):
            return  # failing while told of a failure: logged, not looped
        self._dispatch(role, c.HandlerFailed(event=event, error=text), now)

    def _act(self, role: c.Role, action: c.Action, now: float) -> None:
        if isinstance(action, c.Send):
            self._act_send(action, now)
        elif isinstance(action, c.SendBatch):
            self._act_batch(role, action, now)
        elif isinstance(action, c.OpenStream):
            st = self._stream_peer(action.peer, action.stream)
            if action.stream in st.senders:
                raise c.LocalProtocolError(f"stream {action.stream} to {action.peer} is already open")
            if len(st.senders) >= self.config.max_streams:
                raise c.LocalProtocolError(
                    f"stream {action.stream}: {self.config.max_streams} streams open to {action.peer}"
                )
            st.senders[action.stream] = (role.name, CreditSender(action.stream, action.credit))
        elif isinstance(action, c.AcceptStream):
            st = self._stream_peer(action.peer, action.stream)
            # Checked now, where the role is told (HandlerFailed), not at the first batch.
            check_receiver_credit(action.stream, action.credit)
            if action.stream not in st.receivers:
                st.accepted[action.stream] = action.credit
        elif isinstance(action, c.Consumed):
            self._act_consumed(action, now)
        elif isinstance(action, c.GrantCredit):
            recv = self._receiver(action.peer, action.stream)
            self._send_flow_control(action.peer, action.stream, *recv.grant(action.credit), now)
        elif isinstance(action, c.CloseStream):
            known = self._peers.get(action.peer)
            if known is not None:
                closing = known.receivers.get(action.stream)
                if closing is not None and closing.done and action.stream in known.senders:
                    # The key names a stream each way (a query's edge between two participants): the
                    # finished incoming one is closed; the outgoing one goes on (it ends with its last batch).
                    del known.receivers[action.stream]
                else:
                    known.senders.pop(action.stream, None)
                    ending = known.receivers.pop(action.stream, None)
                    if ending is not None and not ending.done:
                        self._stream_ended(known, action.stream, ending.expected_ordinal)
                    elif ending is None and action.stream in known.accepted:
                        self._stream_ended(known, action.stream, 0)
                known.accepted.pop(action.stream, None)
        elif isinstance(action, c.SetTimer):
            self._timers[(role.name, action.key)] = action.at
            heapq.heappush(self._timer_heap, (action.at, role.name, action.key))
        elif isinstance(action, c.CancelTimer):
            self._timers.pop((role.name, action.key), None)
        elif isinstance(action, c.Reply):
            if action.call_id in self._role_calls:
                self._call_answered(action.call_id, action.result, action.error)
            else:
                self.out.append(Completed(action.call_id, action.result, action.error))
        elif isinstance(action, c.Call):
            self._act_call(role, action)
        else:
            raise c.LocalProtocolError(f"unknown action {action!r}")

    def _act_call(self, caller: c.Role, action: c.Call) -> None:
        target = self.roles.get(action.role)
        if target is None:
            error = f"node {self.node_id} runs no role {action.role!r} (it runs {sorted(self.roles)})"
            self._local.append((caller, c.CallResult(tag=action.tag, error=error)))
            return
        call_id = self._next_call
        self._next_call += 1
        self._role_calls[call_id] = (caller.name, action.tag)
        self._local.append((target, c.LocalCall(call_id=call_id, name=action.name, args=action.args)))

    def _call_answered(self, call_id: int, result: Any, error: str | None) -> None:
        caller_name, tag = self._role_calls.pop(call_id)
        caller = self.roles.get(caller_name)
        if caller is not None:
            self._local.append((caller, c.CallResult(tag=tag, result=result, error=error)))

    def _act_send(self, action: c.Send, now: float) -> None:
        if action.peer == self.node_id:
            role = self._by_message.get(type(action.message))
            if role is None:
                raise c.LocalProtocolError(f"no role on {self.node_id} takes {type(action.message).__name__}")
            self._local.append((role, c.MessageReceived(peer=self.node_id, message=action.message)))
            return
        peer = action.peer
        st = self._peers.get(peer)
        if st is None or not st.up:
            raise c.LocalProtocolError(
                f"cannot send {type(action.message).__name__}: peer {peer} is not connected"
            )
        if self._inbound[peer].kind == "client":
            self._send_to_peer(peer, action.message, now)
            self._n_messages_out += 1
            return
        # _send_to_peer and _emit for a node, inline: the path of every message a role sends. Encoded
        # before the sequence number moves on (see _send_ctl).
        out = self._outbound[peer]
        frames = self._encode(action.message, session=out.session, seq=out.seq + 1)
        out.seq += 1
        out.last_sent = now
        self._n_messages_out += 1
        self._n_out["ctl"] += 1
        self._n_bytes_out += sum(map(len, frames))
        self.out.append(Transmit("ctl", peer, frames))

    def _send_to_peer(self, peer: str, msg: Any, now: float, stream: str | None = None) -> None:
        inbound = self._inbound[peer]
        if inbound.kind == "client":
            frames = self._encode(msg, session=inbound.session, seq=inbound.reply_seq + 1, stream=stream)
            inbound.reply_seq += 1  # after the encoding, as in _send_ctl
            self._emit("reply", inbound.rid, frames)
            return
        self._send_ctl(self._outbound[peer], msg, now, stream)

    def _drain_local(self, now: float) -> None:
        while self._local:
            role, event = self._local.popleft()
            self._dispatch(role, event, now)


def _int_fields(frames: Sequence[Buffer]) -> dict[str, int]:
    """The int fields at the top level of a message's body (its second frame), when that is a plain msgpack
    map; empty otherwise (compressed, not msgpack, not a map)."""
    if len(frames) < 2:
        return {}
    try:
        body = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return {}
    if not isinstance(body, dict):
        return {}
    return {k: v for k, v in body.items() if type(k) is str and type(v) is int}


def _refusal_code(exc: DecodeError) -> ErrorCode:
    """LIMIT_EXCEEDED for a message over a decoder limit, MALFORMED for any other that does not decode."""
    return ErrorCode.LIMIT_EXCEEDED if isinstance(exc, LimitExceeded) else ErrorCode.MALFORMED
