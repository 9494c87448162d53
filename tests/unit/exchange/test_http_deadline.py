"""The HTTP exchange client bounds each request as a whole, not each read.

A socket timeout ends one wait for bytes, so a server that sends its headers and then one byte of its body
every 0.3 s held a client (and the driver's worker thread running it) for ever. These tests run such a
server on loopback: its first connection trickles, every later one answers properly, so a request after
the failed one shows the client usable again, on a new connection, with keep-alive still working.

Every wait here is bounded by ``BOUND``, which only detects a hang: nothing asserts how long a request
took. A request still running after it is broken off with ``abort``, so the test fails and the suite
goes on.
"""

from __future__ import annotations

import queue
import select
import socket
import threading
from collections.abc import Iterator

import pytest

from sparkbus.bus.contract import HttpFetch, HttpFetched
from sparkbus.bus.http_fetch import HttpExchangeClient, HttpFetcher, HttpPages, HttpRequestTimeout, fetch
from sparkbus.bus.http_wire import frame_pages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = "q7.0.0.0"
LIMIT = 0.5  # the client's timeout; the trickle (a byte every 0.3 s) never lets a 0.5 s read time out
TRICKLE_EVERY = 0.3
BOUND = 10.0  # far beyond LIMIT: a request still running after this hangs


class TricklingThenGoodServer:
    """A loopback HTTP server, one connection at a time on one thread: the first connection is answered
    with headers and then a byte of body every ``TRICKLE_EVERY`` s (of a body far too long to finish);
    every later one gets proper keep-alive answers (one page, ``b"page"``) until the client closes it."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(4)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self.stop = threading.Event()
        self.trickle_closed = threading.Event()  # the client closed the trickling connection
        self.connections = 0
        self.good_requests = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, name="trickle-server", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self._thread.join(BOUND)
        self._listener.close()
        assert not self._thread.is_alive(), "the server thread did not stop"
        assert not self.errors, self.errors

    def _serve(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    self.connections += 1
                    if self.connections == 1:
                        self._trickle(conn)
                    else:
                        self._answer(conn)
        except BaseException as exc:
            self.errors.append(exc)

    def _read_request(self, conn: socket.socket) -> bool:
        """Read one request's head (the client sends no body); False when the client closed."""
        data = b""
        while b"\r\n\r\n" not in data:
            if not self._readable(conn):
                return False
            chunk = conn.recv(4096)
            if not chunk:
                return False
            data += chunk
        return True

    def _readable(self, conn: socket.socket) -> bool:
        while not self.stop.is_set():
            if select.select([conn], [], [], 0.1)[0]:
                return True
        return False

    def _trickle(self, conn: socket.socket) -> None:
        if not self._read_request(conn):
            return
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/X-presto-pages\r\nContent-Length: 100000\r\n"
            b"X-Presto-Page-Sequence-Id: 0\r\nX-Presto-Page-End-Sequence-Id: 1\r\n\r\n"
        )
        while not self.stop.wait(TRICKLE_EVERY):
            if select.select([conn], [], [], 0)[0]:
                try:
                    gone = conn.recv(1) == b""
                except ConnectionResetError:
                    gone = True
                if gone:
                    self.trickle_closed.set()
                    return
            try:
                conn.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                self.trickle_closed.set()
                return

    def _answer(self, conn: socket.socket) -> None:
        body = frame_pages([b"page"])
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/X-presto-pages\r\n"
            f"Content-Length: {len(body)}\r\nX-Presto-Task-Instance-Id: inst\r\n"
            "X-Presto-Page-Sequence-Id: 0\r\nX-Presto-Page-End-Sequence-Id: 1\r\n"
            "X-Presto-Buffer-Complete: true\r\nX-Presto-Buffer-Remaining-Bytes: 0\r\n\r\n"
        ).encode()
        while self._read_request(conn):
            self.good_requests += 1
            conn.sendall(head + body)


