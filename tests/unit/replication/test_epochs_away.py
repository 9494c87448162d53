"""Replicas away at role level: REPLICA_ABSENT, a hello's ``returning``, REPLICA_RETURNS and
REPLICA_CAUGHT_UP, and what a peer may not make a replica believe with them (``roles/replication/epochs.py``, "Replicas away")."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from sparkbus.bus.contract import PeerUp, Send, TimerFired
from sparkbus.codecs import EnvelopeCodec
from sparkbus.roles.replication.layout import Layout
from sparkbus.roles.replication.messages import (
    ReplicaAbsent,
    ReplicaCaughtUp,
    ReplicaHello,
    ReplicaReturns,
)
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import MANIFEST

from .test_dropped_replica import CONFIG, P, write
from .test_epochs import NEW, OLD, SPEC, receive, role

CODEC = EnvelopeCodec()
EIO = "cannot open: OSError: [Errno 5] Input/output error"


def leader(r: ReplicationRole) -> str | None:
    rep = r.local[P]
    return rep.leader.node if rep.leader is not None else None


def up(r: ReplicationRole, *peers: str, now: float = 0.5) -> list[Any]:
    out = []
    for p in peers:
        out += [x.message for x in r.handle(PeerUp(peer=p), now) if isinstance(x, Send)]
    return out


def unopened(node: str) -> ReplicationRole:
    """``node``'s role whose replica of P cannot be opened (every read fails with EIO)."""

    class Failing(MemoryStorage):
        def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    storage = Failing()
    storage.append_durable(MANIFEST, b"{}")  # a replica's files are there: it is not a new store
    r = ReplicationRole(node, Layout.of([SPEC]), lambda p: storage, CONFIG)
    list(r.handle(TimerFired(key="replication/tick"), 0.0))
    assert P in r.unopened
    return r


@pytest.mark.parametrize(
    "msg",
    [
        ReplicaAbsent(partition=P, placement=2, error=EIO),
        ReplicaCaughtUp(partition=P, placement=2, epoch=OLD),
        ReplicaHello(partition=P, placement=2, epoch=OLD, returning=True),
        ReplicaReturns(partition=P, placement=2, epoch=OLD),
    ],
    ids=lambda m: type(m).__name__,
)
def test_the_messages_round_trip_in_the_family_range(msg: Any) -> None:
    assert CODEC.decode(CODEC.encode(msg)).message == msg
    assert 0x0120 <= CODEC.registry.code_of(type(msg)) <= 0x013F


def test_an_absent_replicas_reason_is_bounded() -> None:
    with pytest.raises(ValueError, match="error"):
        ReplicaAbsent(partition=P, placement=2, error="x" * 1025)


def test_a_replica_that_cannot_be_opened_says_so_on_peer_up_and_on_each_tick() -> None:
    a = unopened("a")
    sent = up(a, "b", "c")
    assert sent == [ReplicaAbsent(partition=P, placement=1, error=EIO)] * 2
    ticked = [x.message for x in a.handle(TimerFired(key="replication/tick"), 1.0) if isinstance(x, Send)]
    assert ticked == [ReplicaAbsent(partition=P, placement=1, error=EIO)] * 2
    assert a._leader_of(P) is not None and a._leader_of(P).node == "b"  # type: ignore[union-attr]


def holding(node: str) -> ReplicationRole:
    """``node``'s role with a segment of its own (written while it led alone), then a and c up."""
    r = role(node)
    write(r, [1, 2])
    up(r, "a", "c")
    return r


def test_peers_elect_another_replica_while_one_is_absent_until_its_hello() -> None:
    b = holding("b")
    assert leader(b) == "a"
    receive(b, "a", ReplicaAbsent(partition=P, placement=1, error=EIO))
    assert leader(b) == "b" and b.counters["peers_absent"] == 1
    term = b.local[P].term
    receive(b, "a", ReplicaAbsent(partition=P, placement=1, error=EIO), 2.0)  # the next tick's
    assert b.local[P].term == term and b.counters["peers_absent"] == 1
    answer = receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True), 3.0)
    assert leader(b) == "b", "returning: b leads until it catches a up"
    assert answer[0] == ReplicaHello(partition=P, placement=2, epoch=b.local[P].store.epoch)
    again = receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True), 4.0)
    assert not any(isinstance(m, ReplicaHello) for m in again), "answered once, not back and forth"
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD), 5.0)
    assert leader(b) == "a"


