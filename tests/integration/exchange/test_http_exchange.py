"""The HTTP exchange on 127.0.0.1: http.client and curl read the same buffers BinX serves."""

from __future__ import annotations

import http.client
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparkbus.bus import http_fetch
from sparkbus.bus.contract import HttpFetch, HttpFetched
from sparkbus.bus.http_exchange import HttpExchangeServer
from sparkbus.bus.http_fetch import HttpExchangeClient, HttpExchangeError, HttpFetcher
from sparkbus.bus.http_wire import unframe_pages
from sparkbus.roles.exchange import OutputBuffers

pytestmark = pytest.mark.integration

T = "q9.1.0.0"
TIMEOUT = 10.0


@pytest.fixture
def server() -> Iterator[HttpExchangeServer]:
    srv = HttpExchangeServer(OutputBuffers(instance_id="inst-1"), host="127.0.0.1", port=0, max_wait=5.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def client(server: HttpExchangeServer) -> Iterator[HttpExchangeClient]:
    with HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT) as c:
        yield c


def fill(server: HttpExchangeServer, buffer_id: int, pages: list[bytes], finish: bool = True) -> None:
    with server.producer() as src:
        assert isinstance(src, OutputBuffers)
        if (T, buffer_id) not in src:
            src.create(T, buffer_id)
        src.add_pages(T, buffer_id, pages)
        if finish:
            src.no_more_pages(T, buffer_id)


def test_get_tokens_acks_and_completion(server: HttpExchangeServer, client: HttpExchangeClient) -> None:
    fill(server, 0, [b"alpha", b"beta", b"gamma"])
    first = client.get(T, 0, 0, max_bytes=9)
    assert first.status == 200 and first.pages == (b"alpha", b"beta")
    assert (first.token, first.next_token, first.instance_id) == (0, 2, "inst-1")
    assert first.remaining_bytes == (5,) and not first.complete
    again = client.get(T, 0, 0, max_bytes=9)
    assert again.pages == first.pages  # a repeated token re-sends the same pages
    last = client.get(T, 0, 2)
    assert last.pages == (b"gamma",) and last.complete
    with pytest.raises(HttpExchangeError) as err:
        client.get(T, 0, 1)
    assert err.value.status == 410 and err.value.code == 3 and T in err.value.message
    end = client.get(T, 0, 3)
    assert end.status == 204 and end.complete and end.pages == ()


def test_head_probe_ack_delete_and_errors(server: HttpExchangeServer, client: HttpExchangeClient) -> None:
    fill(server, 1, [b"x" * 10, b"y" * 20], finish=False)
    probe = client.probe(T, 1, 0)
    assert probe.status == 200 and probe.remaining_bytes == (10, 20) and probe.pages == ()
    client.acknowledge(T, 1, 1)
    src = server.source
    assert isinstance(src, OutputBuffers) and src.bytes_held == 20
    with pytest.raises(HttpExchangeError) as err:
        client.get("ghost", 4, 0)
    assert err.value.status == 404
    client.delete(T, 1)
    client.delete(T, 1)
    assert src.bytes_held == 0
    assert client.get(T, 1, 1).complete
    with server.producer() as s:
        assert isinstance(s, OutputBuffers)
        s.create(T, 2)
        s.abort(T, 2, "task failed")
    with pytest.raises(HttpExchangeError) as err:
        client.get(T, 2, 0)
    assert err.value.status == 500 and "task failed" in err.value.message


def test_long_poll_wakes_on_pages(server: HttpExchangeServer, client: HttpExchangeClient) -> None:
    fill(server, 3, [], finish=False)
    producer = threading.Timer(0.2, fill, args=(server, 3, [b"late"]))
    producer.start()
    try:
        res = client.get(T, 3, 0, max_wait=TIMEOUT)
    finally:
        producer.join(TIMEOUT)
    assert res.pages == (b"late",) and res.complete


def test_long_poll_expiry_is_204(server: HttpExchangeServer, client: HttpExchangeClient) -> None:
    fill(server, 4, [], finish=False)
    res = client.get(T, 4, 0, max_wait=0.05)
    assert res.status == 204 and not res.complete and res.remaining_bytes == ()


def test_fetch_all_over_one_keep_alive_connection(
    server: HttpExchangeServer, client: HttpExchangeClient
) -> None:
    pages = [bytes([i]) * (i * 100) for i in range(40)]
    fill(server, 5, pages)
    assert client.fetch_all(T, 5, max_bytes=500) == pages
    assert (T, 5) not in server.source  # type: ignore[operator]


