"""A node's HTTP exchange server on 127.0.0.1, and a bare ``http.client`` request to it (what a Presto
client sends, read as it comes: status, headers and body)."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sparkbus.bus.http_exchange import BufferSource, HttpExchangeServer
from sparkbus.roles.exchange import OutputBuffers


@contextmanager
def serving(source: BufferSource, max_wait: float = 5.0) -> Iterator[HttpExchangeServer]:
    """``source`` served on a free port until the block ends."""
    srv = HttpExchangeServer(source, host="127.0.0.1", port=0, max_wait=max_wait)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def publish(server: HttpExchangeServer, task: str, pages: list[bytes]) -> None:
    """Add ``pages`` to buffer 0 of ``task`` on ``server`` (``OutputBuffers``), creating it at first."""
    with server.producer() as src:
        assert isinstance(src, OutputBuffers)
        if (task, 0) not in src:
            src.create(task, 0)
        src.add_pages(task, 0, pages)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


def ask(server: HttpExchangeServer, method: str, task: str, token: int) -> Answer:
    """``method`` on buffer 0 of ``task`` from ``token``, asking not to wait."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10.0)
    try:
        conn.request(method, f"/v1/task/{task}/results/0/{token}", headers={"X-Presto-Max-Wait": "0s"})
        resp = conn.getresponse()
        body = resp.read()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()
