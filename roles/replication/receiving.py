"""The receiving side of segment replication: the receive procedure of spec 3.5 and incoming transfers.

Mixed into ``ReplicationRole``; the decision order is protocol-facts 2.2's (OVERLOADED, INFLIGHT, then
leader or follower rules), and it runs again when the bytes are complete, because the partition may have
moved on while they travelled.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal

from sparkbus.bus.contract import (
    AcceptStream,
    BatchReceived,
    CloseStream,
    Consumed,
    Send,
)
from sparkbus.roles.replication.layout import Lifecycle
from sparkbus.roles.replication.local import Hooks, LocalReplica, ReplicationConfig
from sparkbus.roles.replication.messages import (
    DeclineReason,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
    parse_stream,
    stream_key,
)
from sparkbus.roles.replication.segments import (
    SegmentCorrupt,
    SegmentEntry,
    TrailerCheck,
    is_referenced,
    read_header,
    read_schema,
)
from sparkbus.roles.replication.storage import FileWriter
from sparkbus.roles.replication.store import MAX_LSN, ReadFailed, StoreError, segment_file
from sparkbus.roles.replication.transfers import InEvent, InState, next_in

log = logging.getLogger(__name__)

Decision = Literal["ff", "merge"] | DeclineReason
#: A segment id as ``PartitionStore`` makes them: the writing placement in hex, the store's epoch in hex
#: (absent in ids written before stores had epochs), its number there, joined by dots. An offered id
#: becomes a file name and a manifest entry, so nothing else is taken.
SEGMENT_ID = re.compile(r"[0-9a-f]{1,16}(\.[0-9a-f]{16})?\.[0-9]{1,20}")


def offer_problem(offer: SegmentOffered) -> str | None:
    """Why ``offer`` cannot be taken whatever the partition's state, or None."""
    for what, value in (("segment_id", offer.segment_id), ("base_id", offer.base_id)):
        if value is not None and not SEGMENT_ID.fullmatch(value):
            return f"{what} {value[:40]!r} is not a segment id (<placement hex>.<epoch hex>.<number>)"
    for value in offer.included:
        if not SEGMENT_ID.fullmatch(value):
            return f"included id {value[:40]!r} is not a segment id"
    if offer.max_lsn > MAX_LSN:
        return f"max_lsn {offer.max_lsn} is above {MAX_LSN}"
    if offer.base_id == offer.segment_id or offer.segment_id in offer.included:
        return f"segment {offer.segment_id} names itself as its base or among its included ids"
    return None


#: How many refused segments a role remembers (``Receiving.refused``); the oldest is forgotten first.
REFUSED_MAX = 1024


@dataclass(kw_only=True)
class _In:
    """One incoming transfer, keyed by (partition, segment id)."""

    offer: SegmentOffered
    peer: str
    stream: str
    name: str
    writer: FileWriter
    check: TrailerCheck
    tapped: bool
    state: InState = InState.RECEIVING
    received: int = 0
    chunks: int = 0
    summary: SegmentTransited | None = None

    @property
    def what(self) -> str:
        return f"{self.offer.partition}/{self.offer.segment_id} <- {self.peer}"


