"""This node's replica of a partition, the settings of the replication role, and the hooks its mixed-in
parts call on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkbus.bus.contract import Action
from sparkbus.roles.replication.layout import Lifecycle, PartitionSpec, Replica, SplitTarget
from sparkbus.roles.replication.messages import SplitFinalized
from sparkbus.roles.replication.store import PartitionStore, StoreConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicationConfig:
    """Settings of the role.

    Attributes:
        store: thresholds of every partition store.
        max_incoming: MAX_REPL_INCOMING_SEGMENTS: concurrent incoming transfers before OVERLOADED.
            Default 6, EventQL's ``kDefaultReplicationConcurrency``.
        chunk_bytes: bytes per stream batch of a transit.
        credit_bytes: initial credit (the most a receiver buffers per transit).
        tick: seconds between runs of the replication procedures.
        retry_after: seconds before retrying a target after OVERLOADED, INVALID, INFLIGHT or an error.
        start_wait: seconds a replica opened at start waits, before it leads, for a peer whose store it
            knows and that is not up yet to come up and speak (it may hold the replica for away and
            have taken rows meanwhile); a peer still down then is led without.
    """

    store: StoreConfig = field(default_factory=StoreConfig)
    max_incoming: int = 6
    chunk_bytes: int = 1 << 20
    credit_bytes: int = 4 << 20
    tick: float = 1.0
    retry_after: float = 0.5
    start_wait: float = 5.0

    def __post_init__(self) -> None:
        if self.max_incoming < 1 or self.chunk_bytes < 1 or self.credit_bytes < 1:
            raise ValueError("max_incoming, chunk_bytes and credit_bytes must be >= 1")
        if self.tick <= 0 or self.retry_after < 0 or self.start_wait < 0:
            raise ValueError("tick must be > 0, retry_after and start_wait >= 0")


@dataclass(kw_only=True)
class LocalReplica:
    """This node's replica of one partition."""

    spec: PartitionSpec
    me: Replica
    store: PartitionStore
    leader: Replica | None = None
    term: int = 0
    # Draining in UNLOAD: when it last sent the split's finalize, and whether a current replica of the
    # partition has answered that it knows of the split (the drain ends only then).
    told_at: float = float("-inf")
    split_known: bool = False

    @property
    def lifecycle(self) -> Lifecycle:
        return Lifecycle(self.store.meta.get("lifecycle", int(self.spec.lifecycle)))

    def set_lifecycle(self, lifecycle: Lifecycle) -> None:
        self.store.meta["lifecycle"] = int(lifecycle)
        self.store.save_manifest()

    @property
    def leads(self) -> bool:
        return self.leader is not None and self.leader.node == self.me.node

    def split_finalized(
        self, targets: tuple[SplitTarget, ...] | None = None, async_split: bool | None = None
    ) -> SplitFinalized:
        """SPLIT_FINALIZE of this replica's split (its spec's unless given), naming this store (a peer
        that heard the store's hello takes it though its layout no longer places this node) and its clock
        (a source replica raised it to the leader's when it took the finalize)."""
        return SplitFinalized(
            partition=self.spec.partition,
            targets=self.spec.split_targets if targets is None else targets,
            async_split=self.spec.async_split if async_split is None else async_split,
            placement=self.me.placement,
            epoch=self.store.epoch,
            lamport=self.store.lamport,
        )


class Hooks:
    """What each part mixed into ``ReplicationRole`` calls on the role, which provides it."""

    def _emit(self, action: Action) -> None:
        raise NotImplementedError

    def _count(self, name: str) -> None:
        raise NotImplementedError

    def _start_compaction(self, rep: LocalReplica) -> bool:
        raise NotImplementedError

    def _compacting(self, rep: LocalReplica) -> bool:
        raise NotImplementedError

    def _abandon_compaction(self, partition: str, why: str, rep: LocalReplica | None = None) -> None:
        raise NotImplementedError
