"""The state a node core keeps per link and per peer, shared by its layers (links, streams, dispatch)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.credit import CreditReceiver, CreditSender
from sparkbus.bus.messages import ErrorCode
from sparkbus.codecs import Buffer, EnvelopeCodec


# Outputs are made once per message and read once by the driver; not frozen, because a frozen dataclass's
# __init__ sets each field through object.__setattr__ (0.39 against 0.13 us for these three fields).
@dataclass(slots=True)
class Transmit:
    """Send ``frames`` on ``channel`` to ``to`` (a peer id, or a routing id for ``reply``)."""

    channel: str
    to: str | bytes
    frames: list[Buffer]


@dataclass(slots=True)
class Completed:
    """A local call finished."""

    call_id: int
    result: Any
    error: str | None


Output = Transmit | Completed


@dataclass(slots=True)
class _Outbound:
    """Our direction towards a peer: the session the peer gave us."""

    peer: str
    state: str = "idle"  # idle -> hello_sent -> established; or refused (final)
    # The number of our latest HELLO, echoed in its answer. It starts at a random value (a nonce per node
    # incarnation) and moves on with every HELLO, and a link lost while a HELLO is unanswered moves it on
    # too: a WELCOME carrying any other number answers a HELLO of an attempt that is over, and is ignored.
    attempt: int = 0
    offered: tuple[int, int, int] | None = None
    session: int = 0
    seq: int = 0
    data_seq: int = 0
    last_sent: float = 0.0
    heartbeat: float = 0.0  # this direction's heartbeat interval, set by WELCOME (IEP-83's rule)
    hello_at: float = 0.0
    refused: str = ""
    features: bytes = b""
    peer_welcomed: int = 0  # the attempt of the peer's latest HELLO we welcomed (0: none yet)
    # Set when the peer's endpoint answered as another node (its WELCOME named another node id), cleared by
    # the peer's own WELCOME: what ``status()["misdirected"]`` shows.
    misdirected: str = ""


@dataclass(slots=True)
class _Inbound:
    """The peer's direction towards us: the session we gave it."""

    peer: str
    rid: bytes
    kind: str
    session: int
    connection_id: str
    seq: int = 0
    data_seq: int = 0
    reply_seq: int = 0
    last_recv: float = 0.0
    version: tuple[int, int, int] = (0, 0, 0)
    features: bytes = b""
    hello_attempt: int = 0  # the ``attempt`` of the HELLO that opened this session
    incarnation: int = 0  # the process that opened it, as its HELLO named it (0: not named)
    # A node's session is confirmed by the first sequenced message the peer sends on it (the HEARTBEAT it
    # sends once welcomed): proof that the peer has our WELCOME, so its own direction is open too.
    confirmed: bool = False
    # Data the peer says it sent that has not arrived: the count of STREAM_BATCH messages a HEARTBEAT
    # claimed (0: none outstanding), and when that HEARTBEAT or the latest batch since arrived. Data travel
    # on another pipe and may trail the heartbeat; none of them for ``peer_timeout``, they were lost.
    data_due: int = 0
    data_due_since: float = float("inf")


@dataclass(slots=True)
class _Peer:
    up: bool = False
    senders: dict[str, tuple[str, CreditSender]] = field(default_factory=dict)  # stream -> (role, credit)
    receivers: dict[str, CreditReceiver] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)  # stream -> credit, before its first batch
    # Incoming streams this side ended before their last batch (closed on cancel, or refused), with the
    # ordinal their sender goes on from: its batches still in flight are dropped, not taken for a new
    # stream (whose ordinal 0 would be a violation). Cleared with the link, bounded by ``max_streams``.
    ended: dict[str, int] = field(default_factory=dict)
    # The peer's process, as its HELLOs name it (``INCARNATION``), while our direction towards it may be
    # one that process opened (0: unknown; cleared when the link is lost with our direction).
    incarnation: int = 0
    # The process that answers at the peer's endpoint, as the latest WELCOME our DEALER took named it
    # (never cleared), and the processes of the peer's node id known not to be it (the most recent
    # ``RETIRED_KEPT``): one it replaced there, or one that said HELLO while another answered there. A
    # retired one that says HELLO is refused ``DUPLICATE_NODE`` (docs/PROTOCOL.md, "Replaced processes").
    owner: int = 0
    retired: list[int] = field(default_factory=list)


#: How many replaced incarnations of a peer a node remembers.
RETIRED_KEPT = 16


class NodeState:
    """Attributes and hooks the layers of ``NodeCore`` share (the core defines the hooks)."""

    node_id: str
    config: BusConfig
    codec: EnvelopeCodec
    roles: dict[str, c.Role]
    _counts: Counter[str]
    _n_batches_in: int
    _n_batches_out: int
    _n_stream_bytes_in: int
    _n_stream_bytes_out: int
    _n_flow_control_in: int
    _n_flow_control_out: int
    out: list[Output]
    _entropy: Callable[[int], int]
    _incarnation: int
    _features: bytes
    peer_addresses: dict[str, str]
    _outbound: dict[str, _Outbound]
    _inbound: dict[str, _Inbound]
    _by_rid: dict[bytes, _Inbound]
    _by_session: dict[int, _Inbound]
    _peers: dict[str, _Peer]
    _local: deque[tuple[c.Role, c.Event]]

    @property
    def grants_sent(self) -> int:
        """FLOW_CONTROL messages this node has sent (credit grants to its streams' senders)."""
        return self._n_flow_control_out

    def is_up(self, peer: str) -> bool:
        raise NotImplementedError

    def _dispatch(self, role: c.Role, event: c.Event, now: float) -> None:
        raise NotImplementedError

    def _emit(self, channel: str, to: str | bytes, frames: list[Buffer]) -> None:
        raise NotImplementedError

    def _reply(self, rid: bytes, msg: Any, now: float, session: int = 0) -> None:
        raise NotImplementedError

    def _refusal(self, code: ErrorCode) -> None:
        raise NotImplementedError

    def _refuse_early(self, inbound: _Inbound, cls: type, now: float) -> None:
        raise NotImplementedError

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
        raise NotImplementedError

    def _error_to(self, inbound: _Inbound, code: ErrorCode, text: str, ref_type: int, now: float) -> None:
        raise NotImplementedError

    def _send_ctl(self, out: _Outbound, msg: Any, now: float, stream: str | None = None) -> None:
        raise NotImplementedError

    def _send_to_peer(self, peer: str, msg: Any, now: float, stream: str | None = None) -> None:
        raise NotImplementedError

    def _link_lost(self, peer: str, reason: str, now: float, *, keep_outbound: bool = False) -> None:
        raise NotImplementedError
