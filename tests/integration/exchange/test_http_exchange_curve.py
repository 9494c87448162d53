"""Under CURVE a node serves no HTTP exchange: it is plain HTTP, neither encrypted nor authenticated, and would
hand the ``binx.server`` buffers to anyone who reaches its port, around the keys and the address list."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkbus.bus import BusConfig, security
from sparkbus.bus.config import CurveSettings
from sparkbus.bus.node import Node
from sparkbus.roles.exchange import BinxServer, OutputBuffers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _listening() -> set[int]:
    """The TCP ports this process listens on (IPv4 and IPv6), read from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _node(config: BusConfig) -> Node:
    return Node("a", config, [BinxServer(OutputBuffers(instance_id="a"))])


@pytest.fixture
def curve(tmp_path: Path) -> BusConfig:
    security.generate(tmp_path / "keys", ["a"])
    # allow names an address that is not loopback: nothing from 127.0.0.1 may get in
    settings = CurveSettings(key_dir=str(tmp_path / "keys"), allow_addresses=("10.9.9.9",))
    return BusConfig(cluster_tag="curve-http", curve=settings)


@contextmanager
def _started(config: BusConfig) -> Iterator[tuple[Node, set[int]]]:
    before = _listening()
    node = _node(config)
    node.bind()
    node.start({})
    try:
        yield node, _listening() - before
    finally:
        node.stop()


def test_a_curve_node_running_binx_server_listens_on_its_bus_ports_only(curve: BusConfig) -> None:
    with _started(curve) as (node, opened):
        assert node.endpoints is not None
        assert opened == {_port(node.endpoints.control), _port(node.endpoints.data)}


def test_a_curve_node_advertises_no_http_exchange(curve: BusConfig) -> None:
    with _started(curve) as (node, _):
        assert node.endpoints is not None and node.endpoints.http == ""
        assert "http" not in node.endpoints.to_json()  # what its peers and the state file learn
        assert "http" not in node.status(timeout=5)["endpoints"]


def test_without_curve_the_node_serves_the_http_exchange_as_before() -> None:
    with _started(BusConfig(cluster_tag="plain-http")) as (node, opened):
        assert node.endpoints is not None and node.endpoints.http
        ports = {_port(node.endpoints.control), _port(node.endpoints.data), _port(node.endpoints.http)}
        assert opened == ports
