"""The ``client.gateway`` role: runs thin-client requests through the node's roles, and keeps each
logical connection (IEP-90) alive across a broken session for a restore timeout.

Per logical connection the gateway keeps a context: the requests running on the node's roles and the
results not yet acknowledged by the client. A result is a sequence of ``Response`` chunks, sent at most
the request's ``window`` ahead of the chunks the client acknowledged consuming (``Ack.consumed``); a
chunk stays held until then, and the whole result until the client releases it (``Request.ack``,
``Ack.release``, or implicitly by not listing it in ``Restore.waiting``). After a restore the unacknowledged
chunks are sent again in order, from the first the client does not have (``Restore.received``); the client
drops any duplicate by request id and chunk number: every chunk is delivered exactly once.

Transitions (anything else is answered with an error response or a ``RestoreRefused``):

=====================  =====================================  ===================================
context state          event                                  result
=====================  =====================================  ===================================
(none)                 PeerUp(client, connection_id)          attached, fresh
attached               Request                                the op runs; attached (past MAX_HELD
                                                              with no result sent whole to drop:
                                                              refused LIMIT_EXCEEDED, not run)
attached               Ack                                    chunks freed, more sent; attached
attached               RefusedMessage of a REQUEST            its error result held (the node's
                                                              code and reason); attached
attached, fresh        Restore(id of a live context)          that context attached here; this one
                                                              released; Restored + held results
attached, fresh        Restore(unknown id)                    RestoreRefused RESOURCE_NOT_FOUND;
                                                              not fresh
attached, not fresh    Restore                                RestoreRefused OUT_OF_STATE
attached               PeerLost                               detached, restore timer set
detached               CallResult                             result held
detached               restore timer fires                    released (connection unknown); its
                                                              running SQL queries cancelled
=====================  =====================================  ===================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from sparkbus.bus import contract as c
from sparkbus.bus.messages import ErrorCode
from sparkbus.codecs import REGISTRY, MiB
from sparkbus.codecs.errors import DecodeError
from sparkbus.roles.client.chunks import split_ipc
from sparkbus.roles.client.messages import (
    ARROW_OPS,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    Ack,
    Op,
    Request,
    Response,
    Restore,
    Restored,
    RestoreRefused,
)

log = logging.getLogger("sparkbus.roles.client")

NAME = "client.gateway"
CLIENT_PREFIX = "client:"
#: seconds a logical connection outlives its broken session (Ignite leaves it to configuration)
DEFAULT_RESTORE_TIMEOUT = 10.0
#: bytes of result per Response message (well below the codec's 64 MiB frame limit)
DEFAULT_CHUNK_BYTES = 1 * MiB
#: results held or on their way per logical connection: past it the oldest result already sent whole is
#: dropped, and a request that would need more room is refused (LIMIT_EXCEEDED) without being run
MAX_HELD = 1024

_REQUEST = REGISTRY.code_of(Request)

#: op -> (role, local call) for the operations the gateway forwards; anything else is refused.
ROUTES: dict[int, tuple[str, str]] = {
    Op.SQL: ("query", "execute"),
    Op.QUERY_CANCEL: ("query", "cancel"),
    Op.LOAD: ("query", "load"),
    Op.FLUSH: ("replication", "flush"),
    Op.WRITE: ("replication", "write"),
    Op.PEEK: ("compute.controller", "peek"),
    Op.SUBSCRIBE: ("compute.controller", "subscribe"),
    Op.FETCH: ("compute.controller", "fetch"),
    Op.UNSUBSCRIBE: ("compute.controller", "unsubscribe"),
    Op.CREATE_TABLE: ("compute.controller", "create_table"),
    Op.TABLE_WRITE: ("compute.controller", "write"),
    Op.CREATE_VIEW: ("compute.controller", "create_view"),
    Op.DROP_VIEW: ("compute.controller", "drop_view"),
}


def _view_args(args: dict[str, Any]) -> dict[str, Any]:
    """CREATE_VIEW carries the ``ViewDef`` in its plain (msgpack) form; the controller takes the object."""
    from sparkbus.codecs.schema import from_plain  # noqa: PLC0415
    from sparkbus.roles.compute.plans import ViewDef  # noqa: PLC0415 (only a gateway next to compute needs it)

    return {**args, "view": from_plain(ViewDef, args.get("view"), "CREATE_VIEW")}


def _peek_args(args: dict[str, Any]) -> dict[str, Any]:
    """PEEK's ``finishing`` arrives as a plain map of ``Finishing``'s fields (those left out take their
    defaults); the controller takes the object."""
    from sparkbus.codecs.schema import from_plain, to_plain  # noqa: PLC0415
    from sparkbus.roles.compute.plans import Finishing  # noqa: PLC0415 (only a gateway next to compute needs it)

    finishing = args.get("finishing")
    if finishing is None:
        return args
    if isinstance(finishing, dict):
        finishing = {**to_plain(Finishing()), **finishing}
    return {**args, "finishing": from_plain(Finishing, finishing, "PEEK.finishing")}


#: op -> the conversion of a request's msgpack args into what the routed local call takes.
ARGS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    Op.CREATE_VIEW: _view_args,
    Op.PEEK: _peek_args,
}


@dataclass
class _Held:
    """A result's chunks: ``[0, acked)`` consumed by the client (freed), ``[acked, sent)`` sent on the
    current session, the rest waiting for the window."""

    chunks: list[Response | None]
    window: int
    acked: int = 0
    sent: int = 0


@dataclass
class _Context:
    connection_id: str
    peer: str | None
    fresh: bool = True  # no message received on this session yet: RESTORE is still allowed
    running: dict[int, tuple[int, int]] = field(default_factory=dict)  # request id -> (op, window)
    held: dict[int, _Held] = field(default_factory=dict)  # request id -> its result


def _tag(ctx: _Context, request_id: int) -> str:
    """A request of a logical connection, as the gateway names it to the node's roles (the call's tag, an
    SQL query's ``owner``)."""
    return f"{ctx.connection_id}/{request_id}"


