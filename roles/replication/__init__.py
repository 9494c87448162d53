"""Segment replication (EventQL): segment store, partition leader and follower."""

from sparkbus.roles.replication.factory import (
    PARTITION_COLUMN,
    REPLICAS_TABLE,
    ServingReplication,
    layout_for,
    make_role,
    partition_name,
    split_by_partition,
)
from sparkbus.roles.replication.layout import (
    FirstLiveElection,
    Layout,
    LeaderElection,
    Lifecycle,
    PartitionSpec,
    Replica,
    SplitTarget,
)
from sparkbus.roles.replication.local import ReplicationConfig
from sparkbus.roles.replication.messages import (
    DeclineReason,
    JoinFinalized,
    ReplicaHello,
    ReplicaRejoin,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
    SplitFinalized,
)
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.storage import DiskStorage, MemoryStorage, SimulatedCrash, Storage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, StoreError

__all__ = [
    "PARTITION_COLUMN",
    "REPLICAS_TABLE",
    "DeclineReason",
    "DiskStorage",
    "FirstLiveElection",
    "JoinFinalized",
    "Layout",
    "LeaderElection",
    "Lifecycle",
    "MemoryStorage",
    "PartitionSpec",
    "PartitionStore",
    "Replica",
    "ReplicaHello",
    "ReplicaRejoin",
    "ReplicationConfig",
    "ReplicationRole",
    "SegmentAccepted",
    "SegmentAcked",
    "SegmentDeclined",
    "SegmentOffered",
    "SegmentTransited",
    "ServingReplication",
    "SimulatedCrash",
    "SplitFinalized",
    "SplitTarget",
    "Storage",
    "StoreConfig",
    "StoreError",
    "layout_for",
    "make_role",
    "partition_name",
    "split_by_partition",
]
