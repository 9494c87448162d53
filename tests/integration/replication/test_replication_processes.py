"""Three replication nodes in child processes on real sockets, SIGKILLed and restarted on their stores.

a leads partition t/0 (first in placement order), b and c follow. Writes acknowledged by the leader; a
follower SIGKILLed while a segment is on its way to it; then the leader SIGKILLed while a segment is on its
way and with acknowledged rows only in its log; both restarted on the same store directory. In the end
every acknowledged row is on every replica, and the partial incoming files were discarded on restart.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkbus.roles.replication.storage import DiskStorage
from sparkbus.roles.replication.store import listed_files

from ...childproc import Proc

pytestmark = pytest.mark.integration
PROC = Path(__file__).with_name("replica_proc.py")
NODES = ("a", "b", "c")
REPLY_TIMEOUT = 15.0


class Replica(Proc):
    """One replica process: commands over stdin, answers on stdout (``Proc``)."""

    def __init__(self, node: str, ipc_dir: Path, store_dir: Path) -> None:
        self.node = node
        self.store = store_dir / node / "t~0"
        argv = [str(PROC), node, ",".join(NODES), str(ipc_dir), str(store_dir)]
        super().__init__(node, argv, reply_timeout=REPLY_TIMEOUT)
        assert self.receive() == {"started": node}

    def write(self, keys: range) -> bool:
        return "ok" in self.ask("write", keys=list(keys))

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.ask("status")
        return status

    def partition(self) -> dict[str, Any]:
        part: dict[str, Any] = self.status()["partitions"]["t/0"]
        return part

    def partial_files(self) -> list[str]:
        """Segment files on disk that the manifest does not list (yet): transfers arriving in place.

        Read from disk, not asked: a node appending slowly answers only between chunks."""
        if not self.store.exists():
            return []
        on_disk = {p.name for p in self.store.iterdir() if p.name.startswith(("seg-", "in-"))}
        return sorted(on_disk - listed_files(DiskStorage(self.store)))  # the manifest read after the listing


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
    left: list[str] = []

    def arriving() -> bool:  # the files seen are the ones killed mid-way: no second look in between
        left[:] = procs["c"].partial_files()
        return bool(left)

    until("c has a partial incoming file", arriving)
    procs["c"].kill()
    assert all((procs["c"].store / name).exists() for name in left), "the kill left the partial file behind"
    write("a", range(2000, 2500))
    start("c")
    recovered = procs["c"].partition()["recovered"]
    assert recovered["partial_files"] >= 1
    assert set(left) <= set(recovered["discarded"]), "the restarted store removed it"

    # Another segment on its way to b and rows only in a's log, then SIGKILL the leader.
    for i in range(3000, 5000, 200):
        write("a", range(i, i + 200))
    more = iter(range(5100, 6000, 50))
    last_write = [time.monotonic()]

    def b_receiving() -> bool:
        # The segment may have arrived before the first look: keep giving b small (age-flushed) ones.
        if procs["b"].partial_files():
            return True
        if time.monotonic() - last_write[0] > 0.3 and (k := next(more, None)) is not None:
            write("a", range(k, k + 50))
            last_write[0] = time.monotonic()
        return False

    until("b has a partial incoming file", b_receiving)
    write("a", range(5000, 5050))  # just before the kill: in the log only (flush_age is 0.5 s)
    written = set(range(2500)) | set(range(3000, 5050)) | {k for k in range(5100, 6000) if k in acked}
    assert acked == written and set(range(3000, 5050)) <= acked, "the leader acknowledged every write"
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
        counters = p.status()["counters"]
        # the role catches its own errors (logged and counted): none is expected here either
        failed = {
            k: counters.get(k, 0)
            for k in ("handler_failed", "handler_errors", "procedure_errors", "open_errors")
        }
        assert failed == dict.fromkeys(failed, 0), (p.node, failed)
