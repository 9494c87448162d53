"""Which CURVE key may speak for which node id (``sparkbus.bus.security``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from sparkbus.bus import security
from sparkbus.bus.security import MissingKey, _Authenticator, key_names, key_owner


def test_key_names_are_the_files_the_public_keys_came_from(tmp_path: Path) -> None:
    security.generate(tmp_path, ["a", "b", security.SHARED_NAME])
    names = key_names(tmp_path)
    assert sorted(names.values()) == ["a", "b", "cluster"]
    for public, name in names.items():
        assert zmq.auth.load_certificate(tmp_path / "public" / f"{name}.key")[0] == public


def test_an_unreadable_public_certificate_is_named_in_the_error(tmp_path: Path) -> None:
    security.generate(tmp_path, ["a"])
    (tmp_path / "public" / "bad.key").write_text("not a certificate\n")
    with pytest.raises(MissingKey, match=r"cannot read the public certificate .*bad\.key"):
        key_names(tmp_path)


@pytest.mark.parametrize(
    ("rid", "user", "fits"),
    [
        (b"a", "a", True),  # its own key
        (b"a", "b", False),  # another node's key
        (b"a", "cluster", False),  # the shared pair, though "a" has one of its own
        (b"d", "cluster", True),  # "d" has no pair of its own: any admitted key speaks for it
        (b"d", "a", True),
        (b"\x00\x12\x34\x56\x78", "client", True),  # a thin client's generated routing id
    ],
)
def test_a_node_id_with_a_key_of_its_own_is_that_keys_alone(rid: bytes, user: str, fits: bool) -> None:
    assert key_owner(rid, user, frozenset({b"a", b"b"})) is fits


def test_naming_a_key_never_raises_on_the_handlers_thread() -> None:
    """An exception in ``curve_user_id`` would end pyzmq's ZAP thread, and every CURVE handshake with it."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        auth = _Authenticator(ctx)
        public, _ = zmq.curve_keypair()
        auth.names["d"] = {public: "a"}
        auth._current = ("d", "127.0.0.1")
        assert auth.curve_user_id(zmq.utils.z85.decode(public)) == "a"
        unknown, _ = zmq.curve_keypair()
        assert auth.curve_user_id(zmq.utils.z85.decode(unknown)) == unknown.decode()  # pyzmq's default
        assert auth.curve_user_id(b"short") == "?"
    finally:
        ctx.term()
