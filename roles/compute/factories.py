"""Factories the topology registry calls for ``compute.controller`` and ``compute.replica``."""

from __future__ import annotations

from typing import Any

from sparkbus.roles.compute.controller import ComputeController
from sparkbus.roles.compute.replica import ComputeReplica


def make_controller(ctx: Any) -> ComputeController:
    """A controller feeding every node of the topology that runs ``compute.replica``."""
    return ComputeController(replicas=ctx.topology.hosting("compute.replica"))


def make_replica(ctx: Any) -> ComputeReplica:
    return ComputeReplica()
