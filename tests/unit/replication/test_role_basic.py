"""Steady state: writes on the leader, flushes, fast-forward on followers."""

from __future__ import annotations

from sparkbus.roles.replication.layout import PartitionSpec, Replica
from sparkbus.roles.replication.role import ReplicationConfig
from sparkbus.roles.replication.store import StoreConfig

from .harness import Cluster

P = "t/0"
SPEC = PartitionSpec(
    partition=P,
    replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2), Replica(node="c", placement=3)),
)


def config(**store: object) -> ReplicationConfig:
    return ReplicationConfig(
        store=StoreConfig(flush_rows=4, compact_minors=3, **store), chunk_bytes=256, credit_bytes=1024
    )  # type: ignore[arg-type]


def test_steady_state_fast_forward() -> None:
    c = Cluster(["a", "b", "c"], [SPEC], config(), seed=1)
    assert c.leader("a", P) == "a"
    for i in range(10):
        r = c.write("a", P, {"key": [i * 2, i * 2 + 1], "v": [f"x{i}", f"y{i}"]})
        assert r.error is None, r.error
    c.settle(10)
    expect = c.read("a", P)
    assert len(expect["key"]) == 20
    for n in "bc":
        assert c.read(n, P) == expect
    counters = c.status("b")["counters"]
    assert counters.get("fast_forwards", 0) > 0
    assert c.status("a")["counters"].get("merges", 0) == 0
