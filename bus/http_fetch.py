"""The client side of Presto's HTTP exchange: ``HttpExchangeClient`` (a keep-alive ``http.client``
connection to one ``HttpExchangeServer``, every request bounded by its long-poll wait plus a timeout, every
answer body by ``max_body_bytes``), and what the node runs for the ``http.client`` role: ``fetch`` turns
one ``HttpFetch`` into its ``HttpFetched``, ``HttpFetcher`` runs those on worker threads, one connection
per server and worker (docs/EXCHANGE.md section 5). The server is ``sparkbus.bus.http_exchange``.
"""

from __future__ import annotations

import errno
import http.client
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sparkbus.bus.contract import HttpFetch, HttpFetched
from sparkbus.bus.http_wire import ERROR_STATUS, BufferRead, unframe_pages
from sparkbus.codecs import DEFAULT_LIMITS, MiB

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

#: Least seconds between ``HttpExchangeClient.fetch_all``'s requests to an empty open buffer.
POLL_DELAY = 0.1
#: Largest answer body ``HttpExchangeClient`` takes by default: the largest BinX message a node takes.
MAX_BODY_BYTES = DEFAULT_LIMITS.max_message_bytes
_BODY_PIECE = 4 * MiB  # most bytes read from a body at once: it grows only as its bytes arrive


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpPages:
    """One HTTP exchange response, parsed.

    Attributes:
        status: the HTTP status (200 or 204).
        instance_id: ``X-Presto-Task-Instance-Id``.
        token: ``X-Presto-Page-Sequence-Id``.
        next_token: ``X-Presto-Page-End-Sequence-Id``.
        complete: ``X-Presto-Buffer-Complete``.
        remaining_bytes: ``X-Presto-Buffer-Remaining-Bytes`` (empty for ``0``).
        pages: the pages of the body.
    """

    status: int
    instance_id: str
    token: int
    next_token: int
    complete: bool
    remaining_bytes: tuple[int, ...]
    pages: tuple[bytes, ...]


class HttpExchangeError(Exception):
    """The server answered with an error status.

    Attributes:
        status: the HTTP status.
        code: the BinX error code from ``X-Sparkbus-Error-Code`` (0 when absent).
        message: the server's text.
    """

    def __init__(self, status: int, code: int, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"HTTP {status} (error code {code}): {message}")


class HttpRequestTimeout(TimeoutError):
    """A request had no complete answer within its limit (its long-poll wait plus the client's
    ``timeout``); the client closed the connection it used.

    Attributes:
        url: the request's URL.
        limit: the limit, seconds.
    """

    def __init__(self, url: str, limit: float, message: str) -> None:
        super().__init__(message)
        self.url = url
        self.limit = limit


class HttpAnswerTooLarge(ValueError):
    """An answer's body is larger than the client's ``max_body_bytes`` (declared so, or sent so); the
    client closed the connection it used."""


