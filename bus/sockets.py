"""The process's ZeroMQ context, and a bus node's sockets with their options.

One set per node (DESIGN.md section 4): the ROUTER and PULL it binds, and per peer the DEALER and PUSH
it dials. Every socket has LINGER=0, explicit HWMs, MAXMSGSIZE and ZMTP heartbeats (``keepalive``); the
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
    keepalive(router, config, 2 * config.peer_timeout)
    keepalive(pull, config, max(DATA_SILENCE, 10 * config.peer_timeout))
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
    for sock in (dealer, push):
        keepalive(sock, config, 2 * config.peer_timeout)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDHWM, config.hwm)
        sock.setsockopt(zmq.RCVHWM, config.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, config.limits.max_frame_bytes)  # per frame (module docstring)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    return dealer, push


def keepalive(sock: Socket, config: BusConfig, timeout: float) -> None:
    """ZMTP heartbeats: a PING every ``heartbeat_interval`` on each connection of ``sock``, and a
    connection that received nothing for ``timeout`` seconds is closed (a dialling socket then dials
    its endpoint again, reaching whatever process listens there now).

    ZeroMQ's I/O threads answer PINGs, so a busy Python loop never trips them; a stopped process, a
    dead host or a cut network do. But ZeroMQ counts only whole frames and commands as received, so
    a connection in the middle of one long frame looks silent until it ends. DEALER and PUSH receive
    only handshake answers and PINGs, and the ROUTER mostly small control messages: twice
    ``peer_timeout``, which also closes soon the connection of a process whose routing id another
    took (``ZMQ_ROUTER_HANDOVER``). The PULL receives the long data batches and segment chunks:
    ``DATA_SILENCE``. The link itself is lost earlier, after ``peer_timeout``, by the core's own
    heartbeats (docs/PROTOCOL.md section 3).

    ZeroMQ's handshake (greeting, mechanism) gets as long (HANDSHAKE_IVL; libzmq's default is 30 s):
    heartbeats start only after it, and a DEALER that dialled a listener which never answers (the socket
    file of a stopped process, bound again since by its new one) waits that long before it dials again.
    """
    ms = max(1, round(timeout * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(config.heartbeat_interval * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ms)
    sock.setsockopt(zmq.HANDSHAKE_IVL, ms)


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
