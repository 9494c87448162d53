"""A store that starts empty under a placement its peers already know (spec 3.6, the second ABA case).

Spec 3.6 gives a replica that starts with an empty partition a new placement id, so that no peer takes
it for the store it had: the acked lists name placement ids, and a peer deletes what the placement has
acked. Placement ids here come from the topology, so a node whose disk was lost, or that moved to a
machine without its data directory, comes back under its old id. Left at that, a follower would never be
sent again what it acked, and a leader would serve an empty partition while its followers kept the rows.

So each store draws an *epoch* when it is created (``PartitionStore.epoch``: random bytes in its
manifest) and the pair (placement, epoch) is the identity the spec's placement id stands for:

* when a link comes up, each replica sends ``ReplicaHello`` (its placement, epoch and what the store
  knows of itself) to the peer, for every partition both hold, before anything else of the partition;
  and to every live replica when it is placed by ``assign`` or its own state changes;
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
(finalized); a hello's state is taken as the store says it, except a lagging ``rejoining`` after a
finalize. When every replica is joining and some only rejoin, those may be elected (``_electable``). A finalize for an epoch other than the one recorded waits in memory until the replica's
own hello names that epoch (it may come first on another link), so an old finalize never brings back an
old store's epoch. A node that knew no epoch of a placement (a store written before epochs existed)
takes the first one it hears as it is: for such a node, a disk lost before then goes unnoticed.
"""

from __future__ import annotations

from dataclasses import replace

from sparkbus.bus.contract import Send
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.local import Hooks, LocalReplica
from sparkbus.roles.replication.messages import JoinFinalized, ReplicaHello, ReplicaRejoin

MEMBER, REJOINING, JOINED = "member", "rejoining", "joined"

Records = dict[int, tuple[bytes, str]]


def records_of(rep: LocalReplica) -> Records:
    """The epochs ``rep``'s store knows, by placement (its own placement only once it rejoined)."""
    return {int(p): (bytes(e), str(s)) for p, e, s in rep.store.meta.get("epochs", ())}


def _save(rep: LocalReplica, records: Records) -> None:
    rep.store.meta["epochs"] = [[p, e, s] for p, (e, s) in sorted(records.items())]
    rep.store.save_manifest()


