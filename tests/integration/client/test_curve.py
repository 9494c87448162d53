"""The thin client against real CURVE nodes: an allowed key runs SQL, an unknown key (or no CURVE at all) is
refused at once with an ``AuthenticationError`` naming the address, and never retried."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import sparkbus
from sparkbus.bus import BusConfig, security
from sparkbus.bus.config import CurveSettings
from sparkbus.bus.node import Node
from sparkbus.roles.client import AuthenticationError, Gateway
from sparkbus.roles.query import QueryRole, table_to_ipc
from sparkbus.topologies.client import ClientCurve

from .test_client import until

TAG = "curve-it"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    security.generate(tmp_path / "keys", ["n1", "client"])
    return tmp_path / "keys"


@pytest.fixture
def node(keys: Path) -> Iterator[Node]:
    n = Node(
        "n1",
        BusConfig(cluster_tag=TAG, curve=CurveSettings(key_dir=str(keys))),
        [QueryRole("n1", incarnation="a"), Gateway("n1")],
    )
    n.bind()
    n.start({})
    try:
        n.call(
            "query", "load", {"table": "t", "batches": [table_to_ipc(pa.table({"x": [1, 2, 3]}))]}, timeout=10
        )
        yield n
    finally:
        n.stop()


def control(n: Node) -> str:
    assert n.endpoints is not None
    return n.endpoints.control


def curve_denied(n: Node) -> int:
    return int(n.status()["refusals"].get("curve_denied", 0))


def test_an_allowed_key_runs_sql(node: Node, keys: Path) -> None:
    address = control(node)
    curve = ClientCurve.from_key_dir(keys, nodes={address: "n1"})
    with sparkbus.connect([address], cluster_tag=TAG, curve=curve, connect_timeout=10) as client:
        assert client.sql("SELECT SUM(x) AS s FROM t").to_pylist() == [{"s": 6}]
    assert curve_denied(node) == 0


def test_key_dir_with_a_shared_cluster_pair(tmp_path: Path) -> None:
    security.generate(tmp_path / "k", [security.SHARED_NAME, "client"])
    n = Node(
        "n1", BusConfig(cluster_tag=TAG, curve=CurveSettings(key_dir=str(tmp_path / "k"))), [Gateway("n1")]
    )
    n.bind()
    n.start({})
    try:
        with sparkbus.connect(
            [control(n)], cluster_tag=TAG, key_dir=tmp_path / "k", connect_timeout=10
        ) as client:
            assert client.status()["node"] == "n1"
    finally:
        n.stop()


def test_key_dir_with_per_node_keys_by_node_id(node: Node, keys: Path) -> None:
    # `keys` holds n1's own pair and a client pair, no shared one: the address must name its node
    address = control(node)
    with sparkbus.connect({"n1": address}, cluster_tag=TAG, key_dir=keys, connect_timeout=10) as client:
        assert client.sql("SELECT SUM(x) AS s FROM t").to_pylist() == [{"s": 6}]
    with pytest.raises(AuthenticationError, match=r"no public/cluster\.key and the node id of tcp://"):
        sparkbus.connect([address], cluster_tag=TAG, key_dir=keys, connect_timeout=10)
    assert curve_denied(node) == 0


def test_an_unknown_key_is_an_authentication_error_naming_the_address(
    node: Node, keys: Path, tmp_path: Path
) -> None:
    address = control(node)
    # The stranger knows the server's public key, but its own key is on no allow-list.
    stranger = tmp_path / "stranger"
    security.generate(stranger, ["client"])
    shutil.copy(keys / "public" / "n1.key", stranger / "public" / "n1.key")
    curve = ClientCurve.from_key_dir(stranger, nodes={address: "n1"})
    # A generous connect timeout: the refusal must end the attempt, not the timeout.
    with pytest.raises(AuthenticationError, match="refused this client's CURVE key") as err:
        sparkbus.connect([address], cluster_tag=TAG, curve=curve, connect_timeout=60)
    assert address in str(err.value)
    assert "AUTHENTICATION" in str(err.value)
    assert curve_denied(node) >= 1
    assert node.status()["counters"].get("sessions_opened", 0) == 0


def test_a_plain_client_is_refused_by_a_curve_node(node: Node) -> None:
    address = control(node)
    with pytest.raises(AuthenticationError, match="mechanism mismatch") as err:
        sparkbus.connect([address], cluster_tag=TAG, connect_timeout=60)
    assert address in str(err.value)


def test_a_wrong_server_key_is_an_authentication_error(node: Node, keys: Path) -> None:
    address = control(node)
    good = ClientCurve.from_key_dir(keys, nodes={address: "n1"})
    wrong = ClientCurve(public=good.public, secret=good.secret, default_server_key=good.public)
    with pytest.raises(AuthenticationError, match="server public key") as err:
        sparkbus.connect([address], cluster_tag=TAG, curve=wrong, connect_timeout=60)
    assert address in str(err.value)


def test_a_refused_node_is_not_retried_while_another_serves(node: Node, keys: Path, tmp_path: Path) -> None:
    security.generate(tmp_path / "other", ["m1"])
    other = Node(
        "m1",
        BusConfig(cluster_tag=TAG, curve=CurveSettings(key_dir=str(tmp_path / "other"))),
        [Gateway("m1")],
    )
    other.bind()
    other.start({})
    try:
        good, refusing = control(node), control(other)
        curve = ClientCurve.from_key_dir(keys, nodes={good: "n1"})
        curve = ClientCurve(
            public=curve.public,
            secret=curve.secret,
            server_keys={
                good: curve.server_keys[good],
                refusing: security.server_key(tmp_path / "other", "m1"),
            },
        )
        with sparkbus.connect(
            [good, refusing], cluster_tag=TAG, curve=curve, connect_timeout=10, background_interval=0.2
        ) as client:

            def state() -> str:
                return str(client._on_loop(lambda: client.core.links[refusing].state))

            until(lambda: state() == "refused")  # the background connect after the first node
            for _ in range(5):  # background reconnects (every 0.2 s) would knock again meanwhile
                assert client.sql("SELECT SUM(x) AS s FROM t").to_pylist() == [{"s": 6}]
            errors = client._on_loop(lambda: list(client.core.links[refusing].errors))
            assert len(errors) == 1 and "authentication failed" in errors[0], errors
            assert refusing in errors[0]
            assert state() == "refused"
    finally:
        other.stop()
