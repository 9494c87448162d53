"""Probe nodes that fail on purpose, pickled by value into the Spark tasks (see test_runtime.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from sparkbus.topologies.probe import ProbeFactory, ProbeNode
from sparkbus.topologies.runtime import NodeHandle, NodeRequest


class _FailingNode(ProbeNode):
    def __init__(self, request: NodeRequest, mode: str) -> None:
        super().__init__(request)
        self.mode = mode

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        if self.mode == "raise":
            raise ValueError("disk on fire")
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)

    def bind(self):  # type: ignore[no-untyped-def]
        if self.mode == "bind":
            raise OSError("address already in use")
        return super().bind()


@dataclass(frozen=True)
class FailingFactory(ProbeFactory):
    """Probes, except ``victim``, which fails in ``mode`` (raise, exit, sigkill, bind)."""

    victim: str = ""
    mode: str = "raise"

    def __call__(self, request: NodeRequest) -> NodeHandle:
        if request.node_id == self.victim:
            return _FailingNode(request, self.mode)
        return ProbeNode(request)
