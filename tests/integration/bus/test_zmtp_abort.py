"""A node's listening sockets survive what made libzmq 4.3.5 abort the process.

libzmq asserts ``!_io_error`` (src/stream_engine_base.cpp:310) when a connection's ZMTP heartbeat timer
fires after ZeroMQ stopped reading that connection and its far end hung up. A listening socket stops
reading a connection whose queue is full (a peer flooding a busy loop) or was taken from it (a routing id
handed over to a newer connection). With PINGs of its own, the node then died of SIGABRT: a replaced
process that sent once more and exited was enough to kill every peer it had been connected to. The
listening sockets now send no PINGs (``sparkbus.bus.sockets.listening``).

Each case runs the node's sockets, with the node's options, in a child process and checks that it outlives
the heartbeat timers that used to kill it. It waits for those timers (about 25 of their intervals), not for
a race: the order of events is fixed by the parent, step by step.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import zmq

pytestmark = pytest.mark.timeout(60)

#: The child: the node's ROUTER and PULL on 127.0.0.1, their ports on stdout; it reads the ROUTER only
#: when told to ("read" on stdin) and exits 0 after ``hold`` seconds of its heartbeat interval's timers.
_CHILD = textwrap.dedent(
    """
    import sys, time, zmq
    from sparkbus.bus.config import BusConfig
    from sparkbus.bus.sockets import context, server_sockets

    config = BusConfig(heartbeat_interval=0.02, peer_timeout=5.0, hwm=20)
    router, pull = server_sockets(context(), config)
    ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in (router, pull)]
    print(*ports, flush=True)
    read = sys.stdin.readline().strip() == "read"
    end = time.monotonic() + 0.5  # 25 heartbeat intervals
    while time.monotonic() < end:
        if read and router.poll(10):
            router.recv_multipart()
        elif not read:
            time.sleep(0.01)
    print("alive", flush=True)
    for s in (router, pull):
        s.close(0)
    context().term()
    """
)


def _child(read: bool) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    router_port, pull_port = map(int, proc.stdout.readline().split())
    proc.stdin.write("read\n" if read else "hold\n")
    proc.stdin.flush()
    return proc, router_port, pull_port


def _outlived(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return f"exit {proc.returncode}, {out.strip()!r}"


def _socket(
    ctx: zmq.Context[zmq.Socket[bytes]], kind: int, port: int, ident: bytes | None = None
) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.SNDHWM, 0)
    if ident is not None:
        sock.setsockopt(zmq.IDENTITY, ident)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _settle() -> None:
    """A pause for what was sent to reach the child (loopback: well under this). The child's fate does
    not hang on it: it only orders the steps as the scenario needs them."""
    time.sleep(0.1)


def test_a_connection_handed_over_that_sends_again_and_hangs_up_kills_nothing() -> None:
    proc, router_port, _ = _child(read=True)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        old = _socket(ctx, zmq.DEALER, router_port, b"b")
        old.send(b"old")
        _settle()
        new = _socket(ctx, zmq.DEALER, router_port, b"b")  # takes routing id b: the old one is not read
        new.send(b"new")
        _settle()
        for _ in range(3):
            old.send(b"old again")  # queued towards a pipe that is gone: ZeroMQ stops reading old
        _settle()
        old.close()  # and it hangs up
        assert _outlived(proc) == "exit 0, 'alive'"
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize("socket_kind", ["router", "pull"])
def test_a_peer_that_fills_a_connections_queue_and_hangs_up_kills_nothing(socket_kind: str) -> None:
    proc, router_port, pull_port = _child(read=False)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        if socket_kind == "router":
            sock = _socket(ctx, zmq.DEALER, router_port, b"flood")
        else:
            sock = _socket(ctx, zmq.PUSH, pull_port)
        for _ in range(2000):  # a hundred times the queue (hwm 20): ZeroMQ stops reading the connection
            sock.send(b"x" * 1000)
        time.sleep(0.2)  # the TCP buffers in between fill: what is sent, not a race
        sock.close(0)  # and the peer hangs up
        assert _outlived(proc) == "exit 0, 'alive'"
    finally:
        ctx.destroy(linger=0)
