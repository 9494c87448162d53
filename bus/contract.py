"""The contract between roles and the bus: events in, actions out.

A role is a state machine with no I/O. The bus (the ZeroMQ node loop, or the deterministic ``SimBus``)
calls ``role.handle(event, now)`` and carries out the actions it returns. Time is given, never read.

Routing:
    * ``MessageReceived`` goes to the role whose ``messages`` contains the message's class. From a thin
      client's session (peer ``"client:..."``) only to a role with ``serves_clients = True`` (the
      ``client.gateway``); the node answers any other role's message from a client with ERROR
      ``OUT_OF_STATE`` and drops a client's stream batches. A client's message of such a role that the node
      cannot take (over its limits, malformed) reaches that role as a ``RefusedMessage``.
    * Stream events go to the role whose ``name`` is the stream key's first ``/``-separated part: a role
      names its streams ``f"{receiving role name}/..."``. A key names one stream each way between two peers (a
      query edge between two participants uses one key both ways; ``CloseStream`` after the incoming
      stream's last batch then leaves the outgoing one open). Do not
      reopen a key right after its last batch (a flow-control grant for the old stream may still be in
      flight); put an attempt number in the key instead.
    * ``TimerFired`` goes to the role that set the timer; ``LocalCall`` to the role it names.
    * A role can call another role on the same node with ``Call``: the target gets a ``LocalCall`` and its
      ``Reply`` comes back to the caller as ``CallResult`` (never to the driver).
    * ``PeerUp`` and ``PeerLost`` go to every role.

If ``handle`` raises, the node logs the error with the event, counts it, and delivers ``HandlerFailed``
to the same role; the node keeps serving everyone else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

# ---------------------------------------------------------------- events (bus -> role)


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerUp:
    """Both directions of the link to ``peer`` completed their handshake (a new session).

    ``connection_id`` is the session's logical connection id (IEP-90; 128 random bits, hex) for a thin client
    (peer ``"client:<routing id hex>"``), and empty for a node.
    """

    peer: str
    connection_id: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerLost:
    """The link to ``peer`` broke: socket disconnect, heartbeat silence, a sequence gap, or a stale session.

    Every stream with that peer is gone. If the peer comes back it is a new session and a new ``PeerUp``.
    """

    peer: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageReceived:
    """A decoded control message from ``peer``, in the order the peer sent it."""

    peer: str
    message: Any


@dataclass(frozen=True, kw_only=True, slots=True)
class RefusedMessage:
    """In ``MessageReceived.message``, in place of a thin client's message that the node could not take (over
    its decoder limits: ``code`` LIMIT_EXCEEDED; not decoding: MALFORMED), for the role serving thin clients
    whose ``messages`` hold its type. The node has answered ERROR and the session goes on; the role can end
    what the message asked for with its own answer. Not a wire message.

    Attributes:
        type_code: the message's type code (from its header).
        code: the refusal, an ``ErrorCode``.
        reason: why, naming the message and the field or limit.
        fields: the int fields at the top level of the message's body, when that is a plain msgpack map (a
            REQUEST's ``request_id``); empty when it is not.
    """

    type_code: int
    code: int
    reason: str
    fields: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchReceived:
    """A stream batch from ``peer``.

    Attributes:
        stream: the stream key.
        ordinal: the sender's batch counter on this stream, from 0.
        last: no batch follows on this stream.
        data: the payload (usually an Arrow IPC row batch); may be a memoryview.
        size: bytes counted against credit.
        remaining: the sender's credit after this batch (0 means it is starved).
    """

    peer: str
    stream: str
    ordinal: int
    last: bool
    data: bytes
    size: int
    remaining: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CreditChanged:
    """Sender side: the receiver set our credit on ``stream`` (it is now ``credit`` bytes)."""

    peer: str
    stream: str
    credit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerFired:
    """A timer this role set with ``SetTimer`` came due."""

    key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalCall:
    """A call from the node's owner (user code, the CLI, a test). Answer it with ``Reply(call_id=...)``."""

    call_id: int
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class CallResult:
    """The answer to this role's ``Call(tag=...)``: ``error`` None means success with ``result``.

    An unknown role, or a target role that raised while handling the call, gives an error result.
    """

    tag: str
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class HandlerFailed:
    """This role's ``handle`` raised while handling ``event``; the actions of that call were discarded."""

    event: Any
    error: str


Event = (
    PeerUp
    | PeerLost
    | MessageReceived
    | BatchReceived
    | CreditChanged
    | TimerFired
    | LocalCall
    | CallResult
    | HandlerFailed
)

# ---------------------------------------------------------------- actions (role -> bus)


@dataclass(frozen=True, kw_only=True, slots=True)
class Send:
    """Send a registered control message to ``peer`` (ordered per peer)."""

    peer: str
    message: Any


