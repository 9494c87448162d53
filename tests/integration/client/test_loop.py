"""The client's loop thread over real sockets (127.0.0.1, a timeout on every wait): a bad argument or a bad
reply fails that one call with a clear ``ClientError``, and the loop thread serves on."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

import sparkbus
from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
from sparkbus.bus.messages import ErrorCode
from sparkbus.bus.node import Node
from sparkbus.roles.client import ClientError, Gateway
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