class _PausingClient(HttpExchangeClient):
    """Records ``fetch_all``'s pauses instead of sleeping; the third one lets the producer finish."""

    def __init__(self, server: HttpExchangeServer) -> None:
        super().__init__("127.0.0.1", server.port, timeout=TIMEOUT)
        self.server = server
        self.pauses: list[float] = []
        self.gets = 0

    def get(self, *args: Any, **kwargs: Any) -> http_fetch.HttpPages:
        self.gets += 1
        assert self.gets <= 10, "an empty buffer is asked again at once, without a pause"
        return super().get(*args, **kwargs)

    def _pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if len(self.pauses) == 3:
            fill(self.server, 6, [b"late"])


def test_fetch_all_without_a_long_poll_pauses_between_empty_answers(server: HttpExchangeServer) -> None:
    fill(server, 6, [], finish=False)
    with _PausingClient(server) as client:
        assert client.fetch_all(T, 6, max_wait=0.0) == [b"late"]
    assert client.gets == 4 and len(client.pauses) == 3
    assert all(p <= http_fetch.POLL_DELAY for p in client.pauses)


def test_bad_requests_are_refused(server: HttpExchangeServer, client: HttpExchangeClient) -> None:
    conn = client
    resp, body = conn._request("GET", "/v1/task/x/results/0/0", {"X-Presto-Max-Size": "lots"}, 0.0)
    assert resp.status == 400 and b"data size" in body
    resp, _ = conn._request("GET", "/v1/elsewhere", {}, 0.0)
    assert resp.status == 404
    resp, _ = conn._request("DELETE", "/v1/task/x/results/0/5", {}, 0.0)
    assert resp.status == 405
    # a size that is no number: answered 400, not a dropped connection (the handler used to die)
    resp, body = conn._request("GET", "/v1/task/x/results/0/0", {"X-Presto-Max-Size": "9" * 400 + "B"}, 0.0)
    assert resp.status == 400 and b"too large" in body


def test_a_long_poll_on_a_kept_alive_connection_gets_its_own_timeout(server: HttpExchangeServer) -> None:
    """http.client sets a socket's timeout when it connects: a long poll over a connection an ack opened
    timed out after the ack's timeout (0.3 s here) instead of its own (0.3 s + its wait)."""
    fill(server, 7, [], finish=False)
    with HttpExchangeClient("127.0.0.1", server.port, timeout=0.3) as c:
        c.acknowledge(T, 7, 0)
        assert c.get(T, 7, 0, max_wait=0.8).status == 204


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_reads_a_buffer(server: HttpExchangeServer) -> None:
    fill(server, 6, [b"hello", b"curl"])
    url = f"http://127.0.0.1:{server.port}/v1/task/{T}/results/6/0"
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-D", "-", "-H", "X-Presto-Max-Size: 1MB", url],
        capture_output=True,
        timeout=TIMEOUT + 5,
        check=True,
    ).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    headers = head.decode().lower()
    assert headers.startswith("http/1.1 200")
    assert "x-presto-page-sequence-id: 0" in headers and "x-presto-page-end-sequence-id: 2" in headers
    assert "x-presto-buffer-complete: true" in headers
    assert unframe_pages(body) == [b"hello", b"curl"]
    deleted = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
            url[: url.rindex("/")],
        ],
        capture_output=True,
        timeout=TIMEOUT + 5,
        check=True,
    ).stdout
    assert deleted == b"204"


# ---------------------------------------------------------------- a server that never answers a connect

NEVER = 600.0  # a client timeout no test waits out: only an abort ends these connects


@pytest.fixture
def unanswered() -> Iterator[int]:
    """A port whose connects get no answer: a listener with a backlog of 0, filled by connects never
    accepted, so the kernel drops further SYNs and a connect waits (as to a host that is down)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        yield port
    finally:
        for s in fillers:
            s.close()
        srv.close()


@pytest.fixture
def connecting(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a client starts to connect (the real connect follows)."""
    started = threading.Event()
    real = http_fetch._connect

    def connect(sock: socket.socket, addr: Any, timeout: float | None, aborted: Callable[[], bool]) -> None:
        started.set()
        real(sock, addr, timeout, aborted)

    monkeypatch.setattr(http_fetch, "_connect", connect)
    return started


def test_a_connect_that_gets_no_answer_times_out(unanswered: int) -> None:
    with HttpExchangeClient("127.0.0.1", unanswered, timeout=0.5) as c, pytest.raises(TimeoutError):
        c.probe(T, 1, 0)


