"""Each package re-exports its public names; layers import only downwards."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import sparkbus.codecs

PACKAGES = [
    "sparkbus",
    "sparkbus.codecs",
    "sparkbus.bus",
    "sparkbus.roles",
    "sparkbus.roles.client",
    "sparkbus.topologies",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    mod = importlib.import_module(name)
    for public in getattr(mod, "__all__", []):
        assert hasattr(mod, public), f"{name}.__all__ names {public}, which does not exist"


def test_codecs_is_not_the_standard_library() -> None:
    stdlib_codecs = importlib.import_module("codecs")  # the ban on bare `codecs` is the point here
    assert stdlib_codecs.lookup("utf-8").name == "utf-8"
    assert sparkbus.codecs.EnvelopeCodec is not None


# layer -> packages it must not import
FORBIDDEN = {
    "codecs": ("zmq", "sparkbus.bus", "sparkbus.roles", "sparkbus.topologies"),
    "bus": ("sparkbus.roles", "sparkbus.topologies"),
    "roles": ("zmq", "socket", "threading", "asyncio", "subprocess", "sparkbus.topologies"),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_downwards(layer: str) -> None:
    pkg = Path(importlib.import_module(f"sparkbus.{layer}").__file__ or "").parent
    for path in pkg.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                bad = [f for f in FORBIDDEN[layer] if n == f or n.startswith(f + ".")]
                assert not bad, f"{path.name} (layer {layer}) imports {n}"


def test_sparkbus_is_light_and_lazily_offers_the_client() -> None:
    import subprocess
    import sys

    code = "import sys, sparkbus, sparkbus.codecs; print('zmq' in sys.modules, sparkbus.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split()[0] == "False"  # importing sparkbus or a subpackage does not import ZeroMQ
    import sparkbus

    assert sparkbus.connect.__module__ == "sparkbus.topologies.client"
    assert issubclass(sparkbus.ConnectionUnknownError, sparkbus.ClientError)
    with pytest.raises(AttributeError):
        sparkbus.nothing  # noqa: B018


def test_the_client_roles_surface() -> None:
    import sparkbus.roles.client as rc

    for name in (
        "ClientCore",
        "Gateway",
        "make_gateway",
        "Request",
        "Response",
        "Restore",
        "RetryReadPolicy",
    ):
        assert name in rc.__all__
