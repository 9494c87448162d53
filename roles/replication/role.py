"""The ``replication`` role: one per node, one leader-or-follower state per local partition replica.

Events in, actions out (``sparkbus.bus.contract``); all file I/O goes through each replica's
``PartitionStore`` and its ``Storage``. The procedures are those of spec section 3.5, run for every
partition on each tick and after every event that can let one proceed:

* leader: flush (row, byte or age threshold), compact, ``replicate_partition`` (delete weakly
  referenced segments, merge then delete unreferenced ones), ``replicate_partition_to`` every other
  replica, and, while splitting, to every split target's leader (spec 3.8);
* follower: flush what it wrote while it led, delete weakly referenced segments the leader acked, and
  push every segment the leader has not acked to the leader;
* UNLOAD: push every segment to every split target's leader, then drop the partition (UNLOAD_FINAL).

Offers go one at a time per (source partition, target partition, target placement), in segment-list
order, so each target sees them sequentially (spec 3.4). Choices where the spec is silent are listed in
``docs/REPLICATION.md``; the main ones are noted where they are made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import pyarrow as pa

from sparkbus.bus.contract import (
    AcceptStream,
    Action,
    BatchReceived,
    CloseStream,
    Consumed,
    CreditChanged,
    Event,
    HandlerFailed,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    OpenStream,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Send,
    SendBatch,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import DecodeError, decode_batch, encode_batch
from sparkbus.roles.replication.layout import (
    FirstLiveElection,
    Layout,
    LeaderElection,
    Lifecycle,
    PartitionSpec,
    Replica,
    SplitTarget,
)
from sparkbus.roles.replication.messages import (
    MESSAGES,
    DeclineReason,
    JoinFinalized,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
    SplitFinalized,
    stream_key,
)
from sparkbus.roles.replication.segments import (
    SegmentCorrupt,
    SegmentEntry,
    TrailerCheck,
    is_reference_weak,
    is_referenced,
    latest_major_index,
)
from sparkbus.roles.replication.storage import FileWriter, Storage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, StoreError, segment_file
from sparkbus.roles.replication.transfers import InEvent, InState, OutEvent, OutState, next_in, next_out

TICK = "replication/tick"
Decision = Literal["ff", "merge"] | DeclineReason


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
    """

    store: StoreConfig = field(default_factory=StoreConfig)
    max_incoming: int = 6
    chunk_bytes: int = 1 << 20
    credit_bytes: int = 4 << 20
    tick: float = 1.0
    retry_after: float = 0.5

    def __post_init__(self) -> None:
        if self.max_incoming < 1 or self.chunk_bytes < 1 or self.credit_bytes < 1:
            raise ValueError("max_incoming, chunk_bytes and credit_bytes must be >= 1")
        if self.tick <= 0 or self.retry_after < 0:
            raise ValueError("tick must be > 0 and retry_after >= 0")


@dataclass(kw_only=True)
class _Out:
    """One offer in progress; ``dest`` = (source partition, target partition, target placement)."""

    dest: tuple[str, str, int]
    peer: str
    segment_id: str
    file: str
    size: int
    temp: bool
    state: OutState = OutState.OFFERED
    offset: int = 0
    credit: int = 0
    chunks: int = 0

    @property
    def what(self) -> str:
        return f"{self.dest[1]}/{self.segment_id} -> {self.peer} (placement {self.dest[2]})"


@dataclass(kw_only=True)
class _In:
    """One incoming transfer, keyed by (partition, segment id)."""

    offer: SegmentOffered
    peer: str
    writer: FileWriter
    check: TrailerCheck
    state: InState = InState.RECEIVING
    received: int = 0
    chunks: int = 0
    summary: SegmentTransited | None = None

    @property
    def what(self) -> str:
        return f"{self.offer.partition}/{self.offer.segment_id} <- {self.peer}"


@dataclass(kw_only=True)
class _Local:
    """This node's replica of one partition."""

    spec: PartitionSpec
    me: Replica
    store: PartitionStore
    leader: Replica | None = None
    term: int = 0

    @property
    def lifecycle(self) -> Lifecycle:
        return Lifecycle(self.store.meta.get("lifecycle", int(self.spec.lifecycle)))

    def set_lifecycle(self, lifecycle: Lifecycle) -> None:
        self.store.meta["lifecycle"] = int(lifecycle)
        self.store.save_manifest()

    @property
    def leads(self) -> bool:
        return self.leader is not None and self.leader.node == self.me.node


