"""``sparkbus.topologies.client`` is the thin client's public module: every name the rest of sparkbus (and
its tests) imports from it stays there, declared in its ``__all__``, and where to connect (addresses,
topology files, CURVE keys) and decoding replies are modules of their own that open no socket, so the loop's
module stays small."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

import sparkbus.topologies.client_reply as reply
import sparkbus.topologies.client_target as target
from sparkbus.topologies import client

ROOT = Path(__file__).resolve().parents[3]


def imported_from(module: str) -> set[str]:
    """The names any source or test file imports from ``module`` (``toplevel``'s lazy table included)."""
    names: set[str] = set()
    for folder in ("topologies", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if module not in text:
                continue
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == module:
                    names |= {a.name for a in node.names}
                elif isinstance(node, ast.Dict):  # sparkbus/__init__: name -> the module it comes from
                    for key, value in zip(node.keys, node.values, strict=True):
                        if isinstance(value, ast.Constant) and value.value == module:
                            assert isinstance(key, ast.Constant)
                            names.add(str(key.value))
    return names


def test_the_client_module_declares_every_name_imported_from_it() -> None:
    offered = imported_from("sparkbus.topologies.client")
    assert {"Client", "AsyncClient", "ClientCurve", "connect", "topology_target"} <= offered
    assert offered <= set(client.__all__), offered - set(client.__all__)
    for name in client.__all__:
        assert hasattr(client, name), name
    assert client.ClientCurve is target.ClientCurve
    assert client.connect.__module__ == "sparkbus.topologies.client"


@pytest.mark.parametrize("module", [target, reply], ids=["client_target", "client_reply"])
def test_where_to_connect_and_reply_decoding_open_no_socket(module: ModuleType) -> None:
    tree = ast.parse(Path(module.__file__ or "").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "zmq" not in imported and "sparkbus.topologies.client" not in imported, imported


def test_each_client_module_stays_under_900_lines() -> None:
    for name in (
        "sparkbus.topologies.client",
        "sparkbus.topologies.client_target",
        "sparkbus.topologies.client_reply",
    ):
        path = Path(importlib.import_module(name).__file__ or "")
        assert len(path.read_text().splitlines()) < 900, path
