"""A fragment that waits for a partition being read (SourcePending) runs again at sources_ready. The
build is dropped, and sources_ready sent, exactly when the node stops leading the partition: its
leadership moved to another participant whose scan already ran (without it: it did not lead then), so
the partition was in nobody's rows and the query answered short (5 of 65 rows), with no error. Now the
rerun compares what the node serves with what it served when the fragment first ran, and fails the query
with MEMBER_LEAVE (transient: a client retries it) when that changed.

The simulated clock gives each step of a read 1 us; on a real node each step is a loop turn of tens of
milliseconds (a 2-million-row chain: 47 steps, 1.5 s). ``STEP_GAP`` is raised to model that duration."""

from __future__ import annotations

import errno

import pyarrow as pa
import pytest

from sparkbus.codecs import encode_batch
from sparkbus.roles.query.api import Query, result_table
from sparkbus.roles.replication import MemoryStorage, serving
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.store import MANIFEST

from .test_serving_reads import Nodes as ServingNodes

P, Q = "a/0", "a/1"
NODES = ("s-0", "s-1")
LAYOUT = Layout.of(
    [
        PartitionSpec(
            partition=P, replicas=(Replica(node="s-0", placement=1), Replica(node="s-1", placement=2))
        ),
        PartitionSpec(
            partition=Q, replicas=(Replica(node="s-1", placement=3), Replica(node="s-0", placement=4))
        ),
    ]
)


class Nodes(ServingNodes):
    """Both nodes with replication, query and ``test_serving_reads``'s ticker (idle here), over a/0 and a/1."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed, LAYOUT)

    def write_flushed(self, node: str, partition: str, ids: list[int]) -> None:
        batch = pa.RecordBatch.from_pydict({"id": ids, "v": ["x"] * len(ids)})
        args = {"partition": partition, "rows": bytes(encode_batch(batch))}
        self.sim.result(self.sim.call(node, "replication", "write", args))
        self.sim.result(self.sim.call(node, "replication", "flush", {"partition": partition}))


def failing_disk(storage: MemoryStorage) -> list[bool]:
    """Make ``storage``'s manifest unreadable (EIO) while the returned flag holds True."""
    failing = [False]
    readable = storage.read

    def read(name: str, offset: int = 0, size: int = -1) -> bytes:
        if failing[0] and name == MANIFEST:
            raise OSError(errno.EIO, "Input/output error")
        return readable(name, offset, size)

    storage.read = read  # type: ignore[method-assign]
    return failing


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_waiting_scan_whose_partition_moves_to_another_participant(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = Nodes(seed)
    sim = nodes.sim
    for start in range(0, 60, 20):
        nodes.write_flushed("s-0", P, list(range(start, start + 20)))  # a/0: 60 rows, 3 segments
    nodes.write_flushed("s-1", Q, [1000, 1001, 1002, 1003, 1004])  # a/1: 5 rows, led by s-1
    sim.run_for(5.0)
    monkeypatch.setattr(serving, "STEP_GAP", 0.5)  # a step: a loop turn of real time (module doc)
    failing = failing_disk(nodes.storages[f"s-0:{P}"])
    sim.crash("s-0")
    failing[0] = True  # s-0 comes back with its replica of a/0 unreadable: s-1 leads a/0 and reads it
    sim.restart("s-0", nodes.roles_of("s-0"))
    s0, s1 = nodes.roles["s-0"], nodes.roles["s-1"]
    q0, q1 = sim.node("s-0").roles["query"], sim.node("s-1").roles["query"]
    sim.run_until(
        lambda: "s-0" in q1.peers_up and "s-1" in q0.peers_up and P in s0.failing and s1.local[P].leads,
        limit=10,
    )
    assert P in s1.serving.builds, "s-1 leads a/0 and is still reading its rows"
    query = Query(sql="SELECT COUNT(*) AS n FROM a", participants=("s-0", "s-1"), timeout=30.0)
    cid = sim.call("s-1", "query", "execute", query.args())
    sim.run_until(lambda: q1.counters["source_waits"] > 0, limit=5)  # s-0's scan ran; s-1's waits
    failing[0] = False  # s-0's disk is repaired: it opens a/0 again, is caught up and leads it
    sim.run_until(lambda: sim.reply(cid) is not None, limit=60)
    done = sim.reply(cid)
    assert done is not None
    got = done.error if done.error is not None else result_table(done.result).to_pylist()
    assert done.error is not None, f"answered {got} without error, where 65 rows are loaded (a/0 60, a/1 5)"
    assert "MEMBER_LEAVE" in done.error, done.error
    assert f"the partitions of a s-1 serves changed while its rows were read ({P})" in done.error
    assert q1.counters["source_waits"] >= 1
    sim.run_for(5.0)
    again = Query(sql="SELECT COUNT(*) AS n FROM a", participants=("s-0", "s-1"), timeout=30.0)
    assert result_table(sim.result(sim.call("s-1", "query", "execute", again.args()))).to_pylist() == [
        {"n": 65}
    ]