@dataclass(frozen=True, kw_only=True, slots=True)
class OpenStream:
    """Sender side: open ``stream`` to ``peer`` with an initial credit in bytes, agreed out of band
    (for example inside a start message). Batches may be sent at once."""

    peer: str
    stream: str
    credit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class AcceptStream:
    """Receiver side: expect ``stream`` from ``peer`` with ``credit`` bytes of initial credit, the most the
    receiver will hold for it. Without it, a stream is accepted on its first batch with the node's default."""

    peer: str
    stream: str
    credit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SendBatch:
    """Send a batch on an open stream. ``data`` is bytes-like; its bytes must not exceed the credit left
    (``LocalProtocolError``); an empty batch is allowed only with ``last``."""

    peer: str
    stream: str
    data: bytes
    last: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Consumed:
    """Receiver side: ``size`` bytes of received batches were processed and freed. The bus's grant policy
    decides when to send flow control (by default: sender below 40 % and receiver above 40 %)."""

    peer: str
    stream: str
    size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class GrantCredit:
    """Receiver side: set the sender's credit on ``stream`` to exactly ``credit`` bytes now."""

    peer: str
    stream: str
    credit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CloseStream:
    """Forget a stream's state on this side (after ``last``, or on cancel). If the key also names a stream
    the other way, only the finished incoming one is forgotten; if neither has finished, both are."""

    peer: str
    stream: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SetTimer:
    """Fire ``TimerFired(key)`` at time ``at`` (same clock as ``now``). Setting a key again moves it."""

    key: str
    at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelTimer:
    key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Reply:
    """Complete a ``LocalCall``: ``error`` None means success with ``result``."""

    call_id: int
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """Call role ``role`` on this node: it gets ``LocalCall(name, args)`` with a fresh call id, and its
    ``Reply`` comes back to the calling role as ``CallResult(tag=tag)``."""

    role: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    tag: str = ""


Action = (
    Send
    | OpenStream
    | AcceptStream
    | SendBatch
    | Consumed
    | GrantCredit
    | CloseStream
    | SetTimer
    | CancelTimer
    | Reply
    | Call
)


# ---------------------------------------------------------------- HTTP exchange (role <-> driver)

#: The role whose fetches the node driver carries out over HTTP (``sparkbus.roles.exchange.HttpClient``).
HTTP_CLIENT = "http.client"
#: The role whose output buffers the node driver serves over HTTP (``sparkbus.roles.exchange.BinxServer``).
HTTP_BUFFERS = "binx.server"


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpFetch:
    """One HTTP exchange request the driver makes for the ``http.client`` role (docs/EXCHANGE.md section 5).

    Roles do no I/O, and the core carries out only the actions above, so these travel on the ``Call``
    contract instead of as an action: the driver keeps one ``LocalCall`` "jobs" open on the role, which
    answers it with a tuple of ``HttpFetch`` when it has any; the driver runs them (the node on worker
    threads with ``HttpExchangeClient``, the simulator against its nodes' buffers in memory) and hands each
    answer back as ``LocalCall`` "fetched" ``{"result": HttpFetched}``.

    Attributes:
        job: the role's id of this request, repeated in the answer.
        peer: the node whose buffers are read; the driver knows its HTTP address (``Endpoints.http``).
        task_id: the producing task.
        buffer_id: the buffer within the task.
        token: DATA: the first page wanted (acknowledging every page before it).
        max_bytes: DATA: the most page bytes wanted (the first page comes whole).
        max_wait: DATA: long-poll seconds.
        delete: a DELETE of the buffer instead of a DATA request.
    """

    job: int
    peer: str
    task_id: str
    buffer_id: int
    token: int = 0
    max_bytes: int = 1 << 20
    max_wait: float = 0.0
    delete: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpFetched:
    """The answer to an ``HttpFetch``.

    Attributes:
        job: the request's ``job``.
        pages: the pages from ``token`` (none for a DELETE, an error, or an expired long-poll).
        token: the first page's token.
        next_token: the token to ask for next.
        complete: no page follows ``next_token``.
        instance_id: the producing buffer's incarnation ("" if unknown).
        error: None on success, else why the request failed (the server's address and what went wrong;
            the role adds the source's peer, task and buffer).
        code: the BinX error code of a server's refusal (``UNKNOWN_BUFFER`` 1 and ``OVERLOADED`` 6 are
            worth retrying), or 0 when the server could not be reached or answered nonsense.
    """

    job: int
    pages: tuple[bytes, ...] = ()
    token: int = 0
    next_token: int = 0
    complete: bool = False
    instance_id: str = ""
    error: str | None = None
    code: int = 0


@runtime_checkable
class Role(Protocol):
    """What a role offers the bus.

    A role may also define ``close()``: ``Node.stop`` calls it once the loop has stopped (on every stop,
    so it must be idempotent), for what the role holds outside the bus, e.g. the replication role's
    data directory lock, which a node started again in the same process must be able to take. A role that
    serves thin clients defines ``serves_clients: ClassVar[bool] = True``; no other role gets a message from a
    client's session.

    Attributes:
        name: unique on a node, e.g. ``"query"``; also the first part of the stream keys it receives.
        messages: the control message classes routed to this role.
    """

    name: str
    messages: ClassVar[tuple[type, ...]]

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one event at time ``now`` (seconds, monotonic) with actions for the bus."""
        ...


class LocalProtocolError(Exception):
    """The caller (a role, or user code) broke the protocol's rules."""


class RemoteProtocolError(Exception):
    """The peer broke the protocol's rules."""