class _BoundedSocket(socket.socket):
    """A client socket whose every send and receive also ends at ``deadline`` (``time.monotonic``
    seconds), set by ``HttpExchangeClient`` for each request: the socket timeout bounds one wait, so a
    server that trickles its answer a byte at a time would otherwise hold the request for ever. Past the
    deadline a wait raises ``TimeoutError``, as the socket timeout does."""

    deadline = math.inf

    def _bound(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        timeout = self.gettimeout()
        if timeout is None or left < timeout:
            self.settimeout(left)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._bound()
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self._bound()
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self._bound()
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self._bound()
        super().sendall(data, flags)


class HttpExchangeClient:
    """A keep-alive client of one HTTP exchange server (one connection; not thread-safe).

    Each request has a limit of its long-poll wait plus ``timeout``, from its start (a connect included)
    to the last byte of its answer: past it the request raises ``HttpRequestTimeout`` and the connection
    is closed, so a server that answers slowly or trickles its answer holds the calling thread no longer.

    Args:
        host: server address.
        port: server port.
        timeout: each request's limit beyond its long-poll wait, seconds.
        max_body_bytes: the largest answer body taken: a larger one, declared or sent, raises
            ``HttpAnswerTooLarge`` and the connection is closed.
    """

    def __init__(
        self, host: str, port: int, *, timeout: float = 20.0, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.host = host
        self.port = port
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None  # the last socket opened, shut down by ``abort``
        self._aborted = False
        self._deadline = math.inf  # of the request in progress (``time.monotonic``)

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def abort(self) -> None:
        """Break off a request in progress from another thread, connected or still connecting: its socket
        is shut down, so the thread blocked in it gets an ``OSError`` at once (used when a node stops).
        The client makes no request after this one."""
        self._aborted = True
        sock = self._sock
        if sock is not None:
            with suppress(OSError):  # closed already, or not connecting yet (the flag stops that one)
                sock.shutdown(socket.SHUT_RDWR)

    def _open(
        self, address: tuple[str, int], timeout: float | None, source: tuple[str, int] | None = None
    ) -> socket.socket:
        """``socket.create_connection`` for ``http.client``, abortable while it connects: a connect to a
        host that does not answer would otherwise hold the thread (and a stopping node) up to ``timeout``.
        The socket is visible to ``abort`` from its creation, and the wait looks at the abort flag, so an
        abort before the connect starts is seen too."""
        error: OSError = OSError(f"no address for {address[0]}")
        for family, kind, proto, _, addr in socket.getaddrinfo(*address, 0, socket.SOCK_STREAM):
            sock = _BoundedSocket(family, kind, proto)
            sock.deadline = self._deadline
            self._sock = sock
            left = self._deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError(f"connecting to {addr}: no time left")
                _connect(sock, addr, left if timeout is None else min(timeout, left), lambda: self._aborted)
            except OSError as exc:
                sock.close()
                error = exc
                if self._aborted:
                    break
                continue
            sock.settimeout(timeout)
            return sock
        if self._aborted:
            raise ConnectionAbortedError(f"connecting to {address[0]}:{address[1]}: aborted") from error
        raise error

    def __enter__(self) -> HttpExchangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, headers: dict[str, str], wait: float
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """Send a request and read its whole answer within ``wait + self.timeout`` seconds.

        Any failure closes the connection, which may still hold the rest of an answer.

        Raises:
            HttpRequestTimeout: no complete answer within that limit.
            HttpAnswerTooLarge: a body over ``max_body_bytes``.
        """
        limit = self.timeout + wait
        self._deadline = time.monotonic() + limit
        try:
            for attempt in (0, 1):
                if self._aborted:
                    raise ConnectionAbortedError(f"{method} {path}: the client was aborted")
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=limit)
                    self._conn._create_connection = self._open  # type: ignore[attr-defined]
                self._conn.timeout = limit
                sock = self._conn.sock
                if sock is not None:
                    # http.client applies its timeout only when it connects: a kept-alive socket still has
                    # the one of the request that opened it (an ack's, shorter than a long poll's).
                    sock.settimeout(limit)
                    if isinstance(sock, _BoundedSocket):
                        sock.deadline = self._deadline
                try:
                    self._conn.request(method, path, headers=headers)
                    resp = self._conn.getresponse()
                    return resp, self._body(resp, method, path)
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    # The server closed an idle keep-alive connection: reconnect once.
                    self.close()
                    if attempt:
                        raise
        except TimeoutError as exc:
            # Every wait of the request ends by its deadline, so any timeout is the request's: its
            # connection may hold the rest of an answer, and is not used again.
            self.close()
            url = f"http://{self.host}:{self.port}{path}"
            raise HttpRequestTimeout(
                url,
                limit,
                f"{method} {url}: no complete answer within {limit:g} s "
                f"(long-poll {wait:g} s + request timeout {self.timeout:g} s), connection closed: {exc}",
            ) from exc
        except BaseException:
            self.close()
            raise
        raise AssertionError("unreachable")

    def _body(self, resp: http.client.HTTPResponse, method: str, path: str) -> bytes:
        """The answer's body, read in pieces of at most ``_BODY_PIECE`` bytes up to ``max_body_bytes``:
        ``resp.read()`` would allocate whatever length the server declares, and read a chunked or
        close-delimited body without end."""
        limit, declared = self.max_body_bytes, resp.length
        refused = f"{method} http://{self.host}:{self.port}{path}: the answer %s the client takes; "
        refused += "connection closed"
        if declared is not None and declared > limit:
            raise HttpAnswerTooLarge(refused % f"declares {declared} bytes, more than the {limit}")
        pieces: list[bytes] = []
        total = 0
        while piece := resp.read(min(_BODY_PIECE, limit + 1 - total)):
            total += len(piece)
            if total > limit:
                raise HttpAnswerTooLarge(refused % f"sends a body of more than the {limit} bytes")
            pieces.append(piece)
        body = b"".join(pieces)
        if declared is not None and total < declared:
            # ``read(n)`` takes a connection closed early for the end, where ``read()`` refuses it.
            raise http.client.IncompleteRead(body, declared - total)
        return body

    @staticmethod
    def _path(task_id: str, buffer_id: int, token: int | None = None) -> str:
        base = f"/v1/task/{quote(task_id, safe='')}/results/{buffer_id}"
        return base if token is None else f"{base}/{token}"

    def _pages(
        self, method: str, task_id: str, buffer_id: int, token: int, max_bytes: int, max_wait: float
    ) -> HttpPages:
        headers = {"X-Presto-Max-Size": f"{max_bytes}B", "X-Presto-Max-Wait": f"{int(max_wait * 1000)}ms"}
        resp, body = self._request(method, self._path(task_id, buffer_id, token), headers, max_wait)
        if resp.status not in (200, 204):
            code = int(resp.getheader("X-Sparkbus-Error-Code", "0") or 0)
            raise HttpExchangeError(resp.status, code, body.decode(errors="replace"))
        remaining = resp.getheader("X-Presto-Buffer-Remaining-Bytes", "0")
        sizes = tuple(int(n) for n in remaining.split(",") if n.strip())
        return HttpPages(
            status=resp.status,
            instance_id=resp.getheader("X-Presto-Task-Instance-Id", ""),
            token=int(resp.getheader("X-Presto-Page-Sequence-Id", str(token))),
            next_token=int(resp.getheader("X-Presto-Page-End-Sequence-Id", str(token))),
            complete=resp.getheader("X-Presto-Buffer-Complete", "false") == "true",
            remaining_bytes=() if sizes == (0,) else sizes,
            pages=tuple(unframe_pages(body)),
        )

    def get(
        self, task_id: str, buffer_id: int, token: int, *, max_bytes: int = 1 << 20, max_wait: float = 0.0
    ) -> HttpPages:
        """GET pages from ``token`` (acknowledging every page before it)."""
        return self._pages("GET", task_id, buffer_id, token, max_bytes, max_wait)

    def probe(self, task_id: str, buffer_id: int, token: int, *, max_wait: float = 0.0) -> HttpPages:
        """HEAD size probe: the sizes of the pages available from ``token``."""
        return self._pages("HEAD", task_id, buffer_id, token, 0, max_wait)

    def acknowledge(self, task_id: str, buffer_id: int, token: int) -> None:
        """Acknowledge every page before ``token`` (best-effort, as in Presto: errors are ignored)."""
        try:
            self._request("GET", self._path(task_id, buffer_id, token) + "/acknowledge", {}, 0.0)
        except OSError:
            self.close()

    def delete(self, task_id: str, buffer_id: int) -> None:
        """Delete the buffer on the server.

        Raises:
            HttpExchangeError: the server refused.
        """
        resp, body = self._request("DELETE", self._path(task_id, buffer_id), {}, 0.0)
        if resp.status not in (200, 204):
            raise HttpExchangeError(resp.status, 0, body.decode(errors="replace"))

    def fetch_all(
        self, task_id: str, buffer_id: int, *, max_bytes: int = 1 << 20, max_wait: float = 1.0
    ) -> list[bytes]:
        """Read a whole buffer, then delete it (what Presto's exchange source does). An empty answer that
        is not the end is asked again no sooner than ``POLL_DELAY`` after the previous request: without a
        long-poll (``max_wait`` 0, or the server's cap) an empty buffer is not polled in a tight loop."""
        token = 0
        pages: list[bytes] = []
        while True:
            sent = time.monotonic()
            res = self.get(task_id, buffer_id, token, max_bytes=max_bytes, max_wait=max_wait)
            pages.extend(res.pages)
            token = res.next_token
            if res.complete:
                self.delete(task_id, buffer_id)
                return pages
            if not res.pages:
                self._pause(sent + POLL_DELAY - time.monotonic())

    def _pause(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


def where(address: str) -> str:
    """How an answer's error names the server (the role names the source: peer, task, buffer)."""
    return f"http://{address}"


def answer_of(job: HttpFetch, result: BufferRead, address: str) -> HttpFetched:
    """The ``HttpFetched`` a server's read ``result`` makes once it crossed HTTP: what ``fetch`` returns for
    the same answer (the simulator, which has no sockets, answers its ``HttpFetch`` requests with this)."""
    if result.error_code:
        status = ERROR_STATUS.get(result.error_code, 500)
        text = f"{where(address)}: HTTP {status}: {result.error_message}"
        return HttpFetched(job=job.job, error=text, code=int(result.error_code))
    return HttpFetched(
        job=job.job,
        pages=tuple(bytes(p) for p in result.pages),
        token=result.token,
        next_token=result.next_token,
        complete=result.complete,
        instance_id=result.instance_id,
    )


def fetch(client: HttpExchangeClient, job: HttpFetch) -> HttpFetched:
    """Run one ``HttpFetch`` with ``client`` (blocking): its ``HttpFetched``, errors included.

    A server's refusal keeps its BinX error code (``X-Sparkbus-Error-Code``); a server that cannot be
    reached, or answers what is not an HTTP exchange answer (a body over ``max_body_bytes`` too), gives
    code 0. Raises nothing: any other exception is an error answer too, and closes the connection.
    """
    here = where(f"{client.host}:{client.port}")
    try:
        if job.delete:
            client.delete(job.task_id, job.buffer_id)
            return HttpFetched(job=job.job, token=job.token, next_token=job.token, complete=True)
        res = client.get(
            job.task_id, job.buffer_id, job.token, max_bytes=job.max_bytes, max_wait=job.max_wait
        )
    except HttpExchangeError as exc:
        return HttpFetched(job=job.job, error=f"{here}: HTTP {exc.status}: {exc.message}", code=exc.code)
    except Exception as exc:
        client.close()  # its connection may hold the rest of an answer
        if isinstance(exc, HttpRequestTimeout | HttpAnswerTooLarge):
            text = str(exc)
        elif isinstance(exc, OSError | http.client.HTTPException | ValueError):
            text = f"cannot reach the HTTP exchange: {type(exc).__name__}: {exc}"
        else:
            text = f"the HTTP exchange request failed: {type(exc).__name__}: {exc}"
        return HttpFetched(job=job.job, error=f"{here}: {text}")
    return HttpFetched(
        job=job.job,
        pages=res.pages,
        token=res.token,
        next_token=res.next_token,
        complete=res.complete,
        instance_id=res.instance_id,
    )


def _connect(
    sock: socket.socket, addr: Any, timeout: float | None, aborted: Callable[[], bool], slice_s: float = 0.25
) -> None:
    """Connect ``sock`` to ``addr`` within ``timeout`` seconds (None: no limit), giving up at once when
    the socket is shut down and within ``slice_s`` when ``aborted()`` turns true. A wait that ends is
    checked: a socket shut down before its connect started wakes the wait without being connected."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sock.setblocking(False)
    err = sock.connect_ex(addr)
    if err in (errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY):
        waiter = select.poll()
        waiter.register(sock, select.POLLOUT)
        while not waiter.poll(int(slice_s * 1000)):
            if aborted():
                raise ConnectionAbortedError(f"connecting to {addr}: aborted")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"connecting to {addr}: no answer in {timeout} s")
        if aborted():
            raise ConnectionAbortedError(f"connecting to {addr}: aborted")
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, f"connecting to {addr}: {os.strerror(err)}")
    sock.getpeername()  # OSError (ENOTCONN) unless the connect completed


class HttpFetcher:
    """Runs ``HttpFetch`` requests on worker threads for a node driver, and hands each answer to ``deliver``
    (called on the worker thread). Each worker keeps its keep-alive connection per server for the next
    request; ``close`` breaks off requests in progress and joins every worker.

    Args:
        deliver: takes each ``HttpFetched`` (it must not block; the node queues it for its loop).
        workers: the most requests in progress at once (a long-poll holds a worker up to its wait).
        timeout: each request's limit beyond its long-poll wait, seconds (``HttpExchangeClient``).
        max_body_bytes: the largest answer body taken (``HttpExchangeClient``).
        name: prefix of the worker threads' names.
    """

    def __init__(
        self,
        deliver: Callable[[HttpFetched], None],
        *,
        workers: int = 4,
        timeout: float = 20.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        name: str = "http-fetch",
    ) -> None:
        self._deliver = deliver
        self._new_client = partial(HttpExchangeClient, timeout=timeout, max_body_bytes=max_body_bytes)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[HttpExchangeClient]] = {}
        self._busy: set[HttpExchangeClient] = set()
        self._closed = False

    def submit(self, job: HttpFetch, address: str) -> None:
        """Run ``job`` against the server at ``address`` (``host:port``)."""
        host, _, port = address.rpartition(":")
        with self._lock:
            if self._closed:
                return
            self._executor.submit(self._run, job, host, int(port))

    def _run(self, job: HttpFetch, host: str, port: int) -> None:
        with self._lock:
            if self._closed:
                return
            idle = self._idle.get((host, port))
            client = idle.pop() if idle else self._new_client(host, port)
            self._busy.add(client)
        # ``fetch`` raises nothing, and closes a failed request's connection: none is pooled mid-answer.
        answer = fetch(client, job)
        with self._lock:
            self._busy.discard(client)
            keep = not self._closed
            if keep:
                self._idle.setdefault((host, port), []).append(client)
        if keep:
            self._deliver(answer)
        else:
            client.close()

    def close(self) -> None:
        """Break off the requests in progress, join the workers, close every connection."""
        with self._lock:
            self._closed = True
            busy = list(self._busy)
        for client in busy:
            client.abort()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            idle = [client for clients in self._idle.values() for client in clients]
            self._idle.clear()
        for client in idle:
            client.close()