def _owned(op: int, args: dict[str, Any], ctx: _Context, rid: int) -> dict[str, Any]:
    """SQL runs as this request's (``owner``, whatever the client sent), and QUERY_CANCEL cancels an SQL
    request of this connection only, by its ``request_id``: a call id (a counter of the node's) or a query id
    (shown in error texts) would let any client cancel any other's query.

    Raises:
        ValueError: a QUERY_CANCEL without an int ``request_id``.
    """
    if op == Op.SQL:
        return {**args, "owner": _tag(ctx, rid)}
    if op == Op.QUERY_CANCEL:
        target = args.get("request_id")
        if type(target) is not int:
            raise ValueError(f"takes request_id (int), an SQL request of this connection, got {target!r}")
        return {"owner": _tag(ctx, target)}
    return args


def is_client(peer: str) -> bool:
    """Whether a bus peer name is a thin-client session."""
    return peer.startswith(CLIENT_PREFIX)


def encode_response(
    request_id: int,
    result: Any,
    error: str | None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    arrow: bool = False,
) -> list[Response]:
    """The ``Response`` chunks carrying ``result`` (msgpack; with ``arrow`` and Arrow IPC bytes, IPC
    streams of about ``chunk_bytes`` each) or ``error``."""
    if error is not None:
        return [Response(request_id=request_id, chunk=0, last=True, code=_code_of(error), error=error)]
    if arrow and isinstance(result, bytes | bytearray | memoryview):
        pieces = split_ipc(bytes(result), chunk_bytes)
        if pieces is not None:
            return [
                Response(request_id=request_id, chunk=i, last=i == len(pieces) - 1, arrow=True, payload=part)
                for i, part in enumerate(pieces)
            ]
    try:
        body = msgpack.packb(result, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        text = f"result of request {request_id} cannot be sent: {exc}"
        return [Response(request_id=request_id, chunk=0, last=True, code=ErrorCode.PROTOCOL, error=text)]
    view = memoryview(body)
    parts = [bytes(view[i : i + chunk_bytes]) for i in range(0, len(body), chunk_bytes)] or [b""]
    return [
        Response(request_id=request_id, chunk=i, last=i == len(parts) - 1, payload=part)
        for i, part in enumerate(parts)
    ]


def _code_of(error: str) -> int:
    """A query error reply starts with ``[code NAME]``; keep its code, otherwise a generic one."""
    if error.startswith("["):
        head = error[1:].split(" ", 1)[0]
        try:
            return int(head)
        except ValueError:
            pass
    return ErrorCode.PROTOCOL


class Gateway:
    """The ``client.gateway`` role.

    Args:
        node_id: this node.
        roles: the roles this node runs (for ``status``).
        restore_timeout: seconds a logical connection waits for its client after the session broke.
        chunk_bytes: result bytes per ``Response``.
    """

    name = NAME
    messages: ClassVar[tuple[type, ...]] = (Request, Restore, Ack)
    #: a thin client's session reaches this role only (bus/core.py refuses its other messages)
    serves_clients: ClassVar[bool] = True

    def __init__(
        self,
        node_id: str,
        roles: Iterable[str] = (),
        *,
        restore_timeout: float = DEFAULT_RESTORE_TIMEOUT,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        if restore_timeout <= 0 or chunk_bytes <= 0:
            raise ValueError("restore_timeout and chunk_bytes must be positive")
        self.node_id = node_id
        self.node_roles = sorted(roles)
        self.restore_timeout = restore_timeout
        self.chunk_bytes = chunk_bytes
        self.contexts: dict[str, _Context] = {}  # connection id -> context
        self.by_peer: dict[str, str] = {}  # client peer -> connection id
        self.nodes_up: set[str] = set()
        self.counters: dict[str, int] = {"restored": 0, "restore_refused": 0, "released": 0, "requests": 0}

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.MessageReceived):
            ctx = self._context_of(event.peer)
            if ctx is None:
                return []
            if isinstance(event.message, Restore):
                return self._on_restore(ctx, event.peer, event.message)
            ctx.fresh = False
            if isinstance(event.message, c.RefusedMessage):
                return self._on_refused(ctx, event.peer, event.message)
            if isinstance(event.message, Ack):
                return self._on_ack(ctx, event.peer, event.message)
            return self._on_request(ctx, event.peer, event.message)
        if isinstance(event, c.CallResult):
            return self._on_result(event)
        if isinstance(event, c.PeerUp):
            if not is_client(event.peer):
                self.nodes_up.add(event.peer)
            elif event.connection_id:
                self.contexts[event.connection_id] = _Context(event.connection_id, event.peer)
                self.by_peer[event.peer] = event.connection_id
            return []
        if isinstance(event, c.PeerLost):
            return self._on_lost(event.peer, now)
        if isinstance(event, c.TimerFired):
            ctx = self.contexts.get(event.key)
            if ctx is None or ctx.peer is not None:
                return []
            return self._release(ctx)
        if isinstance(event, c.LocalCall):
            return [c.Reply(call_id=event.call_id, result=self.status())]
        return []

    def status(self) -> dict[str, Any]:
        """What the ``STATUS`` op answers."""
        return {
            "node": self.node_id,
            "roles": self.node_roles,
            "nodes_up": sorted(self.nodes_up),
            "connections": len(self.contexts),
            "detached": sum(1 for x in self.contexts.values() if x.peer is None),
            "counters": dict(self.counters),
        }

    # ------------------------------------------------------------------ events

    def _context_of(self, peer: str) -> _Context | None:
        cid = self.by_peer.get(peer)
        return self.contexts.get(cid) if cid is not None else None

    def _on_lost(self, peer: str, now: float) -> list[c.Action]:
        if not is_client(peer):
            self.nodes_up.discard(peer)
            return []
        cid = self.by_peer.pop(peer, None)
        ctx = self.contexts.get(cid) if cid is not None else None
        if ctx is None or ctx.peer != peer:
            return []
        ctx.peer = None
        return [c.SetTimer(key=ctx.connection_id, at=now + self.restore_timeout)]

    def _release(self, ctx: _Context) -> list[c.Action]:
        """The restore timeout of a detached connection passed: it goes, with what it holds on the node
        (IEP-90). Its SQL queries still running are cancelled; their answers and the cancels' find no
        context and are dropped."""
        del self.contexts[ctx.connection_id]
        self.counters["released"] += 1
        log.info("gateway %s: logical connection %s released", self.node_id, ctx.connection_id[:8])
        role, name = ROUTES[Op.QUERY_CANCEL]
        return [
            c.Call(role=role, name=name, args={"owner": _tag(ctx, rid)}, tag=_tag(ctx, rid))
            for rid, (op, _) in ctx.running.items()
            if op == Op.SQL
        ]

    def _on_request(self, ctx: _Context, peer: str, msg: Any) -> list[c.Action]:
        assert isinstance(msg, Request)
        self.counters["requests"] += 1
        for rid in msg.ack:
            ctx.held.pop(rid, None)
        rid = msg.request_id
        if rid in ctx.running:
            return []  # a duplicate of a request still running: its result will come once
        if rid in ctx.held:
            return self._pump(ctx, rid)
        if msg.op == Op.PING:
            return [c.Send(peer=peer, message=r) for r in encode_response(rid, None, None)]
        window = min(MAX_WINDOW, msg.window)
        if not self._make_room(ctx):
            # Nothing the client still waits for is dropped to make room, and nothing is run that could not
            # be answered: the request is refused (sent, not held: held is full).
            text = (
                f"more than {MAX_HELD} unacknowledged results on this logical connection: request {rid} "
                "was not run"
            )
            error = Response(request_id=rid, chunk=0, last=True, code=ErrorCode.LIMIT_EXCEEDED, error=text)
            return [c.Send(peer=peer, message=error)]
        if msg.op == Op.STATUS:
            return self._complete(ctx, rid, msg.op, window, self.status(), None)
        route = ROUTES.get(msg.op)
        if route is None:
            return self._complete(ctx, rid, msg.op, window, None, f"unknown operation {msg.op}")
        try:
            args = _owned(msg.op, dict(msg.args), ctx, rid)
            convert = ARGS.get(msg.op)
            if convert is not None:
                args = convert(args)
        except (DecodeError, ValueError, TypeError) as exc:
            return self._complete(ctx, rid, msg.op, window, None, f"{Op(msg.op).name}: {exc}")
        ctx.running[rid] = (msg.op, window)
        return [c.Call(role=route[0], name=route[1], args=args, tag=_tag(ctx, rid))]

    def _on_refused(self, ctx: _Context, peer: str, msg: c.RefusedMessage) -> list[c.Action]:
        """A REQUEST the node could not take (over its limits, malformed): its call ends with the node's
        reason, as an error result, when its request id can be read."""
        rid = msg.fields.get("request_id")
        if msg.type_code != _REQUEST or rid is None or rid < 0 or rid in ctx.running or rid in ctx.held:
            return []
        error = Response(
            request_id=rid,
            chunk=0,
            last=True,
            code=msg.code,
            error=f"request {rid} refused by node {self.node_id}: {msg.reason}",
        )
        if not self._make_room(ctx):
            return [c.Send(peer=peer, message=error)]
        ctx.held[rid] = _Held([error], DEFAULT_WINDOW)
        return self._pump(ctx, rid)

    def _on_ack(self, ctx: _Context, peer: str, msg: Ack) -> list[c.Action]:
        for rid in msg.release:
            ctx.held.pop(rid, None)
        out: list[c.Action] = []
        for rid, n in sorted(msg.consumed.items()):
            held = ctx.held.get(rid)
            if held is None:
                continue
            self._free(held, n)
            if held.acked >= len(held.chunks):
                del ctx.held[rid]  # consumed whole
            else:
                out += self._pump(ctx, rid)
        return out

    @staticmethod
    def _free(held: _Held, consumed: int) -> None:
        consumed = min(consumed, len(held.chunks))
        for i in range(held.acked, consumed):
            held.chunks[i] = None
        held.acked = max(held.acked, consumed)
        held.sent = max(held.sent, held.acked)

    def _pump(self, ctx: _Context, rid: int) -> list[c.Action]:
        """Send the chunks of ``rid`` the window allows."""
        held = ctx.held[rid]
        out: list[c.Action] = []
        if ctx.peer is None:
            return out
        end = min(len(held.chunks), held.acked + held.window)
        while held.sent < end:
            chunk = held.chunks[held.sent]
            assert chunk is not None
            out.append(c.Send(peer=ctx.peer, message=chunk))
            held.sent += 1
        return out

    def _on_result(self, event: c.CallResult) -> list[c.Action]:
        cid, _, rid_text = event.tag.rpartition("/")
        ctx = self.contexts.get(cid)
        if ctx is None:
            return []  # released meanwhile: nobody to tell
        rid = int(rid_text)
        op, window = ctx.running.pop(rid, (0, DEFAULT_WINDOW))
        return self._complete(ctx, rid, op, window, event.result, event.error)

    def _complete(
        self, ctx: _Context, rid: int, op: int, window: int, result: Any, error: str | None
    ) -> list[c.Action]:
        chunks = encode_response(rid, result, error, self.chunk_bytes, arrow=op in ARROW_OPS)
        ctx.held[rid] = _Held(list(chunks), window)
        return self._pump(ctx, rid)

    @staticmethod
    def _make_room(ctx: _Context) -> bool:
        """Whether a new request's result can be held: fewer than ``MAX_HELD`` results held or running, or
        else the oldest held result that was sent whole is dropped for it (its client has every chunk, and
        only its acknowledgement is missing). A result with chunks still to send is never dropped: its
        client is reading it and would wait for the rest for ever."""
        if len(ctx.held) + len(ctx.running) < MAX_HELD:
            return True
        for rid, held in ctx.held.items():
            if held.sent >= len(held.chunks):
                del ctx.held[rid]
                return True
        return False

    def _on_restore(self, ctx: _Context, peer: str, msg: Restore) -> list[c.Action]:
        fresh, ctx.fresh = ctx.fresh, False  # a RESTORE, answered either way, is the session's first message
        target = self.contexts.get(msg.connection_id)
        if not fresh or target is ctx:
            return self._refuse(
                peer, ErrorCode.OUT_OF_STATE, "RESTORE must be the first message of a new session"
            )
        if target is None:
            return self._refuse(
                peer,
                ErrorCode.RESOURCE_NOT_FOUND,
                f"connection unknown: {msg.connection_id[:8]}... is not known on {self.node_id} "
                f"(released after its restore timeout of {self.restore_timeout:g} s, or never opened here)",
            )
        # This session's own fresh context is replaced by the restored one.
        del self.contexts[ctx.connection_id]
        if target.peer is not None:
            # The old session has not timed out on the bus yet; the connection id proves the new one owns it.
            self.by_peer.pop(target.peer, None)
        target.peer = peer
        target.fresh = False
        self.by_peer[peer] = target.connection_id
        waiting = set(msg.waiting)
        for rid in [r for r in target.held if r not in waiting]:
            del target.held[rid]  # the client has it
        for rid, held in target.held.items():
            self._free(held, msg.consumed.get(rid, 0))
            # Resume after what the client has; what was sent on the broken session and lost goes again.
            held.sent = max(held.acked, min(len(held.chunks), msg.received.get(rid, 0)))
        self.counters["restored"] += 1
        out: list[c.Action] = [
            c.CancelTimer(key=target.connection_id),
            c.Send(
                peer=peer,
                message=Restored(
                    connection_id=target.connection_id,
                    known=tuple(sorted(set(target.running) | set(target.held))),
                ),
            ),
        ]
        for rid in list(target.held):
            out += self._pump(target, rid)
        return out

    def _refuse(self, peer: str, code: ErrorCode, text: str) -> list[c.Action]:
        self.counters["restore_refused"] += 1
        return [c.Send(peer=peer, message=RestoreRefused(code=code, message=text))]


def make_gateway(ctx: Any) -> Gateway:
    """Registry factory: a gateway for node ``ctx.node_id`` (``ctx`` is a ``RoleContext``)."""
    return Gateway(ctx.node_id, getattr(ctx.spec, "roles", ()))
