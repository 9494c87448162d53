"""The run directory (``{run_dir}`` keys, ``sparkbus up`` state) is used only when it is this user's alone:
without ``XDG_RUNTIME_DIR`` it is ``<tmp>/sparkbus-<uid>``, a name any local user can create first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from sparkbus.bus import security
from sparkbus.topologies import keys, launcher
from sparkbus.topologies.model import Topology
from sparkbus.topologies.schema import loads

from .test_keys import CURVE

NODES = ["n-0", "n-1"]


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory (``/tmp``), as the run directory's parent without ``XDG_RUNTIME_DIR``."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv(keys.RUN_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def topology(tmp_path: Path, key_dir: str = "{run_dir}/keys-k") -> Topology:
    return loads(CURVE.format(key_dir=key_dir), str(tmp_path / "t.toml"))


def planted(where: Path) -> Path:
    """``where`` made as another user would: key pairs whose secrets they hold."""
    security.generate(where / "keys-k", NODES)
    return where


def test_a_world_writable_run_dir_with_planted_keys_is_refused(tmp_dir: Path) -> None:
    run = planted(tmp_dir / f"sparkbus-{os.getuid()}")
    run.chmod(0o777)
    topo = topology(tmp_dir)
    assert keys.key_dir(topo) == run / "keys-k"
    with pytest.raises(keys.UnsafeDirectory) as refused:
        keys.ensure_keys(topo)
    assert str(refused.value) == (
        f"refusing {run}: its mode 0777 lets other users write in it; "
        "remove it (or chmod 700 it if it holds nothing it should not)"
    )
    assert isinstance(refused.value, OSError)  # what `sparkbus up` reports in one line


def test_a_group_writable_key_dir_is_refused_in_a_private_run_dir(tmp_dir: Path) -> None:
    run = planted(tmp_dir / f"sparkbus-{os.getuid()}")
    run.chmod(0o700)
    (run / "keys-k").chmod(0o770)
    with pytest.raises(keys.UnsafeDirectory, match=f"^refusing {run / 'keys-k'}: its mode 0770 "):
        keys.ensure_keys(topology(tmp_dir))


def test_a_run_dir_of_another_user_is_refused(tmp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getuid()
    monkeypatch.setattr(
        keys.os, "getuid", lambda: me + 1
    )  # this user is now another: the directory is not theirs
    run = planted(tmp_dir / f"sparkbus-{me + 1}")
    run.chmod(0o700)
    with pytest.raises(keys.UnsafeDirectory) as refused:
        keys.ensure_keys(topology(tmp_dir))
    assert str(refused.value) == (
        f"refusing {run}: it belongs to uid {me}, not to this user (uid {me + 1}), who may have put keys or "
        "state there; remove it or set XDG_RUNTIME_DIR"
    )


@pytest.mark.parametrize("xdg", [True, False])
def test_a_run_dir_of_another_user_named_by_sparkbus_run_dir_is_refused_with_advice_that_can_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: bool
) -> None:
    """With SPARKBUS_RUN_DIR set, XDG_RUNTIME_DIR is never read: setting it would change nothing, so the
    refusal names the variable that chose the directory."""
    me = os.getuid()
    run = tmp_path / "theirs"
    run.mkdir(mode=0o700)
    monkeypatch.setattr(keys.os, "getuid", lambda: me + 1)  # the directory is another user's
    monkeypatch.setenv(keys.RUN_DIR_ENV, str(run))
    if xdg:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for refused_by in (launcher.state_dir, lambda: keys.ensure_keys(topology(tmp_path))):
        with pytest.raises(keys.UnsafeDirectory) as refused:
            refused_by()
        assert str(refused.value) == (
            f"refusing {run}: it belongs to uid {me}, not to this user (uid {me + 1}), who may have put keys "
            f"or state there; remove it or set {keys.RUN_DIR_ENV} to a directory of yours"
        )


def test_a_symbolic_link_as_run_dir_is_refused(tmp_dir: Path) -> None:
    target = planted(tmp_dir / "elsewhere")
    target.chmod(0o700)
    (tmp_dir / f"sparkbus-{os.getuid()}").symlink_to(target)
    with pytest.raises(keys.UnsafeDirectory, match="is a symbolic link"):
        keys.ensure_keys(topology(tmp_dir))


def test_a_new_run_dir_and_key_dir_are_made_private_and_then_trusted(tmp_dir: Path) -> None:
    topo = topology(tmp_dir, "{run_dir}/deep/keys-k")
    written = keys.ensure_keys(topo)
    run = tmp_dir / f"sparkbus-{os.getuid()}"
    assert len(written) == 2 * len(NODES)
    for made in (run, run / "deep", run / "deep" / "keys-k"):
        assert made.stat().st_mode & 0o777 == 0o700, made
    assert keys.ensure_keys(topo) == []  # found, checked, kept


def test_a_private_run_dir_made_before_is_used(tmp_dir: Path) -> None:
    run = tmp_dir / f"sparkbus-{os.getuid()}"
    run.mkdir(mode=0o755)  # this user's, readable by others, writable by no one else
    run.chmod(0o755)
    assert len(keys.ensure_keys(topology(tmp_dir))) == 2 * len(NODES)


def test_keys_outside_the_run_dir_are_not_checked_here(tmp_dir: Path) -> None:
    run = tmp_dir / f"sparkbus-{os.getuid()}"
    run.mkdir()
    run.chmod(0o777)
    assert keys.ensure_keys(topology(tmp_dir, str(tmp_dir / "operator-keys"))) == []


def test_up_refuses_to_keep_its_state_in_a_world_writable_run_dir(tmp_dir: Path) -> None:
    run = tmp_dir / f"sparkbus-{os.getuid()}"
    run.mkdir()
    run.chmod(0o777)
    with pytest.raises(keys.UnsafeDirectory, match=f"^refusing {run}: its mode 0777"):
        launcher.claim(tmp_dir / "t.toml")
    assert list(run.iterdir()) == []


def test_a_state_file_in_a_run_dir_others_can_write_is_not_read(tmp_dir: Path) -> None:
    run = keys.run_dir()
    run.mkdir()
    os.chmod(run, 0o777)
    (run / "up-t-0123456789abcdef.json").write_text(
        '{"launcher_pid": 999999999, "topology": "/elsewhere/t.toml"}'
    )
    with pytest.raises(keys.UnsafeDirectory, match="lets other users write"):
        launcher.running_clusters()
    with pytest.raises(keys.UnsafeDirectory, match="lets other users write"):
        launcher.state_file(tmp_dir / "t.toml")
    os.chmod(run, 0o700)
    assert launcher.running_clusters() == []  # its launcher is gone: skipped


def test_no_run_dir_yet_is_not_made_by_a_reader(tmp_dir: Path) -> None:
    assert launcher.running_clusters() == []
    assert not keys.run_dir().exists()
