from __future__ import annotations

import pytest

from sparkbus.topologies.runtime import Endpoints, NodeRequest, advertise_host
from sparkbus.topologies.schema import load, shipped


def test_endpoints_round_trip_and_refusals() -> None:
    ep = Endpoints(control="tcp://127.0.0.1:5000", data="tcp://127.0.0.1:5001")
    assert Endpoints.from_json(ep.to_json()) == ep
    with pytest.raises(ValueError, match="'control', 'data' and optionally 'http'"):
        Endpoints.from_json({"control": "tcp://a:1"})
    with pytest.raises(ValueError, match="ZeroMQ addresses"):
        Endpoints.from_json({"control": "a:1", "data": "tcp://a:2"})
    with_http = Endpoints(control="tcp://a:1", data="tcp://a:2", http="a:3")
    assert with_http.to_json()["http"] == "a:3" and "http" not in ep.to_json()
    assert Endpoints.from_json(with_http.to_json()) == with_http
    for bad in ("tcp://a:3", "a", 3):
        with pytest.raises(ValueError, match="http endpoint must be host:port"):
            Endpoints.from_json({"control": "tcp://a:1", "data": "tcp://a:2", "http": bad})
    with pytest.raises(ValueError, match="optionally 'http'"):
        Endpoints.from_json({"control": "tcp://a:1", "data": "tcp://a:2", "web": "a:3"})


def test_advertise_host() -> None:
    assert advertise_host("0.0.0.0", "10.0.0.7") == "10.0.0.7"
    assert advertise_host("*", "10.0.0.7") == "10.0.0.7"
    assert advertise_host("127.0.0.1", "10.0.0.7") == "127.0.0.1"


def test_node_request_builds_the_role_context() -> None:
    topo = load(shipped("local.toml"))
    ctx = NodeRequest(node_id="store-1", topology=topo, advertise_host="127.0.0.1").role_context()
    assert ctx.spec.name == "store"
    assert ctx.local_data == ()
