"""Every ``sparkbus`` command imports ``sparkbus.topologies.cli`` first: what that import pulls in, each
command pays before it starts. The launcher, the client, Rich's console, the roles and Spark are imported by
the commands that use them (docs/OPERATIONS.md, "Start-up time")."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import sparkbus.topologies
from sparkbus.bus import node, security
from sparkbus.topologies import keys, launcher

#: imported by the commands that need them, never by ``import sparkbus.topologies.cli`` or ``--help``
DEFERRED = (
    "asyncio",
    "numpy",
    "pyarrow",
    "pyspark",
    "rich.console",
    "sparkbus.bus.core",
    "sparkbus.bus.node",
    "sparkbus.bus.security",
    "sparkbus.codecs.batches",
    "sparkbus.roles",
    "sparkbus.topologies.client",
    "sparkbus.topologies.echo",
    "sparkbus.topologies.launcher",
    "sparkbus.topologies.mainjob",
    "zmq",
)


def _loaded_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {DEFERRED!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_command_line_imports_no_command() -> None:
    assert _loaded_after("import sparkbus.topologies.cli") == []


def test_help_imports_no_command() -> None:
    code = (
        "import contextlib, io\n"
        "from sparkbus.topologies.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    )
    assert _loaded_after(code) == []


@pytest.mark.parametrize("package", ["sparkbus.topologies", "sparkbus.bus", "sparkbus.codecs"])
def test_the_package_names_are_still_offered(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError):
        module.nothing  # noqa: B018


def test_a_lazy_name_comes_from_its_module() -> None:
    assert sparkbus.topologies.EchoRole.__module__ == "sparkbus.topologies.echo"


def test_the_launcher_imports_no_node_loop() -> None:
    """``sparkbus status`` and ``sparkbus up`` import the launcher; the node loop runs in the nodes."""
    assert _loaded_after("import sparkbus.topologies.launcher") == [
        "rich.console",
        "sparkbus.topologies.launcher",
        "zmq",
    ]


def test_the_constants_kept_apart_agree() -> None:
    assert keys.SHARED_NAME == security.SHARED_NAME
    assert launcher.OWN_IPC_DIR == node.OWN_IPC_DIR_PREFIX