def test_abort_breaks_off_a_connect_that_gets_no_answer(unanswered: int, connecting: threading.Event) -> None:
    client = HttpExchangeClient("127.0.0.1", unanswered, timeout=NEVER)
    errors: list[BaseException] = []

    def get() -> None:
        try:
            client.get(T, 1, 0, max_bytes=1, max_wait=0.0)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=get, daemon=True)
    t.start()
    assert connecting.wait(TIMEOUT)
    client.abort()
    t.join(TIMEOUT)
    assert not t.is_alive(), "the connect went on after the abort"
    assert len(errors) == 1 and isinstance(errors[0], ConnectionAbortedError)
    with pytest.raises(ConnectionAbortedError, match="aborted"):
        client.probe(T, 1, 0)  # an aborted client makes no more requests


def test_fetcher_close_breaks_off_a_fetch_still_connecting(
    unanswered: int, connecting: threading.Event
) -> None:
    delivered: list[HttpFetched] = []
    fetcher = HttpFetcher(delivered.append, workers=1, timeout=NEVER, name="test-fetch")
    fetcher.submit(HttpFetch(job=1, peer="p", task_id=T, buffer_id=1), f"127.0.0.1:{unanswered}")
    assert connecting.wait(TIMEOUT)
    done = threading.Thread(target=fetcher.close, daemon=True)
    done.start()
    done.join(TIMEOUT)
    assert not done.is_alive(), "close waited for a connect that gets no answer"
    assert not [t for t in threading.enumerate() if t.name.startswith("test-fetch") and t.is_alive()]
    assert delivered == []  # answers after close are dropped, as the node has stopped


class _ParkedSource:
    """A ``WaitingSource``, as the node's: ``read_wait`` says the GET reached its long-poll, then holds it
    until the test releases it, as a long-poll parked in the ``binx.server`` role does."""

    def __init__(self) -> None:
        self.buffers = OutputBuffers(instance_id="inst-1")
        self.buffers.create(T, 0)
        self.entered = threading.Event()
        self.release = threading.Event()

    def read_wait(
        self, task_id: str, buffer_id: int, token: int, max_bytes: int, wait: float, **kw: Any
    ) -> Any:
        self.entered.set()
        self.release.wait(TIMEOUT)
        return self.buffers.read(task_id, buffer_id, token, max_bytes, **kw)

    def read(self, *args: Any, **kw: Any) -> Any:
        return self.buffers.read(*args, **kw)

    def acknowledge(self, task_id: str, buffer_id: int, token: int) -> int:
        return int(self.buffers.acknowledge(task_id, buffer_id, token))

    def delete(self, task_id: str, buffer_id: int) -> None:
        self.buffers.delete(task_id, buffer_id)


def test_a_consumer_gone_during_its_long_poll_is_counted_not_printed(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A consumer leaves with its long-poll parked (its node stops and breaks off its requests, its
    process dies, or the request outran its deadline): the answer goes into a reset connection."""
    source = _ParkedSource()
    server = HttpExchangeServer(source, host="127.0.0.1", port=0, max_wait=5.0).start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        sock.sendall(
            f"GET /v1/task/{T}/results/0/0 HTTP/1.1\r\nHost: x\r\nX-Presto-Max-Wait: 5s\r\n\r\n".encode()
        )
        assert source.entered.wait(TIMEOUT), "the GET never reached its long-poll"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # linger 0: a reset, as when the consumer's process dies
        source.buffers.add_pages(T, 0, [b"page"])
        source.release.set()  # the long-poll ends with a page, written into the reset connection
    finally:
        server.close()  # joins every request thread
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert server.counters["disconnects"] == 1 and server.counters["errors"] == 0


class _BrokenSource(_ParkedSource):
    def read_wait(self, *args: Any, **kw: Any) -> Any:
        raise RuntimeError("a bug in the source")


def test_any_other_failure_of_a_request_is_still_printed(capfd: pytest.CaptureFixture[str]) -> None:
    server = HttpExchangeServer(_BrokenSource(), host="127.0.0.1", port=0).start()
    try:
        client = HttpExchangeClient("127.0.0.1", server.port, timeout=TIMEOUT)
        with client, pytest.raises(http.client.RemoteDisconnected):  # no answer: the thread failed
            client.get(T, 0, 0)
    finally:
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug in the source" in err, err
    assert server.counters["disconnects"] == 0
