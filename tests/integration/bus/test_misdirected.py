"""Real sockets on 127.0.0.1: a node given two peers' endpoints swapped links with neither, says where."""

from __future__ import annotations

import logging
import time

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node

pytestmark = pytest.mark.integration


def test_a_peers_endpoint_answered_by_another_node_is_named_and_never_linked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = BusConfig(cluster_tag="it", heartbeat_interval=0.1, peer_timeout=0.8, handshake_timeout=0.2)
    nodes = {n: Node(n, cfg, []) for n in "abc"}
    eps = {n: node.bind() for n, node in nodes.items()}
    try:
        with caplog.at_level(logging.WARNING, logger="sparkbus.bus"):
            nodes["a"].start({"b": eps["c"], "c": eps["b"]})  # a stale table: b's and c's swapped
            nodes["b"].start({"a": eps["a"], "c": eps["c"]})
            nodes["c"].start({"a": eps["a"], "b": eps["b"]})
            deadline = time.monotonic() + 10
            while len((status := nodes["a"].status())["misdirected"]) < 2:
                assert time.monotonic() < deadline, status
                time.sleep(0.01)
            with pytest.raises(TimeoutError, match="is answered by node"):
                nodes["a"].wait_ready(0.3)
        assert status["misdirected"] == {
            "b": f"the endpoint of 'b' ({eps['c'].control}) is answered by node 'c'",
            "c": f"the endpoint of 'c' ({eps['b'].control}) is answered by node 'b'",
        }
        assert status["counters"]["welcomes_from_other_nodes"] >= 2
        assert not any(p["up"] for p in status["peers"].values()) and status["refused"] == {}
        assert any(status["misdirected"]["b"] in r.getMessage() for r in caplog.records)
        for name in "bc":
            other = nodes[name].status()
            assert other["refused"] == {} and "DUPLICATE_NODE" not in other["refusals"]
    finally:
        for node in nodes.values():
            node.stop()