@pytest.fixture
def server() -> Iterator[TricklingThenGoodServer]:
    srv = TricklingThenGoodServer()
    try:
        yield srv
    finally:
        srv.close()


def test_a_trickled_answer_fails_at_the_request_limit_and_the_client_goes_on(
    server: TricklingThenGoodServer,
) -> None:
    client = HttpExchangeClient("127.0.0.1", server.port, timeout=LIMIT)
    outcome: list[HttpPages | BaseException] = []

    def get() -> None:
        try:
            outcome.append(client.get(T, 0, 0, max_wait=0.0))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=get, name="trickled-get", daemon=True)
    worker.start()
    worker.join(BOUND)
    try:
        if worker.is_alive():
            client.abort()  # frees the thread, so that the test fails instead of hanging
            worker.join(BOUND)
            pytest.fail(f"a request to a server trickling its answer was still running after {BOUND:g} s")
        [error] = outcome
        assert isinstance(error, HttpRequestTimeout), repr(error)
        url = f"http://127.0.0.1:{server.port}/v1/task/{T}/results/0/0"
        assert error.url == url and error.limit == LIMIT
        assert f"GET {url}: no complete answer within 0.5 s" in str(error)
        assert "connection closed" in str(error)
        assert server.trickle_closed.wait(BOUND), "the client kept the trickling connection open"

        # The same client, the server now answering: a new connection, kept alive across requests.
        for _ in range(2):
            res = client.get(T, 0, 0, max_wait=0.0)
            assert res.pages == (b"page",) and res.complete
        assert server.connections == 2 and server.good_requests == 2
    finally:
        client.close()


def test_fetch_reports_the_limit_and_url_of_a_trickled_answer(server: TricklingThenGoodServer) -> None:
    client = HttpExchangeClient("127.0.0.1", server.port, timeout=LIMIT)
    answers: queue.Queue[HttpFetched] = queue.Queue()
    job = HttpFetch(job=3, peer="p", task_id=T, buffer_id=0, max_wait=0.0)
    worker = threading.Thread(target=lambda: answers.put(fetch(client, job)), daemon=True)
    worker.start()
    try:
        try:
            answer = answers.get(timeout=BOUND)
        except queue.Empty:
            client.abort()
            worker.join(BOUND)
            pytest.fail(f"fetch of a trickled answer gave no answer in {BOUND:g} s")
        assert answer.job == 3 and answer.code == 0
        url = f"http://127.0.0.1:{server.port}/v1/task/{T}/results/0/0"
        assert answer.error is not None
        assert answer.error.startswith(f"http://{server.address}: GET {url}: no complete answer within 0.5 s")
        worker.join(BOUND)
        assert fetch(client, HttpFetch(job=4, peer="p", task_id=T, buffer_id=0)).pages == (b"page",)
    finally:
        client.close()


def test_a_trickling_server_does_not_keep_the_fetchers_worker(server: TricklingThenGoodServer) -> None:
    """One worker: the trickled request must end and free it for the next job."""
    answers: queue.Queue[HttpFetched] = queue.Queue()
    fetcher = HttpFetcher(answers.put, workers=1, timeout=LIMIT, name="deadline-fetch")
    try:
        fetcher.submit(HttpFetch(job=1, peer="p", task_id=T, buffer_id=0), server.address)
        fetcher.submit(HttpFetch(job=2, peer="p", task_id=T, buffer_id=0), server.address)
        got: list[HttpFetched] = []
        for _ in range(2):
            try:
                got.append(answers.get(timeout=BOUND))
            except queue.Empty:
                pytest.fail(f"the fetcher's only worker gave no answer in {BOUND:g} s: {got}")
        first, second = got
        assert first.job == 1 and first.error is not None and "no complete answer within 0.5 s" in first.error
        assert second.job == 2 and second.error is None and second.pages == (b"page",)
    finally:
        fetcher.close()  # breaks off a request still running (on the old client), joins the worker
    assert not [t for t in threading.enumerate() if t.name.startswith("deadline-fetch") and t.is_alive()]
