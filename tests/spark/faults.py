"""Nodes that fail on purpose, pickled by value into the Spark tasks (see test_runtime.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from sparkbus.topologies.busnode import BusNodeFactory, BusNodeHandle
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


class _RecordedBusNode(BusNodeHandle):
    def __init__(self, request: NodeRequest, record: Path, *, fail: str) -> None:
        super().__init__(request)
        self.record = record
        self.fail = fail
        roots = [
            str(r.storage_for.root) for r in self.roles if hasattr(getattr(r, "storage_for", None), "root")
        ]
        (record / f"{self.node_id}.roots").write_text("".join(f"{root}\n" for root in roots))

    def bind(self):  # type: ignore[no-untyped-def]
        endpoints = super().bind()
        (self.record / f"{self.node_id}.endpoints").write_text(f"{endpoints.control}\n{endpoints.data}\n")
        return endpoints

    def start(self) -> None:
        if self.fail == "start":
            raise ValueError("disk on fire")
        super().start()

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        if self.fail == "ready":
            raise ValueError("disk on fire")
        if self.fail == "sigkill":  # its worker dies as the OOM killer would have it: no cleanup at all
            os.kill(os.getpid(), signal.SIGKILL)

    def stop(self) -> None:
        super().stop()
        (self.record / f"{self.node_id}.stopped").touch()


@dataclass(frozen=True)
class RecordingBusFactory(BusNodeFactory):
    """Real bus nodes, each writing where its replicas live (one directory a line) to
    ``<record>/<node>.roots`` when it is built, its endpoints to ``<node>.endpoints`` when it is bound, and
    ``<record>/<node>.stopped`` once it has stopped; ``victim`` fails in ``when``: ``ready`` (once its links
    are up), ``start`` (its node never starts, so the others wait for their links to it) or ``sigkill`` (its
    Python worker is killed once its links are up)."""

    record: str = ""
    victim: str = ""
    when: str = "ready"

    def __call__(self, request: NodeRequest) -> NodeHandle:
        fail = self.when if request.node_id == self.victim else ""
        return _RecordedBusNode(request, Path(self.record), fail=fail)