@pytest.mark.parametrize(
    ("peer", "msg"),
    [
        ("z", ReplicaAbsent(partition=P, placement=1, error=EIO)),  # holds no replica
        ("c", ReplicaAbsent(partition=P, placement=1, error=EIO)),  # not its placement
        ("b", ReplicaAbsent(partition="t/9", placement=2, error=EIO)),  # a partition nobody has
    ],
)
def test_only_a_replica_says_itself_absent(peer: str, msg: ReplicaAbsent) -> None:
    a = role("a")
    up(a, "b", "c")
    assert receive(a, peer, msg) == []
    assert a.absent == {} and leader(a) == "a"
    assert a.counters["absent_refused"] == 1


def test_a_returning_replica_leads_again_only_on_the_leaders_word_for_its_store() -> None:
    c = role("c")
    write(c, [1, 2])
    up(c, "a", "b")
    receive(c, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True))
    assert leader(c) == "b"
    receive(c, "z", ReplicaCaughtUp(partition=P, placement=1, epoch=OLD))  # not a replica
    receive(c, "a", ReplicaCaughtUp(partition=P, placement=1, epoch=OLD))  # the returning replica itself
    assert leader(c) == "b" and c.counters["caught_up_refused"] == 2
    receive(c, "b", ReplicaCaughtUp(partition=P, placement=1, epoch=b"\x09" * 8))  # another store
    assert leader(c) == "b" and c.returning == {(P, 1): OLD}
    receive(c, "b", ReplicaCaughtUp(partition=P, placement=1, epoch=OLD))
    assert leader(c) == "a" and c.returning == {}


def test_the_leader_takes_no_other_replicas_word_that_a_returning_replica_caught_up() -> None:
    b = holding("b")
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True))
    for sender in ("c", "a"):  # a follower cannot know what the leader holds; nor can the replica
        receive(b, sender, ReplicaCaughtUp(partition=P, placement=1, epoch=OLD))
        assert leader(b) == "b" and b.returning == {(P, 1): OLD}
    assert b.counters["caught_up_refused"] == 2


def test_a_returning_replica_whose_node_restarts_is_told_it_still_returns() -> None:
    b = holding("b")
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True))
    sent = up(b, "a", now=3.0)  # a restarted before b caught it up: returning lived in its memory
    assert sent[0] == ReplicaReturns(partition=P, placement=1, epoch=OLD)
    answer = receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD), 4.0)  # forgot it returns
    assert answer[0] == ReplicaReturns(partition=P, placement=1, epoch=OLD)  # then what a lacks
    assert leader(b) == "b" and b.returning == {(P, 1): OLD}
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD, returning=True), 5.0)
    assert leader(b) == "b" and b.returning == {(P, 1): OLD}
    # The same session's later hello without it repeats the leader's word (it led alone, or was told).
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD), 6.0)
    assert leader(b) == "a" and b.returning == {}


def test_a_peer_held_absent_that_opened_at_a_restart_is_told_it_returns() -> None:
    b = holding("b")
    receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD))  # b knows a's store
    receive(b, "a", ReplicaAbsent(partition=P, placement=1, error=EIO), 2.0)
    assert leader(b) == "b"
    sent = up(b, "a", now=3.0)  # a restarted: a new session
    assert sent[:2] == [
        ReplicaReturns(partition=P, placement=1, epoch=OLD),  # before our hello, which a waits for
        ReplicaHello(partition=P, placement=2, epoch=b.local[P].store.epoch),
    ]
    answer = receive(b, "a", ReplicaHello(partition=P, placement=1, epoch=OLD), 4.0)  # not returning
    assert answer[0] == ReplicaReturns(partition=P, placement=1, epoch=OLD)  # then what a lacks
    assert leader(b) == "b" and b.absent == {} and b.returning == {(P, 1): OLD}
    assert b.counters["told_returning"] == 1


