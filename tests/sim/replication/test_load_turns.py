"""A node loads its local rows a chunk per loop turn: the load timer is set just after ``now``, because the
bus (``NodeCore.tick``) fires again, in the same call, a timer set at the time it runs, and set at ``now``
the whole load was written in one turn, the node reading no socket (its peers' heartbeats) meanwhile."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.replication import MemoryStorage, ServingReplication, factory
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica

LAYOUT = Layout.of([PartitionSpec(partition="a/0", replicas=(Replica(node="s", placement=1),))])


def test_each_tick_of_the_node_writes_one_chunk_of_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "LOAD_CHUNK_ROWS", 4)
    rows = pa.table({"id": list(range(40)), factory.PARTITION_COLUMN: ["a/0"] * 40})
    storage = MemoryStorage()
    rep = ServingReplication(
        "s", LAYOUT, {"a": ("id",)}, lambda p: storage, local_data=tuple(rows.to_batches())
    )
    sim = SimBus(seed=1)
    sim.add_node("s", [rep])
    sim.start()
    core = sim.node("s").core
    sim.call("s", "replication", "status")  # the role's first event: it opens its store, writes a chunk
    written = [rep.loaded.get("a/0", 0)]
    for _ in range(100):
        at = core.next_deadline()
        assert at is not None
        core.tick(max(at, sim.now))
        written.append(rep.loaded.get("a/0", 0))
        if written[-1] == 40:
            break
    steps = [b - a for a, b in zip([0, *written], written, strict=False)]
    assert written[-1] == 40 and max(steps) <= 4, written  # ten ticks of one chunk, not one of ten
    assert rep.local["a/0"].store.rows().num_rows == 40
