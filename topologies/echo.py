"""The ``echo`` service: a sans-IO role that exercises a topology's wiring.

Two things can be asked of it through ``LocalCall``:

* ``ping`` (``peer``, optional ``payload`` bytes and ``timeout`` seconds): sends ``EchoRequest``; the
  peer's echo answers ``EchoReply`` with the same payload; the call returns the round-trip time.
* ``stream`` (``peer``, ``batches``, optional ``batch_size``, ``credit``, ``timeout``): accepts stream
  ``echo/<request id>`` and sends ``StreamRequest``; the peer's echo opens the stream with the agreed
  credit, sends the batches as credit allows (byte *k* of batch *n* is ``n % 256``), then reports its
  totals with ``StreamSent``. The call returns when the last batch and the totals are both in and agree.

``counters`` returns this role's counters. Message type codes are 0x0410..0x0414 (thin-client range,
reserved for this service).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sparkbus.bus.contract import (
    AcceptStream,
    Action,
    BatchReceived,
    CallResult,
    CancelTimer,
    CloseStream,
    Consumed,
    CreditChanged,
    Event,
    HandlerFailed,
    LocalCall,
    MessageReceived,
    OpenStream,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Send,
    SendBatch,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import blob, message

if TYPE_CHECKING:
    from sparkbus.topologies.registry import RoleContext

NAME = "echo"
MAX_PAYLOAD = 1 << 20
#: Bounds on what a peer's StreamRequest can make this node build: one batch fits a frame, and one
#: credit window holds at most MAX_WINDOW_BATCHES batches (every batch of a window is built at once).
MAX_BATCH_SIZE = 64 << 20
MAX_CREDIT = 1 << 30
MAX_WINDOW_BATCHES = 1 << 20


def _non_negative(cls: str, **values: int) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{cls}.{key} must be >= 0, got {value}")


@message(0x0410)
@dataclass(frozen=True, kw_only=True)
class EchoRequest:
    """Asks the peer's echo to send ``payload`` back."""

    request_id: int
    payload: bytes = blob()

    def __post_init__(self) -> None:
        _non_negative("EchoRequest", request_id=self.request_id)
        if len(self.payload) > MAX_PAYLOAD:
            raise ValueError(f"EchoRequest.payload is {len(self.payload)} bytes, limit {MAX_PAYLOAD}")


@message(0x0411)
@dataclass(frozen=True, kw_only=True)
class EchoReply:
    """The answer to ``EchoRequest`` with the same id and payload."""

    request_id: int
    payload: bytes = blob()

    def __post_init__(self) -> None:
        _non_negative("EchoReply", request_id=self.request_id)


@message(0x0412)
@dataclass(frozen=True, kw_only=True)
class StreamRequest:
    """Asks the peer to send ``batches`` batches of ``batch_size`` bytes on ``echo/<request_id>``, starting
    with ``credit`` bytes of credit (the receiver has already accepted the stream with that credit)."""

    request_id: int
    batches: int
    batch_size: int
    credit: int

    def __post_init__(self) -> None:
        _non_negative("StreamRequest", request_id=self.request_id, batches=self.batches)
        if not 0 < self.batch_size <= self.credit:
            raise ValueError(
                f"StreamRequest needs 0 < batch_size <= credit, got batch_size={self.batch_size} credit={self.credit}"
            )
        if (
            self.batch_size > MAX_BATCH_SIZE
            or self.credit > MAX_CREDIT
            or self.credit // self.batch_size > MAX_WINDOW_BATCHES
        ):
            raise ValueError(
                f"StreamRequest needs batch_size <= {MAX_BATCH_SIZE}, credit <= {MAX_CREDIT} and at most "
                f"{MAX_WINDOW_BATCHES} batches per credit window, got batch_size={self.batch_size} credit={self.credit}"
            )


@message(0x0413)
@dataclass(frozen=True, kw_only=True)
class StreamSent:
    """The sender's totals for stream ``echo/<request_id>``, sent after its last batch."""

    request_id: int
    batches: int
    size: int

    def __post_init__(self) -> None:
        _non_negative("StreamSent", request_id=self.request_id, batches=self.batches, size=self.size)


@message(0x0414)
@dataclass(frozen=True, kw_only=True)
class EchoRefused:
    """The peer will not serve request ``request_id``, and says why."""

    request_id: int
    reason: str


