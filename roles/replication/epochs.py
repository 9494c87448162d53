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

Replicas away. Election looks at node liveness, and a node that is up may still fail to open its replica
of a partition (``ReplicationRole._open``: listed under ``failing``, not hosted). Its peers went on naming
it leader, and nobody led the partition. So:

* a node whose replica cannot be opened sends ``ReplicaAbsent`` (its placement and the error) to every
  live replica of the partition on each tick while so, and to a peer whose link comes up; its peers record
  it (in memory, across the link's loss: a node that restarts still failing says so again, and nothing
  flaps) and take it for joining in the election (``_electable``), as it takes its own;
* a hello names a hosted store and ends that. A replica that opens again after it could not is
  *returning*: its hello says so (``returning``), and it and its peers take it for joining while another
  replica can lead. A peer that hears a replica return answers with its own hello for the partition
  (the returning one heard none while it was away). The leader sends it what it lacks, as to any
  follower; once it has acked every segment from the leader's latest major, the leader sends
  ``ReplicaCaughtUp`` (placement, epoch) to every live replica and the replica may lead again; it says
  so in a new hello, for a peer that missed the leader's word;
* a returning replica that no other replica can replace (the others down, joining or absent) leads,
  as after a restart, and returns no more.

A node that restarts while its replica returns comes back as after any restart (the state is in memory).
A node whose replica was away and opens at a restart does not know it was away: a peer that holds it for
absent takes a hello that does not say it returns for a return all the same, and tells it so with
``ReplicaReturns`` (placement, epoch), at once when the link comes up (with the epoch it recorded, before
its hello) and in answer to such a hello; the replica takes itself for returning. Until each live peer
whose store it knows has spoken of the partition (a hello, ``ReplicaAbsent`` or ``ReplicaReturns``), a
replica opened at start takes itself for joining while another can lead (``_waiting``): else it led in
its own view until that word came, beside the peer that led while it was away. Once every such peer has
spoken it waits no more; until then a peer that comes up later stops it leading for that long.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sparkbus.bus.contract import Send
from sparkbus.roles.replication.layout import Layout, LeaderElection, PartitionSpec, Replica
from sparkbus.roles.replication.local import Hooks, LocalReplica
from sparkbus.roles.replication.messages import (
    MAX_ABSENT_ERROR,
    JoinFinalized,
    ReplicaAbsent,
    ReplicaCaughtUp,
    ReplicaHello,
    ReplicaRejoin,
    ReplicaReturns,
)

MEMBER, REJOINING, JOINED = "member", "rejoining", "joined"

