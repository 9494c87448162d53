"""Links: the IEP-90 / IEP-76 handshake on each direction, peer up and peer lost."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgpack

from sparkbus.bus import contract as c
from sparkbus.bus.messages import (
    DROPPED_ATTEMPT,
    FINAL_CODES,
    INCARNATION,
    MAGIC,
    SESSION_ENDING_CODES,
    ErrorCode,
    Heartbeat,
    Hello,
    Reject,
    Welcome,
    and_features,
    check_version,
    retry_version,
    version_text,
)
from sparkbus.bus.state import RETIRED_KEPT, NodeState, _Inbound, _Outbound, _Peer
from sparkbus.codecs import Buffer, DecodeError
from sparkbus.codecs.errors import clip
from sparkbus.codecs.schema import quote

log = logging.getLogger("sparkbus.bus")

#: REJECT codes that end our link for good, when they answer our current HELLO.
_FOR_GOOD = FINAL_CODES | {ErrorCode.DUPLICATE_NODE, ErrorCode.AUTHENTICATION}

#: Characters of a refusal's text (ERROR, REJECT) at most, whatever it quotes of the refused message: a
#: backstop behind ``DecodeError``'s own bound (``codecs.errors.clip``), so that no message makes this node
#: build a large answer.
MAX_REFUSAL_TEXT = 4096


class LinkLayer(NodeState):
    """Handshakes and link loss; mixed into ``NodeCore``."""

    def _send_hello(self, out: _Outbound, now: float) -> None:
        out.attempt += 1
        out.state = "hello_sent"
        out.hello_at = now
        version = self._offered(out)
        # Tell the peer when we dropped the session we gave its latest HELLO: if that HELLO is still its
        # current attempt, its WELCOME (on the way, or taken already) names a session we no longer know.
        inbound = self._inbound.get(out.peer)
        held = inbound is not None and inbound.hello_attempt == out.peer_welcomed
        extensions = {INCARNATION: str(self._incarnation)}
        if out.peer_welcomed and not held:
            extensions[DROPPED_ATTEMPT] = str(out.peer_welcomed)
        hello = Hello(
            magic=MAGIC,
            version=version,
            features=self._features,
            cluster_tag=self.config.cluster_tag,
            node_id=self.node_id,
            kind="node",
            attempt=out.attempt,
            extensions=extensions,
        )
        self._emit("ctl", out.peer, self.codec.encode(hello))
        self._counts["hellos_out"] += 1

    def _on_hello(self, rid: bytes, frames: Sequence[Buffer], now: float) -> None:
        cfg = self.config
        try:
            hello = self.codec.decode(frames).message
        except DecodeError as exc:
            offered, attempt = _offered_version(frames)
            if offered is not None and offered not in cfg.versions:
                # A HELLO of another version may carry fields this one does not know: what matters is
                # the version, so the peer can retry with one we speak (IEP-90).
                self._refuse_version(rid, offered, attempt, now)
                return
            code = ErrorCode.HANDSHAKE_HEADER if exc.field in ("magic", "<body>") else ErrorCode.MALFORMED
            # Echoing its attempt: the sender takes a final code only as the answer to its current HELLO.
            self._refuse_rid(rid, code, clip(f"bad HELLO: {exc}", MAX_REFUSAL_TEXT), now, attempt)
            return
        assert isinstance(hello, Hello)
        if hello.magic != MAGIC:
            self._refuse_rid(
                rid,
                ErrorCode.HANDSHAKE_HEADER,
                f"expected magic {MAGIC!r}, got {quote(hello.magic)}",
                now,
                hello.attempt,
            )
            return
        if hello.version not in cfg.versions:
            self._refuse_version(rid, hello.version, hello.attempt, now)
            return
        if hello.cluster_tag != cfg.cluster_tag:
            self._refuse_rid(
                rid,
                ErrorCode.CLUSTER_ID_MISMATCH,
                f"cluster mismatch: this node is in {cfg.cluster_tag!r}, the peer in {quote(hello.cluster_tag)}",
                now,
                hello.attempt,
            )
            return
        if hello.kind == "node":
            if hello.node_id.encode() != rid:
                self._refuse_rid(
                    rid,
                    ErrorCode.PROTOCOL,
                    f"node id {quote(hello.node_id)} does not match its routing id",
                    now,
                    hello.attempt,
                )
                return
            if hello.node_id not in self._outbound:
                self._refuse_rid(
                    rid,
                    ErrorCode.RESOURCE_NOT_FOUND,
                    f"node {quote(hello.node_id)} is not a peer of {self.node_id!r} in this topology",
                    now,
                    hello.attempt,
                )
                return
            peer = hello.node_id
        else:
            peer = f"client:{rid.hex()}"
        old = self._inbound.get(peer)
        # Thin clients only: the topology bounds the nodes, and clients must never lock them out.
        if (
            old is None
            and hello.kind == "client"
            and sum(i.kind == "client" for i in self._inbound.values()) >= cfg.max_peers
        ):
            self._refuse_rid(
                rid,
                ErrorCode.TOO_MANY_PEERS,
                f"this node already has {cfg.max_peers} client sessions",
                now,
                hello.attempt,
            )
            return
        out = self._outbound.get(peer) if hello.kind == "node" else None
        # The peer says it dropped the session it gave our current attempt: our direction (open, or its
        # WELCOME on the way) is stale, and we handshake again. Any other direction of ours is kept: the
        # peer has not answered it yet, or holds it still. Resetting a direction the peer holds would make
        # it handshake again in turn, and two sides could go on replacing each other's sessions for ever.
        stale = (
            out is not None
            and out.state in ("hello_sent", "established")
            and _dropped_attempt(hello) == out.attempt
        )
        reason = "peer opened a new session"
        incarnation = _extension_int(hello, INCARNATION, 2**63) if hello.kind == "node" else 0
        known = self._peers.get(peer)
        if incarnation and known is not None and incarnation in known.retired:
            self._refuse_replaced(rid, peer, incarnation, known, hello.attempt, now)
            return
        if incarnation and known is not None and known.incarnation not in (0, incarnation):
            # A new process under the peer's name, before its old one was noticed gone: the old held the
            # session our HELLO opened, so our direction is stale too, whatever the new one can tell us.
            stale = out is not None and out.state in ("hello_sent", "established")
            reason = "peer restarted (a new process said HELLO)"
            self._counts["peer_restarts_seen"] += 1
        if old is not None or stale:
            # A new HELLO from a peer with a session means its side lost the link (or restarted): the
            # session we gave it is replaced, and every stream with it ends.
            self._link_lost(peer, reason, now, keep_outbound=not stale)
        session = self._new_session_id()
        inbound = _Inbound(
            peer=peer,
            rid=rid,
            kind=hello.kind,
            session=session,
            connection_id=f"{self._entropy(128):032x}",
            last_recv=now,
            version=hello.version,
            features=and_features(hello.features, self._features),
            hello_attempt=hello.attempt,
            confirmed=hello.kind == "client",
        )
        self._inbound[peer] = inbound
        if out is not None:
            out.peer_welcomed = hello.attempt
        self._by_rid[rid] = inbound
        self._by_session[session] = inbound
        st = self._peers.setdefault(peer, _Peer())
        if incarnation:
            st.incarnation = incarnation
            inbound.incarnation = incarnation
        welcome = Welcome(
            version=hello.version,
            features=inbound.features,
            session=session,
            connection_id=inbound.connection_id,
            idle_timeout_ms=int(cfg.peer_timeout * 1000),
            node_id=self.node_id,
            cluster_tag=cfg.cluster_tag,
            attempt=hello.attempt,
            incarnation=self._incarnation if hello.kind == "node" else 0,
        )
        self._emit("reply", rid, self.codec.encode(welcome))
        self._counts["sessions_accepted"] += 1
        self._maybe_up(peer, now)

    def _refuse_replaced(
        self, rid: bytes, peer: str, incarnation: int, known: _Peer, attempt: int, now: float
    ) -> None:
        """REJECT ``DUPLICATE_NODE`` of a HELLO from a process of ``peer`` known not to answer at its
        endpoint (``_retire``).

        The node id belongs to the process our DEALER reaches at the peer's endpoint: a process that
        was stopped or cut off while a new one took its place there, or a second process started under
        the same id, is not it. Taking it would end the owner's session, and with ZeroMQ's routing-id
        handover the two would go on taking the id from each other; refused, it stops dialling us.
        The owner's session is not touched.
        """
        self._counts["replaced_processes_refused"] += 1
        text = (
            f"node id {peer!r} belongs to the process at its endpoint (incarnation {known.owner}); this "
            f"process (incarnation {incarnation}) is not it: stop it, or give it another node id"
        )
        log.warning("node %s: refused a replaced process of %s: %s", self.node_id, peer, text)
        self._refuse_rid(rid, ErrorCode.DUPLICATE_NODE, text, now, attempt)

    def _refuse_version(self, rid: bytes, offered: tuple[int, int, int], attempt: int, now: float) -> None:
        """REJECT ``PROTOCOL_COMPATIBILITY`` of a HELLO offering a version we do not speak, with the one
        to try: the newest we speak below it (a newer peer may speak it too), else our newest."""
        older = [v for v in self.config.versions if v < offered]
        answer = max(older) if older else self.config.versions[0]
        text = f"unsupported version {version_text(offered)}"
        self._refuse_rid(rid, ErrorCode.PROTOCOL_COMPATIBILITY, text, now, attempt, version=answer)

    def _offered(self, out: _Outbound) -> tuple[int, int, int]:
        """The version our HELLOs towards ``out.peer`` offer: our newest, or the one negotiation chose."""
        return out.offered or self.config.versions[0]

    def _new_session_id(self) -> int:
        while True:
            sid = self._entropy(63)
            if sid and sid not in self._by_session:
                return sid

    def _on_welcome(self, out: _Outbound, msg: Welcome, now: float) -> None:
        if out.state != "hello_sent" or msg.attempt != out.attempt:
            # The answer to a HELLO of an attempt that is over (answered already, or its link was lost
            # while it was in flight): the peer may have dropped that session since, and taking it would
            # open a direction the peer refuses, whose REJECT would then end the link again.
            self._counts["dropped_stale_welcome"] += 1
            return
        if msg.node_id != out.peer:
            self._welcomed_by_another(out, msg, now)
            return
        if msg.cluster_tag != self.config.cluster_tag:
            self._refuse_outbound(
                out, f"cluster mismatch: expected {self.config.cluster_tag!r}, got {msg.cluster_tag!r}", now
            )
            return
        if msg.version != self._offered(out):
            # The server picks the version by refusing ours, never by welcoming another one.
            v, o = version_text(msg.version), version_text(self._offered(out))
            self._refuse_outbound(out, f"peer welcomed version {v}, but this node offered {o}", now)
            return
        if msg.incarnation:
            self._learn_owner(out.peer, msg.incarnation, now)
        out.misdirected = ""
        out.state = "established"
        out.session = msg.session
        out.seq = 0
        out.data_seq = 0
        out.last_sent = now
        out.features = msg.features
        out.heartbeat = heartbeat_interval(self.config.heartbeat_interval, msg.idle_timeout_ms)
        self._counts["sessions_opened"] += 1
        # Confirm the session at once: the peer is up only once it has heard from us on it.
        self._send_ctl(out, Heartbeat(), now)
        self._counts["heartbeats_out"] += 1
        self._maybe_up(out.peer, now)

    def _welcomed_by_another(self, out: _Outbound, msg: Welcome, now: float) -> None:
        """A WELCOME to our current HELLO from a node other than the peer: the peer's endpoint reaches
        another node (a stale or swapped endpoint table, a port another node took after a restart).

        Nothing of it is taken, neither its session (our messages for the peer would reach that node) nor
        its incarnation as the owner of the peer's node id (the peer's own process would be refused
        ``DUPLICATE_NODE``). The attempt ends and the next HELLO goes after ``handshake_timeout``: the
        endpoint may be corrected meanwhile, and a DEALER dials again whenever its connection closes.
        """
        self._counts["welcomes_from_other_nodes"] += 1
        where = self.peer_addresses.get(out.peer, "its endpoint")
        text = f"the endpoint of {out.peer!r} ({where}) is answered by node {msg.node_id!r}"
        (log.debug if text == out.misdirected else log.warning)(
            "node %s: %s; its WELCOME is ignored and the handshake with %s retried (a stale or swapped "
            "endpoint?)",
            self.node_id,
            text,
            out.peer,
        )
        out.misdirected = text
        out.state = "idle"
        out.hello_at = now

    def _learn_owner(self, peer: str, owner: int, now: float) -> None:
        """A WELCOME on our current attempt named ``owner``: the process at the peer's endpoint.

        Any other process of the peer's node id is not the node: the one that answered there before
        (replaced: a restart while it was stopped or cut off), and one whose HELLO opened the session
        we hold for the peer (a second process under the same id, or a stray connection claiming it);
        that session ends. A HELLO alone never retires anyone: anything that can reach our ROUTER can
        send one, and the process it would push out may be the live node.
        """
        st = self._peers.setdefault(peer, _Peer())
        if st.owner not in (0, owner):
            self._retire(st, st.owner)
        st.owner = owner
        if owner in st.retired:
            st.retired.remove(owner)  # answers at the endpoint again (a stray said it was elsewhere)
        inbound = self._inbound.get(peer)
        if inbound is not None and inbound.incarnation not in (0, owner):
            self._retire(st, inbound.incarnation)
            self._link_lost(
                peer,
                f"the process that opened its session ({inbound.incarnation}) is not the one at its "
                f"endpoint ({owner})",
                now,
                keep_outbound=True,
            )

    def _retire(self, st: _Peer, incarnation: int) -> None:
        if incarnation not in st.retired:
            st.retired.append(incarnation)
            del st.retired[:-RETIRED_KEPT]

    def _on_reject(self, out: _Outbound, msg: Reject, session: int, now: float) -> None:
        self._counts[f"rejected_{msg.code.name.lower()}"] += 1
        if msg.code in _FOR_GOOD:
            # A final code, or (DUPLICATE_NODE) our node id belongs to another process, the one at our
            # endpoint, or (AUTHENTICATION) to another CURVE key than ours. Only as the answer to the HELLO
            # we are waiting on: with ZeroMQ's handover the reply meant for another process holding our
            # routing id (a stranger, a process under our node id) may reach us, and an open link must
            # not be given up over it. Attempts start at random numbers, and ours are never 0 (the attempt
            # of a REJECT of anything but a HELLO, or of one whose attempt could not be read).
            if out.state == "hello_sent" and msg.attempt == out.attempt:
                self._refuse_outbound(out, f"{msg.code.name}: {msg.message}", now)
            else:
                self._counts["dropped_stale_reject"] += 1
            return
        if (
            msg.code == ErrorCode.PROTOCOL_COMPATIBILITY
            and out.state == "hello_sent"
            and msg.attempt == out.attempt
        ):
            again = retry_version(self.config.versions, self._offered(out), msg.version)
            if again is not None:
                out.offered = again  # IEP-90: retry with the server's version, or an older one we speak
                self._send_hello(out, now)
            else:
                self._refuse_outbound(out, f"no common protocol version: {msg.message}", now)
            return
        if out.state == "established" and msg.code in SESSION_ENDING_CODES:
            if session != out.session:
                # It ends a session of ours that is over already, not the one we have now.
                self._counts["dropped_stale_reject"] += 1
                return
            self._link_lost(out.peer, f"peer ended our session: {msg.message}", now)
            return
        if out.state == "hello_sent" and msg.attempt == out.attempt:
            log.warning("node %s: %s refused our HELLO: %s", self.node_id, out.peer, msg.message)

    def _confirm(self, inbound: _Inbound, now: float) -> None:
        """The first sequenced message on a node's session: the peer has our WELCOME."""
        inbound.confirmed = True
        self._maybe_up(inbound.peer, now)

    def _refuse_early(self, inbound: _Inbound, cls: type, now: float) -> None:
        """A role's message or a batch on a session while the link is not up here.

        A peer is up only once both sides are welcomed (its session with us is confirmed by our first
        message), so an honest peer never sends one: the message is refused and the link broken, loudly,
        rather than held (without bound) or dropped (the peer took its sequence number, so the session or
        the stream would go on with a hole). The REJECT names the session, so the peer ends it at once.
        """
        reason = (
            f"{cls.__name__} from {inbound.peer} before the link was open at {self.node_id} "
            "(a peer sends only once it has heard from us on its session)"
        )
        self._refusal(ErrorCode.OUT_OF_STATE)
        reject = Reject(code=ErrorCode.OUT_OF_STATE, message=reason, version=self.config.versions[0])
        self._reply(inbound.rid, reject, now, session=inbound.session)
        self._link_lost(inbound.peer, reason, now)

    def _refuse_outbound(self, out: _Outbound, reason: str, now: float) -> None:
        log.error("node %s: link to %s refused for good: %s", self.node_id, out.peer, reason)
        was_up = self._peers.get(out.peer, _Peer()).up
        out.state = "refused"
        out.refused = reason
        if was_up:
            self._link_lost(out.peer, reason, now)

    def _maybe_up(self, peer: str, now: float) -> None:
        st = self._peers[peer]
        inbound = self._inbound.get(peer)
        if st.up or inbound is None or not inbound.confirmed:
            return
        if inbound.kind == "node":
            out = self._outbound.get(peer)
            if out is None or out.state != "established":
                return
        st.up = True
        self._counts["peers_up"] += 1
        connection_id = inbound.connection_id if inbound.kind == "client" else ""
        for role in self.roles.values():
            self._dispatch(role, c.PeerUp(peer=peer, connection_id=connection_id), now)

    def _link_lost(self, peer: str, reason: str, now: float, *, keep_outbound: bool = False) -> None:
        """Both directions end (our direction survives with ``keep_outbound``), with every stream."""
        st = self._peers.get(peer)
        inbound = self._inbound.pop(peer, None)
        if inbound is not None:
            self._by_rid.pop(inbound.rid, None)
            self._by_session.pop(inbound.session, None)
        out = self._outbound.get(peer)
        if out is not None and not keep_outbound and out.state in ("hello_sent", "established"):
            # A HELLO still unanswered belongs to the link that ended: its WELCOME, when it comes, is
            # ignored (the next HELLO carries a new attempt), since the peer may drop that session too.
            out.state = "idle"
            out.hello_at = now - self.config.handshake_timeout  # re-handshake on the next tick
            out.session = 0
        if st is None:
            return
        if not keep_outbound:
            # Our next direction is opened anew, with whichever process answers: an incarnation seen
            # from now on is news of no restart.
            st.incarnation = 0
        st.senders.clear()
        st.receivers.clear()
        st.accepted.clear()
        st.ended.clear()
        if st.up:
            st.up = False
            self._counts["peers_lost"] += 1
            log.warning("node %s: peer %s lost: %s", self.node_id, peer, reason)
            for role in self.roles.values():
                self._dispatch(role, c.PeerLost(peer=peer, reason=reason), now)
        if peer.startswith("client:") and peer not in self._outbound:
            # A thin client's session is all there is of it: a client that comes back is a new one (a new
            # routing id), so its entry goes, or every session a long-lived node ever served stays listed.
            del self._peers[peer]