class Epochs(Hooks):
    """Hello, rejoin and the finalize of a rejoin; ``ReplicationRole`` provides the state and hooks."""

    node: str
    layout: Layout
    live: set[str]
    local: dict[str, LocalReplica]
    # Finalizes that name an epoch other than the recorded one, by (partition, placement).
    _finalized_ahead: dict[tuple[str, int], set[bytes]]

    def _set_spec(self, spec: PartitionSpec) -> None:
        raise NotImplementedError

    def _reapply_rejoins(self, partition: str | None = None) -> None:
        """Placements recorded as rejoining stay joining across a restart or an ``assign`` (the layout
        does not know)."""
        for rep in list(self.local.values()):
            if partition is not None and rep.spec.partition != partition:
                continue
            for placement, (epoch, state) in records_of(rep).items():
                if state == REJOINING and (placement != rep.me.placement or epoch == rep.store.epoch):
                    self._set_joining(rep.spec.partition, placement, True)

    def _own_hello(self, rep: LocalReplica) -> ReplicaHello:
        epoch = rep.store.epoch
        own = records_of(rep).get(rep.me.placement, (epoch, MEMBER))
        state = own[1] if own[0] == epoch else MEMBER
        return ReplicaHello(
            partition=rep.spec.partition, placement=rep.me.placement, epoch=epoch, state=state
        )

    def _announce(self, partition: str) -> None:
        """Name our store of ``partition`` to every live peer that holds it (placed, or our state changed)."""
        rep = self.local.get(partition)
        if rep is None:
            return
        for r in rep.spec.replicas:
            if r.node != self.node and r.node in self.live:
                self._emit(Send(peer=r.node, message=self._own_hello(rep)))

    def _hello(self, peer: str) -> None:
        """A link came up: name our stores to ``peer`` and repeat the rejoins we finalized or saw finalized."""
        for rep in self.local.values():
            if rep.spec.replica_on(peer) is None:
                continue
            partition = rep.spec.partition
            self._emit(Send(peer=peer, message=self._own_hello(rep)))
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
        q, said = msg.placement, msg.state
        known = records.get(q)
        if known is not None and known[0] == msg.epoch:
            if known[1] == REJOINING and said == MEMBER:  # it may have restarted before it saved the rejoin
                self._send_rejoin(peer, msg)
            elif known[1] != said and said != MEMBER and (known[1], said) != (JOINED, REJOINING):
                # What the store knows of itself: a peer told it it rejoins, or a leader finalized it.
                self._record(rep, records, q, msg.epoch, said)
            return
        if known is None:
            self._record(rep, records, q, msg.epoch, said)  # the first store we hear of, as it says
            return
        # A new store under a placement we know: what the old one acked is gone with it.
        self._count("replica_resets")
        rep.store.forget_acked({q})
        finalized = said == JOINED or msg.epoch in self._finalized_ahead.pop((msg.partition, q), set())
        self._record(rep, records, q, msg.epoch, JOINED if finalized else REJOINING)
        if not finalized and said != REJOINING:
            self._send_rejoin(peer, msg)

    def _record(self, rep: LocalReplica, records: Records, placement: int, epoch: bytes, state: str) -> None:
        was = records.get(placement, (b"", MEMBER))[1]
        records[placement] = (epoch, state)
        _save(rep, records)
        if state in (REJOINING, JOINED) or was == REJOINING:  # a layout's join is left alone
            self._set_joining(rep.spec.partition, placement, state == REJOINING)

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
        self._count("rejoins")
        self._record(rep, records, msg.placement, msg.epoch, REJOINING)
        self._announce(msg.partition)  # peers that took our first hello as a member's learn it

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
        self._count("joins_finalized")
        self._record(rep, records, msg.placement, msg.epoch, JOINED)
        if msg.placement == rep.me.placement:
            self._announce(msg.partition)

    def _rejoin_epoch(self, rep: LocalReplica, replica: Replica) -> bytes | None:
        """The epoch of ``replica`` if we take it for rejoining, else None."""
        epoch, state = records_of(rep).get(replica.placement, (b"", MEMBER))
        return epoch if state == REJOINING else None

    def _finalize_rejoin(self, rep: LocalReplica, replica: Replica, epoch: bytes) -> None:
        """Leader: ``replica`` acked every segment from the major; it takes part in elections again."""
        msg = JoinFinalized(partition=rep.spec.partition, placement=replica.placement, epoch=epoch)
        for r in rep.spec.replicas:
            if r.node != self.node and r.node in self.live:  # the others on their next hello
                self._emit(Send(peer=r.node, message=msg))
        self._count("joins_finalized")
        self._record(rep, records_of(rep), replica.placement, epoch, JOINED)

    def _electable(self, spec: PartitionSpec) -> PartitionSpec:
        """``spec`` for the election: when every replica is joining and some only rejoin (their stores
        started empty), those may lead. Their peers that held the rows lost them too, or the partition
        would have no leader for good; the first one in placement order leads and finalizes the others,
        and once one is a member again it leads."""
        if any(not r.joining for r in spec.replicas):
            return spec
        rep = self.local.get(spec.partition)
        if rep is None:
            return spec
        records = records_of(rep)
        rejoining = {p for p, (_, state) in records.items() if state == REJOINING}
        if not rejoining:
            return spec
        return replace(
            spec,
            replicas=tuple(
                replace(r, joining=False) if r.placement in rejoining else r for r in spec.replicas
            ),
        )

    def _set_joining(self, partition: str, placement: int, joining: bool) -> None:
        spec = self.layout.partitions.get(partition)
        if spec is None:
            return
        for r in spec.replicas:
            if r.placement == placement and r.joining != joining:
                self._set_spec(spec.with_replica(replace(r, joining=joining)))
