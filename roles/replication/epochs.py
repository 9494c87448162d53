"""A store that starts empty under a placement its peers already know (spec 3.6, the second ABA case).

Spec 3.6 gives a replica that starts with an empty partition a new placement id, so that no peer takes
it for the store it had: the acked lists name placement ids, and a peer deletes what the placement has
acked. Placement ids here come from the topology, so a node whose disk was lost, or that moved to a
machine without its data directory, comes back under its old id. Left at that, a follower would never be
sent again what it acked, and a leader would serve an empty partition while its followers kept the rows.

So each store draws an *epoch* when it is created (``PartitionStore.epoch``: random bytes in its
manifest) and the pair (placement, epoch) is the identity the spec's placement id stands for:

* when a link comes up, each replica sends ``ReplicaHello`` (its placement and epoch) to the peer, for
  every partition both hold, before anything else of the partition;
* a peer records the epoch of each placement it hears from (in its manifest). The first epoch it hears
  is taken as it is. Another epoch under a placement it knows is a new store: the peer strikes the
  placement from its acked lists (``PartitionStore.forget_acked``, saved at once), takes it for a
  joining replica (never elected, spec 3.7), and answers ``ReplicaRejoin``, on which that replica takes
  itself for joining too;
* the leader sends the rejoining replica everything from its latest major, as to any replica that acked
  nothing, and the rejoining replica pushes to the leader whatever it wrote before it knew. Once it has
  acked every segment from the major (or at once if the leader holds none), the leader sends
  ``JoinFinalized`` with the epoch; every replica that receives it takes the placement for a member
  again, and re-sends that finalize to each peer that comes back, as for the layout's joins.

A record is ``(epoch, state)`` with state ``member`` (first heard as it is), ``rejoining`` or ``joined``
(finalized). A finalize for an epoch other than the one recorded waits in memory until the replica's
own hello names that epoch (it may come first on another link), so an old finalize never brings back an
old store's epoch. A node that knew no epoch of a placement (a store written before epochs existed)
takes the first one it hears as it is: for such a node, a disk lost before then goes unnoticed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sparkbus.bus.contract import Send
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import LocalReplica
from sparkbus.roles.replication.messages import JoinFinalized, ReplicaHello, ReplicaRejoin

MEMBER, REJOINING, JOINED = "member", "rejoining", "joined"

Records = dict[int, tuple[bytes, str]]


def records_of(rep: LocalReplica) -> Records:
    """The epochs ``rep``'s store knows, by placement (its own placement only once it rejoined)."""
    return {int(p): (bytes(e), str(s)) for p, e, s in rep.store.meta.get("epochs", ())}


def _save(rep: LocalReplica, records: Records) -> None:
    rep.store.meta["epochs"] = [[p, e, s] for p, (e, s) in sorted(records.items())]
    rep.store.save_manifest()


