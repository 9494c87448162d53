"""The Spark runtime's channel between the driver and the barrier tasks: where it binds, whom it admits,
and what it does with a message that is not a task's. No Spark job runs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from sparkbus.bus import security
from sparkbus.topologies.model import Topology
from sparkbus.topologies.schema import load, loads, shipped
from sparkbus.topologies.spark_channel import DriverChannel, task_socket

from .zmq_peers import WAIT_MS, Sockets, handshake

NODES = ("store-0", "store-1", "store-2", "store-3")


def curve_topology(tmp_path: Path, allow: list[str]) -> Topology:
    """``cluster.example.toml`` with a key directory of its own (every node's pair) and ``allow``."""
    keys = tmp_path / "keys"
    text = shipped("cluster.example.toml").read_text().replace("/etc/sparkbus/keys", str(keys))
    topo = loads(re.sub(r"(?m)^allow = .*$", f"allow = {json.dumps(allow)}", text))
    security.generate(keys, topo.node_ids())
    return topo


@pytest.fixture
def zsockets() -> Iterator[Sockets]:
    with Sockets() as made:
        yield made


@pytest.fixture
def channels() -> Iterator[list[DriverChannel]]:
    opened: list[DriverChannel] = []
    try:
        yield opened
    finally:
        for channel in opened:
            channel.close()


class _Conf:
    def get(self, key: str, default: str | None = None) -> str | None:
        return "10s" if key == "spark.barrier.sync.timeout" else default


def stand_in_session() -> Any:
    """Enough of a SparkSession for SparkRuntime's constructor."""
    return type("Session", (), {"sparkContext": type("SC", (), {"getConf": lambda _: _Conf()})()})()


def received(channel: DriverChannel) -> tuple[str, str, dict[str, Any]] | None:
    assert channel.poll(WAIT_MS), "nothing arrived"
    return channel.receive()


def test_a_curve_channel_binds_in_bus_ports_and_admits_no_address_outside_allow(
    tmp_path: Path, zsockets: Sockets, channels: list[DriverChannel]
) -> None:
    topo = curve_topology(tmp_path, ["10.0.0.11"])  # not this machine's loopback
    channels.append(channel := DriverChannel(topo, NODES, "127.0.0.1", "127.0.0.1"))
    assert topo.bus.ports is not None
    assert topo.bus.ports.first <= int(channel.endpoint.rsplit(":", 1)[1]) <= topo.bus.ports.last
    # The node's own key pair, from an address outside the allow list: refused by ZAP.
    task = zsockets.add(task_socket(zsockets.ctx, topo, "store-0"))
    assert handshake(task, channel.endpoint) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    # No CURVE at all: refused by the mechanism.
    plain = zsockets.dealer(b"store-0")
    assert handshake(plain, channel.endpoint) == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    assert not channel.poll(0)  # neither connection carries a message: DEALER has nowhere to send one


def test_a_curve_channel_takes_a_nodes_messages_on_its_own_key_only(
    tmp_path: Path, zsockets: Sockets, channels: list[DriverChannel]
) -> None:
    topo = curve_topology(tmp_path, ["127.0.0.1"])
    channels.append(channel := DriverChannel(topo, NODES, "127.0.0.1", "127.0.0.1"))
    # store-1's key pair speaking as store-0: admitted (the key is the cluster's), its messages dropped.
    impostor = zsockets.add(task_socket(zsockets.ctx, topo, "store-1"))
    impostor.setsockopt(zmq.IDENTITY, b"store-0")
    assert handshake(impostor, channel.endpoint) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    impostor.send_multipart([b"failed", b'{"error": "spoofed"}'])
    assert received(channel) is None
    task = zsockets.add(task_socket(zsockets.ctx, topo, "store-1"))
    assert handshake(task, channel.endpoint) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    task.send_multipart([b"ended", b"{}"])
    assert received(channel) == ("store-1", "ended", {})
    channel.send("store-1", "abort", {"cause": "test"})
    assert task.poll(WAIT_MS) and task.recv_multipart() == [b"abort", b'{"cause": "test"}']


def test_a_message_that_is_not_a_tasks_is_dropped(zsockets: Sockets, channels: list[DriverChannel]) -> None:
    topo = load(shipped("local.toml"))
    channels.append(channel := DriverChannel(topo, ("store-0", "store-1"), "127.0.0.1", "127.0.0.1"))
    stranger = zsockets.dealer(b"store-9")
    stranger.connect(channel.endpoint)
    stranger.send_multipart([b"failed", b'{"error": "not a node of the stage"}'])
    assert received(channel) is None
    task = zsockets.dealer(b"store-0")
    task.connect(channel.endpoint)
    for frames in (
        [b"failed"],
        [b"failed", b"{}", b"{}"],
        [b"crashed", b"{}"],
        [b"failed", b"not json"],
        [b"failed", b'["a list"]'],
        [b"ready", b'{"pid": 7}'],
    ):
        task.send_multipart(frames)
    assert [received(channel) for _ in range(6)] == [None] * 5 + [("store-0", "ready", {"pid": 7})]


def test_a_task_event_whose_fields_are_wrong_is_dropped() -> None:
    pytest.importorskip("pyspark")
    from sparkbus.topologies.probe import ProbeFactory
    from sparkbus.topologies.spark import SparkRuntime

    session = stand_in_session()
    rt = SparkRuntime(load(shipped("local.toml")), session, ProbeFactory())
    rt._on_task_event("store-0", "bound", {"control": 5, "data": "tcp://x:1"})
    rt._on_task_event("store-0", "ready", {"pid": "seven"})
    rt._on_task_event("store-0", "ready", {"marks": {"node_built": "noon"}})
    rt._on_task_event("store-0", "rows", {"endpoint": ["tcp://x:1"]})
    rt._on_task_event("store-0", "failed", {"cause": "no 'error'"})
    assert (rt.endpoints, rt.worker_pids, rt._progress.bound, rt._progress.ready) == ({}, {}, set(), set())
    assert rt._progress.seen == {"store-0"}


def test_a_curve_topology_takes_a_router_that_exchanges_rows(tmp_path: Path) -> None:
    # The tasks' row exchange speaks CURVE like the bus (test_row_exchange.py): nothing to refuse.
    pytest.importorskip("pyspark")
    from sparkbus.topologies.probe import ProbeFactory
    from sparkbus.topologies.spark import SparkRuntime

    data = type("Routed", (), {"router": type("Router", (), {"exchange": True})()})()
    rt = SparkRuntime(curve_topology(tmp_path, []), stand_in_session(), ProbeFactory(), data=data)
    assert rt.topology.bus.security.mode == "curve" and rt.data.router.exchange is True
