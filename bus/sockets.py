"""The process's ZeroMQ context, and a bus node's sockets with their options.

One set per node (DESIGN.md section 4): the ROUTER and PULL it binds, and per peer the DEALER and PUSH
it dials. Every socket has LINGER=0, explicit HWMs and MAXMSGSIZE; the dialling ones ZMTP heartbeats
(``keepalive``), the listening ones TCP keepalive (``listening``); the
ROUTER has ROUTER_MANDATORY and ROUTER_HANDOVER; DEALER and PUSH have IMMEDIATE and a bounded reconnect
interval. ``sparkbus.bus.node`` binds, connects and serves them.

libzmq checks MAXMSGSIZE against each frame on its own, as the frame's length arrives and before the frame
is buffered, and closes the connection of a peer that sends a longer one (nothing of that message is
delivered, and nothing answers it). On the PULL, DEALER and PUSH it is ``limits.max_frame_bytes``. On the
ROUTER, where thin clients and peers send requests that can be answered, it is ``limits.max_message_bytes``:
a frame over ``max_frame_bytes`` but within the message limit is delivered, and the core answers it
``LIMIT_EXCEEDED`` on its session, so a client whose limits are above the node's gets the node's reason
rather than a closed connection. libzmq 4.3 has no option that bounds
the frames of one message, or their sum: it delivers a message only once its last frame has arrived, so a
message of many frames, each within the limit, is held whole in ZeroMQ's buffers before the node sees it.
``recv_message`` (and the node's ROUTER drain) then keep at most ``limits.max_frames`` of its frames and
drop the rest as they are read (``TooManyFrames``), and the core refuses the frame count and the total
(docs/PROTOCOL.md section 3). What a peer can make ZeroMQ hold is bounded only by who can connect: anyone
that reaches the ports without CURVE, only the admitted keys with it.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from sparkbus.bus.config import BusConfig

Socket = zmq.Socket[bytes]
Context = zmq.Context[Socket]
T = TypeVar("T")

#: Seconds (at least; ten peer timeouts if longer) a PULL connection may receive nothing, not even the
#: end of a frame, before it is closed: a long batch on a slow link stays (``keepalive``).
DATA_SILENCE = 30.0

_CONTEXT: tuple[int, Context] | None = None
_CONTEXT_LOCK = threading.Lock()


class NoFreePort(OSError):
    """Every port of a node's range (``bus.ports``) is taken on its host."""


def first_free_port(ports: tuple[int, int], bind: Callable[[int], T], what: str) -> T:
    """``bind(port)`` for each port of the inclusive range ``ports`` in turn; the first that is not in use.

    Raises:
        NoFreePort: every one is in use (names ``what`` and the range).
    """
    first, last = ports
    for port in range(first, last + 1):
        try:
            return bind(port)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise NoFreePort(
        errno.EADDRINUSE, f"{what}: every port of bus.ports {first}-{last} is in use; widen the range"
    )


def bind_tcp(sock: Socket, host: str, ports: tuple[int, int] | None, what: str) -> str:
    """Bind ``sock`` on ``host`` at a free port: any (``ports`` None), or the first free one of ``ports``
    (the range an operator opened in the firewall). Returns the endpoint."""
    if ports is None:
        sock.bind(f"tcp://{host}:0")
    else:
        first_free_port(ports, lambda port: sock.bind(f"tcp://{host}:{port}"), what)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def context() -> Context:
    """The process's ZeroMQ context, created on first use in *this* process (fork-safe: PySpark forks its
    Python workers, and a context must never cross a fork)."""
    global _CONTEXT
    with _CONTEXT_LOCK:
        if _CONTEXT is None or _CONTEXT[0] != os.getpid():
            ctx: Context = zmq.Context()
            ctx.linger = 0
            _CONTEXT = (os.getpid(), ctx)
        return _CONTEXT[1]


def server_sockets(ctx: Context, config: BusConfig) -> tuple[Socket, Socket]:
    """The node's ROUTER (control) and PULL (data), not bound yet."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # A peer's new connection takes its node id from the old one, which may be held open by a process
    # that is stopped, or by a host gone without closing it: without handover ZeroMQ ignores the new
    # connection for as long as the old one stays open (docs/RELIABILITY.md, "A node restarted under its
    # id"). A process that is not the one at the peer's endpoint is refused DUPLICATE_NODE by the core.
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    pull = ctx.socket(zmq.PULL)
    listening(router, control_silence(config))
    listening(pull, data_silence(config))
    for sock in (router, pull):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, config.hwm)
        sock.setsockopt(zmq.SNDHWM, config.hwm)
    # Per frame (module docstring): the ROUTER's requests over the frame limit are answered by the core.
    router.setsockopt(zmq.MAXMSGSIZE, config.limits.max_message_bytes)
    pull.setsockopt(zmq.MAXMSGSIZE, config.limits.max_frame_bytes)
    return router, pull


def peer_sockets(ctx: Context, config: BusConfig, node_id: str) -> tuple[Socket, Socket]:
    """The DEALER (routing id ``node_id``) and PUSH towards one peer, not connected yet."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, node_id.encode())
    push = ctx.socket(zmq.PUSH)
    keepalive(dealer, config, control_silence(config))
    keepalive(push, config, data_silence(config))
    for sock in (dealer, push):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDHWM, config.hwm)
        sock.setsockopt(zmq.RCVHWM, config.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, config.limits.max_frame_bytes)  # per frame (module docstring)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    return dealer, push


def control_silence(config: BusConfig) -> float:
    """Seconds a control connection (a DEALER's to a ROUTER) may receive nothing before it is closed."""
    return 2 * config.peer_timeout


