"""Three replication nodes in child processes on real sockets, SIGKILLed and restarted on their stores.

a leads partition t/0 (first in placement order), b and c follow. Writes acknowledged by the leader; a
follower SIGKILLed while a segment is on its way to it; then the leader SIGKILLed while a segment is on its
way and with acknowledged rows only in its log; both restarted on the same store directory. In the end
every acknowledged row is on every replica, and the partial incoming files were discarded on restart.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
PROC = Path(__file__).with_name("replica_proc.py")
NODES = ("a", "b", "c")
REPLY_TIMEOUT = 15.0


class Replica:
    """One child process; commands over stdin, answers read from stdout by a thread, with timeouts."""

    def __init__(self, node: str, ipc_dir: Path, store_dir: Path) -> None:
        self.node = node
        self.store = store_dir / node / "t~0"
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC), node, ",".join(NODES), str(ipc_dir), str(store_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        assert self.receive() == {"started": node}

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
            raise AssertionError(f"{self.node}: no answer within {timeout} s") from None
        assert line is not None, f"{self.node} exited (status {self.proc.poll()})"
        return json.loads(line)

    def ask(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self.receive()

    def write(self, keys: range) -> bool:
        return "ok" in self.ask("write", keys=list(keys))

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.ask("status")
        return status

    def partition(self) -> dict[str, Any]:
        part: dict[str, Any] = self.status()["partitions"]["t/0"]
        return part

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close()

    def reap(self) -> None:
        if self.proc.poll() is None:
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

    def partial_files(self) -> list[str]:
        return sorted(p.name for p in self.store.glob("in-*.tmp")) if self.store.exists() else []


def until(what: str, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll a condition another process brings about (never used to order protocol events)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        time.sleep(0.005)


@pytest.fixture
def cluster() -> Iterator[tuple[dict[str, Replica], Callable[[str], Replica]]]:
    root = Path(tempfile.mkdtemp(prefix="repl-it-", dir="/tmp"))  # short: ipc paths have a length limit
    (root / "ipc").mkdir()
    procs: dict[str, Replica] = {}

    def start(node: str) -> Replica:
        procs[node] = Replica(node, root / "ipc", root / "stores")
        return procs[node]

    try:
        for n in NODES:
            start(n)
        yield procs, start
    finally:
        for p in procs.values():
            p.reap()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(180)
def test_every_acknowledged_row_survives_sigkill_of_a_follower_and_of_the_leader(
    cluster: tuple[dict[str, Replica], Callable[[str], Replica]],
) -> None:
    procs, start = cluster
    until("every node sees the others", lambda: all(len(p.status()["live"]) == 3 for p in procs.values()))
    acked: set[int] = set()

    def write(node: str, keys: range) -> None:
        if procs[node].write(keys):
            acked.update(keys)

    # A full segment (2000 rows) for the followers; SIGKILL c while it arrives.
    for i in range(0, 2000, 200):
        write("a", range(i, i + 200))
    until("c has a partial incoming file", lambda: bool(procs["c"].partial_files()))
    left = procs["c"].partial_files()
    procs["c"].kill()
    assert set(left) <= set(procs["c"].partial_files()), "the kill left the partial file behind"
    write("a", range(2000, 2500))
    start("c")
    assert procs["c"].partition()["recovered"]["partial_files"] >= 1
    assert not set(left) & set(procs["c"].partial_files()), "the restarted store removed it"

    # Another segment on its way to b and rows only in a's log, then SIGKILL the leader.
    for i in range(3000, 5000, 200):
        write("a", range(i, i + 200))
    write("a", range(5000, 5050))
    until("b has a partial incoming file", lambda: bool(procs["b"].partial_files()))
    assert acked == set(range(2500)) | set(range(3000, 5050)), "the leader acknowledged every write"
    procs["a"].kill()
    until("b leads", lambda: procs["b"].partition()["leader"] == "b")
    until("c follows b", lambda: procs["c"].partition()["leader"] == "b")
    for i in range(6000, 6600, 200):
        write("b", range(i, i + 200))
    assert set(range(6000, 6600)) <= acked

    start("a")  # recovers its log, leads again, merges what b accepted meanwhile
    assert procs["a"].partition()["recovered"]["log_records"] >= 1
    until("a leads everywhere", lambda: all(p.partition()["leader"] == "a" for p in procs.values()))
    write("a", range(7000, 7010))

    def converged() -> bool:
        reads = [set(p.ask("read")["keys"]) for p in procs.values()]
        return all(r == reads[0] for r in reads) and acked <= reads[0]

    until("every replica holds every acknowledged row", converged, timeout=60)
    got = set(procs["a"].ask("read")["keys"])
    assert got == acked, sorted(got ^ acked)[:10]

    def quiet() -> bool:  # a compaction's major may still be on its way after the rows converged
        statuses = [p.status() for p in procs.values()]
        idle = all(st["incoming"] == 0 and st["outgoing"] == 0 for st in statuses)
        return idle and not any(p.partial_files() for p in procs.values())

    until("no transfer and no partial file left", quiet)
    for p in procs.values():
        assert p.status()["counters"].get("handler_failed", 0) == 0, p.node
