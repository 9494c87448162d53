"""A leader in UNLOAD answered OUT_OF_ORDER (an offer made before a split, answered after it): no
compaction is started, where one was registered and counted (``compactions_for_out_of_order``, the offer
put off for retry_after) only for ``_void`` to abandon it at its first step (``compactions_abandoned``)."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.bus.contract import LocalCall, Reply, TimerFired
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.compacting import COMPACT_TIMER
from sparkbus.roles.replication.layout import Layout, Lifecycle, PartitionSpec, Replica, SplitTarget
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.messages import DeclineReason, SegmentDeclined
from sparkbus.roles.replication.offering import _Out
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import StoreConfig, segment_file

P, T = "t/0", "t/1"
STORE = StoreConfig(batch_rows=2, flush_rows=8, compact_minors=3, flush_age=1000.0)


def test_an_out_of_order_decline_in_unload_gets_its_target_a_major() -> None:
    storages = {P: MemoryStorage(), T: MemoryStorage()}
    layout = Layout.of(
        [
            PartitionSpec(
                partition=P,
                replicas=(Replica(node="s", placement=1), Replica(node="x", placement=2)),
                split_targets=(SplitTarget(partition=T, low=None, high=None),),
            ),
            PartitionSpec(partition=T, replicas=(Replica(node="y", placement=3),)),
        ]
    )
    role = ReplicationRole("s", layout, lambda p: storages[p], ReplicationConfig(store=STORE, start_wait=0.0))
    role.handle(TimerFired(key="replication/tick"), 0.0)
    for i, tag in enumerate("ab"):  # a major and a minor
        batch = pa.RecordBatch.from_pydict({"key": list(range(8)), "v": [f"{tag}{k}" for k in range(8)]})
        call = LocalCall(call_id=i, name="write", args={"partition": P, "rows": bytes(encode_batch(batch))})
        assert [a.error for a in role.handle(call, 1.0) if isinstance(a, Reply)] == [None]
    rep = role.local[P]
    assert rep.leads and rep.store.minors_since_major() == 1
    rep.set_lifecycle(Lifecycle.UNLOAD)  # the split is finalized: the source pushes to the target
    minor = rep.store.root
    assert minor is not None
    role._now, role._actions = 2.0, []
    # An offer to a follower made in SERVE, answered after the split's finalize put the source in UNLOAD.
    out = _Out(
        dest=(P, P, 2), peer="x", segment_id=minor, file=segment_file(minor), size=0, temp=False, sender=1
    )
    role.outgoing[out.dest] = out
    role._on_declined("x", SegmentDeclined(partition=P, segment_id=minor, reason=DeclineReason.OUT_OF_ORDER))
    registered = P in role.compactions
    for _ in range(50):  # the compaction's steps
        role.handle(TimerFired(key=COMPACT_TIMER), 2.0)
    counters = role.counters
    # No compaction can run in UNLOAD (``_void``): none is started, none counted, none abandoned.
    assert (
        registered,
        counters.get("compactions_for_out_of_order"),
        counters.get("compactions_abandoned"),
    ) == (
        False,
        None,
        None,
    )
