"""Where a node listens: inside ``bus.ports`` when given, and ipc sockets in a directory of its own."""

from __future__ import annotations

import os
import socket

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node
from sparkbus.bus.sockets import NoFreePort
from sparkbus.roles.exchange.buffers import OutputBuffers
from sparkbus.roles.exchange.server import BinxServer
from sparkbus.topologies.busnode import BusNodeHandle
from sparkbus.topologies.echo import EchoRole
from sparkbus.topologies.runtime import NodeRequest
from sparkbus.topologies.schema import loads

pytestmark = pytest.mark.integration
CONFIG = BusConfig(cluster_tag="bind-test")


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _free_range(size: int) -> tuple[int, int]:
    """A range of ``size`` ports none of which listens now (the kernel's ephemeral ones, tried in turn)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + size > 65535:
            continue
        held = []
        try:
            for port in range(first, first + size):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first, first + size - 1
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no free range found")


def test_a_node_binds_control_data_and_http_inside_its_port_range(nodes: list[Node]) -> None:
    first, last = _free_range(6)
    serves_http = BinxServer(OutputBuffers(instance_id="a"))  # a node with it serves the HTTP exchange
    a = Node("a", CONFIG, [EchoRole(node_id="a"), serves_http], ports=(first, last))
    b = Node("b", CONFIG, [EchoRole(node_id="b")], ports=(first, last))
    nodes += [a, b]
    ea, eb = a.bind(), b.bind()
    bound = [_port(ea.control), _port(ea.data), _port(ea.http), _port(eb.control), _port(eb.data)]
    assert all(first <= p <= last for p in bound) and len(set(bound)) == 5
    a.start({"b": eb})
    b.start({"a": ea})
    a.wait_ready(10)
    assert a.call("echo", "ping", {"peer": "b", "payload": b"x"}, timeout=10)


def test_a_port_range_with_no_free_port_is_a_clear_error(nodes: list[Node]) -> None:
    first, last = _free_range(2)
    held = []
    try:
        for port in (first, last):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        node = Node("a", CONFIG, [EchoRole(node_id="a")], ports=(first, last))
        nodes.append(node)
        with pytest.raises(
            NoFreePort, match=rf"node a \(control\): every port of bus.ports {first}-{last} is in use"
        ):
            node.bind()
    finally:
        for s in held:
            s.close()


def test_ipc_sockets_without_a_directory_get_one_of_their_own_removed_at_stop() -> None:
    one = Node("a", CONFIG, [EchoRole(node_id="a")], transport="ipc")
    two = Node("a", CONFIG, [EchoRole(node_id="a")], transport="ipc")  # another cluster's "a"
    try:
        e1, e2 = one.bind(), two.bind()
        assert e1.control != e2.control and e1.data != e2.data
        where = os.path.dirname(e1.control.removeprefix("ipc://"))
        assert os.path.isdir(where) and where != "/tmp"
        one.start({})
        two.start({})
    finally:
        one.stop()
        two.stop()
    for endpoint in (e1.control, e1.data, e2.control, e2.data):
        assert not os.path.exists(os.path.dirname(endpoint.removeprefix("ipc://")))


def test_a_topologys_bus_ports_reach_its_nodes() -> None:
    first, last = _free_range(4)
    topo = loads(
        f'[cluster]\nname = "p"\n[bus]\nports = "{first}-{last}"\n'
        '[[nodes]]\nname = "a"\nplacement = "host"\nhost = "127.0.0.1"\nservices = ["echo"]\n'
    )
    handle = BusNodeHandle(NodeRequest(node_id="a", topology=topo, advertise_host="127.0.0.1"))
    try:
        ep = handle.bind()
        assert first <= _port(ep.control) <= last and first <= _port(ep.data) <= last
    finally:
        handle.stop()