def _offered_version(frames: Sequence[Buffer]) -> tuple[tuple[int, int, int] | None, int]:
    """The ``version`` and ``attempt`` of a HELLO that does not decode as ours, each read from its body if
    that is a map holding a valid one (None for no version, 0 for no attempt)."""
    if len(frames) < 2:
        return None, 0
    try:
        body = msgpack.unpackb(bytes(frames[1]), raw=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None, 0
    if not isinstance(body, dict):
        return None, 0
    version, attempt = body.get("version"), body.get("attempt")
    attempt = attempt if type(attempt) is int and 0 <= attempt < 2**63 else 0
    if not (isinstance(version, list) and len(version) == 3 and all(type(x) is int for x in version)):
        return None, attempt
    offered = (version[0], version[1], version[2])
    try:
        check_version(offered)
    except ValueError:
        return None, attempt
    return offered, attempt


def _dropped_attempt(hello: Hello) -> int:
    """The attempt of our HELLO whose session the peer has dropped since, as its HELLO names it (0: none)."""
    return _extension_int(hello, DROPPED_ATTEMPT, 2**64)


def _extension_int(hello: Hello, key: str, below: int) -> int:
    """A HELLO extension holding a number below ``below`` in plain decimal (no sign, no leading zero;
    0: absent, or not such a number, so that one value has one spelling)."""
    value = hello.extensions.get(key, "")
    if not (value.isascii() and value.isdigit() and len(value) <= 20) or value != str(int(value)):
        return 0
    number = int(value)
    return number if number < below else 0


#: IEP-83: the shortest heartbeat interval a server's idle timeout may ask for (seconds).
MIN_RECOMMENDED_HEARTBEAT = 0.5


def heartbeat_interval(configured: float, idle_timeout_ms: int) -> float:
    """The heartbeat interval towards a peer whose WELCOME gave ``idle_timeout_ms`` (IEP-83).

    ``min(configured, idle_timeout / 3)``, the third no shorter than 500 ms; the configured interval
    alone when the peer has no idle timeout (0 or less).
    """
    if idle_timeout_ms <= 0:
        return configured
    return min(configured, max(MIN_RECOMMENDED_HEARTBEAT, idle_timeout_ms / 3000))