class ReplicationRole:
    """Segment replication (spec 001) for every partition replica on ``node``.

    Args:
        node: this node's name (as peers know it).
        layout: every partition's spec; replicas on ``node`` are hosted here.
        storage_for: the Storage of this node's replica of a partition.
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
        self.local: dict[str, _Local] = {}
        self.outgoing: dict[tuple[str, str, int], _Out] = {}
        self.incoming: dict[tuple[str, str], _In] = {}
        self.retry_at: dict[tuple[str, str, int], float] = {}
        self.counters: dict[str, int] = {}
        self._started = False
        self._now = 0.0
        self._actions: list[Action] = []

    # ------------------------------------------------------------ entry point

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one event at time ``now``."""
        self._now = now
        self._actions = out = []
        if not self._started:
            self._started = True
            for spec in self.layout.partitions.values():
                self._host(spec)
            self._elect()
            out.append(SetTimer(key=TICK, at=now + self.config.tick))
        if isinstance(event, MessageReceived):
            self._on_message(event.peer, event.message)
        elif isinstance(event, BatchReceived):
            self._on_batch(event)
        elif isinstance(event, CreditChanged):
            self._on_credit(event)
        elif isinstance(event, PeerUp):
            self.live.add(event.peer)
            self._elect()
            self._resend_finalize(event.peer)
        elif isinstance(event, PeerLost):
            self.live.discard(event.peer)
            self._abort_peer(event.peer)
            self._elect()
        elif isinstance(event, TimerFired):
            if event.key == TICK:
                out.append(SetTimer(key=TICK, at=now + self.config.tick))
        elif isinstance(event, LocalCall):
            self._on_call(event)
            return out
        elif isinstance(event, HandlerFailed):
            self._count("handler_failed")
        self._run_all()
        return out

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # ------------------------------------------------------------ placement and election

    def _host(self, spec: PartitionSpec) -> None:
        """Open, re-open (new placement) or drop this node's replica of ``spec``."""
        me = spec.replica_on(self.node)
        current = self.local.get(spec.partition)
        if me is None:
            if current is not None:
                current.store.reset()
                del self.local[spec.partition]
            return
        if current is not None and current.me.placement == me.placement:
            current.spec, current.me = spec, me
            return
        store = PartitionStore.open(
            self.storage_for(spec.partition), spec.partition, me.placement, self.config.store, self._now
        )
        self.local[spec.partition] = _Local(spec=spec, me=me, store=store)

    def _elect(self) -> None:
        live = frozenset(self.live)
        for rep in self.local.values():
            leader = self.election.leader(rep.spec, live)
            if leader != rep.leader:
                was_leader = rep.leads
                rep.leader = leader
                rep.term += 1
                if was_leader and not rep.leads:
                    # What we wrote while we led must reach the new leader as a segment (our choice: the
                    # spec leaves a follower's memtable open): flush now, the push procedure sends it.
                    self._flush(rep)

    def _leader_of(self, partition: str) -> Replica | None:
        spec = self.layout.partitions.get(partition)
        if spec is None:
            return None
        return self.election.leader(spec, frozenset(self.live))

    # ------------------------------------------------------------ the procedures (spec 3.5, 3.8)

    def _run_all(self) -> None:
        for rep in list(self.local.values()):
            try:
                self._run(rep)
            except StoreError as exc:
                self._count("store_errors")
                raise LocalProtocolError(f"{rep.spec.partition}: {exc}") from exc

    def _run(self, rep: _Local) -> None:
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
        if store.should_flush(self._now):
            self._flush(rep)
        if store.minors_since_major() >= self.config.store.compact_minors:
            store.compact()
            self._count("compactions")
        self._replicate_partition(rep)
        for replica in rep.spec.replicas:
            if replica.node != self.node:
                self._replicate_to(rep, rep.spec.partition, replica)
        if rep.spec.split_targets and not rep.spec.async_split:
            for target in rep.spec.split_targets:
                leader = self._leader_of(target.partition)
                if leader is not None:
                    self._replicate_to(rep, target.partition, leader, target)
            self._maybe_finalize_split(rep)

    def _flush(self, rep: _Local) -> SegmentEntry | None:
        entry = rep.store.flush()
        if entry is not None:
            self._count("flushes")
        return entry

    def _replicate_partition(self, rep: _Local) -> None:
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
            self._flush(rep)

    def _sending(self, partition: str) -> set[str]:
        return {o.segment_id for o in self.outgoing.values() if o.dest[0] == partition}

    def _candidates(self, rep: _Local) -> list[SegmentEntry]:
        """Segments from the most recent major referenced by the root, old to new."""
        start = latest_major_index(rep.store.entries, rep.store.root)
        return list(rep.store.entries[start or 0 :])

    def _replicate_to(
        self, rep: _Local, target_partition: str, replica: Replica, split: SplitTarget | None = None
    ) -> None:
        """``replicate_partition_to``: offer the first segment ``replica`` has not acked."""
        for entry in self._candidates(rep):
            if replica.placement not in entry.acked:
                self._offer(rep, target_partition, replica, entry, split)
                return
        if split is None and replica.joining and replica.node in self.live and rep.store.root is not None:
            self._finalize_join(rep, replica)

    def _follow(self, rep: _Local) -> None:
        """Follower: delete what the leader holds; push to the leader what it has not acked."""
        leader = rep.leader
        if leader is None or leader.node not in self.live:
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

    def _unload(self, rep: _Local) -> None:
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

    def _finalize_join(self, rep: _Local, replica: Replica) -> None:
        msg = JoinFinalized(partition=rep.spec.partition, placement=replica.placement)
        for r in rep.spec.replicas:
            if r.node != self.node:
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

    def _maybe_finalize_split(self, rep: _Local) -> None:
        leaders = [self._leader_of(t.partition) for t in rep.spec.split_targets]
        if any(leader is None for leader in leaders):
            return
        candidates = self._candidates(rep)
        if all(leader is not None and leader.placement in e.acked for leader in leaders for e in candidates):
            self._finalize_split(rep)

    def _finalize_split(self, rep: _Local) -> None:
        msg = SplitFinalized(
            partition=rep.spec.partition, targets=rep.spec.split_targets, async_split=rep.spec.async_split
        )
        for node in self._split_nodes(rep.spec):
            self._emit(Send(peer=node, message=msg))
        self._apply_split(msg)

    def _split_nodes(self, spec: PartitionSpec) -> set[str]:
        nodes = {r.node for r in spec.replicas}
        for t in spec.split_targets:
            target = self.layout.partitions.get(t.partition)
            if target is not None:
                nodes |= {r.node for r in target.replicas}
        return nodes - {self.node}

    def _apply_split(self, msg: SplitFinalized) -> None:
        spec = self.layout.partitions.get(msg.partition)
        if spec is not None and spec.split_targets != msg.targets:
            self._set_spec(replace(spec, split_targets=msg.targets, async_split=msg.async_split))
        source = self.local.get(msg.partition)
        if source is not None and source.lifecycle in (Lifecycle.LOAD, Lifecycle.SERVE):
            source.set_lifecycle(Lifecycle.UNLOAD)
            self._count("splits_finalized")
        for t in msg.targets:
            target = self.local.get(t.partition)
            if target is not None and target.lifecycle == Lifecycle.LOAD:
                target.set_lifecycle(Lifecycle.SERVE)

    def _resend_finalize(self, peer: str) -> None:
        """A replica that was offline during a split learns of it when it comes back."""
        for rep in self.local.values():
            unloading = rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL)
            if unloading and rep.spec.split_targets and peer in self._split_nodes(rep.spec):
                msg = SplitFinalized(
                    partition=rep.spec.partition,
                    targets=rep.spec.split_targets,
                    async_split=rep.spec.async_split,
                )
                self._emit(Send(peer=peer, message=msg))

    def _set_spec(self, spec: PartitionSpec) -> None:
        self.layout.partitions[spec.partition] = spec
        self._host(spec)
        self._elect()

    # ------------------------------------------------------------ offering (sender side)

    def _offer(
        self,
        rep: _Local,
        target_partition: str,
        replica: Replica,
        entry: SegmentEntry,
        split: SplitTarget | None,
    ) -> None:
        dest = (rep.spec.partition, target_partition, replica.placement)
        if dest in self.outgoing or self.retry_at.get(dest, -1.0) > self._now:
            return
        if replica.node not in self.live:
            return
        file, size, checksum, rows, temp = (
            segment_file(entry.segment_id),
            entry.size,
            entry.checksum,
            entry.rows,
            False,
        )
        if split is not None:
            file, size, checksum, rows = rep.store.rewrite_for_range(
                entry, split.partition, split.low, split.high
            )
            temp = True
        self.outgoing[dest] = _Out(
            dest=dest, peer=replica.node, segment_id=entry.segment_id, file=file, size=size, temp=temp
        )
        self._count("offers")
        self._emit(
            Send(
                peer=replica.node,
                message=SegmentOffered(
                    partition=target_partition,
                    segment_id=entry.segment_id,
                    base_id=entry.base_id,
                    included=entry.included,
                    major=entry.major,
                    rows=rows,
                    max_lsn=entry.max_lsn,
                    size=size,
                    checksum=checksum,
                    sender=rep.me.placement,
                    target=replica.placement,
                ),
            )
        )

    def _out_for(self, peer: str, partition: str, segment_id: str) -> _Out:
        for out in self.outgoing.values():
            if out.peer == peer and out.dest[1] == partition and out.segment_id == segment_id:
                return out
        raise RemoteProtocolError(f"{partition}/{segment_id} from {peer}: no offer of ours is open")

    def _end_out(self, out: _Out, retry: bool) -> None:
        self.outgoing.pop(out.dest, None)
        rep = self.local.get(out.dest[0])
        if out.temp and rep is not None:
            rep.store.storage.delete(out.file)
        if retry:
            self.retry_at[out.dest] = self._now + self.config.retry_after

    def _mark_acked(self, out: _Out) -> None:
        rep = self.local.get(out.dest[0])
        if rep is None:
            return
        entry = rep.store.entry(out.segment_id)
        if entry is not None:
            rep.store.set_acked(out.segment_id, entry.acked | {out.dest[2]})

    def _on_accepted(self, peer: str, msg: SegmentAccepted) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.ACCEPTED, out.what)
        out.credit = msg.credit
        self._emit(OpenStream(peer=peer, stream=msg.stream, credit=msg.credit))
        self._pump(out)

    def _on_credit(self, event: CreditChanged) -> None:
        partition, segment_id = _parse_stream(event.stream)
        out = self._out_for(event.peer, partition, segment_id)
        out.state = next_out(out.state, OutEvent.CREDIT, out.what)
        out.credit = event.credit
        self._pump(out)

    def _pump(self, out: _Out) -> None:
        """Send chunks while credit lasts; the segment is read a chunk at a time, never whole."""
        if out.state is not OutState.SENDING:
            return
        rep = self.local.get(out.dest[0])
        if rep is None:
            return
        stream = stream_key(out.dest[1], out.segment_id)
        while out.offset < out.size and out.credit > 0:
            n = min(self.config.chunk_bytes, out.credit, out.size - out.offset)
            data = rep.store.storage.read(out.file, out.offset, n)
            out.offset += n
            out.credit -= n
            out.chunks += 1
            self._emit(SendBatch(peer=out.peer, stream=stream, data=data, last=out.offset == out.size))
        if out.offset == out.size:
            out.state = next_out(out.state, OutEvent.DRAINED, out.what)
            self._emit(CloseStream(peer=out.peer, stream=stream))
            self._emit(
                Send(
                    peer=out.peer,
                    message=SegmentTransited(
                        partition=out.dest[1], segment_id=out.segment_id, size=out.size, chunks=out.chunks
                    ),
                )
            )

    def _on_declined(self, peer: str, msg: SegmentDeclined) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.DECLINED, out.what)
        self._count(f"declined_{msg.reason.name}")
        rep = self.local.get(out.dest[0])
        if msg.reason is DeclineReason.SEGMENT_EXISTS:
            self._mark_acked(out)
            self._end_out(out, retry=False)
        elif msg.reason is DeclineReason.OUT_OF_ORDER and rep is not None and rep.leads:
            # Spec 3.5: remove R from the acked lists and restart from the most recent major (3.6, ABA 1).
            for entry in list(rep.store.entries):
                if out.dest[2] in entry.acked:
                    rep.store.set_acked(entry.segment_id, entry.acked - {out.dest[2]})
            # Restarting alone can loop forever: a follower holding a fork of its own on top of our
            # major answers EXISTS for the major and OUT_OF_ORDER for every minor after it (found by
            # the property test). A follower accepts any major, so give it one (our choice).
            if rep.store.minors_since_major():
                rep.store.compact()
                self._count("compactions_for_out_of_order")
            self._end_out(out, retry=False)
        else:
            self._end_out(out, retry=True)

    def _on_acked(self, peer: str, msg: SegmentAcked) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.ACKED, out.what)
        if msg.ok:
            self._count("acked")
            self._mark_acked(out)
            self._end_out(out, retry=False)
        else:
            self._count("ack_errors")
            self._end_out(out, retry=True)

    # ------------------------------------------------------------ receiving

    def _decide(self, rep: _Local, offer: SegmentOffered, peer: str) -> Decision:
        """The receive procedure of spec 3.5 after the OVERLOADED and INFLIGHT checks."""
        store = rep.store
        if rep.lifecycle not in (Lifecycle.LOAD, Lifecycle.SERVE) or offer.target != rep.me.placement:
            return DeclineReason.INVALID
        if rep.leads:
            if offer.base_id == store.root:
                return "ff"
            if rep.lifecycle == Lifecycle.LOAD and store.root is None:
                return "ff"
            if is_referenced(store.entries, store.root, offer.segment_id):
                return DeclineReason.SEGMENT_EXISTS
            return "merge"
        leader = rep.leader
        if leader is None or leader.node != peer or leader.placement != offer.sender:
            return DeclineReason.INVALID
        if offer.base_id == store.root:
            return "ff"
        if is_referenced(store.entries, store.root, offer.segment_id):
            return DeclineReason.SEGMENT_EXISTS
        if offer.major:
            return "ff"
        return DeclineReason.OUT_OF_ORDER

    def _on_offered(self, peer: str, offer: SegmentOffered) -> None:
        def decline(reason: DeclineReason, detail: str) -> None:
            self._count(f"sent_decline_{reason.name}")
            self._emit(
                Send(
                    peer=peer,
                    message=SegmentDeclined(
                        partition=offer.partition, segment_id=offer.segment_id, reason=reason, detail=detail
                    ),
                )
            )

        if len(self.incoming) >= self.config.max_incoming:
            return decline(DeclineReason.OVERLOADED, f"{len(self.incoming)} segments incoming")
        key = (offer.partition, offer.segment_id)
        if key in self.incoming or any(k[1] == offer.segment_id for k in self.incoming):
            return decline(DeclineReason.INFLIGHT, "the same segment is already incoming")
        rep = self.local.get(offer.partition)
        if rep is None:
            return decline(DeclineReason.INVALID, f"{self.node} holds no replica of {offer.partition}")
        decision = self._decide(rep, offer, peer)
        if isinstance(decision, DeclineReason):
            return decline(decision, f"root {rep.store.root}, base {offer.base_id}")
        stream = stream_key(offer.partition, offer.segment_id)
        writer = rep.store.storage.create(f"in-{offer.segment_id}")
        self.incoming[key] = _In(offer=offer, peer=peer, writer=writer, check=TrailerCheck(stream))
        credit = self.config.credit_bytes
        self._emit(AcceptStream(peer=peer, stream=stream, credit=credit))
        self._emit(
            Send(
                peer=peer,
                message=SegmentAccepted(
                    partition=offer.partition, segment_id=offer.segment_id, stream=stream, credit=credit
                ),
            )
        )
        return None

    def _on_batch(self, event: BatchReceived) -> None:
        partition, segment_id = _parse_stream(event.stream)
        inc = self.incoming.get((partition, segment_id))
        self._emit(Consumed(peer=event.peer, stream=event.stream, size=event.size))
        if inc is None or inc.peer != event.peer:
            self._count("stray_batches")
            return
        inc.state = next_in(inc.state, InEvent.LAST_CHUNK if event.last else InEvent.CHUNK, inc.what)
        data = bytes(event.data)
        inc.received += len(data)
        inc.chunks += 1
        if inc.received > inc.offer.size:
            self._fail_in(inc, f"received {inc.received} bytes, offered {inc.offer.size}")
            return
        inc.writer.append(data)
        inc.check.feed(data)
        if inc.state is InState.COMPLETE:
            self._complete_in(inc)

    def _on_transited(self, peer: str, msg: SegmentTransited) -> None:
        inc = self.incoming.get((msg.partition, msg.segment_id))
        if inc is None or inc.peer != peer:
            self._count("stray_transit")
            return
        inc.state = next_in(inc.state, InEvent.SUMMARY, inc.what)
        inc.summary = msg
        if inc.state is InState.COMPLETE:
            self._complete_in(inc)

    def _fail_in(self, inc: _In, error: str) -> None:
        self._count("incoming_failed")
        inc.writer.abort()
        self.incoming.pop((inc.offer.partition, inc.offer.segment_id), None)
        self._emit(CloseStream(peer=inc.peer, stream=stream_key(inc.offer.partition, inc.offer.segment_id)))
        rep = self.local.get(inc.offer.partition)
        placement = rep.me.placement if rep is not None else inc.offer.target
        self._emit(
            Send(
                peer=inc.peer,
                message=SegmentAcked(
                    partition=inc.offer.partition,
                    segment_id=inc.offer.segment_id,
                    placement=placement,
                    ok=False,
                    error=error,
                ),
            )
        )

    def _complete_in(self, inc: _In) -> None:
        offer = inc.offer
        rep = self.local.get(offer.partition)
        summary = inc.summary
        assert summary is not None
        if rep is None:
            return self._fail_in(inc, "partition no longer hosted here")
        if summary.size != inc.received or summary.chunks != inc.chunks or inc.received != offer.size:
            return self._fail_in(
                inc, f"got {inc.received} bytes in {inc.chunks} chunks, sender says {summary}"
            )
        try:
            checksum = inc.check.finish()
        except SegmentCorrupt as exc:
            return self._fail_in(inc, str(exc))
        if checksum != offer.checksum:
            return self._fail_in(inc, "checksum differs from the offer")
        inc.writer.commit()
        self.incoming.pop((offer.partition, offer.segment_id))
        self._emit(CloseStream(peer=inc.peer, stream=stream_key(offer.partition, offer.segment_id)))
        store = rep.store
        temp = f"in-{offer.segment_id}"
        # The partition may have moved on while the bytes travelled: decide again on what we have now.
        decision = self._decide(rep, offer, inc.peer)
        if decision == "ff":
            if store.entry(offer.segment_id) is not None:
                store.entries = [e for e in store.entries if e.segment_id != offer.segment_id]
            store.storage.rename(temp, segment_file(offer.segment_id))
            store.add_segment(
                SegmentEntry(
                    segment_id=offer.segment_id,
                    base_id=offer.base_id,
                    included=offer.included,
                    major=offer.major,
                    acked=frozenset({offer.sender}),
                    rows=offer.rows,
                    max_lsn=offer.max_lsn,
                    size=offer.size,
                    checksum=offer.checksum,
                )
            )
            self._count("fast_forwards")
        elif decision == "merge":
            store.merge_segment_file(temp, self._now)
            store.storage.delete(temp)
            self._count("merges")
            self._flush(rep)
        else:
            store.storage.delete(temp)
            if decision is not DeclineReason.SEGMENT_EXISTS:
                return self._send_ack(inc, rep, f"segment no longer applies: {decision.name}")
        self._send_ack(inc, rep, "")
        return None

    def _send_ack(self, inc: _In, rep: _Local, error: str) -> None:
        self._emit(
            Send(
                peer=inc.peer,
                message=SegmentAcked(
                    partition=inc.offer.partition,
                    segment_id=inc.offer.segment_id,
                    placement=rep.me.placement,
                    ok=not error,
                    error=error,
                ),
            )
        )

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
        elif isinstance(msg, JoinFinalized):
            self._apply_join(msg.partition, msg.placement)
        elif isinstance(msg, SplitFinalized):
            self._apply_split(msg)
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

    def _rep(self, args: dict[str, Any]) -> _Local:
        partition = args["partition"]
        rep = self.local.get(partition)
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
        if rep.store.should_flush(self._now):
            self._flush(rep)
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
                "root": rep.store.root,
                "segments": [(e.segment_id, e.base_id, e.major, sorted(e.acked)) for e in rep.store.entries],
                "memtable_rows": rep.store.memtable_rows,
            }
        out["partitions"] = parts
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
        entry = rep.store.compact()
        return entry.segment_id if entry is not None else None

    def _call_assign(self, args: dict[str, Any]) -> Any:
        spec = args["spec"]
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"spec must be a PartitionSpec, got {type(spec).__name__}")
        self._set_spec(spec)
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
        spec = replace(rep.spec, split_targets=targets, async_split=bool(args.get("async_split", False)))
        self._set_spec(spec)
        if spec.async_split:
            self._finalize_split(self.local[spec.partition])
        return None


class _Refused(Exception):
    """A local call refused for a reason the caller can act on (e.g. the leader's name)."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def _parse_stream(stream: str) -> tuple[str, str]:
    prefix = "replication/"
    if not stream.startswith(prefix) or "/" not in stream[len(prefix) :]:
        raise RemoteProtocolError(f"stream {stream!r} is not a replication stream")
    partition, segment_id = stream[len(prefix) :].rsplit("/", 1)
    return partition, segment_id