def stream_key(receiver: str, request_id: int) -> str:
    """The key of the stream ``receiver`` asked for. Both nodes number their requests from 1, so the key
    carries the receiver: otherwise two nodes streaming to each other would use one key for two streams
    (and closing one would close the other)."""
    return f"{NAME}/{receiver}/{request_id}"


def batch_payload(ordinal: int, size: int) -> bytes:
    """The bytes of batch ``ordinal``: a pattern the receiver checks to catch reordering or mixing."""
    return bytes((ordinal % 256,)) * size


@dataclass
class _Ping:
    call_id: int
    peer: str
    sent_at: float


@dataclass
class _Incoming:
    call_id: int
    peer: str
    batches: int
    batch_size: int
    started_at: float
    received: int = 0
    size: int = 0
    last: bool = False
    sent: StreamSent | None = None


@dataclass
class _Outgoing:
    peer: str
    request_id: int
    batches: int
    batch_size: int
    credit: int
    sent: int = 0
    max_credit: int = 0


@dataclass
class Counters:
    """What an echo did; ``as_dict`` is what ``counters`` returns."""

    pings_sent: int = 0
    pings_answered: int = 0
    replies_received: int = 0
    late_replies: int = 0
    streams_requested: int = 0
    streams_served: int = 0
    streams_completed: int = 0
    batches_sent: int = 0
    bytes_sent: int = 0
    batches_received: int = 0
    bytes_received: int = 0
    failures: int = 0
    peers_up: int = 0
    peers_lost: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class EchoRole:
    """The ``echo`` role of one node.

    Args:
        node_id: this node's id, for error messages.
        batch_size: default bytes per batch for ``stream`` calls.
        credit: default initial credit for ``stream`` calls.
        timeout: default seconds a ``ping`` or ``stream`` call waits before failing.
    """

    node_id: str
    batch_size: int = 64 * 1024
    credit: int = 1 << 20
    timeout: float = 10.0
    name: str = field(default=NAME, init=False)
    counters: Counters = field(default_factory=Counters, init=False)
    messages: ClassVar[tuple[type, ...]] = (EchoRequest, EchoReply, StreamRequest, StreamSent, EchoRefused)
    _next_id: int = field(default=1, init=False)
    _pings: dict[int, _Ping] = field(default_factory=dict, init=False)
    _incoming: dict[int, _Incoming] = field(default_factory=dict, init=False)
    _outgoing: dict[tuple[str, str], _Outgoing] = field(default_factory=dict, init=False)
    _peers: set[str] = field(default_factory=set, init=False)

    @property
    def peers(self) -> frozenset[str]:
        """Peers whose link is up."""
        return frozenset(self._peers)

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one bus event; see the module docstring."""
        match event:
            case LocalCall():
                return self._call(event, now)
            case MessageReceived(peer=peer, message=msg):
                return self._message(peer, msg, now)
            case BatchReceived():
                return self._batch(event, now)
            case CreditChanged(peer=peer, stream=stream, credit=credit):
                out = self._outgoing.get((peer, stream))
                if out is None:
                    return []
                # A well-behaved receiver never grants more than the window it accepted; a larger grant
                # would make one pump build more batches than the request's bounds allow.
                out.credit = min(credit, out.max_credit)
                return self._pump(out)
            case TimerFired(key=key):
                return self._timeout(key)
            case PeerUp(peer=peer):
                self._peers.add(peer)
                self.counters.peers_up += 1
                return []
            case PeerLost(peer=peer, reason=reason):
                return self._lost(peer, reason)
            case HandlerFailed():
                self.counters.failures += 1
                return []
            case CallResult():
                return []  # echo never calls another role

    # -- calls from the node's owner

    def _call(self, call: LocalCall, now: float) -> list[Action]:
        if call.name == "counters":
            return [Reply(call_id=call.call_id, result=self.counters.as_dict())]
        if call.name not in ("ping", "stream"):
            return [
                Reply(
                    call_id=call.call_id,
                    error=f"echo has no call {call.name!r}; calls: counters, ping, stream",
                )
            ]
        peer = call.args.get("peer")
        if not isinstance(peer, str):
            return [Reply(call_id=call.call_id, error=f"echo.{call.name} needs args['peer'], a node id")]
        timeout = float(call.args.get("timeout", self.timeout))
        request_id = self._next_id
        self._next_id += 1
        if call.name == "ping":
            try:
                req = EchoRequest(request_id=request_id, payload=bytes(call.args.get("payload", b"ping")))
            except ValueError as exc:
                return [Reply(call_id=call.call_id, error=str(exc))]
            self._pings[request_id] = _Ping(call.call_id, peer, now)
            self.counters.pings_sent += 1
            return [Send(peer=peer, message=req), SetTimer(key=f"ping/{request_id}", at=now + timeout)]
        try:
            sreq = StreamRequest(
                request_id=request_id,
                batches=int(call.args["batches"]),
                batch_size=int(call.args.get("batch_size", self.batch_size)),
                credit=int(call.args.get("credit", self.credit)),
            )
        except (KeyError, ValueError) as exc:
            return [Reply(call_id=call.call_id, error=f"echo.stream: bad arguments: {exc}")]
        self._incoming[request_id] = _Incoming(call.call_id, peer, sreq.batches, sreq.batch_size, now)
        self.counters.streams_requested += 1
        return [
            AcceptStream(peer=peer, stream=stream_key(self.node_id, request_id), credit=sreq.credit),
            Send(peer=peer, message=sreq),
            SetTimer(key=f"stream/{request_id}", at=now + timeout),
        ]

    # -- control messages from peers

    def _message(self, peer: str, msg: Any, now: float) -> list[Action]:
        match msg:
            case EchoRequest(request_id=rid, payload=payload):
                self.counters.pings_answered += 1
                return [Send(peer=peer, message=EchoReply(request_id=rid, payload=payload))]
            case EchoReply(request_id=rid, payload=payload):
                ping = self._pings.get(rid)
                if ping is None or ping.peer != peer:
                    self.counters.late_replies += 1  # its call already timed out or the peer is confused
                    return []
                del self._pings[rid]
                self.counters.replies_received += 1
                result = {"peer": peer, "payload": payload, "rtt": now - ping.sent_at}
                return [CancelTimer(key=f"ping/{rid}"), Reply(call_id=ping.call_id, result=result)]
            case StreamRequest():
                return self._serve(peer, msg)
            case StreamSent(request_id=rid):
                inc = self._incoming.get(rid)
                if inc is None or inc.peer != peer:
                    return []
                inc.sent = msg
                return self._maybe_done(rid, now)
            case EchoRefused(request_id=rid, reason=reason):
                return self._fail(rid, f"{peer} refused: {reason}")
        raise RemoteProtocolError(f"echo on {self.node_id}: unexpected {type(msg).__name__} from {peer}")

    def _serve(self, peer: str, req: StreamRequest) -> list[Action]:
        key = stream_key(peer, req.request_id)
        if (peer, key) in self._outgoing:
            reason = f"stream {key} to {peer} is already being sent"
            return [Send(peer=peer, message=EchoRefused(request_id=req.request_id, reason=reason))]
        out = _Outgoing(peer, req.request_id, req.batches, req.batch_size, req.credit, max_credit=req.credit)
        self._outgoing[(peer, key)] = out
        self.counters.streams_served += 1
        return [OpenStream(peer=peer, stream=key, credit=req.credit), *self._pump(out)]

    def _pump(self, out: _Outgoing) -> list[Action]:
        """Send as many batches as the credit allows; finish the stream after the last."""
        key = stream_key(out.peer, out.request_id)
        actions: list[Action] = []
        if out.batches == 0:
            actions.append(SendBatch(peer=out.peer, stream=key, data=b"", last=True))
        while out.sent < out.batches and out.credit >= out.batch_size:
            last = out.sent == out.batches - 1
            data = batch_payload(out.sent, out.batch_size)
            actions.append(SendBatch(peer=out.peer, stream=key, data=data, last=last))
            out.sent += 1
            out.credit -= out.batch_size
            self.counters.batches_sent += 1
            self.counters.bytes_sent += out.batch_size
        if out.sent == out.batches:
            del self._outgoing[(out.peer, key)]
            totals = StreamSent(request_id=out.request_id, batches=out.sent, size=out.sent * out.batch_size)
            actions += [CloseStream(peer=out.peer, stream=key), Send(peer=out.peer, message=totals)]
        return actions

    # -- stream batches

    def _batch(self, ev: BatchReceived, now: float) -> list[Action]:
        head, _, tail = ev.stream.rpartition("/")
        ok = head == f"{NAME}/{self.node_id}" and tail.isdigit()
        inc = self._incoming.get(int(tail)) if ok else None
        if inc is None or inc.peer != ev.peer:
            raise RemoteProtocolError(
                f"echo on {self.node_id}: batch on unknown stream {ev.stream!r} from {ev.peer}"
            )
        rid = int(tail)
        actions: list[Action] = [Consumed(peer=ev.peer, stream=ev.stream, size=ev.size)] if ev.size else []
        if ev.data and (
            ev.ordinal != inc.received or len(ev.data) != inc.batch_size or ev.data[0] != ev.ordinal % 256
        ):
            return actions + self._fail(
                rid, f"batch {ev.ordinal} on {ev.stream} from {ev.peer} is not the one expected"
            )
        if ev.data:
            inc.received += 1
            inc.size += len(ev.data)
            self.counters.batches_received += 1
            self.counters.bytes_received += len(ev.data)
        if ev.last:
            inc.last = True
            actions.append(CloseStream(peer=ev.peer, stream=ev.stream))
        return actions + self._maybe_done(rid, now)

    def _maybe_done(self, rid: int, now: float) -> list[Action]:
        inc = self._incoming[rid]
        if not inc.last or inc.sent is None:
            return []
        del self._incoming[rid]
        done = [CancelTimer(key=f"stream/{rid}")]
        got = (inc.received, inc.size)
        if got != (inc.sent.batches, inc.sent.size) or inc.received != inc.batches:
            self.counters.failures += 1
            error = (
                f"stream {stream_key(self.node_id, rid)} from {inc.peer}: received {got[0]} batches / {got[1]} bytes, "
                f"sender reports {inc.sent.batches} / {inc.sent.size}, asked for {inc.batches}"
            )
            return [*done, Reply(call_id=inc.call_id, error=error)]
        self.counters.streams_completed += 1
        result = {
            "peer": inc.peer,
            "batches": inc.received,
            "bytes": inc.size,
            "seconds": now - inc.started_at,
        }
        return [*done, Reply(call_id=inc.call_id, result=result)]

    # -- failures

    def _fail(self, rid: int, reason: str) -> list[Action]:
        inc = self._incoming.pop(rid, None)
        if inc is None:
            return []
        self.counters.failures += 1
        key = stream_key(self.node_id, rid)
        return [
            CancelTimer(key=f"stream/{rid}"),
            CloseStream(peer=inc.peer, stream=key),
            Reply(call_id=inc.call_id, error=reason),
        ]

    def _timeout(self, key: str) -> list[Action]:
        kind, _, tail = key.partition("/")
        rid = int(tail)
        if kind == "ping" and (ping := self._pings.pop(rid, None)) is not None:
            self.counters.failures += 1
            return [
                Reply(
                    call_id=ping.call_id, error=f"echo.ping to {ping.peer}: no reply (request {rid}) in time"
                )
            ]
        if kind == "stream" and rid in self._incoming:
            inc = self._incoming[rid]
            return self._fail(
                rid, f"echo.stream from {inc.peer}: {inc.received}/{inc.batches} batches in time"
            )
        return []

    def _lost(self, peer: str, reason: str) -> list[Action]:
        self._peers.discard(peer)
        self.counters.peers_lost += 1
        actions: list[Action] = []
        for rid, ping in list(self._pings.items()):
            if ping.peer == peer:
                del self._pings[rid]
                self.counters.failures += 1
                actions += [
                    CancelTimer(key=f"ping/{rid}"),
                    Reply(call_id=ping.call_id, error=f"echo.ping: lost {peer}: {reason}"),
                ]
        for rid, inc in list(self._incoming.items()):
            if inc.peer == peer:
                actions += self._fail(rid, f"echo.stream: lost {peer}: {reason}")
        # The bus dropped every stream with the peer; only our bookkeeping is left to forget.
        for key in [k for k in self._outgoing if k[0] == peer]:
            del self._outgoing[key]
        return actions


def make_echo(context: RoleContext) -> EchoRole:
    """Registry factory: an echo sized by the topology's bus settings."""
    bus = context.topology.bus
    return EchoRole(
        node_id=context.node_id,
        batch_size=bus.batch_size,
        credit=bus.initial_credit,
        timeout=max(10.0, 4 * bus.peer_timeout),
    )
