"""The sending side of segment replication: offers and outgoing transfers (spec 3.4, 3.5).

Mixed into ``ReplicationRole``, which decides what to offer to whom (its procedures); this side makes
the offer, sends the segment's bytes as credit allows, and takes the answer: an accept opens the stream,
a decline or an ack ends the offer (and marks the target acked, or retries later, per protocol-facts
2.2), and an offer whose sending replica is gone is ended short without leaving its receiver waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sparkbus.bus.contract import (
    CloseStream,
    CreditChanged,
    OpenStream,
    RemoteProtocolError,
    Send,
    SendBatch,
)
from sparkbus.roles.replication.layout import Replica, SplitTarget
from sparkbus.roles.replication.local import Hooks, LocalReplica, ReplicationConfig
from sparkbus.roles.replication.messages import (
    DeclineReason,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
)
from sparkbus.roles.replication.segments import SegmentEntry
from sparkbus.roles.replication.store import segment_file
from sparkbus.roles.replication.transfers import OutEvent, OutState, next_out


@dataclass(kw_only=True)
class _Out:
    """One offer in progress; ``dest`` = (source partition, target partition, target placement)."""

    dest: tuple[str, str, int]
    peer: str
    segment_id: str
    file: str
    size: int
    temp: bool
    sender: int
    stream: str = ""
    state: OutState = OutState.OFFERED
    offset: int = 0
    credit: int = 0
    chunks: int = 0
    # The segment file, mapped from the first chunk to the last: chunks are slices of it, not reads.
    view: memoryview | None = None
    # The sending replica was dropped or re-placed (``Offering._abandon``): the transfer is ended
    # short and its answer changes nothing.
    abandoned: bool = False

    def close_view(self) -> None:
        # Dropped, not released: ZeroMQ may still hold slices of it until their frames are sent.
        self.view = None

    @property
    def what(self) -> str:
        return f"{self.dest[1]}/{self.segment_id} -> {self.peer} (placement {self.dest[2]})"


class Offering(Hooks):
    """Outgoing offers and transfers; ``ReplicationRole`` provides the state and the hooks."""

    config: ReplicationConfig
    live: set[str]
    local: dict[str, LocalReplica]
    draining: dict[str, LocalReplica]
    outgoing: dict[tuple[str, str, int], _Out]
    retry_at: dict[tuple[str, str, int], float]
    _now: float

    def _offer(
        self,
        rep: LocalReplica,
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
                entry, split.partition, split.low, split.high, receiver=replica.placement
            )
            temp = True
        self.outgoing[dest] = _Out(
            dest=dest,
            peer=replica.node,
            segment_id=entry.segment_id,
            file=file,
            size=size,
            temp=temp,
            sender=rep.me.placement,
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

    def _sender_rep(self, out: _Out) -> LocalReplica | None:
        """The replica ``out`` sends from: hosted, or draining after an unassign; None once it is gone."""
        for rep in (self.local.get(out.dest[0]), self.draining.get(out.dest[0])):
            if rep is not None and rep.me.placement == out.sender:
                return rep
        return None

    def _out_for(self, peer: str, partition: str, segment_id: str) -> _Out:
        for out in self.outgoing.values():
            if out.peer == peer and out.dest[1] == partition and out.segment_id == segment_id:
                return out
        raise RemoteProtocolError(f"{partition}/{segment_id} from {peer}: no offer of ours is open")

    def _end_out(self, out: _Out, retry: bool) -> None:
        self.outgoing.pop(out.dest, None)
        out.close_view()
        short = out.offset < out.size and not out.abandoned  # an abandoned one closed its stream already
        if out.state is OutState.DONE and out.stream and short and out.peer in self.live:
            self._emit(CloseStream(peer=out.peer, stream=out.stream))  # ended before its last batch
        rep = self._sender_rep(out)
        if out.temp and rep is not None:
            rep.store.storage.delete(out.file)
        if retry:
            self.retry_at[out.dest] = self._now + self.config.retry_after

    def _abandon(self, out: _Out, rep: LocalReplica | None) -> None:
        """End an offer whose sending replica is gone, without leaving its receiver waiting.

        The protocol has no cancel: a stream that is open ends with an empty last batch and a summary of
        what was sent, which the receiver finds short of the offer and answers with an error ack. An
        offer not answered yet is ended the same way once accepted, or simply when declined. The answer
        changes nothing (``abandoned``): the segment belonged to the old placement.
        """
        if not out.abandoned:
            out.abandoned = True
            self._count("abandoned_offers")
            if out.temp and rep is not None:
                rep.store.storage.delete(out.file)  # a split rewrite of the old placement's segment
                out.temp = False
        if out.state is not OutState.SENDING:
            return  # OFFERED: ended when answered; DRAINED: every byte sent, the ack ends it
        out.chunks += 1
        self._emit(SendBatch(peer=out.peer, stream=out.stream, data=b"", last=True))
        self._drained(out)

    def _mark_acked(self, out: _Out) -> None:
        rep = self._sender_rep(out)
        if rep is None:
            return
        entry = rep.store.entry(out.segment_id)
        if entry is not None:
            rep.store.set_acked(out.segment_id, entry.acked | {out.dest[2]})

    def _on_accepted(self, peer: str, msg: SegmentAccepted) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.ACCEPTED, out.what)
        out.credit = msg.credit
        out.stream = msg.stream
        self._emit(OpenStream(peer=peer, stream=msg.stream, credit=msg.credit))
        self._pump(out)  # an abandoned offer is ended short there

    def _on_credit(self, event: CreditChanged) -> None:
        out = next(
            (o for o in self.outgoing.values() if o.peer == event.peer and o.stream == event.stream), None
        )
        if out is None:
            raise RemoteProtocolError(f"credit for {event.stream} from {event.peer}: no transfer of ours")
        out.state = next_out(out.state, OutEvent.CREDIT, out.what)
        out.credit = event.credit
        self._pump(out)

    def _pump(self, out: _Out) -> None:
        """Send chunks while credit lasts: slices of the mapped segment file, never read into memory."""
        if out.state is not OutState.SENDING:
            return
        rep = self._sender_rep(out)
        if out.abandoned or rep is None:
            self._abandon(out, rep)  # its file is not ours any more: end the stream short
            return
        stream = out.stream
        if out.view is None and out.offset < out.size:
            out.view = rep.store.storage.view(out.file)
        while out.offset < out.size and out.credit > 0:
            assert out.view is not None
            n = min(self.config.chunk_bytes, out.credit, out.size - out.offset)
            # A short file sends short: the receiver's size check refuses it. The slice is a view of
            # the map (no copy); ``SendBatch.data`` is typed ``bytes`` but, as ``BatchReceived.data``,
            # is only measured and handed to ZeroMQ, which takes any buffer.
            data = cast(bytes, out.view[out.offset : out.offset + n])
            out.offset += n
            out.credit -= n
            out.chunks += 1
            self._emit(SendBatch(peer=out.peer, stream=stream, data=data, last=out.offset == out.size))
        if out.offset == out.size:
            self._drained(out)

    def _drained(self, out: _Out) -> None:
        """The last batch of ``out`` went out (or ``_abandon``'s empty one): close the stream, sum it up."""
        out.close_view()
        out.state = next_out(out.state, OutEvent.DRAINED, out.what)
        self._emit(CloseStream(peer=out.peer, stream=out.stream))
        self._emit(
            Send(
                peer=out.peer,
                message=SegmentTransited(
                    partition=out.dest[1], segment_id=out.segment_id, size=out.offset, chunks=out.chunks
                ),
            )
        )

    def _on_declined(self, peer: str, msg: SegmentDeclined) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.DECLINED, out.what)
        self._count(f"declined_{msg.reason.name}")
        rep = self._sender_rep(out)
        if out.abandoned:
            self._end_out(out, retry=False)
        elif msg.reason is DeclineReason.SEGMENT_EXISTS:
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
            if rep.store.minors_since_major() and self._start_compaction(rep):  # in steps: compacting.py
                self._count("compactions_for_out_of_order")
            # While the major is being written (loop turns), offered again at once the follower's answers
            # would go round (EXISTS, OUT_OF_ORDER) until it is installed: offered again after retry_after.
            self._end_out(out, retry=self._compacting(rep))
        else:
            self._end_out(out, retry=True)

    def _on_acked(self, peer: str, msg: SegmentAcked) -> None:
        out = self._out_for(peer, msg.partition, msg.segment_id)
        out.state = next_out(out.state, OutEvent.ACKED, out.what)
        if out.abandoned:
            self._count("abandoned_ended")
            self._end_out(out, retry=False)
        elif msg.ok:
            self._count("acked")
            self._mark_acked(out)
            self._end_out(out, retry=False)
        else:
            self._count("ack_errors")
            self._end_out(out, retry=True)