def data_silence(config: BusConfig) -> float:
    """Seconds a data connection (a PUSH's to a PULL) may receive nothing, not even the end of a frame,
    before it is closed: ``DATA_SILENCE``, or ten peer timeouts if longer."""
    return max(DATA_SILENCE, 10 * config.peer_timeout)


def keepalive(sock: Socket, config: BusConfig, silence: float) -> None:
    """ZMTP heartbeats on a dialling socket (DEALER, PUSH): a PING every ``heartbeat_interval`` on each of
    its connections, which closes one that brought nothing back (not even the PONG) for ``silence``
    seconds, and dials its endpoint again, reaching whatever process listens there now. Each PING also
    carries ``silence`` as its TTL: the listening end closes the connection when nothing follows a PING
    for that long, a stopped process or a dead host on the dialling side (``listening``).

    ZeroMQ's I/O threads answer PINGs, so a busy Python loop never trips them; a stopped process, a
    dead host or a cut network do. But ZeroMQ counts only whole frames and commands as received, so
    a connection in the middle of one long frame looks silent until it ends: control connections carry
    mostly small messages, and get twice ``peer_timeout`` (``control_silence``), which also closes soon
    the connection of a process whose routing id another took (``ZMQ_ROUTER_HANDOVER``) once it goes
    quiet; data connections carry the long batches and segment chunks, and get ``data_silence``. The
    link itself is lost earlier, after ``peer_timeout``, by the core's own heartbeats (docs/PROTOCOL.md
    section 3).

    ZeroMQ's handshake (greeting, mechanism) gets as long (HANDSHAKE_IVL; libzmq's default is 30 s):
    heartbeats start only after it, and a DEALER that dialled a listener which never answers (the socket
    file of a stopped process, bound again since by its new one) waits that long before it dials again.
    """
    ms = max(1, round(silence * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(config.heartbeat_interval * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, min(ms, _MAX_TTL_MS))
    sock.setsockopt(zmq.HANDSHAKE_IVL, ms)


#: ZMTP's PING carries its TTL in deciseconds, in two bytes.
_MAX_TTL_MS = 0xFFFF * 100


def listening(sock: Socket, silence: float) -> None:
    """A listening socket's (ROUTER, PULL) side of ``keepalive``: it sends no PINGs of its own. Its
    connections are closed by the TTL the dialling end's PINGs carry, by TCP keepalive when the far host
    is gone (a thin client's connection, which has no ZMTP heartbeats), or when their far end closes.

    Why no PINGs here: libzmq 4.3.5 aborts the process (``Assertion failed: !_io_error
    (src/stream_engine_base.cpp:310)``) when a connection's heartbeat timer fires after ZeroMQ stopped
    reading it and its far end hung up. A listening socket stops reading a connection when its queue
    towards the node is full (``hwm`` messages, a peer flooding a busy loop) or has been taken from it (a
    routing id handed over to a newer connection, a socket being closed): a PING timer on that connection
    then killed the node. The dialling sockets' connections bring the node almost nothing (answers to
    their handshakes, PONGs) and are read all the time. ``tests/integration/bus/test_zmtp_abort.py``.

    The handshake gets ``silence`` seconds (HANDSHAKE_IVL), as in ``keepalive``.
    """
    sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, round(silence * 1000)))
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, round(silence)))
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


UNKNOWN = "an unknown address"


def peer_address(fd: int) -> str:
    """The peer address of the connection on ``fd`` (libzmq's, borrowed: never closed here)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return UNKNOWN  # closed already
    try:
        peer = sock.getpeername()
    except OSError:
        return UNKNOWN
    finally:
        sock.detach()
    return str(peer[0]) if isinstance(peer, tuple) else (peer or "a local socket")


_NOBLOCK = int(zmq.NOBLOCK)


class TooManyFrames(Exception):
    """A message of more than ``max_frames`` frames, read to its end: only its first frames were kept.

    Attributes:
        frames: the frames kept (``max_frames`` of them; for the ROUTER, without the routing id).
        count: how many frames the message had in all.
        size: its bytes in all, the dropped frames included.
    """

    def __init__(self, frames: list[Any], count: int, size: int) -> None:
        super().__init__(f"{count} frames")
        self.frames = frames
        self.count = count
        self.size = size


def drop_rest(sock: Socket) -> tuple[int, int]:
    """Read and drop the frames left of the message whose last frame read had ``more`` set: ``(frames,
    bytes)``. Each is let go as soon as it is read, never copied into Python."""
    count = size = 0
    more = True
    while more:
        frame = sock.recv(_NOBLOCK, copy=False)
        count += 1
        size += len(frame)
        more = frame.more
    return count, size


def recv_message(sock: Socket, *, zero_copy: bool, max_frames: int) -> list[Any]:
    """One whole message from ``sock`` (raises ``zmq.Again`` when there is none).

    Frames are taken as ``zmq.Frame``s, whose ``more`` flag ends the message: asking the socket for
    ZMQ_RCVMORE costs pyzmq more than the frame object (it converts the option to an enum on every call).
    With ``zero_copy``, frames after the first two (the envelope's header and body, small) are kept as
    memoryviews on ZeroMQ's buffers; the others are copied out as bytes.

    Raises:
        TooManyFrames: the message had more than ``max_frames`` frames; it was read to its end, keeping
            only the first ``max_frames``.
    """
    frame = sock.recv(_NOBLOCK, copy=False)
    parts: list[Any] = [frame.bytes]
    while frame.more:
        if len(parts) == max_frames:
            count, size = drop_rest(sock)
            raise TooManyFrames(parts, max_frames + count, sum(map(len, parts)) + size)
        frame = sock.recv(_NOBLOCK, copy=False)
        parts.append(frame.buffer if zero_copy and len(parts) >= 2 else frame.bytes)
    return parts
