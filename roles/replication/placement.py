"""Where this node's replica of a partition comes and goes: open, re-place, drop (spec 3.6).

Mixed into ``ReplicationRole``. A replica that is unassigned or re-placed may hold rows no other
replica has (writes it acknowledged and has not replicated yet). protocol-facts 2.3's rule for a
partition that is dropped applies: drop only when nothing needs replication. So:

* an unassigned replica drains: it stops serving, forgets the acks it held (it hears no hello from now
  on, so it could not tell an ack of a store lost since), flushes, pushes to the partition's leader (in
  UNLOAD: to each split target's leader) every segment no current replica has acked during the drain,
  and deletes its files only once none is left (in UNLOAD, also only once a current replica of the
  partition has answered its finalize: it may be the only node that knows of the split);
* a re-placed replica carries over: the segments of its chain (every live row, whoever acked them: an
  ack may be of a store lost since, as for a drain) are set aside (``PartitionStore.mark_carry``) and
  merged, with their versions, into the new placement, which starts with an empty segment list as the
  spec asks and replicates them like new writes.

Either way the files stay on disk until their rows are elsewhere: a node that stops first finds them
when it comes back (under its old placement it serves them again; under a new one it carries them
over; where its layout no longer places it, it drains them, as if the ``assign`` came then:
``_resume_drains``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.replication.epochs import records_of
from sparkbus.roles.replication.layout import (
    Layout,
    LeaderElection,
    Lifecycle,
    PartitionSpec,
    Replica,
    SplitTarget,
)
from sparkbus.roles.replication.local import Hooks, LocalReplica, ReplicationConfig
from sparkbus.roles.replication.messages import SplitFinalized
from sparkbus.roles.replication.segments import (
    SegmentCorrupt,
    SegmentEntry,
    UnsupportedSegmentFormat,
    chain,
)
from sparkbus.roles.replication.storage import SimulatedCrash, Storage
from sparkbus.roles.replication.store import MANIFEST, WAL, PartitionStore, StoreError, read_manifest

log = logging.getLogger(__name__)


class Placement(Hooks):
    """Hosting, re-placing and dropping replicas; ``ReplicationRole`` provides the state and hooks."""

    node: str
    layout: Layout
    storage_for: Callable[[str], Storage]
    config: ReplicationConfig
    election: LeaderElection
    live: set[str]
    local: dict[str, LocalReplica]
    # Unassigned replicas that still hold rows no current replica has acked, by partition.
    draining: dict[str, LocalReplica]
    # Nodes an ``assign`` removed from a partition's replicas (``_note_removed``).
    former: dict[str, set[str]]
    # Partitions whose store failed its checksums and started empty, with the reason (status).
    damaged: dict[str, str]
    strays: list[str]
    # When a refused finalize of a split was last answered, by (peer, partition).
    answered: dict[tuple[str, str], float]
    outgoing: dict[tuple[str, str, int], Any]
    incoming: dict[tuple[str, str], Any]
    refused: dict[tuple[str, str, bytes], str]
    _now: float

    def _flush(self, rep: LocalReplica) -> SegmentEntry | None:
        raise NotImplementedError

    def _sending(self, partition: str) -> set[str]:
        raise NotImplementedError

    def _abandon(self, out: Any, rep: LocalReplica | None) -> None:
        raise NotImplementedError

    def _fail_in(self, inc: Any, error: str) -> None:
        raise NotImplementedError

    def _offer(self, rep: LocalReplica, target: str, replica: Any, entry: SegmentEntry, split: Any) -> None:
        raise NotImplementedError

    def _leader_in(self, spec: PartitionSpec) -> Replica | None:
        raise NotImplementedError

    def _split_nodes(self, spec: PartitionSpec) -> set[str]:
        raise NotImplementedError

    def _tell_split(self, msg: SplitFinalized, nodes: set[str]) -> None:
        raise NotImplementedError

    def _host(self, spec: PartitionSpec) -> None:
        """Open, re-open (new placement) or drop this node's replica of ``spec``."""
        partition = spec.partition
        me = spec.replica_on(self.node)
        current = self.local.get(partition)
        old: LocalReplica | None = None
        if current is not None and (me is None or current.me.placement != me.placement):
            self._end_transfers(current)
            del self.local[partition]
            old = current
            if me is None:
                current.spec = spec
                if current.lifecycle != Lifecycle.UNLOAD_FINAL:  # UNLOAD_FINAL holds nothing
                    # It hears no hello from now on (hellos go to replicas), so it cannot tell an ack
                    # from a store that has since lost its disk: it counts only the acks of its drain.
                    current.store.forget_acked()
                    self.draining[partition] = current
                    self._count("drains_started")
                return
        draining = self.draining.get(partition)
        if me is None:
            if draining is not None:
                draining.spec = spec  # its leader may have changed
            return
        if current is not None and old is None:
            current.spec, current.me = self._with_saved_split(spec, current.store), me
            return
        if draining is not None:
            self._end_transfers(draining)
            del self.draining[partition]
            old = draining
        storage = self.storage_for(partition)
        try:
            self._set_aside(storage, spec, old.store if old is not None else None)
            store = PartitionStore.open(storage, partition, me.placement, self.config.store, self._now)
        except UnsupportedSegmentFormat:
            raise  # not damage: the files may be whole (docs/REPLICATION.md, "Files")
        except (StoreError, SegmentCorrupt) as exc:
            store = self._open_over_damaged(storage, partition, me.placement, exc)
        former = self.former.setdefault(partition, set())
        former.update(store.meta.get("former", ()))
        if former and sorted(former) != store.meta.get("former"):  # a new placement keeps them too
            store.meta["former"] = sorted(former)
            store.save_manifest()
        spec = self._with_saved_split(spec, store)
        rep = LocalReplica(spec=spec, me=me, store=store)
        self._merge_carried(rep)
        # Hosted only once whole: a replica whose carried rows failed to merge is opened again
        # (``ReplicationRole._open``), not served without them.
        self.local[partition] = rep

    def _knows_store(self, msg: SplitFinalized) -> bool:
        """Whether this node's replica of the partition heard the hello of the store ``msg`` names."""
        rep = self.local.get(msg.partition)
        known = None if rep is None or msg.placement is None else records_of(rep).get(msg.placement)
        return known is not None and known[0] == msg.epoch

    def _split_problem(self, partition: str, targets: tuple[SplitTarget, ...]) -> str | None:
        """Why ``partition`` cannot split into ``targets``: it split into other targets already, an
        unknown target, or a bound that is not a value of the key's first column, or one its column
        cannot be compared with (it would fail every rewrite of a segment for the range)."""
        rep = self.local.get(partition) or self.draining.get(partition)
        split = rep is not None and rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL)
        # A drainer's spec is the assign's (or the layout's), without the split: its manifest has it.
        made = (rep.spec.split_targets or self._saved_targets(rep.store)) if split and rep is not None else ()
        if made and set(made) != set(targets):
            # Split already, into others: a stale finalize (say of a leader an assign removed, when the
            # split was made again on the current one) must not re-route a split made.
            return f"{partition} split into other targets already"
        schema = None if rep is None else rep.store.schema
        key_type = None if schema is None or rep is None else schema.field(rep.store.config.key[0]).type
        for t in targets:
            if t.partition == partition or t.partition not in self.layout.partitions:
                return f"split target {t.partition!r} is not another partition of the layout"
            for bound in (t.low, t.high):
                if bound is None or key_type is None:
                    continue
                try:
                    # Tried as the rewrite for the range uses it: a value of the key's type that the
                    # key column can be compared with (a float16 key has no comparison kernel).
                    pc.less(pa.array([], key_type), pa.scalar(bound, type=key_type))
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    return f"split bound {bound!r} of {t.partition} cannot be compared with a {key_type} key"
        return None

    def _answer_known_split(self, peer: str, msg: SplitFinalized) -> bool:
        """A finalize this node refuses (from a stranger to it) of the split its replica is in already:
        answer with its own, once a tick, so that a drain waiting for a replica to know ends. (The
        split was made again on the current leader, by the operator: docs/REPLICATION.md.) Two such
        replicas, each a stranger to the other (layouts that disagree), answered each other for ever.
        """
        rep = self.local.get(msg.partition)
        if rep is None or rep.lifecycle not in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL):
            return False
        if set(rep.spec.split_targets) != set(msg.targets):
            return False
        if self._now >= self.answered.get((peer, msg.partition), float("-inf")) + self.config.tick:
            self.answered[peer, msg.partition] = self._now
            self._tell_split(rep.split_finalized(), {peer})
        return True

    def _resume_drains(self) -> None:
        """At start: drain the files of each partition the layout does not place on this node.

        A node stopped before its drain ended, or restarted with a layout that unassigned it while it
        was down, holds rows no current replica may have (it may even be the only node that knows of
        a split). ``storage_for.held(partitions)``, when the storage has it (``NodeData``), names the
        partitions with a manifest here; without it nothing is resumed and the files stay.
        """
        strays = getattr(self.storage_for, "strays", None)
        if strays is not None:
            self.strays = strays(self.layout.partitions)
            if self.strays:
                # Kept: a table dropped from the topology by mistake comes back with its rows.
                log.warning(
                    "replication %s: replica files of partitions the layout does not have are left as "
                    "they are (delete them once not wanted): %s",
                    self.node,
                    ", ".join(self.strays),
                )
        held = getattr(self.storage_for, "held", None)
        if held is None:
            return
        unplaced = [p for p, s in self.layout.partitions.items() if s.replica_on(self.node) is None]
        for partition in held(unplaced):
            if partition in self.draining:
                continue
            try:
                self._resume_drain(self.layout.partitions[partition])
            except SimulatedCrash:
                raise
            except Exception as exc:  # a StoreError, an OSError, a ValueError of a file not classified
                # Files it cannot open stay as they are; raised, they stopped the node's start (its
                # elections) for a partition it does not even serve.
                self._count("drains_unreadable")
                log.error(
                    "replication %s: %s: cannot resume its drain: %s: %s",
                    self.node,
                    partition,
                    type(exc).__name__,
                    exc,
                )

    def _resume_drain(self, spec: PartitionSpec) -> None:
        storage = self.storage_for(spec.partition)
        placement = int(read_manifest(storage, spec.partition)["placement"])
        store = PartitionStore.open(storage, spec.partition, placement, self.config.store, self._now)
        store.forget_acked()  # as any drain (_host): only the acks this drain brings count
        rep = LocalReplica(spec=spec, me=Replica(node=self.node, placement=placement), store=store)
        self._merge_carried(rep)  # killed in a carry-over: the new placement's store holds carry- files
        self.draining[spec.partition] = rep
        self._count("drains_resumed")

    def _open_over_damaged(
        self, storage: Storage, partition: str, placement: int, exc: Exception
    ) -> PartitionStore:
        """A store whose manifest or a listed segment fails its checksum: its files are renamed aside
        (``damaged<k>-<name>``, kept for whoever wants to look) and the replica starts empty, under a
        new epoch, so its peers take it for rejoining and send it everything (``epochs.py``). Raised,
        the error stopped the role's start, its timer and elections, for every partition of the node.
        """
        k = 1
        while any(n.startswith(f"damaged{k}-") for n in storage.names()):
            k += 1
        # The manifest goes first: killed in between, the next open deletes the segment files not
        # renamed yet as unlisted (their rows are what the peers send anyway). The log stays: its
        # records are checked one by one and replaying them twice changes nothing, so the writes
        # acknowledged since the last flush are served again.
        names = [n for n in storage.names() if n != WAL and not n.startswith("damaged")]
        for name in sorted(names, key=lambda n: n != MANIFEST):
            storage.rename(name, f"damaged{k}-{name}")
        self.damaged[partition] = f"{exc} (files renamed to damaged{k}-*)"
        self._count("stores_set_aside")
        return PartitionStore.open(storage, partition, placement, self.config.store, self._now)

    def _set_aside(self, storage: Storage, spec: PartitionSpec, old: PartitionStore | None) -> None:
        """Before a new placement opens on ``storage``: mark what the old placement must carry over.

        ``old`` is the old placement's store if this process has it open; otherwise the one the manifest
        names is opened (a restart with a new placement in the layout), which replays its log.
        """
        me = spec.replica_on(self.node)
        assert me is not None
        if old is None:
            if not storage.exists(MANIFEST):
                return
            placement = int(read_manifest(storage, spec.partition)["placement"])
            if placement == me.placement:
                return
            old = PartitionStore.open(storage, spec.partition, placement, self.config.store, self._now)
        old.flush()  # the log is not carried: its rows go into a segment first
        # Every live row, whatever the acked lists say: an ack may be of a store lost since, whose new
        # hello this node has not heard (it was down, or the link is cut), so no ack proves that the rows
        # are elsewhere. The chain (latest major and the minors after it) holds every row; older
        # segments hold only versions the major has folded in.
        old.mark_carry([e.segment_id for e in chain(old.entries, old.root)])

    def _merge_carried(self, rep: LocalReplica) -> None:
        """Merge the segments an old placement carried over (``carry-<id>``), then delete them.

        Merged through the log, so each file may go once its rows are durable; a crash in between
        merges it again, which changes nothing. The rows keep their versions. The memtable is flushed
        whenever it is full: the carried files hold the whole partition.
        """
        store = rep.store
        carried = store.carried()
        for name in carried:
            store.merge_segment_file(name, self._now)
            store.storage.delete(name)
            self._count("carried_segments")
            if store.should_flush(self._now):
                self._flush(rep)
        if carried:
            self._flush(rep)

    def _note_removed(self, old: PartitionSpec | None, new: PartitionSpec) -> None:
        """Remember the nodes ``new`` drops from ``old``'s replicas, in the hosted replica's manifest too.

        A split finalize is taken from them as from a replica (``_finalize_problem``). The leader of an
        async split sends it at once; an ``assign`` that removed that leader and reached this node first
        made it a stranger here, so its finalize was refused: the source kept serving and the target
        stayed in LOAD for good, holding only the rows the removed leader drained into it.
        """
        removed = {r.node for r in old.replicas} - {r.node for r in new.replicas} if old else set()
        known = self.former.setdefault(new.partition, set())
        rep = self.local.get(new.partition)
        if removed - known:
            known |= removed
            if rep is not None:
                rep.store.meta["former"] = sorted(known)
                rep.store.save_manifest()

    def _drain(self, rep: LocalReplica) -> None:
        """An unassigned replica: push to the leader what no current replica holds; then drop it.

        In UNLOAD (the partition split) the leader takes nothing more: what no current replica holds
        goes to each split target's leader instead, rewritten to its range, as UNLOAD does (spec 3.8).
        """
        partition = rep.spec.partition
        self._flush(rep)
        holders = {r.placement for r in rep.spec.replicas}
        alone = [e for e in rep.store.entries if not e.acked & holders]
        targets = self._saved_targets(rep.store) if rep.lifecycle == Lifecycle.UNLOAD else ()
        if targets:
            alone = self._drain_to_targets(rep, alone, targets)
            # It may be the split's leader, removed by an assign that reached the others before its
            # finalize: then they may know of the split from nobody else (_note_removed). It tells the
            # split's nodes, again each tick, until a current replica answers that it knows.
            if not rep.split_known and self._now >= rep.told_at + self.config.tick:
                msg = rep.split_finalized(targets, bool(rep.store.meta["split"]["async_split"]))
                self._tell_split(msg, self._split_nodes(replace(rep.spec, split_targets=targets)) & self.live)
                rep.told_at = self._now
        if not alone and (rep.split_known or not targets) and not self._sending(partition):
            rep.store.reset()
            rep.store.storage.delete(MANIFEST)  # nothing to resume at the next start
            del self.draining[partition]
            self._count("drains_done")
            return
        leader = self._leader_in(rep.spec)
        if alone and leader is not None and not targets:
            self._offer(rep, partition, leader, alone[0], None)  # one at a time, in list order

    def _drain_to_targets(
        self, rep: LocalReplica, alone: list[SegmentEntry], targets: tuple[SplitTarget, ...]
    ) -> list[SegmentEntry]:
        """Offer each target's leader the first segment of ``alone`` it has not acked; the ones left."""
        left: list[SegmentEntry] = []
        for target in targets:
            spec = self.layout.partitions.get(target.partition)
            leader = None if spec is None else self._leader_in(spec)
            missing = [e for e in alone if leader is None or leader.placement not in e.acked]
            if missing and leader is not None:
                self._offer(rep, target.partition, leader, missing[0], target)
            left += [e for e in missing if e not in left]
        return left

    def _with_saved_split(self, spec: PartitionSpec, store: PartitionStore) -> PartitionSpec:
        """``spec`` with the split its replica's manifest records (``_save_split``), if it names none.

        The layout comes from the topology, which knows nothing of a split: without this a replica
        restarted in UNLOAD has no target to push to and nobody to re-send the finalize to.
        """
        saved = store.meta.get("split")
        if spec.split_targets or not saved:
            return spec
        spec = replace(spec, split_targets=self._saved_targets(store), async_split=bool(saved["async_split"]))
        self.layout.partitions[spec.partition] = spec
        return spec

    @staticmethod
    def _saved_targets(store: PartitionStore) -> tuple[SplitTarget, ...]:
        """The split targets ``store``'s manifest records (``_save_split``), or none."""
        saved = store.meta.get("split") or {"targets": ()}
        return tuple(SplitTarget(partition=t[0], low=t[1], high=t[2]) for t in saved["targets"])

    @staticmethod
    def _save_split(rep: LocalReplica) -> None:
        """Record ``rep``'s split targets in its manifest (saved with the next manifest write)."""
        rep.store.meta["split"] = {
            "targets": [[t.partition, t.low, t.high] for t in rep.spec.split_targets],
            "async_split": rep.spec.async_split,
        }

    def _end_transfers(self, rep: LocalReplica) -> None:
        """``rep`` is dropped or re-placed: end every transfer of its placement (spec 3.6), and its
        compaction under way (its partial file removed before any store opens on its storage again).

        Outgoing ones are ended short (``_abandon``) so their receivers free their slots; incoming ones
        are answered with an error ack, so their senders retry later against the placement we hold then.
        Left open, an accepted offer waits for ever for chunks its sender no longer sends, and with one
        offer at a time per destination nothing reaches that receiver again.
        """
        partition = rep.spec.partition
        self._abandon_compaction(partition, "the replica was re-placed or dropped", rep)
        self.refused = {k: v for k, v in self.refused.items() if k[0] != partition}  # a new, empty store
        for out in [o for o in self.outgoing.values() if o.dest[0] == partition]:
            self._abandon(out, rep)
        for inc in [i for i in self.incoming.values() if i.offer.partition == partition]:
            self._fail_in(inc, f"{self.node} no longer holds placement {inc.offer.target} of {partition}")