def restarted_a() -> tuple[ReplicationRole, bytes]:
    """a's role restarted on a store that has heard b and c, then b and c up."""
    kept: dict[str, MemoryStorage] = {}
    a = role("a", kept)
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    receive(a, "c", ReplicaHello(partition=P, placement=3, epoch=NEW))
    a = role("a", kept)
    up(a, "b", "c")
    return a, a.local[P].store.epoch


def test_a_replica_opened_at_start_leads_only_once_the_peers_it_knows_have_spoken() -> None:
    a, _ = restarted_a()
    assert leader(a) == "b", "b may hold it for absent: a waits for its word"
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    assert leader(a) == "b"
    receive(a, "c", ReplicaHello(partition=P, placement=3, epoch=NEW))
    assert leader(a) == "a" and a.returning == {}


def test_a_replica_opened_at_start_leads_alone_only_after_start_wait_for_peers_not_up() -> None:
    kept: dict[str, MemoryStorage] = {}
    a = role("a", kept)
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    a = role("a", kept)  # restarted at 0.0; b and c not up yet: b may have led while a was away
    assert leader(a) is None, "no peer is live yet, and a does not lead alone before start_wait"
    list(a.handle(TimerFired(key="replication/tick"), 4.9))
    assert leader(a) is None
    list(a.handle(TimerFired(key="replication/tick"), 5.0))
    assert leader(a) == "a", "a peer still down after start_wait is led without"


def test_a_replica_opened_at_start_leads_at_once_once_each_peer_it_knows_has_spoken() -> None:
    kept: dict[str, MemoryStorage] = {}
    a = role("a", kept)
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    a = role("a", kept)
    up(a, "b")
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD), 0.6)
    assert leader(a) == "a", "c never spoke to this store: a waits for nobody else"


def test_a_replica_returns_sent_before_the_leaders_word_reached_its_sender_is_stale() -> None:
    a, epoch = restarted_a()
    receive(a, "b", ReplicaReturns(partition=P, placement=1, epoch=epoch))
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    receive(a, "c", ReplicaHello(partition=P, placement=3, epoch=NEW))
    receive(a, "b", ReplicaCaughtUp(partition=P, placement=1, epoch=epoch))
    assert leader(a) == "a"
    answer = receive(a, "c", ReplicaReturns(partition=P, placement=1, epoch=epoch))  # crossed b's word
    assert leader(a) == "a" and a.returning == {} and a.counters["returns_stale"] == 1
    assert answer == [ReplicaHello(partition=P, placement=1, epoch=epoch)]  # c's record corrected
    up(a, "c", now=2.0)  # a new session: c may have been away and taken rows since
    receive(a, "c", ReplicaReturns(partition=P, placement=1, epoch=epoch), 2.1)
    assert a.returning == {(P, 1): epoch} and leader(a) == "b"


def test_a_replica_told_it_returns_follows_until_caught_up() -> None:
    a, epoch = restarted_a()
    receive(a, "z", ReplicaReturns(partition=P, placement=1, epoch=epoch))  # holds no replica
    receive(a, "b", ReplicaReturns(partition=P, placement=1, epoch=NEW))  # another store
    assert a.counters["returns_refused"] == 1 and a.returning == {}
    answer = receive(a, "b", ReplicaReturns(partition=P, placement=1, epoch=epoch))
    assert a.returning == {(P, 1): epoch} and a.counters["returns"] == 1
    assert ReplicaHello(partition=P, placement=1, epoch=epoch, returning=True) in answer
    receive(a, "b", ReplicaHello(partition=P, placement=2, epoch=OLD))
    receive(a, "c", ReplicaHello(partition=P, placement=3, epoch=NEW))
    assert leader(a) == "b"
    receive(a, "b", ReplicaCaughtUp(partition=P, placement=1, epoch=epoch))
    assert leader(a) == "a" and a.returning == {}
