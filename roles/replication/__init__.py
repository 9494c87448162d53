"""Segment replication (EventQL): segment store, partition leader and follower."""

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
    "ReplicationConfig",
    "ReplicationRole",
    "SegmentAccepted",
    "SegmentAcked",
    "SegmentDeclined",
    "SegmentOffered",
    "SegmentTransited",
    "SimulatedCrash",
    "SplitFinalized",
    "SplitTarget",
    "Storage",
    "StoreConfig",
    "StoreError",
]
