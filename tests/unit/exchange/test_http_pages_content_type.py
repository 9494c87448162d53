"""Presto's HTTP exchange (protocol-facts 3.3): an answer with pages is "200 with data ... Content type is the
Presto pages MIME type". A Presto exchange client refuses a page response of any other media type."""

from __future__ import annotations

import pytest

from sparkbus.bus.http_exchange import PAGES_CONTENT_TYPE
from sparkbus.roles.exchange import OutputBuffers

from .http_stub import ask, publish, serving

pytestmark = pytest.mark.integration

T = "q7.2.0.0"


def test_a_pages_answer_has_the_presto_pages_media_type() -> None:
    assert PAGES_CONTENT_TYPE.lower() == "application/x-presto-pages"
    with serving(OutputBuffers(instance_id="inst-1")) as server:
        publish(server, T, [b"page"])
        answer = ask(server, "GET", T, 0)
    assert answer.status == 200 and answer.body
    assert answer.headers.get("content-type", "").lower() == "application/x-presto-pages"
