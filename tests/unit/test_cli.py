from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkbus.topologies import cli


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ok:
        cli.main(["--version"])
    assert ok.value.code == 0
    assert capsys.readouterr().out.startswith("sparkbus 0.")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run" in capsys.readouterr().out


def test_unknown_command_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["frobnicate"])
    assert err.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_entry_point_is_installed() -> None:
    beside = Path(sys.executable).with_name("sparkbus")
    exe = str(beside) if beside.exists() else shutil.which("sparkbus")
    assert exe is not None, "the sparkbus console script is not on PATH"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.startswith("sparkbus ")
