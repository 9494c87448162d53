"""One node of ``sparkbus up``, as a child process: ``python -m sparkbus.topologies.nodeproc FILE NODE``.

The parent talks to it over the child's stdin and stdout, one JSON object per line:

1. child -> parent: ``{"event": "bound", "endpoints": {...}, "status": "tcp://127.0.0.1:PORT"}`` once its
   sockets are bound on ephemeral ports (``status`` is a ZeroMQ socket answering a REQ's ``status`` as REP
   does; any other body gets ``ok`` false and why, a frame over ``STATUS_MAX_FRAME`` bytes has its connection
   dropped), or
   ``{"event": "error", "error": "..."}`` and exit status 2.
2. parent -> child: ``{"cmd": "peers", "peers": {node: endpoints}}``; the child starts its bus node, or
   says ``{"event": "error", ...}`` and exits with status 2 when it cannot.
3. child -> parent: ``{"event": "ready"}`` once every link completed its handshake.
4. parent -> child: ``{"cmd": "stop"}``, or end of file: the child says goodbye to its peers and exits 0.

The child watches its stdin: when the parent dies, for any reason, the pipe closes and the child stops, so
no node outlives its launcher. SIGINT is ignored (the launcher decides); SIGTERM stops the node. A bus loop
that dies makes the child exit with status 3.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from sparkbus.bus.sockets import TooManyFrames, recv_message
from sparkbus.topologies.busnode import BusNodeHandle
from sparkbus.topologies.runtime import Endpoints, NodeRequest, advertise_host
from sparkbus.topologies.schema import load

EXIT_SETUP = 2
EXIT_LOOP_DIED = 3


def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _read_stdin(commands: queue.SimpleQueue[dict[str, Any] | None]) -> None:
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        try:
            commands.put(json.loads(line))
        except ValueError:
            continue
    commands.put(None)  # end of file: the parent is gone or wants us gone


#: The largest frame the status endpoint takes: a longer one makes libzmq drop the connection unread.
STATUS_MAX_FRAME = 4096
#: The frames of a request kept (routing id, REQ's envelope, body); the rest are read and dropped.
STATUS_KEEP_FRAMES = 8
STATUS_REQUEST = b"status"

log = logging.getLogger(__name__)


def _read_request(sock: zmq.Socket[bytes]) -> tuple[list[bytes], int]:
    """The first ``STATUS_KEEP_FRAMES`` frames of the pending message on ``sock`` and how many it had (every
    one is read, so the next message starts clean)."""
    try:
        frames: list[bytes] = recv_message(sock, zero_copy=False, max_frames=STATUS_KEEP_FRAMES)
    except TooManyFrames as exc:
        return exc.frames, exc.count
    return frames, len(frames)


def _bad_request(body: list[bytes], count: int) -> str | None:
    """Why a body of ``count`` frames, the first of them ``body``, is not a status request (one frame,
    ``status``), or None when it is one."""
    if count == 1 and body == [STATUS_REQUEST]:
        return None
    if count != 1:
        return f"a status request is one frame {STATUS_REQUEST!r}, not {count}"
    return f"a status request is {STATUS_REQUEST!r}, not {body[0][:32]!r}{'...' * (len(body[0]) > 32)}"


def serve_status(handle: BusNodeHandle, sock: zmq.Socket[bytes], extra: dict[str, Any]) -> None:
    """Answer one pending request on ``sock``, a ROUTER (or a REP) that anyone on the machine may reach,
    answering REQ sockets as a REP would: a status request with the node's status, any other body with ``ok`` false and why.
    A message without REQ's envelope (routing id, ..., empty delimiter) is dropped. Raises nothing: no request,
    however made, ends the node or leaves the socket unable to answer the next one."""
    try:
        frames, count = _read_request(sock)
    except zmq.ZMQError as exc:  # nothing there after all: nothing to answer
        log.debug("status endpoint: no request to answer: %s", exc)
        return
    if sock.type == zmq.REP:
        cut = 0  # the envelope stays in the socket
    elif b"" in frames[1:]:
        cut = frames.index(b"", 1) + 1
    else:
        return  # no delimiter among the frames kept: no envelope to answer to
    bad = _bad_request(frames[cut:], count - cut)
    if bad is not None:
        body: dict[str, Any] = {"ok": False, **extra, "error": bad}
    else:
        try:
            body = {"ok": True, **extra, "status": handle.status(timeout=2.0)}
        except Exception as exc:  # the node cannot answer: say why instead of leaving the caller waiting
            body = {"ok": False, **extra, "error": f"{type(exc).__name__}: {exc}"}
    try:  # a ROUTER drops an answer to a peer gone (or whose queue is full); nothing else is raised here
        sock.send_multipart([*frames[:cut], json.dumps(body, default=str).encode()], zmq.NOBLOCK)
    except zmq.ZMQError as exc:
        log.warning("status endpoint: cannot answer: %s", exc)


def run(path: str, node_id: str, *, skip_unavailable: bool, ready_timeout: float) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    commands: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
    signal.signal(signal.SIGTERM, lambda *_: commands.put({"cmd": "stop"}))
    threading.Thread(target=_read_stdin, args=(commands,), name="stdin-watch", daemon=True).start()
    try:
        topo = load(path)
        # `sparkbus up` runs host-placed nodes only, each on its `host`: what a wildcard bind advertises.
        machine = topo.spec_of(node_id).host or "127.0.0.1"
        request = NodeRequest(
            node_id=node_id, topology=topo, advertise_host=advertise_host(topo.bus.host, machine)
        )
        handle = BusNodeHandle(request, skip_unavailable=skip_unavailable)
        endpoints = handle.bind()
    except Exception as exc:
        _say({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return EXIT_SETUP
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    status_sock = ctx.socket(zmq.ROUTER)  # a REP that no request can leave stuck
    status_sock.setsockopt(zmq.LINGER, 0)
    status_sock.setsockopt(zmq.MAXMSGSIZE, STATUS_MAX_FRAME)
    port = status_sock.bind_to_random_port("tcp://127.0.0.1")
    status_addr = f"tcp://127.0.0.1:{port}"
    _say(
        {
            "event": "bound",
            "endpoints": endpoints.to_json(),
            "status": status_addr,
            "skipped": handle.skipped,
        }
    )
    extra = {"node": node_id, "endpoints": endpoints.to_json()}
    started = False
    ready_deadline: float | None = None
    ready_thread: threading.Thread | None = None
    ready_result: list[BaseException | None] = []
    try:
        while True:
            if handle.failure() is not None:
                _say({"event": "error", "error": handle.failure()})
                return EXIT_LOOP_DIED
            if status_sock.poll(50, zmq.POLLIN):
                serve_status(handle, status_sock, extra)
            if ready_thread is not None and not ready_thread.is_alive():
                ready_thread = None
                err = ready_result[0]
                if err is None:
                    _say({"event": "ready"})
                else:
                    _say({"event": "error", "error": f"{type(err).__name__}: {err}"})
                    return EXIT_SETUP
            try:
                cmd = commands.get_nowait()
            except queue.Empty:
                continue
            if cmd is None or cmd.get("cmd") == "stop":
                return 0
            if cmd.get("cmd") == "peers" and not started:
                try:
                    handle.set_peers({k: Endpoints.from_json(v) for k, v in cmd["peers"].items()})
                    handle.start()
                except Exception as exc:  # e.g. no public key for a peer: the cause, to the launcher
                    _say({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
                    return EXIT_SETUP
                started = True
                ready_deadline = time.monotonic() + ready_timeout

                def wait(deadline: float = ready_deadline) -> None:
                    try:
                        handle.wait_ready(max(0.1, deadline - time.monotonic()))
                        ready_result.append(None)
                    except BaseException as exc:
                        ready_result.append(exc)

                ready_thread = threading.Thread(target=wait, name="wait-ready", daemon=True)
                ready_thread.start()
    finally:
        status_sock.close(linger=0)
        try:
            handle.stop()
        finally:
            ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkbus.topologies.nodeproc")
    parser.add_argument("topology")
    parser.add_argument("node")
    parser.add_argument("--skip-unavailable", action="store_true")
    parser.add_argument("--ready-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.ERROR, format=f"[{args.node}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return run(
        args.topology, args.node, skip_unavailable=args.skip_unavailable, ready_timeout=args.ready_timeout
    )


if __name__ == "__main__":
    sys.exit(main())