class Epochs:
    """Hello, rejoin and the finalize of a rejoin; ``ReplicationRole`` provides the state and hooks."""

    node: str
    layout: Layout
    live: set[str]
    local: dict[str, LocalReplica]
    # Finalizes that name an epoch other than the recorded one, by (partition, placement).
    _finalized_ahead: dict[tuple[str, int], set[bytes]]

    def _count(self, name: str) -> None:
        raise NotImplementedError

    def _emit(self, action: Any) -> None:
        raise NotImplementedError

    def _set_spec(self, spec: PartitionSpec) -> None:
        raise NotImplementedError

    def _rejoin_at_start(self) -> None:
        """Placements recorded as rejoining stay joining across a restart (the layout does not know)."""
        for rep in list(self.local.values()):
            for placement, (epoch, state) in records_of(rep).items():
                if state == REJOINING and (placement != rep.me.placement or epoch == rep.store.epoch):
                    self._set_joining(rep.spec.partition, placement, True)

    def _hello(self, peer: str) -> None:
        """A link came up: name our stores to ``peer`` and repeat the rejoins we finalized or saw finalized."""
        for rep in self.local.values():
            if rep.spec.replica_on(peer) is None:
                continue
            partition = rep.spec.partition
            hello = ReplicaHello(partition=partition, placement=rep.me.placement, epoch=rep.store.epoch)
            self._emit(Send(peer=peer, message=hello))
            for placement, (epoch, state) in records_of(rep).items():
                if state == JOINED:
                    msg = JoinFinalized(partition=partition, placement=placement, epoch=epoch)
                    self._emit(Send(peer=peer, message=msg))

    def _epoch_replica(self, peer: str, partition: str, placement: int | None) -> LocalReplica | None:
        """Our replica of ``partition`` if ``peer`` holds one of it (``placement``, if given); else None."""
        rep = self.local.get(partition)
        theirs = None if rep is None else rep.spec.replica_on(peer)
        if rep is None or theirs is None or (placement is not None and theirs.placement != placement):
            self._count("epoch_refused")
            return None
        return rep

    def _on_hello(self, peer: str, msg: ReplicaHello) -> None:
        rep = self._epoch_replica(peer, msg.partition, msg.placement)
        if rep is None:
            return
        records = records_of(rep)
        known = records.get(msg.placement)
        if known is None:
            records[msg.placement] = (msg.epoch, MEMBER)
            _save(rep, records)
            return
        if known[0] == msg.epoch:
            if known[1] == REJOINING:  # it may have restarted before it saved the rejoin
                self._send_rejoin(peer, msg)
            return
        # A new store under a placement we know: what the old one acked is gone with it.
        self._count("replica_resets")
        rep.store.forget_acked(msg.placement)
        finalized = msg.epoch in self._finalized_ahead.pop((msg.partition, msg.placement), set())
        records[msg.placement] = (msg.epoch, JOINED if finalized else REJOINING)
        _save(rep, records)
        if finalized:
            self._set_joining(msg.partition, msg.placement, False)
        else:
            self._set_joining(msg.partition, msg.placement, True)
            self._send_rejoin(peer, msg)

    def _send_rejoin(self, peer: str, msg: ReplicaHello) -> None:
        rejoin = ReplicaRejoin(partition=msg.partition, placement=msg.placement, epoch=msg.epoch)
        self._emit(Send(peer=peer, message=rejoin))

    def _on_rejoin(self, peer: str, msg: ReplicaRejoin) -> None:
        rep = self._epoch_replica(peer, msg.partition, None)
        if rep is None or msg.placement != rep.me.placement or msg.epoch != rep.store.epoch:
            if rep is not None:
                self._count("epoch_refused")  # about a store we no longer are
            return
        records = records_of(rep)
        if records.get(msg.placement, (b"", MEMBER))[1] != MEMBER:
            return  # rejoining already, or finalized: a late repeat
        records[msg.placement] = (msg.epoch, REJOINING)
        _save(rep, records)
        self._count("rejoins")
        self._set_joining(msg.partition, msg.placement, True)

    def _on_rejoin_finalized(self, msg: JoinFinalized) -> None:
        """A leader finalized the rejoin of (placement, epoch); the sender holds a replica (checked)."""
        rep = self.local.get(msg.partition)
        if rep is None:
            return
        if msg.placement == rep.me.placement and msg.epoch != rep.store.epoch:
            return  # the rejoin of a store we no longer are
        records = records_of(rep)
        known = records.get(msg.placement)
        if known is not None and known[0] != msg.epoch:
            self._finalized_ahead.setdefault((msg.partition, msg.placement), set()).add(msg.epoch)
            return
        if known is not None and known[1] != REJOINING:
            return
        records[msg.placement] = (msg.epoch, JOINED)
        _save(rep, records)
        self._count("joins_finalized")
        self._set_joining(msg.partition, msg.placement, False)

    def _rejoin_epoch(self, rep: LocalReplica, replica: Replica) -> bytes | None:
        """The epoch of ``replica`` if we take it for rejoining, else None."""
        epoch, state = records_of(rep).get(replica.placement, (b"", MEMBER))
        return epoch if state == REJOINING else None

    def _finalize_rejoin(self, rep: LocalReplica, replica: Replica, epoch: bytes) -> None:
        """Leader: ``replica`` acked every segment from the major; it takes part in elections again."""
        records = records_of(rep)
        records[replica.placement] = (epoch, JOINED)
        _save(rep, records)
        msg = JoinFinalized(partition=rep.spec.partition, placement=replica.placement, epoch=epoch)
        for r in rep.spec.replicas:
            if r.node != self.node and r.node in self.live:  # the others on their next hello
                self._emit(Send(peer=r.node, message=msg))
        self._count("joins_finalized")
        self._set_joining(rep.spec.partition, replica.placement, False)

    def _set_joining(self, partition: str, placement: int, joining: bool) -> None:
        spec = self.layout.partitions.get(partition)
        if spec is None:
            return
        for r in spec.replicas:
            if r.placement == placement and r.joining != joining:
                self._set_spec(spec.with_replica(replace(r, joining=joining)))
