"""Presto's HTTP exchange (protocol-facts 3.3, client invariants): "A response without a next token is valid
only if the body is empty. The client must not roll back its sequence". An empty answer that carries no
``X-Presto-Page-End-Sequence-Id`` leaves the client's token where it was: the next request asks from the
same token, never from 0 (which the server answers 410, its pages acknowledged and gone)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sparkbus.bus.contract import HttpFetch
from sparkbus.bus.http_fetch import HttpExchangeClient, fetch

pytestmark = pytest.mark.integration


class _NoTokenHandler(BaseHTTPRequestHandler):
    """Answers every GET 204 with the buffer still open and no sequence headers."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(204)
        self.send_header("X-Presto-Buffer-Complete", "false")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def port() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NoTokenHandler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10.0)


def test_an_empty_answer_without_a_next_token_keeps_the_token(port: int) -> None:
    with HttpExchangeClient("127.0.0.1", port, timeout=5.0) as client:
        res = client.get("q1.1.0.0", 0, 5)
        assert res.status == 204 and res.pages == () and not res.complete
        assert (res.token, res.next_token) == (5, 5)
        answer = fetch(client, HttpFetch(job=1, peer="p", task_id="q1.1.0.0", buffer_id=0, token=7))
        assert answer.error is None, answer
        assert (answer.token, answer.next_token, answer.pages) == (7, 7, ())