log = logging.getLogger(__name__)

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
    election: LeaderElection
    failing: dict[str, str]
    unopened: set[str]
    # Finalizes that name an epoch other than the recorded one, by (partition, placement).
    _finalized_ahead: dict[tuple[str, int], set[bytes]]
    # Replicas away, by (partition, placement): peers' that said they cannot be opened (with why), and
    # those returning (ours too) with their store's epoch.
    absent: dict[tuple[str, int], str]
    returning: dict[tuple[str, int], bytes]
    # Peers' returning replicas whose new session has not yet said it returns (it may have restarted).
    recheck: set[tuple[str, int]]
    fresh: set[str]
    heard: set[tuple[str, str]]
    start_until: float
    caught_with: dict[str, set[str]]
    _now: float

    def _elect(self) -> None:
        raise NotImplementedError

    def _set_spec(self, spec: PartitionSpec) -> None:
        raise NotImplementedError

    def _try_flush(self, rep: LocalReplica, when: str) -> None:
        raise NotImplementedError

    def _leader_in(self, spec: PartitionSpec) -> Replica | None:
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
        returning = self.returning.get((rep.spec.partition, rep.me.placement)) == epoch
        return ReplicaHello(
            partition=rep.spec.partition,
            placement=rep.me.placement,
            epoch=epoch,
            state=state,
            returning=returning,
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
        """A link came up: name our stores to ``peer`` and repeat the rejoins we finalized or saw finalized;
        and tell it of each of our replicas it shares that cannot be opened."""
        for peers in self.caught_with.values():
            peers.discard(peer)  # a new session: what it says now is not from before our catch-up
        for rep in self.local.values():
            if rep.spec.replica_on(peer) is not None:
                self._hello_partition(peer, rep, new_session=True)
        for partition in sorted(self.unopened):
            spec = self.layout.partitions.get(partition)
            if spec is not None and spec.replica_on(peer) is not None:
                self._tell_absent(spec, self.failing.get(partition, "cannot open"), {peer})

    def _hello_partition(self, peer: str, rep: LocalReplica, new_session: bool = False) -> None:
        partition = rep.spec.partition
        theirs = rep.spec.replica_on(peer)
        known = None if theirs is None else records_of(rep).get(theirs.placement)
        key = None if theirs is None else (partition, theirs.placement)
        told = None
        if key is not None and known is not None and key in self.absent:
            told = known[0]  # a replica that opened at a restart waits for our hello, and then returns
        elif key is not None and new_session and key in self.returning:
            # Its node may have restarted while it returned: that lives in memory, and its first hello
            # would say it returns no more (``_take_presence`` waits for that hello).
            self.recheck.add(key)
            told = self.returning[key]
        if key is not None and told is not None:
            self._emit(
                Send(peer=peer, message=ReplicaReturns(partition=partition, placement=key[1], epoch=told))
            )
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
        waited = self._hear(peer, msg.partition)
        self._take_store(peer, rep, msg)
        self._take_presence(peer, rep, msg)
        if waited:
            self._elect()

    def _hear(self, peer: str, partition: str) -> bool:
        """``peer`` spoke of ``partition``: True if our replica opened at start waited for it."""
        new = (partition, peer) not in self.heard
        self.heard.add((partition, peer))
        return new and partition in self.fresh

    def _waiting(self, spec: PartitionSpec) -> bool:
        """Our replica of ``spec`` opened at start and a live peer has not spoken of it yet: that peer
        may hold it for absent (it did not know it was away), so it does not lead yet. For
        ``start_wait`` after the start, a peer not up yet counts too (``_starting``)."""
        rep = self.local.get(spec.partition)
        if spec.partition not in self.fresh or rep is None:
            return False
        known = records_of(rep)  # a peer that never spoke to this store cannot have missed it since
        unheard = {r.node for r in spec.replicas if r.node != self.node and r.placement in known} - {
            peer for partition, peer in self.heard if partition == spec.partition
        }
        if not unheard:
            self.fresh.discard(spec.partition)  # every peer has spoken: it waits no more
        return bool(unheard & self.live) or self._starting(spec)

    def _starting(self, spec: PartitionSpec) -> bool:
        """Our replica of ``spec`` opened at start less than ``start_wait`` ago and a peer whose store it
        knows has not spoken of it: then nobody leads it here, not even it alone. Before its links came
        up it led at once and took writes at its old clock, which lost to the rows the peer took while it
        was away as soon as the peer said it returns (acknowledged, then gone)."""
        rep = self.local.get(spec.partition)
        if spec.partition not in self.fresh or rep is None or self._now >= self.start_until:
            return False
        known = records_of(rep)
        heard = {peer for partition, peer in self.heard if partition == spec.partition}
        return any(
            r.node != self.node and r.placement in known and r.node not in heard for r in spec.replicas
        )

    def _take_store(self, peer: str, rep: LocalReplica, msg: ReplicaHello) -> None:
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
        """``spec`` for the election: the replicas away are taken for joining (below, "Replicas away"),
        and when every replica is joining and some only rejoin (their stores started empty), those may
        lead. Their peers that held the rows lost them too, or the partition would have no leader for
        good; the first one in placement order leads and finalizes the others, and once one is a member
        again it leads. A replica away counts as a member there: it holds the rows."""
        spec = self._rejoiners_electable(spec)
        absent = self._absent_in(spec)
        returning = {r.placement for r in spec.replicas if (spec.partition, r.placement) in self.returning}
        mine = spec.replica_on(self.node)
        if mine is not None and self._waiting(spec):
            returning.add(mine.placement)
        if not absent and not returning:
            return spec
        without = spec.with_joining(absent | returning)
        if returning and self.election.leader(without, frozenset(self.live)) is None:
            if mine is not None and self._starting(spec):
                return without  # a peer not up yet may have led it meanwhile: nobody leads until it speaks
            return spec.with_joining(absent)  # none other can lead: a returning replica may
        return without

    def _rejoiners_electable(self, spec: PartitionSpec) -> PartitionSpec:
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

    # ------------------------------------------------------------ replicas away

    def _absent_in(self, spec: PartitionSpec) -> set[int]:
        """Placements of ``spec`` that are not hosted: peers' that said so, and ours if it cannot be opened."""
        absent = {r.placement for r in spec.replicas if (spec.partition, r.placement) in self.absent}
        mine = spec.replica_on(self.node)
        if mine is not None and spec.partition in self.unopened:
            absent.add(mine.placement)
        return absent

    def _tell_absent(self, spec: PartitionSpec, error: str, peers: set[str] | None = None) -> None:
        """Our replica of ``spec`` cannot be opened: tell ``peers`` (default: every live replica's node)."""
        mine = spec.replica_on(self.node)
        if mine is None:
            return
        msg = ReplicaAbsent(
            partition=spec.partition, placement=mine.placement, error=error[:MAX_ABSENT_ERROR]
        )
        for r in spec.replicas:
            if r.node != self.node and r.node in self.live and (peers is None or r.node in peers):
                self._emit(Send(peer=r.node, message=msg))

    def _on_absent(self, peer: str, msg: ReplicaAbsent) -> None:
        spec = self.layout.partitions.get(msg.partition)
        theirs = None if spec is None else spec.replica_on(peer)
        if theirs is None or theirs.placement != msg.placement:
            self._count("absent_refused")  # not a replica of the partition, or not that one
            return
        key = (msg.partition, msg.placement)
        if self._hear(peer, msg.partition):
            self._elect()
        known = key in self.absent
        self.absent[key] = msg.error
        if not known or self.returning.pop(key, None) is not None:
            self._count("peers_absent")
            log.warning(
                "replication %s: %s: %s cannot open its replica: %s", self.node, key[0], peer, msg.error
            )
            self._elect()

    def _take_presence(self, peer: str, rep: LocalReplica, msg: ReplicaHello) -> None:
        """A hello names a hosted store: not absent; returning as it says, or if we held it for absent
        (its store opened at a restart: it did not know it was away), and then we tell it so."""
        key = (msg.partition, msg.placement)
        rechecked = key in self.recheck
        self.recheck.discard(key)
        if rechecked and not msg.returning and self.returning.get(key) == msg.epoch:
            # The first hello of a new session, from a replica we hold returning, that does not say it
            # returns: its node restarted and forgot. Taken as caught up, it led at once without the rows
            # the others took meanwhile; it is told again (its own ``ReplicaReturns`` is a no-op if not).
            self._count("told_returning")
            self._emit(
                Send(
                    peer=peer,
                    message=ReplicaReturns(partition=msg.partition, placement=msg.placement, epoch=msg.epoch),
                )
            )
            return
        was_absent = self.absent.pop(key, None) is not None
        before = self.returning.get(key)
        if msg.returning or was_absent:
            self.returning[key] = msg.epoch
        else:
            self.returning.pop(key, None)
        if was_absent and not msg.returning:
            self._count("told_returning")
            self._emit(
                Send(
                    peer=peer,
                    message=ReplicaReturns(partition=msg.partition, placement=msg.placement, epoch=msg.epoch),
                )
            )
        if msg.returning and before is None:
            # It heard none of our hellos while it could not be opened (nor a store we since lost).
            self._hello_partition(peer, rep)
        if was_absent or before != self.returning.get(key):
            self._elect()

    def _reopened(self, partition: str) -> None:
        """Our replica of ``partition`` opened after it could not: it returns (a follower until the leader
        catches it up, unless no other replica can lead) and names its store to every live peer."""
        rep = self.local.get(partition)
        if rep is None:
            return
        self.returning[partition, rep.me.placement] = rep.store.epoch
        self._count("reopened")
        self._announce(partition)

    def _on_returns(self, peer: str, msg: ReplicaReturns) -> None:
        """A peer held our replica for absent, and it opened at a restart: it returns, as if it had
        opened again on a tick (``_reopened``), unless it is another store by now or returns already."""
        rep = self.local.get(msg.partition)
        if rep is None and msg.partition in self.unopened:
            return  # still away: the peer tells it again once its hello names the store
        if rep is None or rep.spec.replica_on(peer) is None or rep.me.placement != msg.placement:
            self._count("returns_refused")
            return
        key = (msg.partition, msg.placement)
        self.heard.add((msg.partition, peer))  # its hello follows: we wait on until then
        if msg.epoch != rep.store.epoch or key in self.returning:
            return
        if peer in self.caught_with.get(msg.partition, ()):
            # Sent before it heard the leader's word that we are caught up (its answer to our first hello
            # crossed it): we hold what the leader holds. Our hello corrects its record.
            self._count("returns_stale")
            self._emit(Send(peer=peer, message=self._own_hello(rep)))
            return
        self.returning[key] = msg.epoch
        self._count("returns")
        self._elect()  # a replica that can lead is live (the sender): it returns, or leads alone
        if key in self.returning:
            self._announce(msg.partition)

    def _returned(self, rep: LocalReplica) -> None:
        """``rep`` leads: if it was returning, no other replica could lead; it returns no more."""
        if self.returning.pop((rep.spec.partition, rep.me.placement), None) is not None:
            self._announce(rep.spec.partition)

    def _maybe_caught_up(self, rep: LocalReplica, replica: Replica) -> None:
        """Leader: ``replica`` acked every segment from our latest major; if it returns, it may lead again
        once it also holds our memtable: flushed now (as on losing leadership), the next round offers
        that segment, and we say it is caught up when it acks it too."""
        key = (rep.spec.partition, replica.placement)
        epoch = self.returning.get(key)
        if epoch is None or replica.node not in self.live:
            return
        if rep.store.memtable_rows:
            # Led at once without these rows, its clock below their versions: its own write of such a key
            # would lose to the older one once we flush and push it.
            self._try_flush(rep, "before a returning replica is caught up")
            return
        msg = ReplicaCaughtUp(partition=rep.spec.partition, placement=replica.placement, epoch=epoch)
        for r in rep.spec.replicas:
            if r.node != self.node and r.node in self.live:
                self._emit(Send(peer=r.node, message=msg))
        del self.returning[key]
        self._count("caught_up")
        self._elect()

    def _on_caught_up(self, peer: str, msg: ReplicaCaughtUp) -> None:
        """The leader's word that a returning replica holds what it holds. Only the leader can know: from
        any other replica (a follower, the returning replica itself, one whose view of the leader is
        stale) it is refused, or the leader stepped down for a replica without its rows."""
        spec = self.layout.partitions.get(msg.partition)
        leader = None if spec is None else self._leader_in(spec)
        if spec is None or spec.replica_on(peer) is None or leader is None or leader.node != peer:
            self._count("caught_up_refused")
            return
        key = (msg.partition, msg.placement)
        if self.returning.get(key) != msg.epoch:
            return  # returning no more, or another store
        del self.returning[key]
        self._count("caught_up")
        self._elect()
        rep = self.local.get(msg.partition)
        if rep is not None and rep.me.placement == msg.placement:
            self.caught_with[msg.partition] = set(self.live)
            self._announce(msg.partition)  # a peer that missed the leader's word learns it from us
