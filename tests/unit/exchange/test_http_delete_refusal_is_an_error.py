"""Presto's HTTP exchange (protocol-facts 3.3): "DELETE /v1/task/{taskId}/results/{bufferId}: abort. It is
retried with the same back-off." A DELETE the server refuses (503: its node is stopping) is an error to
the caller, so that the http.client role sends it again; taken as done, the buffer would be left on the
server with its pages."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from sparkbus.bus.contract import HttpFetch
from sparkbus.bus.http_exchange import LoopBuffers
from sparkbus.bus.http_fetch import HttpExchangeClient, HttpExchangeError, fetch

from .http_stub import serving

pytestmark = pytest.mark.integration


def _never(role: str, name: str, args: dict[str, Any]) -> Future[Any]:
    raise AssertionError("a stopped source calls nothing")


def test_a_refused_delete_raises_and_its_fetch_answers_an_error() -> None:
    source = LoopBuffers("n1", _never)
    source.close()  # the node is stopping: every access is answered 503
    with (
        serving(source, max_wait=1.0) as server,
        HttpExchangeClient("127.0.0.1", server.port, timeout=5.0) as client,
    ):
        with pytest.raises(HttpExchangeError) as err:
            client.delete("q1.1.0.0", 0)
        assert err.value.status == 503
        job = HttpFetch(job=1, peer="p", task_id="q1.1.0.0", buffer_id=0, token=3, delete=True)
        answer = fetch(client, job)
        assert answer.error is not None and "503" in answer.error, answer
        assert not answer.complete
