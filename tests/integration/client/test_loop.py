"""The client's loop thread over real sockets (127.0.0.1, a timeout on every wait): a bad argument or a bad
reply fails that one call with a clear ``ClientError``, and the loop thread serves on."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

import sparkbus
from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
from sparkbus.bus.messages import ErrorCode
from sparkbus.bus.node import Node
from sparkbus.roles.client import ClientError, Gateway, Op, Response, encode_response
from sparkbus.roles.query import table_to_ipc

TAG = "loop"


@dataclass
class OneRow:
    """``execute`` answers at once with a one-row table."""

    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            return [c.Reply(call_id=event.call_id, result=table_to_ipc(pa.table({"n": [1]})))]
        return []


def start(gateway: Gateway) -> Node:
    n = Node("n1", BusConfig(cluster_tag=TAG), [OneRow(), gateway])
    n.bind()
    n.start({})
    return n


@pytest.fixture
def control() -> Iterator[str]:
    n = start(Gateway("n1", ["query"]))
    try:
        assert n.endpoints is not None
        yield n.endpoints.control
    finally:
        n.stop()


def test_an_argument_msgpack_cannot_carry_fails_that_call_and_the_loop_serves_on(control: str) -> None:
    with sparkbus.connect([control], cluster_tag=TAG, connect_timeout=5, op_timeout=5) as client:
        with pytest.raises(ClientError) as err:
            client.sql("SELECT ? AS a", parameters=[np.int64(3)], timeout=1)
        assert err.value.code == ErrorCode.MALFORMED, (
            f"{err.value}; the loop thread ended with {client.error!r}"
        )
        assert "an argument cannot be sent" in err.value.message
        with pytest.raises(ClientError) as err:
            list(client.sql_batches("SELECT ?", parameters=[object()], timeout=1))
        assert err.value.code == ErrorCode.MALFORMED
        assert client.error is None
        assert client.status()["node"] == "n1"
        assert client.sql("SELECT 1").to_pylist() == [{"n": 1}]


BAD_ARROW = {
    "not Arrow IPC": [b"junk"],
    "chunks of two schemas": [table_to_ipc(pa.table({"n": [1]})), table_to_ipc(pa.table({"s": ["x"]}))],
}


@pytest.mark.parametrize("payloads", BAD_ARROW.values(), ids=list(BAD_ARROW))
def test_an_arrow_reply_that_does_not_decode_fails_its_call_and_the_loop_serves_on(
    control: str, payloads: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def bad_arrow(request_id: int, result: Any, error: str | None, chunk_bytes: int, *, arrow: bool) -> Any:
        if not arrow:
            return encode_response(request_id, result, error, chunk_bytes, arrow=arrow)
        last = len(payloads) - 1
        return [
            Response(request_id=request_id, chunk=i, last=i == last, arrow=True, payload=p)
            for i, p in enumerate(payloads)
        ]

    monkeypatch.setattr("sparkbus.roles.client.gateway.encode_response", bad_arrow)  # a bad server reply
    with sparkbus.connect([control], cluster_tag=TAG, connect_timeout=5, op_timeout=5) as client:
        with pytest.raises(ClientError) as err:
            client.call(Op.SQL, {"sql": "select 1"})
        assert err.value.code == ErrorCode.MALFORMED, (
            f"{err.value}; the loop thread ended with {client.error!r}"
        )
        assert "bad result from the node" in err.value.message
        if len(payloads) == 1:
            with pytest.raises(ClientError, match="bad result from the node"):
                list(client.sql_batches("select 1", timeout=1))
        assert client.error is None
        assert client.status()["node"] == "n1"
