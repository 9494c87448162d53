"""A NodeFactory for the Spark tests: real bus nodes with echo that, once ready, ping and stream to every peer."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkbus.topologies.busnode import BusNodeHandle
from sparkbus.topologies.runtime import Endpoints, NodeHandle, NodeRequest


class ExercisingNode:
    def __init__(self, inner: BusNodeHandle, kill: str | None) -> None:
        self.inner = inner
        self.node_id = inner.node_id
        self.kill = kill
        self.peers: list[str] = []
        self.results: dict[str, Any] = {}

    def bind(self) -> Endpoints:
        return self.inner.bind()

    def set_peers(self, peers: Mapping[str, Endpoints]) -> None:
        self.peers = sorted(p for p in peers if p != self.node_id)
        self.inner.set_peers(peers)

    def start(self) -> None:
        self.inner.start()

    def wait_ready(self, timeout: float) -> None:
        self.inner.wait_ready(timeout)
        if self.kill == self.node_id:
            os.kill(os.getpid(), signal.SIGKILL)
        for peer in self.peers:
            ping = self.inner.call(
                "echo", "ping", {"peer": peer, "payload": b"hi", "timeout": 10}, timeout=15
            )
            sent = self.inner.call(
                "echo",
                "stream",
                {"peer": peer, "batches": 8, "batch_size": 4096, "credit": 8192, "timeout": 10},
                timeout=15,
            )
            self.results[peer] = {"ping": ping["payload"] == b"hi", "stream_bytes": sent["bytes"]}

    def feed(self, batches: Sequence[Any], *, last: bool) -> None:
        self.inner.feed(batches, last=last)

    def failure(self) -> str | None:
        return self.inner.failure()

    def counters(self) -> dict[str, Any]:
        return {**self.inner.counters(), "exchanged": self.results}

    def stop(self) -> None:
        self.inner.stop()


@dataclass(frozen=True)
class ExercisingFactory:
    kill: str | None = None

    def __call__(self, request: NodeRequest) -> NodeHandle:
        return ExercisingNode(BusNodeHandle(request), self.kill)
