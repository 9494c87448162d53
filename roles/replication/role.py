"""The ``replication`` role: one per node, one leader-or-follower state per local partition replica.

Events in, actions out (``sparkbus.bus.contract``); all file I/O goes through each replica's
``PartitionStore`` and its ``Storage``. The procedures are those of spec section 3.5, run for every
partition on each tick and after every event that can let one proceed:

* leader: flush (row, byte or age threshold), compact (in steps over loop turns: ``compacting.py``),
  ``replicate_partition`` (delete weakly referenced segments, merge then delete unreferenced ones),
  ``replicate_partition_to`` every other replica, and, while splitting, to every split target's leader
  (spec 3.8);
* follower: flush what it wrote while it led, delete weakly referenced segments the leader acked, and
  push every segment the leader has not acked to the leader;
* UNLOAD: push every segment to every split target's leader, then drop the partition (UNLOAD_FINAL).

Offers go one at a time per (source partition, target partition, target placement), in segment-list
order, so each target sees them sequentially (spec 3.4). Choices where the spec is silent are listed in
``docs/REPLICATION.md``; the main ones are noted where they are made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar

import pyarrow as pa

from sparkbus.bus.contract import (
    Action,
    BatchReceived,
    CreditChanged,
    Event,
    HandlerFailed,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import DecodeError, decode_batch, encode_batch
from sparkbus.roles.replication.compacting import COMPACT_TIMER, Compacting
from sparkbus.roles.replication.epochs import Epochs, records_of
from sparkbus.roles.replication.layout import (
    FirstLiveElection,
    Layout,
    LeaderElection,
    Lifecycle,
    PartitionSpec,
    Replica,
    SplitTarget,
)
from sparkbus.roles.replication.local import LocalReplica, ReplicationConfig
from sparkbus.roles.replication.messages import (
    MESSAGES,
    JoinFinalized,
    ReplicaAbsent,
    ReplicaCaughtUp,
    ReplicaHello,
    ReplicaRejoin,
    ReplicaReturns,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
    SplitFinalized,
)
from sparkbus.roles.replication.offering import Offering, _Out
from sparkbus.roles.replication.placement import Placement
from sparkbus.roles.replication.receiving import Receiving, _In
from sparkbus.roles.replication.segments import (
    SegmentEntry,
    is_reference_weak,
    is_referenced,
    latest_major_index,
)
from sparkbus.roles.replication.storage import SimulatedCrash, Storage
from sparkbus.roles.replication.store import StoreError, segment_file
from sparkbus.roles.replication.transfers import InEvent, OutEvent, next_in, next_out

TICK = "replication/tick"

log = logging.getLogger(__name__)


class ReplicationRole(Compacting, Receiving, Offering, Placement, Epochs):
    """Segment replication (spec 001) for every partition replica on ``node``.

    Args:
        node: this node's name (as peers know it).
        layout: every partition's spec; replicas on ``node`` are hosted here.
        storage_for: the Storage of this node's replica of a partition; one with ``held`` too
            (``NodeData``) has a restart drain the files of partitions the layout no longer places here.
        config: role settings.
        election: the leader election (default: first live replica in placement order).
    """

    name = "replication"
    messages: ClassVar[tuple[type, ...]] = MESSAGES

    def __init__(
        self,
        node: str,
        layout: Layout,
        storage_for: Callable[[str], Storage],
        config: ReplicationConfig | None = None,
        election: LeaderElection | None = None,
    ) -> None:
        self.node = node
        self.layout = layout
        self.storage_for = storage_for
        self.config = config or ReplicationConfig()
        self.election = election or FirstLiveElection()
        self.live: set[str] = {node}
        self.local: dict[str, LocalReplica] = {}
        self.draining: dict[str, LocalReplica] = {}
        self.outgoing: dict[tuple[str, str, int], _Out] = {}
        self.incoming: dict[tuple[str, str], _In] = {}
        self.refused: dict[tuple[str, str, bytes], str] = {}
        self.accepts = 0
        self.retry_at: dict[tuple[str, str, int], float] = {}
        self.counters: dict[str, int] = {}
        self._started = False
        self._now = 0.0
        self._actions: list[Action] = []
        self._finalized_ahead: dict[tuple[str, int], set[bytes]] = {}
        self.former: dict[str, set[str]] = {}
        self.damaged: dict[str, str] = {}
        self.strays: list[str] = []
        self.answered: dict[tuple[str, str], float] = {}
        # Replicas whose procedures failed in their last run, or that could not be opened, with the
        # error (``_run_all``, ``_open``).
        self.failing: dict[str, str] = {}
        # Partitions placed here whose replica could not be opened; opened again on each tick (``_open``).
        self.unopened: set[str] = set()
        # Replicas away (``epochs.py``): peers' that cannot be opened, and those returning, ours included.
        self.absent: dict[tuple[str, int], str] = {}
        self.returning: dict[tuple[str, int], bytes] = {}
        self.recheck: set[tuple[str, int]] = set()
        # By partition, the peers live (their session unbroken since) when our replica was caught up.
        self.caught_with: dict[str, set[str]] = {}
        # Partitions whose replica opened at start, and the (partition, peer) pairs heard from since: such
        # a replica waits for each live peer's first word before it leads (a peer may hold it for absent:
        # ``epochs.py``).
        self.fresh: set[str] = set()
        self.heard: set[tuple[str, str]] = set()
        self.start_until = 0.0
        self.compactions = {}  # the leaders' automatic compactions under way (compacting.py)
        self.flush_held = set()

    # ------------------------------------------------------------ entry point

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one event at time ``now``.

        Never raises (but ``SimulatedCrash``, a process death): an error is logged once, counted
        (``handler_errors``) and a local call it interrupted is answered with it, and the actions
        collected before it are returned. Raised, it lost them all, the tick's re-arm, acks and replies
        included, and the tick never fired again.
        """
        self._now = now
        out: list[Action] = []
        self._actions = out
        try:
            self._handle(event, now)
        except SimulatedCrash:
            raise
        except Exception as exc:
            self._handler_failed(event, exc)
        return out

    def _handle(self, event: Event, now: float) -> None:
        out = self._actions
        if not self._started:
            self._started = True
            out.append(SetTimer(key=TICK, at=now + self.config.tick))  # first: armed whatever follows
            for spec in list(self.layout.partitions.values()):
                self._open(spec)  # one that cannot be opened is listed under failing; the others open
            self.fresh = set(self.local)
            self.start_until = now + self.config.start_wait
            self._resume_drains()  # files of partitions the layout no longer places here
            for rep in list(self.local.values()):  # joins this replica finalized before a restart
                for placement in rep.store.meta.get("joined", ()):
                    self._apply_join(rep.spec.partition, placement)
            self._reapply_rejoins()
            for rep in [*self.local.values(), *self.draining.values()]:  # splits finalized before a restart
                split = self._split_made(rep)
                if split is not None:
                    # Its UNLOAD is saved before the local targets' clocks and SERVE: killed in between,
                    # they stayed in LOAD, and no peer tells the finalize back to the node it came from.
                    # A draining source too: its manifest holds UNLOAD and the targets, its spec (the
                    # layout's) no split, and with the split's replicas down nobody told it again.
                    self._apply_split(split)
            self._elect()
        if isinstance(event, MessageReceived):
            self._on_message(event.peer, event.message)
        elif isinstance(event, BatchReceived):
            if not self._on_batch(event):
                # A chunk in the middle of a transit changes nothing the procedures read: skipping them
                # saves their cost on every chunk (time-driven work waits for the next tick at most).
                return
        elif isinstance(event, CreditChanged):
            self._on_credit(event)  # sends chunks; the offer stays open until its ack (same as above)
            return
        elif isinstance(event, PeerUp):
            if event.peer in self.live:
                # A PeerUp is a new session: transfers of the old one get no answer on it. The bus sends
                # PeerLost first; without it an open offer would block its destination for ever.
                self._abort_peer(event.peer)
            self.live.add(event.peer)
            self._hello(event.peer)  # before anything else of the partitions we share
            self._elect()
            self._resend_finalize(event.peer)
        elif isinstance(event, PeerLost):
            self.live.discard(event.peer)
            self._abort_peer(event.peer)
            self._elect()
        elif isinstance(event, TimerFired):
            if event.key == TICK:
                out.append(SetTimer(key=TICK, at=now + self.config.tick))
                if self.unopened:
                    self._open_again()
                if self.fresh:
                    self._elect()  # past start_wait, a replica opened at start no longer waits for peers down
                self._run_all(tick=True)  # with the lazy ack saves, per replica
                return
            if event.key == COMPACT_TIMER and not self._compact_turn():
                return  # a step changed nothing the procedures read; once installed, they run
        elif isinstance(event, LocalCall):
            self._on_call(event)
            return
        elif isinstance(event, HandlerFailed):
            self._count("handler_failed")
        self._run_all()

    def _handler_failed(self, event: Event, exc: Exception) -> None:
        self._count("handler_errors")
        text = f"{type(exc).__name__}: {exc}"
        protocol = isinstance(exc, LocalProtocolError | RemoteProtocolError)
        what = type(event).__name__
        if isinstance(event, MessageReceived):
            what = f"{type(event.message).__name__} from {event.peer}"
        elif isinstance(event, LocalCall):
            what = f"call {event.name!r}"
        log.error("replication %s: failed on %s: %s", self.node, what, text, exc_info=not protocol)
        if isinstance(event, LocalCall) and not any(
            isinstance(a, Reply) and a.call_id == event.call_id for a in self._actions
        ):
            self._emit(Reply(call_id=event.call_id, error=f"{event.name} failed: {text}"))

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # ------------------------------------------------------------ placement and election

    def _elect(self) -> None:
        for rep in self.local.values():
            leader = self._leader_in(rep.spec)
            if leader != rep.leader:
                was_leader = rep.leads
                rep.leader = leader
                rep.term += 1
                if was_leader and not rep.leads:
                    self._abandon_compaction(rep.spec.partition, "leadership moved")
                    # What we wrote while we led must reach the new leader as a segment (our choice: the
                    # spec leaves a follower's memtable open): flush now, the push procedure sends it.
                    # Every replica's leader is set whatever this flush does: raised, it left the
                    # partitions after this one with their old leader (two leaders taking writes).
                    self._try_flush(rep, "on losing leadership")
            if rep.leads:
                self._returned(rep)  # elected while returning: no other replica could lead

    def _try_flush(self, rep: LocalReplica, when: str) -> None:
        """Flush now if the disk lets us; else count (``flush_errors``) and log the error, and leave it
        to the procedures: they flush first, as a follower or with a full or old memtable, and list a
        replica whose flush keeps failing under ``failing``. The memtable's rows stay durable in the
        log meanwhile."""
        try:
            self._flush(rep)
        except SimulatedCrash:
            raise
        except Exception as exc:
            self._count("flush_errors")
            log.warning(
                "replication %s: %s: flush %s failed: %s: %s",
                self.node,
                rep.spec.partition,
                when,
                type(exc).__name__,
                exc,
            )

    def _open(self, spec: PartitionSpec, reraise: bool = False) -> None:
        """Host ``spec`` (``_host``); a replica that cannot be opened fails alone.

        Whatever opening it raises (a ``StoreError``, an ``OSError``, a ``ValueError`` of a file the store
        does not classify, an ``UnsupportedSegmentFormat``) is counted (``open_errors``), logged when it
        first occurs and listed under ``failing`` while the partition is not hosted; each tick opens it
        again. Raised at start, it ended the start: every partition after it stayed unopened, with no
        leader elected, for good. ``reraise`` (a local call's ``assign``) raises it on once recorded.
        """
        partition = spec.partition
        try:
            self._host(spec)
        except SimulatedCrash:
            raise
        except Exception as exc:
            self._count("open_errors")
            self.unopened.add(partition)
            text = f"cannot open: {type(exc).__name__}: {exc}"
            if self.failing.get(partition) != text:
                self.failing[partition] = text
                log.error("replication %s: %s: %s", self.node, partition, text, exc_info=True)
            self._tell_absent(spec, text)  # on every attempt: its peers elect another replica meanwhile
            if reraise:
                raise
        else:
            if partition in self.unopened:
                self.unopened.discard(partition)
                if self.failing.pop(partition, None) is not None:
                    log.info("replication %s: %s: opened", self.node, partition)
                self._reopened(partition)

    def _open_again(self) -> None:
        """On a tick: open again each partition placed here whose replica could not be opened."""
        before = set(self.unopened)
        for partition in sorted(before):
            spec = self.layout.partitions.get(partition)
            if spec is None:
                self.unopened.discard(partition)
                self.failing.pop(partition, None)
            else:
                self._open(spec)
        if before - self.unopened:
            self._elect()  # a replica opened now gets its leader

    def _leader_of(self, partition: str) -> Replica | None:
        spec = self.layout.partitions.get(partition)
        if spec is None:
            return None
        return self._leader_in(spec)

    def _leader_in(self, spec: PartitionSpec) -> Replica | None:
        return self.election.leader(self._electable(spec), frozenset(self.live))

    # ------------------------------------------------------------ the procedures (spec 3.5, 3.8)

    def _run_all(self, tick: bool = False) -> None:
        """Run the procedures of every replica; one that fails stops only its own step of this turn.

        On a tick, a hosted replica's step then saves its acked lists recorded lazily
        (``PartitionStore.set_acked``), so a replica whose manifest cannot be written fails its own step
        alone: saved outside the guard, one such replica stopped the procedures of every partition on
        every tick (a step outside a tick, which does not save them, leaves such a replica's
        ``failing`` entry as it is). The error is counted (``procedure_errors``; ``store_errors`` for a ``StoreError``)
        and logged when it first occurs (``failing``, in status, keeps it until the step succeeds again); the other
        replicas run on, and the next tick tries again. Raised, it lost the event's actions, the tick's
        re-arm included, and one partition's error stopped every other partition of the node.
        """
        steps = ((self.local, self._run, ""), (self.draining, self._drain, " (draining)"))
        ran = set()
        for replicas, step, which in steps:
            for rep in list(replicas.values()):
                where = f"{rep.spec.partition}{which}"
                ran.add(where)
                try:
                    step(rep)
                    if tick and replicas is self.local and rep.store.save_acked():
                        self._count("acked_saves")
                except SimulatedCrash:
                    raise
                except Exception as exc:
                    self._count("procedure_errors")
                    if isinstance(exc, StoreError):
                        self._count("store_errors")
                    text = f"{type(exc).__name__}: {exc}"
                    if self.failing.get(where) != text:
                        self.failing[where] = text
                        log.error("replication %s: %s: %s", self.node, where, text, exc_info=True)
                else:
                    if not tick and replicas is self.local and rep.store.acked_unsaved:
                        continue  # the tick's step, which saves them too, tells whether it succeeds
                    if self.failing.pop(where, None) is not None:
                        log.info("replication %s: %s: the procedures run again", self.node, where)
        for gone in set(self.failing) - ran - self.unopened:
            del self.failing[gone]  # no longer hosted (or draining) here: its error is not current

    def _run(self, rep: LocalReplica) -> None:
        lifecycle = rep.lifecycle
        if lifecycle == Lifecycle.UNLOAD_FINAL:
            return
        if lifecycle == Lifecycle.UNLOAD:
            self._flush(rep)
            self._unload(rep)
            return
        if not rep.leads:
            self._flush(rep)
            self._follow(rep)
            return
        store = rep.store
        self._leader_flush(rep, store.should_flush(self._now))  # held while compacting
        if store.minors_since_major() >= self.config.store.compact_minors:
            self._start_compaction(rep)  # in steps over loop turns (compacting.py)
        self._replicate_partition(rep)
        for replica in rep.spec.replicas:
            if replica.node != self.node and (rep.spec.partition, replica.placement) not in self.absent:
                self._replicate_to(rep, rep.spec.partition, replica)
        if rep.spec.split_targets and rep.spec.async_split:
            self._finalize_split(rep)  # only after a restart between the split call and its finalize
        elif rep.spec.split_targets:
            for target in rep.spec.split_targets:
                leader = self._leader_of(target.partition)
                if leader is not None:
                    self._replicate_to(rep, target.partition, leader, target)
            self._maybe_finalize_split(rep)

    def _flush(self, rep: LocalReplica) -> SegmentEntry | None:
        entry = rep.store.flush()
        if entry is not None:
            self._count("flushes")
        return entry

    def _replicate_partition(self, rep: LocalReplica) -> None:
        """Leader: delete weakly referenced segments; merge, then delete, unreferenced ones."""
        store = rep.store
        merged = False
        for entry in list(store.entries):
            if entry.segment_id in self._sending(rep.spec.partition):
                continue  # deleting a file mid-transit would break the transfer; next round
            if is_referenced(store.entries, store.root, entry.segment_id):
                if is_reference_weak(store.entries, store.root, entry.segment_id):
                    store.delete_segment(entry.segment_id)
            else:
                store.merge_segment_file(segment_file(entry.segment_id), self._now)
                store.delete_segment(entry.segment_id)
                self._count("merges")
                merged = True
        if merged:
            self._leader_flush(rep, True)

    def _sending(self, partition: str) -> set[str]:
        return {o.segment_id for o in self.outgoing.values() if o.dest[0] == partition}

    def _candidates(self, rep: LocalReplica) -> list[SegmentEntry]:
        """Segments from the most recent major referenced by the root, old to new."""
        start = latest_major_index(rep.store.entries, rep.store.root)
        return list(rep.store.entries[start or 0 :])

    def _replicate_to(
        self, rep: LocalReplica, target_partition: str, replica: Replica, split: SplitTarget | None = None
    ) -> None:
        """``replicate_partition_to``: offer the first segment ``replica`` has not acked."""
        for entry in self._candidates(rep):
            if replica.placement not in entry.acked:
                self._offer(rep, target_partition, replica, entry, split)
                return
        if split is None:
            self._maybe_caught_up(rep, replica)  # a returning replica holds what we hold
        if split is None and replica.joining and replica.node in self.live:
            epoch = self._rejoin_epoch(rep, replica)
            if epoch is not None:  # it started empty: nothing to send is enough (epochs.py)
                self._finalize_rejoin(rep, replica, epoch)
            elif rep.store.root is not None:
                self._finalize_join(rep, replica)

    def _follow(self, rep: LocalReplica) -> None:
        """Follower: delete what the leader holds; push to the leader what it has not acked."""
        leader = rep.leader
        if leader is None or leader.node not in self.live or self._waiting(rep.spec):
            # Waiting (opened at start, a live peer not heard yet: ``epochs.py``), it follows only in its
            # own view: the leader it follows may take it for the leader, fast-forward what it pushes and
            # ack that; it then took the leader's segments over its own and deleted them as merged, and
            # rows it had acknowledged were gone from every replica.
            return
        store = rep.store
        for entry in list(store.entries):
            if leader.placement in entry.acked:
                if entry.segment_id in self._sending(rep.spec.partition) or entry.segment_id == store.root:
                    continue
                referenced = is_referenced(store.entries, store.root, entry.segment_id)
                # The spec only deletes referenced+weak segments. An unreferenced one the leader acked is
                # a fork the leader has merged: its rows come back in the leader's segments (our choice).
                if not referenced or is_reference_weak(store.entries, store.root, entry.segment_id):
                    store.delete_segment(entry.segment_id)
            else:
                self._offer(rep, rep.spec.partition, leader, entry, None)
                return

    def _unload(self, rep: LocalReplica) -> None:
        """UNLOAD (spec 3.8): push every segment to every split target's leader, then drop the partition."""
        done = True
        for target in rep.spec.split_targets:
            leader = self._leader_of(target.partition)
            if leader is None:
                done = False
                continue
            for entry in rep.store.entries:
                if leader.placement not in entry.acked:
                    done = False
                    self._offer(rep, target.partition, leader, entry, target)
                    break
        if done and rep.spec.split_targets and not self._sending(rep.spec.partition):
            rep.store.reset()
            rep.set_lifecycle(Lifecycle.UNLOAD_FINAL)
            self._count("unload_final")

    # ------------------------------------------------------------ metadata operations (3.7, 3.8)

    def _finalize_join(self, rep: LocalReplica, replica: Replica) -> None:
        # Sent to the replicas that are up; one that is not gets it when it comes back (_resend_finalize),
        # so the finalized placements are kept in the manifest.
        joined = rep.store.meta.setdefault("joined", [])
        if replica.placement not in joined:
            joined.append(replica.placement)
            rep.store.save_manifest()
        msg = JoinFinalized(partition=rep.spec.partition, placement=replica.placement)
        for r in rep.spec.replicas:
            if r.node != self.node and r.node in self.live:
                self._emit(Send(peer=r.node, message=msg))
        self._apply_join(rep.spec.partition, replica.placement)

    def _apply_join(self, partition: str, placement: int) -> None:
        spec = self.layout.partitions.get(partition)
        if spec is None:
            return
        for r in spec.replicas:
            if r.placement == placement and r.joining:
                self._set_spec(spec.with_replica(replace(r, joining=False)))
                self._count("joins_finalized")

    def _maybe_finalize_split(self, rep: LocalReplica) -> None:
        leaders = [self._leader_of(t.partition) for t in rep.spec.split_targets]
        if any(leader is None for leader in leaders):
            return
        candidates = self._candidates(rep)
        if all(leader is not None and leader.placement in e.acked for leader in leaders for e in candidates):
            self._finalize_split(rep)

    def _finalize_split(self, rep: LocalReplica) -> None:
        msg = rep.split_finalized()
        self._tell_split(msg, self._split_nodes(rep.spec) & self.live)  # the others on PeerUp
        self._apply_split(msg)

    def _split_made(self, rep: LocalReplica) -> SplitFinalized | None:
        """The finalize of the split ``rep`` (hosted or draining) is in, or None: not in UNLOAD.

        A drainer's spec is the layout's, without the split: its targets are in its manifest."""
        if rep.lifecycle not in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL):
            return None
        targets = rep.spec.split_targets or self._saved_targets(rep.store)
        if not targets:
            return None
        saved = rep.store.meta.get("split") or {"async_split": rep.spec.async_split}
        return rep.split_finalized(targets, bool(saved["async_split"]))

    def _split_nodes(self, spec: PartitionSpec) -> set[str]:
        nodes = {r.node for r in spec.replicas}
        for t in spec.split_targets:
            target = self.layout.partitions.get(t.partition)
            if target is not None:
                nodes |= {r.node for r in target.replicas}
        return nodes - {self.node}

    def _finalize_problem(self, peer: str, msg: JoinFinalized | SplitFinalized) -> str | None:
        spec = self.layout.partitions.get(msg.partition)
        # A split's leader that an assign removed finalizes still: a node told of the assign keeps the
        # nodes it removed (Placement._note_removed); one that restarted with the new layout knows the
        # sender's store if it heard its hello before (the finalize names it).
        former = isinstance(msg, SplitFinalized) and (
            peer in self.former.get(msg.partition, ()) or self._knows_store(msg)
        )
        if spec is None or (spec.replica_on(peer) is None and not former):
            return f"{peer} holds no replica of {msg.partition}"
        if isinstance(msg, SplitFinalized):
            return self._split_problem(msg.partition, msg.targets)
        return None

    def _apply_split(self, msg: SplitFinalized, sender: str | None = None) -> None:
        spec = self.layout.partitions.get(msg.partition)
        if spec is not None and spec.split_targets != msg.targets:
            self._set_spec(replace(spec, split_targets=msg.targets, async_split=msg.async_split))
        for source in (self.local.get(msg.partition), self.draining.get(msg.partition)):
            if source is not None:
                source.store.raise_clock(msg.lamport)  # the finalizes it re-sends carry it on
            if source is not None and source.lifecycle in (Lifecycle.LOAD, Lifecycle.SERVE):
                # A draining replica pushes to the targets from now on (Placement._drain).
                source.spec = replace(source.spec, split_targets=msg.targets, async_split=msg.async_split)
                self._save_split(source)  # saved with the lifecycle, in one manifest write
                source.set_lifecycle(Lifecycle.UNLOAD)
                self._count("splits_finalized")
                if source is self.local.get(msg.partition) and sender is not None:
                    # Relayed by a replica: a node that restarted has forgotten a removed sender.
                    self._tell_split(msg, self._split_nodes(source.spec) & self.live - {sender})
        local, drainer = self.local.get(msg.partition), self.draining.get(msg.partition)
        if sender is not None and spec is not None and spec.replica_on(sender) is None:
            if local is not None and local.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL):
                self._tell_split(msg, {sender})  # a removed replica drains until it hears this
        elif sender is not None and drainer is not None:
            drainer.split_known = True  # a replica of the partition knows of the split
        for t in msg.targets:
            target = self.local.get(t.partition)
            if target is not None:
                # Before it serves: a write it takes must outversion the rows the split still brings.
                target.store.raise_clock(msg.lamport)
            if target is not None and target.lifecycle == Lifecycle.LOAD:
                target.set_lifecycle(Lifecycle.SERVE)

    def _tell_split(self, msg: SplitFinalized, nodes: set[str]) -> None:
        for node in nodes:
            self._emit(Send(peer=node, message=msg))

    def _resend_finalize(self, peer: str) -> None:
        """A replica that was offline during a join or split finalize learns of it when it comes back.

        (A replica draining in UNLOAD tells every node of the split itself: ``Placement._drain``.)
        """
        for rep in self.local.values():
            if rep.spec.replica_on(peer) is not None:
                for placement in rep.store.meta.get("joined", ()):
                    self._emit(
                        Send(
                            peer=peer,
                            message=JoinFinalized(partition=rep.spec.partition, placement=placement),
                        )
                    )
            unloading = rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL)
            if unloading and rep.spec.split_targets and peer in self._split_nodes(rep.spec):
                self._tell_split(rep.split_finalized(), {peer})

    def _set_spec(self, spec: PartitionSpec) -> None:
        self.layout.partitions[spec.partition] = spec
        self._open(spec, reraise=True)
        self._elect()

    # ------------------------------------------------------------ messages and peers

    def _on_message(self, peer: str, msg: Any) -> None:
        if isinstance(msg, SegmentOffered):
            self._on_offered(peer, msg)
        elif isinstance(msg, SegmentAccepted):
            self._on_accepted(peer, msg)
        elif isinstance(msg, SegmentDeclined):
            self._on_declined(peer, msg)
        elif isinstance(msg, SegmentTransited):
            self._on_transited(peer, msg)
        elif isinstance(msg, SegmentAcked):
            self._on_acked(peer, msg)
        elif isinstance(msg, JoinFinalized | SplitFinalized):
            # Only a replica of the partition finalizes its join or split (spec 3.7, 3.8): from anyone
            # else, or with targets this node cannot split into, it would stop the partition for good.
            problem = self._finalize_problem(peer, msg)
            if (
                problem is not None
                and isinstance(msg, SplitFinalized)
                and self._answer_known_split(peer, msg)
            ):
                pass  # this node split so too: it says so, and the sender's drain may end
            elif problem is not None:
                self._count("finalize_refused")
            elif isinstance(msg, JoinFinalized) and msg.epoch:
                self._on_rejoin_finalized(msg)
            elif isinstance(msg, JoinFinalized):
                self._apply_join(msg.partition, msg.placement)
            else:
                self._apply_split(msg, peer)
        elif isinstance(msg, ReplicaHello):
            self._on_hello(peer, msg)
        elif isinstance(msg, ReplicaRejoin):
            self._on_rejoin(peer, msg)
        elif isinstance(msg, ReplicaAbsent):
            self._on_absent(peer, msg)
        elif isinstance(msg, ReplicaCaughtUp):
            self._on_caught_up(peer, msg)
        elif isinstance(msg, ReplicaReturns):
            self._on_returns(peer, msg)
        else:
            raise RemoteProtocolError(f"{peer}: {type(msg).__name__} is not a replication message")

    def _abort_peer(self, peer: str) -> None:
        for out in [o for o in self.outgoing.values() if o.peer == peer]:
            out.state = next_out(out.state, OutEvent.LOST, out.what)
            self._end_out(out, retry=True)
        for inc in [i for i in self.incoming.values() if i.peer == peer]:
            inc.state = next_in(inc.state, InEvent.LOST, inc.what)
            inc.writer.abort()
            self.incoming.pop((inc.offer.partition, inc.offer.segment_id))

    # ------------------------------------------------------------ local calls

    def _on_call(self, call: LocalCall) -> None:
        handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "write": self._call_write,
            "read": self._call_read,
            "status": self._call_status,
            "flush": self._call_flush,
            "compact": self._call_compact,
            "assign": self._call_assign,
            "split": self._call_split,
        }
        handler = handlers.get(call.name)
        if handler is None:
            self._emit(
                Reply(call_id=call.call_id, error=f"unknown call {call.name!r}; known: {sorted(handlers)}")
            )
            return
        try:
            result = handler(call.args)
        except _Refused as exc:
            self._emit(Reply(call_id=call.call_id, result=exc.result, error=str(exc)))
        except (StoreError, DecodeError, KeyError, TypeError, ValueError) as exc:
            self._emit(Reply(call_id=call.call_id, error=f"{call.name}: {exc}"))
        else:
            self._emit(Reply(call_id=call.call_id, result=result))
        self._run_all()

    def _rep(self, args: dict[str, Any]) -> LocalReplica:
        partition = args["partition"]
        rep = self.local.get(partition)
        if rep is None and partition in self.unopened:
            leader = self._leader_of(partition)
            name = leader.node if leader is not None else None
            raise _Refused(
                f"{self.node} is not the leader of {partition}; leader: {name} (its replica here cannot be "
                f"opened: {self.failing.get(partition, 'not opened')})",
                {"leader": name},
            )
        if rep is None:
            raise _Refused(f"{self.node} holds no replica of {partition}", {"leader": None})
        return rep

    def _call_write(self, args: dict[str, Any]) -> Any:
        """Write rows (Arrow IPC) to a partition; replied only once they are durable (fsync'd log)."""
        rep = self._rep(args)
        if not rep.leads:
            leader = rep.leader.node if rep.leader is not None else None
            raise _Refused(
                f"{self.node} is not the leader of {rep.spec.partition}; leader: {leader}", {"leader": leader}
            )
        if rep.lifecycle != Lifecycle.SERVE:
            raise _Refused(f"{rep.spec.partition} is {rep.lifecycle.name}, not SERVE", {"leader": self.node})
        table = pa.Table.from_batches([decode_batch(args["rows"])])
        seq = rep.store.write(table, self._now)
        if rep.store.should_flush(self._now) and not self._compacting(rep):
            # Written: the rows are durable and served, so a failed flush cannot make this a failed
            # write (the client would take stored rows for not written); the procedures flush them.
            self._try_flush(rep, "after a write")
        return {"rows": table.num_rows, "seq": seq, "leader": self.node, "term": rep.term}

    def _call_read(self, args: dict[str, Any]) -> Any:
        rows = self._rep(args).store.rows().combine_chunks()
        batches = rows.to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=rows.schema)
        return bytes(encode_batch(batch))

    def _call_status(self, args: dict[str, Any]) -> Any:
        out: dict[str, Any] = {"node": self.node, "live": sorted(self.live), "counters": dict(self.counters)}
        parts = {}
        for p, rep in self.local.items():
            parts[p] = {
                "leader": rep.leader.node if rep.leader else None,
                "term": rep.term,
                "lifecycle": rep.lifecycle.name,
                "placement": rep.me.placement,
                "epoch": rep.store.epoch.hex(),
                "joining": [r.node for r in rep.spec.replicas if r.joining],
                "returning": [r.node for r in rep.spec.replicas if (p, r.placement) in self.returning],
                "absent": {
                    r.node: self.absent[p, r.placement]
                    for r in rep.spec.replicas
                    if (p, r.placement) in self.absent
                },
                "epochs": {p: [e.hex(), state] for p, (e, state) in records_of(rep).items()},
                "root": rep.store.root,
                "segments": [(e.segment_id, e.base_id, e.major, sorted(e.acked)) for e in rep.store.entries],
                "memtable_rows": rep.store.memtable_rows,
                "recovered": {  # what opening the store found after a crash
                    "partial_files": rep.store.recovered_partial,
                    "discarded": rep.store.recovered_files,
                    "log_records": rep.store.recovered_log_records,
                    "torn_log_tail": rep.store.recovered_torn_tail,
                },
            }
        out["partitions"] = parts
        out["draining"] = {  # unassigned replicas still pushing rows no current replica holds
            p: {
                "placement": rep.me.placement,
                "segments": [(e.segment_id, e.base_id, e.major, sorted(e.acked)) for e in rep.store.entries],
                "lifecycle": rep.lifecycle.name,  # UNLOAD: it drains to the split's targets and tells
                "split_known": rep.split_known,  # the split until a current replica says it knows
                "split_targets": [[t.partition, t.low, t.high] for t in self._saved_targets(rep.store)],
            }
            for p, rep in self.draining.items()
        }
        out["damaged"] = dict(self.damaged)  # stores set aside for failed checksums, and why
        out["failing"] = dict(self.failing)  # replicas whose procedures failed last time, and why
        out["strays"] = list(self.strays)  # replica files of partitions the layout does not have
        out["incoming"] = len(self.incoming)
        out["outgoing"] = len(self.outgoing)
        return out

    def _call_flush(self, args: dict[str, Any]) -> Any:
        entry = self._flush(self._rep(args))
        return entry.segment_id if entry is not None else None

    def _call_compact(self, args: dict[str, Any]) -> Any:
        rep = self._rep(args)
        if not rep.leads:
            raise _Refused(
                f"only the leader compacts {rep.spec.partition}",
                {"leader": rep.leader.node if rep.leader else None},
            )
        self._abandon_compaction(rep.spec.partition, "the compact call compacts in one go")
        entry = rep.store.compact()
        return entry.segment_id if entry is not None else None

    def _call_assign(self, args: dict[str, Any]) -> Any:
        spec = args["spec"]
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"spec must be a PartitionSpec, got {type(spec).__name__}")
        self._note_removed(self.layout.partitions.get(spec.partition), spec)
        self._set_spec(spec)
        self._reapply_rejoins(spec.partition)  # the topology's spec knows nothing of rejoins
        self._announce(spec.partition)  # a peer placed now had no PeerUp to hear our store from
        return None

    def _call_split(self, args: dict[str, Any]) -> Any:
        """Start splitting a partition this node leads into ``targets`` (their specs must be assigned)."""
        rep = self._rep(args)
        if not rep.leads:
            raise _Refused(
                f"splits are initiated by the leader of {rep.spec.partition}",
                {"leader": rep.leader.node if rep.leader else None},
            )
        targets = tuple(args["targets"])
        if not targets or not all(isinstance(t, SplitTarget) for t in targets):
            raise TypeError("targets must be a non-empty sequence of SplitTarget")
        problem = self._split_problem(rep.spec.partition, targets)
        if problem is not None:
            raise ValueError(problem)
        spec = replace(rep.spec, split_targets=targets, async_split=bool(args.get("async_split", False)))
        self._set_spec(spec)
        rep = self.local[spec.partition]
        self._save_split(rep)  # a leader restarted before the finalize resumes the split
        rep.store.save_manifest()
        if spec.async_split:
            self._finalize_split(self.local[spec.partition])
        return None


class _Refused(Exception):
    """A local call refused for a reason the caller can act on (e.g. the leader's name)."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result
