"""Child processes of the fault tests: started with a command channel, signalled, and always reaped.

Every read has a timeout (a reader thread feeds a queue), every process is waited for with a timeout and
killed if it does not exit, and ``Procs`` reaps whatever is left in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sparkbus.bus.node import Endpoints

HERE = Path(__file__).parent
NODE_PROC = HERE / "node_proc.py"
REPLY_TIMEOUT = 30.0


class Proc:
    """One child speaking JSON lines on stdin/stdout."""

    def __init__(self, name: str, argv: list[str], *, prefix: list[str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name=f"faults-reader-{name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # only this thread touches stdout; it ends when the process does
            for line in self.proc.stdout:
                self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout: float = REPLY_TIMEOUT) -> Any:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer within {timeout} s") from None
        assert line is not None, f"{self.name} exited (status {self.proc.poll()})"
        return json.loads(line)

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def ask(self, op: str, timeout: float = REPLY_TIMEOUT, **args: Any) -> Any:
        self.send({"op": op, **args})
        return self.receive(timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and wait (a stopped process dies too)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close()

    def reap(self) -> None:
        """Close stdin so the child stops on its own; kill it if it has not exited within 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped child cannot read its EOF
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.reader.join(timeout=10)

    def rss_bytes(self) -> int:
        """Resident memory of the child (from /proc)."""
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


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
