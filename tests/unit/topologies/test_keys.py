"""``sparkbus keys generate`` and where a topology's CURVE keys are."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest
import zmq.auth

from sparkbus.bus import security
from sparkbus.topologies import keys
from sparkbus.topologies.schema import loads

CURVE = """
[cluster]
name = "k"
[bus.security]
mode = "curve"
key_dir = "{key_dir}"
allow = ["127.0.0.1"]
[[nodes]]
name = "n"
placement = "host"
host = "127.0.0.1"
count = 2
services = ["echo"]
"""


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sparkbus")
    keys.add_parser(parser.add_subparsers(dest="command"))
    return keys.main(parser.parse_args(["keys", "generate", *argv]))


def test_default_is_one_shared_pair_with_the_secret_kept_private(tmp_path: Path) -> None:
    assert _run(str(tmp_path / "k")) == 0
    public = tmp_path / "k" / "public" / "cluster.key"
    secret = tmp_path / "k" / "private" / "cluster.key_secret"
    assert zmq.auth.load_certificate(public)[1] is None
    pub, sec = zmq.auth.load_certificate(secret)
    assert sec is not None and pub == zmq.auth.load_certificate(public)[0]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert security.node_keys(tmp_path / "k", "any-node").public == pub  # the shared fallback


def test_names_give_each_node_its_own_pair_and_existing_pairs_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(str(tmp_path), "--names", "a, b") == 0
    a = security.node_keys(tmp_path, "a")
    assert security.server_key(tmp_path, "a") == a.public != security.server_key(tmp_path, "b")
    assert _run(str(tmp_path), "--names", "a") == 1
    assert "exists" in capsys.readouterr().err
    assert security.node_keys(tmp_path, "a") == a
    assert _run(str(tmp_path), "--names", "a", "--force") == 0
    assert security.node_keys(tmp_path, "a") != a


@pytest.mark.parametrize("names", [",,", "", " , "])
def test_names_that_name_no_key_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], names: str
) -> None:
    assert _run(str(tmp_path / "k"), "--names", names) == 1
    assert capsys.readouterr().err == (
        f"sparkbus keys: --names {names!r} names no key; e.g. --names store-0,store-1\n"
    )
    assert not (tmp_path / "k").exists()


def test_a_missing_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(security.MissingKey, match="no secret key for node 'x'"):
        security.node_keys(tmp_path, "x")
    with pytest.raises(security.MissingKey, match="no public key for peer 'x'"):
        security.server_key(tmp_path, "x")


def test_topology_names_every_node(tmp_path: Path) -> None:
    topo = tmp_path / "t.toml"
    topo.write_text(CURVE.format(key_dir="/nowhere"))
    assert _run(str(tmp_path / "k"), "--topology", str(topo)) == 0
    assert sorted(p.name for p in (tmp_path / "k" / "public").iterdir()) == ["n-0.key", "n-1.key"]


def test_key_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    topo = loads(CURVE.format(key_dir="{run_dir}/keys-k"), str(tmp_path / "t.toml"))
    assert keys.key_dir(topo) == keys.run_dir() / "keys-k"
    settings = keys.curve_settings(topo)
    assert settings is not None and settings.allow_addresses == ("127.0.0.1",)
    written = keys.ensure_keys(topo)
    assert len(written) == 4 and keys.ensure_keys(topo) == []  # created once, then kept
    relative = loads(CURVE.format(key_dir="keys"), str(tmp_path / "t.toml"))
    assert keys.key_dir(relative) == tmp_path / "keys"
    assert keys.ensure_keys(relative) == []  # keys outside the run directory are the operator's
    plain = loads(
        CURVE.replace('mode = "curve"\nkey_dir = "{key_dir}"\nallow = ["127.0.0.1"]', 'mode = "none"')
    )
    assert keys.key_dir(plain) is None and keys.curve_settings(plain) is None


def test_topology_keeps_existing_pairs_and_adds_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "t.toml"
    topo.write_text(CURVE.format(key_dir="/nowhere"))
    keys_dir = tmp_path / "k"
    assert _run(str(keys_dir), "--names", "n-0") == 0
    before = security.node_keys(keys_dir, "n-0")
    capsys.readouterr()
    assert (
        _run(str(keys_dir), "--topology", str(topo)) == 0
    )  # was refused whole: "a key pair named 'n-0' exists"
    out = capsys.readouterr()
    assert security.node_keys(keys_dir, "n-0") == before  # a running node may hold its public key
    assert security.server_key(keys_dir, "n-1") == security.node_keys(keys_dir, "n-1").public
    assert out.out.splitlines() == [
        str(keys_dir / "public" / "n-1.key"),
        str(keys_dir / "private" / "n-1.key_secret"),
    ]
    assert out.err == f"1 key pair in {keys_dir}; kept 1 existing pair (n-0)\n"
    assert _run(str(keys_dir), "--topology", str(topo)) == 0  # all kept: nothing to do
    assert capsys.readouterr().err == f"0 key pairs in {keys_dir}; kept 2 existing pairs (n-0, n-1)\n"

    (keys_dir / "private" / "n-1.key_secret").unlink()  # half a pair is not kept, nor replaced unasked
    assert _run(str(keys_dir), "--topology", str(topo)) == 1
    assert "a key pair named 'n-1' exists" in capsys.readouterr().err
    assert _run(str(keys_dir), "--topology", str(topo), "--force") == 0
    assert security.node_keys(keys_dir, "n-0") != before  # --force replaces them all
    assert security.node_keys(keys_dir, "n-1").public == security.server_key(keys_dir, "n-1")
