"""SIGSTOP of a follower and of the leader while a segment is in transit (replication, three processes).

Builds on tests/integration/replication (its ``replica_proc.py`` child, whose slow incoming disk keeps a
transit going long enough): a leads partition t/0, b and c follow. The integration test covers SIGKILL
and restarts; here the nodes are stopped and resumed, so each comes back with its memory and its view of
the cluster from before the stop.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import short_tmp
from .procs import Proc, children, until

pytestmark = pytest.mark.timeout(180)
REPLICA_PROC = Path(__file__).parents[1] / "integration" / "replication" / "replica_proc.py"
NODES = ("a", "b", "c")


class Replica(Proc):
    def __init__(self, node: str, root: Path) -> None:
        super().__init__(
            node, [str(REPLICA_PROC), node, ",".join(NODES), str(root / "ipc"), str(root / "stores")]
        )
        self.store = root / "stores" / node / "t~0"
        assert self.receive() == {"started": node}

    def leader(self) -> str:
        leader: str = self.ask("status")["partitions"]["t/0"]["leader"]
        return leader

    def keys(self) -> set[int]:
        return set(self.ask("read")["keys"])

    def partial_files(self) -> list[str]:
        return sorted(p.name for p in self.store.glob("in-*.tmp")) if self.store.exists() else []


@pytest.fixture
def replicas(fds_back: None) -> Iterator[dict[str, Replica]]:
    root = short_tmp("faults-r-")
    (root / "ipc").mkdir()
    with children() as procs:
        try:
            nodes = {n: Replica(n, root) for n in NODES}
            for p in nodes.values():
                procs.add(p)
            yield nodes
        finally:
            procs.reap_all()
            shutil.rmtree(root, ignore_errors=True)


def _idle(status: dict[str, Any]) -> bool:
    return status["incoming"] == 0 and status["outgoing"] == 0


def test_sigstop_of_a_follower_and_of_the_leader_mid_transit_loses_no_acknowledged_row(
    replicas: dict[str, Replica],
) -> None:
    """What the user sees: writes to the leader keep succeeding while a follower is stopped mid-transit;
    while the leader is stopped mid-transit, writes to it cannot be made, b takes over after the peer
    timeout and its writes succeed. After SIGCONT every acknowledged row is on every replica (rows lost:
    0), the resumed nodes catch up by themselves, and no partial incoming file is left."""
    until(
        "every node sees the others",
        lambda: all(len(p.ask("status")["live"]) == 3 for p in replicas.values()),
    )
    acked: set[int] = set()

    def write(node: str, keys: range) -> None:
        if "ok" in replicas[node].ask("write", keys=list(keys)):
            acked.update(keys)

    def converged() -> bool:
        reads = [p.keys() for p in replicas.values()]
        return all(r == reads[0] for r in reads) and acked <= reads[0]

    def write_until_transit(leader: str, follower: str, first: int) -> int:
        """Write 200 rows at a time until a segment is on its way to ``follower`` (a flush, by size or by
        age, starts one); returns the next unused key."""
        deadline = time.monotonic() + 30
        key = first
        while replicas[follower].ask("status")["incoming"] == 0:
            assert time.monotonic() < deadline, f"no segment on its way to {follower} within 30 s"
            write(leader, range(key, key + 200))
            key += 200
        return key

    # 1. write until a segment is on its way to c; stop c during it; a keeps acknowledging writes.
    next_key = write_until_transit("a", "c", 0)
    replicas["c"].signal(signal.SIGSTOP)
    for i in range(next_key, next_key + 600, 200):
        write("a", range(i, i + 200))
    assert acked == set(range(next_key + 600)), "the leader acknowledged every write while c was stopped"
    replicas["c"].signal(signal.SIGCONT)
    resumed = time.monotonic()
    until("c caught up", converged, timeout=60)
    follower_recovery = time.monotonic() - resumed

    # 2. a segment on its way to b; stop the leader during it; b takes over.
    write_until_transit("a", "b", 100_000)
    replicas["a"].signal(signal.SIGSTOP)
    stopped = time.monotonic()
    until("b leads", lambda: replicas["b"].leader() == "b")
    failover = time.monotonic() - stopped
    for i in range(200_000, 200_600, 200):
        write("b", range(i, i + 200))
    assert set(range(200_000, 200_600)) <= acked, "b acknowledged the writes it took over"
    replicas["a"].signal(signal.SIGCONT)
    resumed = time.monotonic()
    until("every replica holds every acknowledged row", converged, timeout=60)
    leader_recovery = time.monotonic() - resumed

    got = replicas["a"].keys()
    assert acked <= got, sorted(acked - got)[:10]  # rows lost: 0
    for p in replicas.values():
        until(f"{p.name} has no transfer open", lambda p=p: _idle(p.ask("status")))
        assert not p.partial_files(), p.name
        counters = p.ask("status")["counters"]
        # the role catches its own errors (logged and counted): none is expected here either
        failed = {
            k: counters.get(k, 0)
            for k in ("handler_failed", "handler_errors", "procedure_errors", "open_errors")
        }
        assert failed == dict.fromkeys(failed, 0), (p.name, failed)
    print(
        f"FAULT replication-sigstop follower_recovery={follower_recovery:.3f} failover={failover:.3f} "
        f"leader_recovery={leader_recovery:.3f} acked={len(acked)} lost={len(acked - got)}"
    )
