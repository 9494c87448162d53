"""Child processes of the fault tests: started with a command channel, signalled, and always reaped.

Every read has a timeout (a reader thread feeds a queue), every process is waited for with a timeout and
killed if it does not exit, and ``Procs`` reaps whatever is left in a ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sparkbus.bus.node import Endpoints

from ..childproc import REPLY_TIMEOUT, Proc

HERE = Path(__file__).parent
NODE_PROC = HERE / "node_proc.py"


class NodeProc(Proc):
    """A ``node_proc.py`` child: its endpoints are known once it has bound."""

    def __init__(
        self, kind: str, node_id: str, transport: str, *extra: str, prefix: list[str] | None = None
    ) -> None:
        super().__init__(node_id, [str(NODE_PROC), kind, node_id, transport, *extra], prefix=prefix)
        self.endpoints = Endpoints.from_json(self.receive())

    def give_peers(self, peers: dict[str, Endpoints]) -> None:
        self.send({k: v.to_json() for k, v in peers.items()})

    def started(self, timeout: float = REPLY_TIMEOUT) -> None:
        assert self.receive(timeout) == {"started": self.name}


class Procs:
    """Owns the children of one test; ``reap_all`` in a ``finally`` leaves none behind."""

    def __init__(self) -> None:
        self.all: list[Proc] = []

    def add(self, proc: Proc) -> Proc:
        self.all.append(proc)
        return proc

    def reap_all(self) -> None:
        for p in self.all:
            p.reap()


@contextlib.contextmanager
def children() -> Iterator[Procs]:
    procs = Procs()
    try:
        yield procs
    finally:
        procs.reap_all()


def until(what: str, predicate: Callable[[], bool], timeout: float = 20.0) -> float:
    """Poll a condition another process brings about; returns the seconds it took (never orders events)."""
    start = time.monotonic()
    deadline = start + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        time.sleep(0.005)
    return time.monotonic() - start


def fd_count() -> int:
    """Open file descriptors of this (the test) process."""
    return len(os.listdir("/proc/self/fd"))
