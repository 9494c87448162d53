"""The thin client over real sockets: a Node with the gateway, and a TCP proxy the test breaks."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa
import pytest

import sparkbus
from sparkbus.bus import BusConfig
from sparkbus.bus import contract as c
from sparkbus.bus.messages import ErrorCode
from sparkbus.bus.node import Node
from sparkbus.roles.client import (
    RETRY_NONE,
    ClusterMismatchError,
    ConnectionUnknownError,
    Gateway,
    node_order,
)
from sparkbus.roles.query import table_to_ipc

from .proxy import Proxy

TAG = "it"


@dataclass
class SlowQuery:
    """``execute`` answers after ``delay`` seconds; ``replied`` is set when it has."""

    delay: float = 0.5
    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()
    calls: list[str] = field(default_factory=list)
    replied: threading.Event = field(default_factory=threading.Event)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.calls.append(event.args.get("sql", ""))
            return [c.SetTimer(key=str(event.call_id), at=now + self.delay)]
        if isinstance(event, c.TimerFired):
            self.replied.set()
            body = table_to_ipc(pa.table({"n": [len(self.calls)]}))
            return [c.Reply(call_id=int(event.key), result=body)]
        return []


def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition the other side makes true (not a timing assumption)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.005)


@pytest.fixture
def node() -> Iterator[tuple[Node, SlowQuery, Gateway, Proxy]]:
    query, gateway = SlowQuery(), Gateway("n1", restore_timeout=1.0)
    n = Node("n1", BusConfig(cluster_tag=TAG), [query, gateway])
    ep = n.bind()
    n.start({})
    host, port = ep.control.removeprefix("tcp://").rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    try:
        yield n, query, gateway, proxy
    finally:
        proxy.close()
        n.stop()


def gateway_status(n: Node) -> dict[str, int]:
    st = n.call("client.gateway", "status", timeout=5)
    return {"detached": st["detached"], **st["counters"]}


def test_broken_mid_query_and_restored_before_the_timeout_delivers_once(
    node: tuple[Node, SlowQuery, Gateway, Proxy],
) -> None:
    n, query, _, proxy = node
    with sparkbus.connect([proxy.address], cluster_tag=TAG, connect_timeout=10) as client:
        fut = client.submit(sparkbus.topologies.client.Op.SQL, {"sql": "select 1", "participants": ["n1"]})
        until(lambda: len(query.calls) == 1)
        proxy.down()
        until(query.replied.is_set)  # the result is ready while the client is cut off
        proxy.up()
        result = fut.result(timeout=15)
        assert result.to_pylist() == [{"n": 1}]
        assert gateway_status(n)["restored"] == 1
        assert query.calls == ["select 1"]
        assert client.status()["client"][proxy.address]["restores"] == 1


def test_broken_past_the_timeout_is_a_clear_error(node: tuple[Node, SlowQuery, Gateway, Proxy]) -> None:
    n, query, _, proxy = node
    with sparkbus.connect([proxy.address], cluster_tag=TAG, connect_timeout=10, retry=RETRY_NONE) as client:
        fut = client.submit(sparkbus.topologies.client.Op.SQL, {"sql": "select 1", "participants": ["n1"]})
        until(lambda: len(query.calls) == 1)
        proxy.down()
        until(lambda: gateway_status(n)["released"] == 1)  # the node gave the connection up
        proxy.up()
        with pytest.raises(ConnectionUnknownError, match="connection unknown"):
            fut.result(timeout=15)
        assert client.status()["node"] == "n1"  # a new logical connection serves on


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_first_address_dead_second_alive(node: tuple[Node, SlowQuery, Gateway, Proxy]) -> None:
    n, _, _, _ = node
    assert n.endpoints is not None
    dead, live = f"127.0.0.1:{free_port()}", n.endpoints.control
    seed = next(s for s in range(100) if node_order([dead, live], random.Random(s))[0] == dead)
    with sparkbus.connect([dead, live], cluster_tag=TAG, seed=seed, connect_timeout=10) as client:
        assert client.status()["node"] == "n1"
        assert (
            "no connection" in client.core.attempts().splitlines()[0] or "refused" in client.core.attempts()
        )


def test_no_live_address_times_out_listing_what_was_tried() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(sparkbus.ConnectTimeoutError, match=dead):
        sparkbus.connect([dead], cluster_tag=TAG, connect_timeout=3, handshake_timeout=0.3)


def test_another_clusters_node_is_refused_with_cluster_id_mismatch(
    node: tuple[Node, SlowQuery, Gateway, Proxy],
) -> None:
    n, _, _, _ = node
    assert n.endpoints is not None
    dead = f"127.0.0.1:{free_port()}"
    # IEP-90: a user error, and final: not CONNECTION, which a caller's retry logic takes as passing
    with pytest.raises(ClusterMismatchError) as err:
        sparkbus.connect([dead, n.endpoints.control], cluster_tag="other", connect_timeout=5)
    assert err.value.code == ErrorCode.CLUSTER_ID_MISMATCH
    assert "tried:" in err.value.message and dead in err.value.message


def test_async_client_runs_sql(node: tuple[Node, SlowQuery, Gateway, Proxy]) -> None:
    import asyncio

    n, _, _, _ = node
    assert n.endpoints is not None

    async def main() -> pa.Table:
        client = await sparkbus.connect_async([n.endpoints.control], cluster_tag=TAG)  # type: ignore[union-attr]
        async with client:
            return await client.sql("select 1")

    assert asyncio.run(main()).to_pylist() == [{"n": 1}]