class Receiving(Hooks):
    """Incoming offers and transfers; ``ReplicationRole`` provides the state and the hooks."""

    node: str
    config: ReplicationConfig
    local: dict[str, LocalReplica]
    incoming: dict[tuple[str, str], _In]
    accepts: int
    # Segments whose bytes were received whole and refused (they cannot join the partition), by
    # (partition, segment id, checksum), with the reason: the same offer again is declined INVALID at
    # once instead of travelling again to be refused again. Forgotten when the replica is re-placed.
    refused: dict[tuple[str, str, bytes], str]
    _now: float

    def _flush(self, rep: LocalReplica) -> SegmentEntry | None:
        raise NotImplementedError

    def _decide(self, rep: LocalReplica, offer: SegmentOffered, peer: str) -> Decision:
        """The receive procedure of spec 3.5 after the OVERLOADED and INFLIGHT checks."""
        store = rep.store
        if rep.lifecycle not in (Lifecycle.LOAD, Lifecycle.SERVE) or offer.target != rep.me.placement:
            return DeclineReason.INVALID
        # A segment id names one segment: one listed already EXISTS (before a fast-forward, which would
        # replace our entry with the offer's, possibly based on itself), after the sender checks.
        listed = any(e.segment_id == offer.segment_id for e in store.entries)
        if rep.leads:
            if listed:
                return DeclineReason.SEGMENT_EXISTS
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
        if listed:
            return DeclineReason.SEGMENT_EXISTS
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
        problem = offer_problem(offer)
        if problem is not None:
            self._count("offers_refused")
            return decline(DeclineReason.INVALID, problem)
        rep = self.local.get(offer.partition)
        if rep is None:
            return decline(DeclineReason.INVALID, f"{self.node} holds no replica of {offer.partition}")
        decision = self._decide(rep, offer, peer)
        if isinstance(decision, DeclineReason):
            unloading = rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL)
            if unloading and rep.spec.split_targets:
                # Split: the sender pushes to the targets' leaders instead. A replica unassigned before
                # the finalize reached it drains here, and no PeerUp re-sends it (not a replica now).
                self._emit(Send(peer=peer, message=rep.split_finalized()))
            return decline(decision, f"root {rep.store.root}, base {offer.base_id}")
        refused = self.refused.get((offer.partition, offer.segment_id, offer.checksum))
        if refused is not None:
            return decline(DeclineReason.INVALID, f"refused before: {refused}")
        try:
            self._accept(rep, offer, peer)
        except (OSError, StoreError, SegmentCorrupt) as exc:
            # Raised, it left the offer without an answer and its sender's destination blocked.
            self._count("offer_errors")
            log.warning("replication %s: cannot receive %s/%s: %s", self.node, key[0], key[1], exc)
            return decline(DeclineReason.INVALID, f"cannot receive: {exc}")
        return None

    def _accept(self, rep: LocalReplica, offer: SegmentOffered, peer: str) -> None:
        self.accepts += 1
        stream = stream_key(offer.partition, offer.segment_id, self.accepts)
        # Written straight under the segment's name: no rename (and directory sync) at the end. Until
        # the manifest lists it, recovery deletes it as an unlisted file. A file of that name that
        # already exists (a listed segment the decision replaces) is never overwritten in place.
        # The checksum is computed by the writer's tap (off the node's loop on disk), or by us.
        name = segment_file(offer.segment_id)
        check = TrailerCheck(stream)
        tapped = not rep.store.storage.exists(name)
        if tapped:
            writer = rep.store.storage.create_in_place(name, tap=check.feed, size=offer.size)
        else:
            name = f"in-{offer.segment_id}"
            writer = rep.store.storage.create(name)
        self.incoming[offer.partition, offer.segment_id] = _In(
            offer=offer, peer=peer, stream=stream, name=name, writer=writer, check=check, tapped=tapped
        )
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

    def _on_batch(self, event: BatchReceived) -> bool:
        """Write a chunk of a transfer; true when the transfer ended with it (completed or failed)."""
        partition, segment_id, _ = parse_stream(event.stream)
        inc = self.incoming.get((partition, segment_id))
        self._emit(Consumed(peer=event.peer, stream=event.stream, size=event.size))
        if inc is None or inc.peer != event.peer or inc.stream != event.stream:
            self._count("stray_batches")
            return False
        inc.state = next_in(inc.state, InEvent.LAST_CHUNK if event.last else InEvent.CHUNK, inc.what)
        data = event.data  # written and hashed in place: no copy of a chunk on its way to the file
        inc.received += len(data)
        inc.chunks += 1
        if inc.received > inc.offer.size:
            self._fail_in(inc, f"received {inc.received} bytes, offered {inc.offer.size}")
            return True
        try:
            inc.writer.append(data)
        except OSError as exc:
            self._fail_in(inc, f"cannot write: {exc}")
            return True
        if not inc.tapped:
            inc.check.feed(data)
        if inc.state is InState.COMPLETE:
            self._complete_in(inc)
            return True
        return False

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
        self._emit(CloseStream(peer=inc.peer, stream=inc.stream))
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
            inc.writer.drain()  # the tap has seen every chunk
            checksum = inc.check.finish()
        except SegmentCorrupt as exc:
            return self._fail_in(inc, str(exc))
        if checksum != offer.checksum:
            return self._fail_in(inc, "checksum differs from the offer")
        try:
            inc.writer.commit()
        except OSError as exc:
            return self._fail_in(inc, f"cannot write: {exc}")
        self.incoming.pop((offer.partition, offer.segment_id))
        self._emit(CloseStream(peer=inc.peer, stream=inc.stream))
        store = rep.store
        temp = inc.name
        # The partition may have moved on while the bytes travelled: decide again on what we have now.
        decision = self._decide(rep, offer, inc.peer)
        if decision in ("ff", "merge"):
            try:
                self._check_received(rep, inc)
            except (StoreError, SegmentCorrupt) as exc:
                return self._refuse_in(rep, inc, str(exc))
            except OSError as exc:  # reading the file's header or schema, or the store's schema
                return self._io_failed(rep, inc, exc, "read")
        if decision == "ff":
            entries = list(store.entries)
            try:
                if store.entry(offer.segment_id) is not None:
                    store.entries = [e for e in store.entries if e.segment_id != offer.segment_id]
                if temp != segment_file(offer.segment_id):
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
            except OSError as exc:
                store.entries = entries  # add_segment listed nothing: the manifest write failed
                return self._io_failed(rep, inc, exc, "write")
            self._count("fast_forwards")
        elif decision == "merge":
            try:
                store.merge_segment_file(temp, self._now)
                self._drop_received(rep, inc)
                self._count("merges")
                self._flush(rep)
            except (StoreError, SegmentCorrupt) as exc:
                # Rows merged before the failing batch stay (merging them again changes nothing).
                return self._refuse_in(rep, inc, str(exc))
            except ReadFailed as exc:  # reading the received file, as while it was checked
                return self._io_failed(rep, inc, exc, "read")
            except OSError as exc:  # writing its rows: the log, the flush after it
                return self._io_failed(rep, inc, exc, "write")
        else:
            self._drop_received(rep, inc)
            if decision is not DeclineReason.SEGMENT_EXISTS:
                return self._send_ack(inc, rep, f"segment no longer applies: {decision.name}")
        self._send_ack(inc, rep, "")
        return None

    def _check_received(self, rep: LocalReplica, inc: _In) -> None:
        """The whole received file is the segment offered, and its rows can join the partition.

        A fast-forward lists the offer's fields as the segment's entry without reading the rows, so they
        must be the file's own: a header of another id, partition, row count or version was acked and
        listed as offered before.

        Raises:
            SegmentCorrupt: the header differs from the offer.
            StoreError: the rows cannot join the partition (``PartitionStore.check_segment_schema``).
        """
        offer, storage = inc.offer, rep.store.storage
        header, _ = read_header(storage, inc.name)
        offered = (offer.segment_id, offer.base_id, tuple(offer.included), offer.major, offer.rows)
        found = (header.segment_id, header.base_id, header.included, header.major, header.rows)
        if (*offered, offer.max_lsn, offer.partition) != (*found, header.max_lsn, header.partition):
            raise SegmentCorrupt(
                inc.name,
                f"header says {header.partition}/{header.segment_id} (base {header.base_id}, "
                f"{header.rows} rows, max_lsn {header.max_lsn}), the offer {offer.partition}/"
                f"{offer.segment_id} (base {offer.base_id}, {offer.rows} rows, max_lsn {offer.max_lsn})",
            )
        rep.store.check_segment_schema(read_schema(storage, inc.name), inc.name)

    def _refuse_in(self, rep: LocalReplica, inc: _In, reason: str) -> None:
        """A whole, verified segment that cannot join the partition: drop it and ack with the error.

        Raised there, the error left the transfer without an answer and its sender waiting for ever (two
        leaders of a new partition during a cut wrote rows of different schemas). The sender retries
        later; the same offer is then declined INVALID without travelling (``refused``).
        """
        offer = inc.offer
        self._count("incoming_refused")
        log.warning(
            "replication %s: refused %s/%s from %s: %s",
            self.node,
            offer.partition,
            offer.segment_id,
            inc.peer,
            reason,
        )
        if len(self.refused) >= REFUSED_MAX:
            del self.refused[next(iter(self.refused))]
        self.refused[offer.partition, offer.segment_id, offer.checksum] = reason
        self._drop_received(rep, inc)
        self._send_ack(inc, rep, f"refused: {reason}")

    def _io_failed(self, rep: LocalReplica, inc: _In, exc: OSError, doing: str) -> None:
        """A local read error while a received segment was checked or merged, or a write error (the
        manifest or the log) while it was listed or merged: nothing of it is listed, its file goes, and
        the ack says so (``cannot read: ...``, ``cannot write: ...``); the sender retries later. Not remembered as
        refused: the disk may have room, or read, by then. Raised, it left the transfer without an
        answer, and the sender, one offer at a time per destination, offered that replica nothing again.
        """
        offer = inc.offer
        self._count(f"incoming_{doing}_errors")
        log.warning(
            "replication %s: cannot %s %s/%s from %s: %s",
            self.node,
            doing,
            offer.partition,
            offer.segment_id,
            inc.peer,
            exc,
        )
        for name in dict.fromkeys((inc.name, segment_file(offer.segment_id))):
            if name == segment_file(offer.segment_id) and rep.store.entry(offer.segment_id) is not None:
                continue  # a segment of ours by that name
            try:
                if rep.store.storage.exists(name):
                    rep.store.storage.delete(name)
            except OSError:
                pass  # unlisted: the next open deletes it
        self._send_ack(inc, rep, f"cannot {doing}: {exc}")

    def _drop_received(self, rep: LocalReplica, inc: _In) -> None:
        """Delete a received file that is not kept as a segment (merged, or no longer needed)."""
        if inc.name == segment_file(inc.offer.segment_id) and rep.store.entry(inc.offer.segment_id):
            return  # listed meanwhile: the name is a segment of ours now, not what we received
        rep.store.storage.delete(inc.name)

    def _send_ack(self, inc: _In, rep: LocalReplica, error: str) -> None:
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
