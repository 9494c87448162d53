"""Presto's HTTP exchange over a node's output buffers: the baseline BinX is measured against.

A real HTTP/1.1 server with keep-alive (the standard library's ``ThreadingHTTPServer``) and a keep-alive
client (``http.client``). Endpoints (``GET /v1/task/{taskId}/results/{bufferId}/{token}`` for pages,
acknowledging before ``token``; ``.../{token}/acknowledge``; ``HEAD`` the size probe; ``DELETE
.../{bufferId}``), the ``X-Presto-*`` headers and the status codes (200 pages, 204 none) follow Presto's
worker protocol (protocol-facts section 3.3). Ours (docs/EXCHANGE.md section 4): the body framing, each
page a 4-byte little-endian length and its bytes; error answers, a text body naming the task and buffer
with ``X-Sparkbus-Error-Code`` (the BinX error code): 404 unknown buffer, 410 token gone, 400 token ahead
or a malformed request, 500 aborted, 503 overloaded.

The buffers are pure and not thread-safe: every access from this module holds one ``threading.Condition``.
Producers sharing the buffers must change them inside ``HttpExchangeServer.producer()``, which also
wakes the long-polls. This module imports no role: the buffers only have to satisfy ``BufferSource``.

A source that also has ``read_wait`` (``WaitingSource``; the node's, which forwards every access to the
loop thread that owns the ``binx.server`` role's buffers) long-polls by itself: the server then calls it
once per GET, without its lock, and answers 503 when it raises ``SourceUnavailable`` (the node is
stopping). The client side (``HttpExchangeClient``, and ``fetch`` and ``HttpFetcher`` that run the
``http.client`` role's requests) is ``sparkbus.bus.http_fetch``.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager, nullcontext, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import unquote

from sparkbus.bus.contract import HTTP_BUFFERS
from sparkbus.bus.http_wire import ERROR_STATUS, BufferRead, frame_pages, parse_data_size, parse_duration

if TYPE_CHECKING:
    pass

PAGES_CONTENT_TYPE = "application/X-presto-pages"
_PATH = re.compile(r"^/v1/task/([^/]+)/results/(\d{1,20})(?:/(\d{1,20})(/acknowledge)?)?$")
#: Seconds ``HttpExchangeServer.close`` waits for its request threads to end (answering 503, cut off).
CLOSE_WAIT = 5.0


class BufferSource(Protocol):
    """Buffers of pages keyed by (task id, buffer id) (``sparkbus.roles.exchange.OutputBuffers``)."""

    def read(
        self, task_id: str, buffer_id: int, token: int, max_bytes: int, *, size_only: bool = False
    ) -> BufferRead: ...

    def acknowledge(self, task_id: str, buffer_id: int, token: int) -> int: ...

    def delete(self, task_id: str, buffer_id: int) -> None: ...


class WaitingSource(BufferSource, Protocol):
    """A ``BufferSource`` that long-polls by itself (the server takes no lock around it)."""

    def read_wait(
        self,
        task_id: str,
        buffer_id: int,
        token: int,
        max_bytes: int,
        wait: float,
        *,
        size_only: bool = False,
    ) -> BufferRead: ...


class SourceUnavailable(Exception):
    """The source cannot answer now (its node is stopping); the server answers 503."""


class LoopBuffers:
    """The ``binx.server`` role's buffers as the HTTP server's threads see them: every access is a
    ``LocalCall`` run on the node's loop thread (``call_async``, as ``Node.call_async``), and a long-poll
    waits in the role, not here."""

    def __init__(self, node_id: str, call_async: Callable[[str, str, dict[str, Any]], Future[Any]]) -> None:
        self._node_id = node_id
        self._call_async = call_async
        self._stopped: Future[None] = Future()

    def close(self) -> None:
        """Answer every access still waiting, and every later one, with ``SourceUnavailable``."""
        with suppress(Exception):
            self._stopped.set_result(None)

    def _call(self, name: str, args: dict[str, Any], timeout: float) -> Any:
        node = self._node_id
        if self._stopped.done():
            raise SourceUnavailable(f"node {node} is stopping")
        try:
            fut = self._call_async(HTTP_BUFFERS, name, args)
        except RuntimeError as exc:
            raise SourceUnavailable(str(exc)) from None
        done, _ = wait([fut, self._stopped], timeout=timeout, return_when=FIRST_COMPLETED)
        if fut not in done:
            raise SourceUnavailable(
                f"node {node} is stopping" if self._stopped.done() else f"node {node} is busy"
            )
        try:
            return fut.result()
        except RuntimeError as exc:
            raise SourceUnavailable(str(exc)) from None

    def read_wait(
        self,
        task_id: str,
        buffer_id: int,
        token: int,
        max_bytes: int,
        wait: float,
        *,
        size_only: bool = False,
    ) -> BufferRead:
        args: dict[str, Any] = {"task_id": task_id, "buffer_id": buffer_id, "token": token}
        args.update(max_bytes=max_bytes, wait=wait, size_only=size_only)
        return cast(BufferRead, self._call("read", args, wait + _LOOP_ANSWER_TIMEOUT))

    def read(
        self, task_id: str, buffer_id: int, token: int, max_bytes: int, *, size_only: bool = False
    ) -> BufferRead:
        return self.read_wait(task_id, buffer_id, token, max_bytes, 0.0, size_only=size_only)

    def acknowledge(self, task_id: str, buffer_id: int, token: int) -> int:
        args = {"task_id": task_id, "buffer_id": buffer_id, "token": token}
        return int(self._call("acknowledge", args, _LOOP_ANSWER_TIMEOUT))

    def delete(self, task_id: str, buffer_id: int) -> None:
        self._call("delete", {"task_id": task_id, "buffer_id": buffer_id}, _LOOP_ANSWER_TIMEOUT)


#: How long an HTTP request waits for the loop's answer beyond its long-poll before it is answered 503.
_LOOP_ANSWER_TIMEOUT = 10.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: with Nagle on, each response waits for the client's delayed
    # ACK (~40 ms), which would make the baseline look far worse than a real HTTP server.
    disable_nagle_algorithm = True
    server: HttpExchangeServer

    def log_message(self, format: str, *args: Any) -> None:
        return  # the exchange is hot; errors are counted on the server instead

    # -- dispatch

    def _route(self) -> tuple[str, int, int | None, bool] | None:
        m = _PATH.match(self.path.split("?", 1)[0])
        if m is None:
            self._send_error(404, 5, f"no such endpoint: {self.path}")
            return None
        token = int(m.group(3)) if m.group(3) is not None else None
        return unquote(m.group(1)), int(m.group(2)), token, m.group(4) is not None

    def do_GET(self) -> None:
        route = self._route()
        if route is None:
            return
        task_id, buffer_id, token, ack = route
        if token is None:
            self._send_error(405, 5, "GET needs a token: /v1/task/{taskId}/results/{bufferId}/{token}")
            return
        if ack:
            try:
                with self.server.lock_for_source():
                    self.server.source.acknowledge(task_id, buffer_id, token)
            except SourceUnavailable as exc:
                self._send_error(503, 6, str(exc))
                return
            self._send_empty(204)
            return
        self._results(task_id, buffer_id, token, size_only=False)

    def do_HEAD(self) -> None:
        route = self._route()
        if route is None:
            return
        task_id, buffer_id, token, ack = route
        if token is None or ack:
            self._send_error(405, 5, "HEAD is the size probe: /v1/task/{taskId}/results/{bufferId}/{token}")
            return
        self._results(task_id, buffer_id, token, size_only=True)

    def do_DELETE(self) -> None:
        route = self._route()
        if route is None:
            return
        task_id, buffer_id, token, _ = route
        if token is not None:
            self._send_error(405, 5, "DELETE takes no token: /v1/task/{taskId}/results/{bufferId}")
            return
        try:
            with self.server.lock_for_source():
                self.server.source.delete(task_id, buffer_id)
                if self.server.read_wait is None:
                    self.server.cond.notify_all()
        except SourceUnavailable as exc:
            self._send_error(503, 6, str(exc))
            return
        self._send_empty(204)

    # -- results

    def _results(self, task_id: str, buffer_id: int, token: int, *, size_only: bool) -> None:
        try:
            max_bytes = parse_data_size(self.headers.get("X-Presto-Max-Size", "1MB"))
            wait = parse_duration(self.headers.get("X-Presto-Max-Wait", "0s"))
        except ValueError as exc:
            self._send_error(400, 5, str(exc))
            return
        max_bytes = max(1, min(max_bytes, self.server.max_reply_bytes))
        wait = min(wait, self.server.max_wait)
        read_wait = self.server.read_wait
        if read_wait is not None:
            try:
                result = read_wait(task_id, buffer_id, token, max_bytes, wait, size_only=size_only)
            except SourceUnavailable as exc:
                self._send_error(503, 6, str(exc))
                return
            self._answer(result, size_only)
            return
        deadline = time.monotonic() + wait
        with self.server.cond:
            while True:
                result = self.server.source.read(task_id, buffer_id, token, max_bytes, size_only=size_only)
                ready = result.pages or result.remaining or result.complete or result.error_code
                left = deadline - time.monotonic()
                if ready or left <= 0 or self.server.closing:
                    break
                self.server.cond.wait(left)
        self._answer(result, size_only)

    def _answer(self, result: BufferRead, size_only: bool) -> None:
        if code := result.error_code:
            self._send_error(ERROR_STATUS.get(code, 500), code, result.error_message)
            return
        body = b"" if size_only else frame_pages(result.pages)
        status = 200 if body or size_only else 204
        self.send_response(status)
        self.send_header("X-Presto-Task-Instance-Id", result.instance_id)
        self.send_header("X-Presto-Page-Sequence-Id", str(result.token))
        self.send_header("X-Presto-Page-End-Sequence-Id", str(result.next_token))
        self.send_header("X-Presto-Buffer-Complete", "true" if result.complete else "false")
        remaining = ",".join(map(str, result.remaining_bytes)) or "0"
        self.send_header("X-Presto-Buffer-Remaining-Bytes", remaining)
        if status == 200:
            self.send_header("Content-Type", PAGES_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _send_empty(self, status: int) -> None:
        self.send_response(status)
        self.end_headers()

    def _send_error(self, status: int, code: int, text: str) -> None:
        self.server.count("errors")
        body = text.encode()
        self.send_response(status)
        self.send_header("X-Sparkbus-Error-Code", str(code))
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class HttpExchangeServer(ThreadingHTTPServer):
    """Serves ``source`` over Presto's HTTP exchange endpoints.

    Args:
        source: the buffers to serve.
        host: address to bind (``127.0.0.1`` in tests).
        port: port to bind (0 picks a free one; see ``port``).
        max_wait: the longest long-poll honoured, seconds.
        max_reply_bytes: cap on ``X-Presto-Max-Size``.
        idle_timeout: seconds an idle keep-alive connection is kept open.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        source: BufferSource,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_wait: float = 30.0,
        max_reply_bytes: int = 32 << 20,
        idle_timeout: float = 30.0,
    ) -> None:
        handler = type("Handler", (_Handler,), {"timeout": idle_timeout})
        super().__init__((host, port), handler)
        self.source = source
        self.read_wait = getattr(source, "read_wait", None)
        self.cond = threading.Condition()
        self.max_wait = max_wait
        self.max_reply_bytes = max_reply_bytes
        self.closing = False
        self.counters: dict[str, int] = {"errors": 0, "disconnects": 0}
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()  # request threads (daemons: socketserver keeps none)
        self._conn_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def count(self, name: str) -> None:
        """Add one to a counter (thread-safe)."""
        with self._conn_lock:
            self.counters[name] = self.counters.get(name, 0) + 1

    def lock_for_source(self) -> Any:
        """The lock around a source access: the condition, or none for a ``WaitingSource`` (which
        serialises on its own, and whose calls wait for another thread)."""
        return self.cond if self.read_wait is None else nullcontext()

    @contextmanager
    def producer(self) -> Iterator[BufferSource]:
        """Hold the lock while changing the buffers, then wake every long-poll."""
        with self.cond:
            yield self.source
            self.cond.notify_all()

    def start(self) -> HttpExchangeServer:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(
            target=self.serve_forever, name=f"http-exchange:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: wake long-polls, close keep-alive connections, release the port."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        with self._conn_lock:
            for conn in self._connections:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self.server_close()
        deadline = time.monotonic() + CLOSE_WAIT  # woken and cut off above, each ends within moments
        for thread in self._handlers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        with self._conn_lock:
            self._connections.add(request)
            self._handlers = {t for t in self._handlers if t.is_alive()}
            self._handlers.add(thread)
        thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exception(), ConnectionError | TimeoutError):  # the consumer went away first
            self.count("disconnects")
        else:
            super().handle_error(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.discard(request)
        super().shutdown_request(request)
