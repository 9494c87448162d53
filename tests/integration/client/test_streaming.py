"""Streamed SQL results over real sockets: batches are handed out while the rest is still on its way, at
most ``window`` chunks held by the client, and a TCP break mid-stream loses or repeats no row."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

import sparkbus
from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node
from sparkbus.roles.client import Gateway
from sparkbus.roles.query import QueryRole, table_to_ipc
from sparkbus.topologies.client import Client

from .proxy import Proxy
from .test_client import until

TAG = "stream-it"
ROWS = 20_000  # 160 000 bytes of int64: about 40 chunks of 4 KiB
WINDOW = 2


@pytest.fixture
def proxied() -> Iterator[Proxy]:
    n = Node(
        "n1", BusConfig(cluster_tag=TAG), [QueryRole("n1", incarnation="a"), Gateway("n1", chunk_bytes=4096)]
    )
    ep = n.bind()
    n.start({})
    host, port = ep.control.removeprefix("tcp://").rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    try:
        data = pa.table({"i": pa.array(range(ROWS), pa.int64())})
        n.call("query", "load", {"table": "t", "batches": [table_to_ipc(data)]}, timeout=10)
        yield proxy
    finally:
        proxy.close()
        n.stop()


def progress(client: Client) -> tuple[int, int]:
    """(chunks received, chunks consumed) of the one stream running."""
    ops = client._on_loop(
        lambda: [(op.received, op.consumed) for op in client.core.ops.values() if op.stream]
    )
    assert len(ops) <= 1
    return ops[0] if ops else (-1, -1)


def test_sql_batches_stream_within_the_window_and_survive_a_break(proxied: Proxy) -> None:
    with sparkbus.connect([proxied.address], cluster_tag=TAG, window=WINDOW, connect_timeout=10) as client:
        rows: list[int] = []
        broke = False
        batches = client.sql_batches("SELECT i FROM t")
        for batch in batches:
            rows += batch.column("i").to_pylist()
            received, consumed = progress(client)
            if received >= 0:  # the stream is not complete: what is held is bounded by the window
                assert received - consumed <= WINDOW  # the chunk being read now included
            if not broke and len(rows) > ROWS // 3:
                assert received != -1, "the whole result had arrived before a third of it was read"
                proxied.down()
                until(lambda: link_state(client) != "up")
                proxied.up()
                broke = True
        assert broke
        assert sorted(rows) == list(range(ROWS))  # every row, once
        assert client.status_of_links()[proxied.address] == 1  # restored, not reconnected afresh


def link_state(client: Client) -> str:
    return str(client._on_loop(lambda: next(iter(client.core.links.values())).state))


def test_load_takes_a_table_of_several_chunks_and_replace(proxied: Proxy) -> None:
    """``client.load`` sends one IPC stream per record batch: the role decodes exactly one batch from
    each, so a table of several chunks (what a concatenation or a Parquet read gives) was refused whole."""
    first = pa.table({"k": [1, 2], "v": ["a", "b"]})
    second = pa.table({"k": [3], "v": ["c"]})
    chunked = pa.concat_tables([first, second])
    assert chunked.column("k").num_chunks == 2
    with sparkbus.connect([proxied.address], cluster_tag=TAG, connect_timeout=10) as client:
        assert client.load("m", chunked) == 3
        assert client.load("m", second) == 4  # added to the rows there
        got = client.sql("SELECT k, v FROM m ORDER BY k, v")
        assert got.column("k").to_pylist() == [1, 2, 3, 3]
        assert got.column("v").to_pylist() == ["a", "b", "c", "c"]
        assert client.load("m", first, replace=True) == 2  # in their place
        assert client.load("e", first.slice(0, 0)) == 0  # no rows: a table of the columns
        assert client.sql("SELECT COUNT(*) AS n FROM e").column("n").to_pylist() == [0]
