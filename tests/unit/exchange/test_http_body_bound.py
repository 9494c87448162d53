"""The HTTP exchange client takes answer bodies up to a bound, and every job of the fetcher is answered.

A server that declares a body no node can hold (``Content-Length`` of a TiB), or streams one without end,
made ``HttpExchangeClient`` allocate what it declared (``MemoryError`` out of ``fetch``), so the driver's
worker never answered its job, and the connection went back to the pool with the rest of the answer on
it, failing the next job to that server. These tests run a loopback server that answers each request
with the next canned answer; every wait is bounded by ``TIMEOUT``, which only detects a hang.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from sparkbus.bus.contract import HttpFetch, HttpFetched
from sparkbus.bus.http_fetch import HttpAnswerTooLarge, HttpExchangeClient, HttpFetcher, fetch
from sparkbus.bus.http_wire import frame_pages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = "q9.1.0.0"
TIMEOUT = 5.0
HEADERS = (
    b"X-Presto-Task-Instance-Id: i\r\nX-Presto-Page-Sequence-Id: 0\r\nX-Presto-Buffer-Complete: false\r\n"
)
EMPTY = b"HTTP/1.1 204 No Content\r\n" + HEADERS + b"X-Presto-Page-End-Sequence-Id: 0\r\n\r\n"
# 1 TiB declared, 4 bytes sent: a server that lies, or one that would send without end.
HUGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/X-presto-pages\r\nContent-Length: 1099511627776\r\n"
    + HEADERS
    + b"X-Presto-Page-End-Sequence-Id: 1\r\n\r\n\x00\x00\x00\x00"
)


def chunked(body: bytes, piece: int) -> bytes:
    """A 200 answer of one page whose body is sent in chunks of ``piece`` bytes."""
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + piece]), body[i : i + piece]) for i in range(0, len(body), piece)
    )
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/X-presto-pages\r\nTransfer-Encoding: chunked\r\n"
        + HEADERS
        + b"X-Presto-Page-End-Sequence-Id: 1\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )


class CannedServer:
    """Answers the requests it reads, in order, with ``answers``; then every later one with ``EMPTY``.
    A connection ends when the client closes it, or after an answer saying ``Connection: close``."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # every wait looks at the stop flag this often
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="canned-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(0.1)
            with conn:
                while not self._stop.is_set():
                    try:
                        if not conn.recv(65536):  # one request head (the client sends no body)
                            break
                        answer = self.answers.pop(0) if self.answers else EMPTY
                        conn.sendall(answer)
                        if b"Connection: close" in answer:
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        self._listener.close()
        assert not self._thread.is_alive(), "the server thread did not stop"


Canned = Callable[[list[bytes]], CannedServer]


@pytest.fixture
def canned() -> Iterator[Canned]:
    servers: list[CannedServer] = []

    def make(answers: list[bytes]) -> CannedServer:
        servers.append(CannedServer(answers))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def job(n: int) -> HttpFetch:
    return HttpFetch(job=n, peer="p", task_id=T, buffer_id=0, token=0, max_bytes=1024, max_wait=0.0)


def test_a_declared_body_over_the_bound_is_an_error_answer_and_the_client_goes_on(
    canned: Canned,
) -> None:
    server = canned([HUGE])
    with HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT) as client:
        answer = fetch(client, job(1))  # raised MemoryError out of fetch
        assert answer.job == 1 and answer.code == 0 and answer.error is not None
        url = f"http://127.0.0.1:{server.port}/v1/task/{T}/results/0/0"
        assert answer.error == (
            f"http://127.0.0.1:{server.port}: GET {url}: the answer declares 1099511627776 bytes, "
            f"more than the {client.max_body_bytes} the client takes; connection closed"
        )
        assert fetch(client, job(2)).error is None  # on a new connection
    assert server.connections == 2


@pytest.mark.parametrize("sent", [1000, 1001], ids=["at-the-bound", "one-byte-over"])
def test_a_chunked_body_is_read_in_pieces_up_to_the_bound(canned: Canned, sent: int) -> None:
    body = frame_pages([b"x" * (sent - 4)])
    server = canned([chunked(body, 300)])
    with HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT, max_body_bytes=1000) as client:
        if sent <= 1000:
            assert client.get(T, 0, 0).pages == (b"x" * 996,)
        else:
            with pytest.raises(
                HttpAnswerTooLarge, match="sends a body of more than the 1000 bytes the client takes"
            ):
                client.get(T, 0, 0)
        assert client.get(T, 0, 0).status == 204  # the connection after a refused body is a new one
    assert server.connections == (1 if sent <= 1000 else 2)


def test_a_body_cut_short_is_an_incomplete_read_not_fewer_pages(canned: Canned) -> None:
    body = frame_pages([b"a", b"b"])
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body) + HEADERS
    short = head + b"X-Presto-Page-End-Sequence-Id: 2\r\nConnection: close\r\n\r\n" + body[:5]
    server = canned([short])
    with HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT) as client:
        with pytest.raises(http.client.IncompleteRead):
            client.get(T, 0, 0)
        assert client.get(T, 0, 0).status == 204


def test_the_fetcher_answers_every_job_and_pools_no_connection_left_mid_answer(
    canned: Canned,
) -> None:
    server = canned([HUGE])
    answers: list[HttpFetched] = []
    got = threading.Condition()

    def deliver(answer: HttpFetched) -> None:
        with got:
            answers.append(answer)
            got.notify_all()

    fetcher = HttpFetcher(deliver, workers=1, timeout=TIMEOUT)
    try:
        fetcher.submit(job(1), f"127.0.0.1:{server.port}")
        with got:
            assert got.wait_for(lambda: len(answers) == 1, timeout=TIMEOUT), "job 1 was never answered"
        assert answers[0].error is not None
        fetcher.submit(job(2), f"127.0.0.1:{server.port}")  # the same worker, the same server
        with got:
            assert got.wait_for(lambda: len(answers) == 2, timeout=TIMEOUT), "job 2 was never answered"
        assert answers[1].error is None, answers[1].error
    finally:
        fetcher.close()


def test_any_other_failure_of_a_request_is_an_error_answer(
    canned: Canned, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = canned([])
    with HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT) as client:
        assert fetch(client, job(1)).error is None

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug in the client")

        monkeypatch.setattr(client, "get", broken)
        answer = fetch(client, job(2))
        assert answer.job == 2 and answer.code == 0
        assert answer.error == (
            f"http://127.0.0.1:{server.port}: the HTTP exchange request failed: RuntimeError: a bug in the client"
        )
        monkeypatch.undo()
        assert fetch(client, job(3)).error is None
    assert server.connections == 2  # the connection of the failed request was closed
