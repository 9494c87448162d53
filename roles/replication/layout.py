"""Where partitions live: replicas with placement ids, lifecycle states, split targets, leader election.

EventQL keeps this in its coordination service; sparkbus gives every ``replication`` role the same
``Layout`` (from the topology) and lets local calls change it (``assign``, ``split``). Leader election
is pluggable (spec 3.2): ``LeaderElection.leader`` names one replica from the partition's replicas and
the set of nodes this node believes live. The role hands it a spec in which each replica that must not
lead is joining: joining ones, and those away (a replica that cannot be opened or has not yet been caught
up after it could not: ``epochs.py``).

The default, ``FirstLiveElection``, picks the first live replica in placement order that is not
joining. Nodes whose liveness views differ (a network cut) can both believe they lead. Both then accept
writes and flush segments based on the same root: the chain forks. Nothing is corrupted: when the views
agree again, the replica that lost leadership flushes its memtable and pushes every segment the leader
has not acknowledged; the leader merges them (idempotent upserts, the highest version wins) and replicates
the result, so all replicas converge. The cost is the merges, as the spec says.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol


class Lifecycle(enum.IntEnum):
    """Partition lifecycle (EventQL ``partition_state.proto``: LOAD, SERVE, UNLOAD; plus UNLOAD_FINAL)."""

    LOAD = 1
    SERVE = 2
    UNLOAD = 3
    UNLOAD_FINAL = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class Replica:
    """One placement of a partition on a node; ``placement`` is unique per assignment (spec 3.6)."""

    node: str
    placement: int
    joining: bool = False

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("node must not be empty")
        if not 0 <= self.placement < 1 << 63:
            raise ValueError(f"placement must be in 0..2**63-1, got {self.placement}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitTarget:
    """A partition that receives the rows with ``low <= key < high`` (None: unbounded)."""

    partition: str
    low: int | str | None = None
    high: int | str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionSpec:
    """Metadata of one partition as every node sees it.

    Attributes:
        partition: the id, e.g. ``"orders/3"``.
        replicas: placements in placement order (the default election's order).
        lifecycle: the state new replicas start in (LOAD for a split target, SERVE otherwise).
        split_targets: set while the partition splits; ``async_split`` finalizes at once.
    """

    partition: str
    replicas: tuple[Replica, ...]
    lifecycle: Lifecycle = Lifecycle.SERVE
    split_targets: tuple[SplitTarget, ...] = ()
    async_split: bool = False

    def __post_init__(self) -> None:
        if not self.partition:
            raise ValueError("partition must not be empty")
        nodes = [r.node for r in self.replicas]
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"{self.partition}: a node holds two replicas: {nodes}")
        placements = [r.placement for r in self.replicas]
        if len(set(placements)) != len(placements):
            raise ValueError(f"{self.partition}: placement ids repeat: {placements}")

    def replica_on(self, node: str) -> Replica | None:
        for r in self.replicas:
            if r.node == node:
                return r
        return None

    def with_joining(self, placements: set[int]) -> PartitionSpec:
        """The spec with the replicas of ``placements`` joining: for an election that must not name them."""
        return replace(
            self,
            replicas=tuple(
                replace(r, joining=True) if r.placement in placements else r for r in self.replicas
            ),
        )

    def with_replica(self, replica: Replica) -> PartitionSpec:
        """The spec with ``replica`` replacing the one on its node (or added)."""
        others = tuple(r for r in self.replicas if r.node != replica.node)
        order = [r.node for r in self.replicas]
        merged = (*others, replica)
        if replica.node in order:
            merged = tuple(sorted(merged, key=lambda r: order.index(r.node)))
        return replace(self, replicas=merged)


@dataclass(kw_only=True)
class Layout:
    """Every partition's spec, by id."""

    partitions: dict[str, PartitionSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, specs: Sequence[PartitionSpec]) -> Layout:
        return cls(partitions={s.partition: s for s in specs})


class LeaderElection(Protocol):
    """Names the leader of a partition from this node's view of which nodes are live."""

    def leader(self, spec: PartitionSpec, live: frozenset[str]) -> Replica | None: ...


class FirstLiveElection:
    """The first live, non-joining replica in placement order (spec 3.2 and 3.7)."""

    def leader(self, spec: PartitionSpec, live: frozenset[str]) -> Replica | None:
        for r in spec.replicas:
            if r.node in live and not r.joining:
                return r
        return None
