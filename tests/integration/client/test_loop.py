"""The client's loop thread over real sockets (127.0.0.1, a timeout on every wait): a bad argument or a bad
reply fails that one call with a clear ``ClientError``, and the loop thread serves on; ``close`` completes
every operation."""

from __future__ import annotations

import asyncio
import threading
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
from sparkbus.roles.client import (
    ArrowParts,
    ClientConnectionError,
    ClientError,
    Gateway,
    Op,
    Response,
    encode_response,
)
from sparkbus.roles.query import table_to_ipc
from sparkbus.topologies.client import OPERATION_TIMEOUT, AsyncClient, Client

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


@dataclass
class NoAnswer:
    """``execute`` never answers."""

    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        return []


def start(gateway: Gateway, query: OneRow | NoAnswer | None = None) -> Node:
    n = Node("n1", BusConfig(cluster_tag=TAG), [query or OneRow(), gateway])
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
        fut = client.submit(Op.SQL, {"sql": "select 1"})
        exc = fut.exception(timeout=5)  # decoded here: the same error from exception() and result()
        assert isinstance(exc, ClientError) and exc.code == ErrorCode.MALFORMED, exc
        with pytest.raises(ClientError, match="bad result from the node"):
            fut.result()
        with pytest.raises(ClientError, match="bad result from the node"):
            asyncio.run(asyncio.wait_for(AsyncClient(client).call(Op.SQL, {"sql": "select 1"}), 10))
        assert client.error is None
        assert client.status()["node"] == "n1"


def test_an_arrow_reply_is_decoded_by_the_thread_that_asks_for_it_never_by_the_loop_thread(
    control: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop thread also sends the heartbeats and carries every other call: a large result decoded
    there would hold all of them up."""
    decoders: list[int] = []
    table = ArrowParts.table

    def recorded(parts: ArrowParts) -> pa.Table:
        decoders.append(threading.get_ident())
        return table(parts)

    monkeypatch.setattr(ArrowParts, "table", recorded)
    with sparkbus.connect([control], cluster_tag=TAG, connect_timeout=5, op_timeout=5) as client:
        assert client.sql("select 1").to_pylist() == [{"n": 1}]
        assert decoders == [threading.get_ident()]
        asked: list[int] = []

        def ask() -> None:
            fut = client.submit(Op.SQL, {"sql": "select 1"})
            assert fut.result(timeout=5).num_rows == 1
            asked.append(threading.get_ident())

        other = threading.Thread(target=ask)
        other.start()
        other.join(10)
        assert asked and decoders[1] == asked[0]

        async def on_asyncio() -> int:
            assert (await AsyncClient(client).sql("select 1")).num_rows == 1
            return threading.get_ident()

        event_loop = asyncio.run(asyncio.wait_for(on_asyncio(), 10))
        assert len(decoders) == 3 and decoders[2] != event_loop  # off the event loop too (a worker thread)
        assert client._thread.ident not in decoders
        assert client.error is None


def test_close_fails_every_pending_operation_with_a_connection_error_and_refuses_new_ones() -> None:
    n = start(Gateway("n1", ["query"]), NoAnswer())
    try:
        assert n.endpoints is not None
        client = sparkbus.connect([n.endpoints.control], cluster_tag=TAG, connect_timeout=5)
        fut = client.submit(Op.SQL, {"sql": "select 1"})
        streamed: list[BaseException] = []

        def read_stream() -> None:
            try:
                list(client.sql_batches("select 2", timeout=10))
            except BaseException as exc:
                streamed.append(exc)

        reader = threading.Thread(target=read_stream)
        reader.start()
        client._on_loop(lambda: None)  # the loop has taken the SQL operation: it is sent and pending
        pause = threading.Event()  # never set: a bounded wait between looks
        for _ in range(500):  # the reader's stream is pending on the loop too
            if client._on_loop(lambda: len(client._streams)):
                break
            pause.wait(0.01)
        client.close()
        reader.join(10)
        assert not reader.is_alive()
        assert len(streamed) == 1 and isinstance(streamed[0], ClientConnectionError), streamed
        exc = fut.exception(timeout=5)
        # CONNECTION, as Ignite's "Channel is closed": not OPERATION_TIMEOUT, whose op_timeout never passed
        assert isinstance(exc, ClientConnectionError) and exc.code == ErrorCode.CONNECTION, exc
        assert exc.message == "client closed"
        with pytest.raises(ClientConnectionError, match="client closed"):
            client.submit(Op.STATUS)
    finally:
        n.stop()


class HeldLoop:
    """Holds the client's loop thread in its next tick until ``release`` (at most ``hold`` seconds): the
    loop takes no command meanwhile, deterministically."""

    def __init__(self, client: Client, hold: float = 10.0) -> None:
        self.in_tick, self.release = threading.Event(), threading.Event()
        tick = client.core.tick
        held = [False]

        def held_tick(now: float) -> None:
            if not held[0]:
                held[0] = True
                self.in_tick.set()
                self.release.wait(hold)
            tick(now)

        client.core.tick = held_tick  # type: ignore[method-assign]
        client._wake()
        assert self.in_tick.wait(5)


def test_an_operation_handed_over_as_close_begins_completes(control: str) -> None:
    """A submit queued after the loop ran its commands for this turn, before it sees the stop. Made
    deterministic by holding the loop in its tick while another thread closes the client."""
    client = sparkbus.connect([control], cluster_tag=TAG, connect_timeout=5)
    loop = HeldLoop(client, hold=5)
    fut = client.submit(Op.STATUS)
    closer = threading.Thread(target=client.close)
    closer.start()
    assert client._stopping.wait(5)
    loop.release.set()
    closer.join(10)
    # fut.result() with no timeout, as concurrent.futures callers write it, would otherwise wait for ever
    exc = fut.exception(timeout=5)
    assert isinstance(exc, ClientConnectionError) and exc.message == "client closed", exc


def test_a_stream_the_loop_does_not_start_in_time_is_an_operation_timeout_and_never_starts(
    control: str,
) -> None:
    """Waiting for the loop thread to take a stream (or to answer ``status``) ends in the client's own
    OPERATION_TIMEOUT naming what timed out, never a bare ``TimeoutError``; the abandoned stream is not
    started when the loop gets to it, and the client serves on."""
    with sparkbus.connect([control], cluster_tag=TAG, connect_timeout=5, op_timeout=0.5) as client:
        loop = HeldLoop(client)
        try:
            with pytest.raises(ClientError) as err:
                next(client.stream(Op.SQL, {"sql": "select 1"}, timeout=0.2))
            assert err.value.code == OPERATION_TIMEOUT, repr(err.value)
            assert "SQL" in err.value.message and "not start" in err.value.message, err.value.message
            with pytest.raises(ClientError) as err:
                client.status_of_links()
            assert err.value.code == OPERATION_TIMEOUT and "status_of_links" in err.value.message, err.value
        finally:
            loop.release.set()
        assert client._on_loop(lambda: (len(client._streams), len(client.core.ops))) == (0, 0)
        assert client.sql("select 1").to_pylist() == [{"n": 1}]
        assert client.error is None
