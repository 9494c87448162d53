"""sparkbus: data-engine protocols over a ZeroMQ bus, next to Spark.

``sparkbus.connect(...)`` opens a thin client (docs/CLIENT.md). The client is imported on first use, so
``import sparkbus.codecs`` (or any subpackage) does not import ZeroMQ.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "connect": "sparkbus.topologies.client",
    "connect_async": "sparkbus.topologies.client",
    "Client": "sparkbus.topologies.client",
    "AsyncClient": "sparkbus.topologies.client",
    "AuthenticationError": "sparkbus.roles.client",
    "ClientError": "sparkbus.roles.client",
    "ClientConnectionError": "sparkbus.roles.client",
    "ConnectionUnknownError": "sparkbus.roles.client",
    "ClusterMismatchError": "sparkbus.roles.client",
    "ConnectTimeoutError": "sparkbus.roles.client",
    "OperationError": "sparkbus.roles.client",
}

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "ClientConnectionError",
    "ClientError",
    "ClusterMismatchError",
    "ConnectTimeoutError",
    "ConnectionUnknownError",
    "OperationError",
    "connect",
    "connect_async",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkbus' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
