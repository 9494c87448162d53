"""``ClientCurve.from_key_dir``: which public key each address gets, and a key directory that cannot serve
an address refused by name before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbus.bus import security
from sparkbus.roles.client import AuthenticationError
from sparkbus.topologies.client import ClientCurve, connect

A, B = "tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001"


def test_per_node_keys_serve_addresses_whose_node_is_named(tmp_path: Path) -> None:
    security.generate(tmp_path, ["a", "b", "client"])
    curve = ClientCurve.from_key_dir(tmp_path, nodes={A: "a", B: "b"}, addresses=[A, B])
    assert curve.server_key(A) == security.server_key(tmp_path, "a")
    assert curve.server_key(B) == security.server_key(tmp_path, "b")
    assert curve.default_server_key is None


def test_an_address_without_a_node_id_and_no_shared_key_is_refused(tmp_path: Path) -> None:
    security.generate(tmp_path, ["a", "b", "client"])
    with pytest.raises(
        AuthenticationError,
        match=rf"{tmp_path} has no public/cluster\.key and the node id of {B} is unknown: name its node",
    ):
        ClientCurve.from_key_dir(tmp_path, nodes={A: "a"}, addresses=[A, B])
    with pytest.raises(AuthenticationError, match=rf"the node id of {A} is unknown"):
        connect(A, cluster_tag="x/dev", key_dir=tmp_path, connect_timeout=1)


def test_a_shared_key_serves_any_address(tmp_path: Path) -> None:
    security.generate(tmp_path, [security.SHARED_NAME, "client"])
    curve = ClientCurve.from_key_dir(tmp_path, addresses=[A, B])
    assert curve.server_key(B) == security.server_key(tmp_path, security.SHARED_NAME)
