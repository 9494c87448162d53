"""Local disk errors (ENOSPC, EIO) on one node: the role answers, keeps its tick and tries again.

Each fault strikes once, at a chosen storage operation of one replica (``_Once``), and the rows
acknowledged before and after it must end on every replica with no further event but the tick. A read
error is not damage: the file it struck is read again later, never refused or set aside for it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import pytest

from sparkbus.roles.replication.store import MANIFEST, WAL, PartitionStore, read_manifest
from tests.sim.replication.cluster import NODES, Cluster, P, Unreadable, spec

Q = "t/9"


class _Once:
    """Make ``method`` of ``storage`` raise ENOSPC (or ``err``) the first time ``hit(name)`` is true
    (every time with ``always``); ``fired`` counts the errors raised. With ``reads`` the call itself
    succeeds, and the file object it returns (``open``) raises on each read: the storage failing under
    Arrow as it reads a segment's body."""

    def __init__(
        self,
        storage: Any,
        method: str,
        hit: Callable[[str], bool],
        *,
        always: bool = False,
        err: int = errno.ENOSPC,
        reads: bool = False,
    ) -> None:
        self.orig = getattr(storage, method)
        self.hit, self.always, self.err, self.reads, self.fired = hit, always, err, reads, 0
        setattr(storage, method, self)

    def __call__(self, name: str, *args: Any, **kw: Any) -> Any:
        if (self.always or not self.fired) and self.hit(name):
            self.fired += 1
            if self.reads:
                return Unreadable(self.orig(name, *args, **kw), self.err)
            raise OSError(self.err, os.strerror(self.err))
        return self.orig(name, *args, **kw)


def _nth_open_of_a_received_file(store: PartitionStore, nth: int) -> Callable[[str], bool]:
    """A ``hit`` true for the ``nth`` opening of each received file (not a listed segment): the check
    opens it first (its schema), the merge second (its rows)."""
    opened: dict[str, int] = {}

    def hit(name: str) -> bool:
        if name in {f"seg-{e.segment_id}" for e in store.entries} or not name.startswith(("seg-", "in-")):
            return False
        opened[name] = opened.get(name, 0) + 1
        return opened[name] == nth

    return hit


def _acks_of(role: Any) -> list[str]:
    """The errors of the acks ``role`` sends from now on (``""`` for an ack that is ok)."""
    acks: list[str] = []
    send_ack = role._send_ack

    def spy(inc: Any, rep: Any, error: str) -> None:
        acks.append(error)
        send_ack(inc, rep, error)

    role._send_ack = spy
    return acks


EIO = f"[Errno {errno.EIO}] {os.strerror(errno.EIO)}"


@pytest.mark.parametrize("seed", [1, 2])
def test_one_failed_age_flush_does_not_stop_the_tick(seed: int) -> None:
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))  # two flushes of 4 rows
    c.settle(10)
    c.assert_identical(NODES, keys)
    fault = _Once(c.role("a").local[P].store.storage, "create", lambda n: n.startswith("seg-"))
    keys += c.write_keys("a", range(100, 102))  # below flush_rows: flushed by age (5 s) on a tick
    c.settle(60)
    assert fault.fired, "the age flush hit the error"
    keys += c.write_keys("a", range(200, 202))  # after it: again below flush_rows, only the tick flushes
    c.settle(60)
    c.assert_identical(NODES, keys)
    assert c.role("a").local[P].store.memtable_rows == 0
    # Logged and counted once, not raised; it clears once the procedures run again.
    assert c.counters("a").get("procedure_errors") == 1 and c.status("a")["failing"] == {}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_manifest_write_error_on_fast_forward_is_acked_and_retried(seed: int) -> None:
    """Raised, the error left the transfer unanswered: the leader, one offer at a time per follower,
    waited for its ack while the link stayed up and replicated nothing to b again."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.assert_identical(NODES, keys)
    fault = _Once(c.role("b").local[P].store.storage, "create", lambda n: n == MANIFEST)
    keys += c.write_keys("a", range(100, 108))  # flushed: offered to b and c
    c.settle(30)
    assert fault.fired
    assert c.counters("b").get("incoming_write_errors") == 1
    keys += c.write_keys("a", range(200, 208))
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


def _b_forked(seed: int) -> tuple[Cluster, list[int]]:
    """a leads P on every node; cut off from a and c, b leads alone and flushes writes: a fork, which
    a merges once ``_heal_b`` joins them again. Returns the keys acknowledged."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "b")
    c.cut("b", "c")
    keys += c.write_keys("b", range(50, 58))  # b leads alone
    c.call("b", "flush", partition=P)
    return c, keys


def _heal_b(c: Cluster) -> None:
    c.heal("a", "b")
    c.heal("b", "c")
    c.settle(30)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_log_write_error_while_merging_is_acked_and_retried(seed: int) -> None:
    """b leads its side of a cut and takes writes; on the heal a merges b's fork, and its log append
    fails once. Unanswered, a never got b's acknowledged rows: reads on the leader missed them for good."""
    c, keys = _b_forked(seed)
    fault = _Once(c.role("a").local[P].store.storage, "append_durable", lambda n: n == WAL)
    _heal_b(c)
    assert fault.fired
    assert c.counters("a").get("incoming_write_errors") == 1
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_lazy_ack_save_that_fails_on_every_tick_stops_no_other_partition(seed: int) -> None:
    """a leads P and Q; from the time P's followers have acked a segment, P's manifest cannot be
    written. Saved outside the per-replica guard, the tick's lazy ack save raised before any procedure
    ran, on every tick: Q's rows written afterwards stayed in a's memtable, neither flushed nor
    replicated."""
    c = Cluster([spec(*NODES), spec(*NODES, partition=Q, first_placement=11)], seed=seed)
    c.settle(5)
    assert c.leader("a") == "a" and c.leader("a", Q) == "a"
    armed: list[bool] = []
    fault = _Once(
        c.role("a").local[P].store.storage, "create", lambda n: bool(armed) and n == MANIFEST, always=True
    )
    keys = c.write_keys("a", range(4))  # flushed: P's acks are recorded, to be saved on the next tick
    armed.append(True)
    c.settle(1)
    keys_q = c.write_keys("a", range(100, 102), partition=Q)  # below flush_rows: only the tick flushes
    assert keys == [0, 1, 2, 3] and keys_q == [100, 101]
    c.settle(60)
    assert fault.fired
    assert c.role("a").local[Q].store.memtable_rows == 0
    c.assert_identical(NODES, keys_q, partition=Q)
    c.assert_identical(NODES, keys)
    # P alone is listed as failing, and logged once rather than on every tick.
    assert list(c.status("a")["failing"]) == [P] and c.counters("a").get("handler_errors") is None


@pytest.mark.parametrize("seed", [1, 2])
def test_a_failed_flush_on_losing_leadership_still_moves_every_partitions_leader(seed: int) -> None:
    """b, first of P and Q, restarts; a, which led both meanwhile, steps down and flushes P's memtable,
    and that flush fails once. Raised, it ended the election loop: a kept leading Q beside b (two
    leaders taking writes) until an unrelated peer event."""
    c = Cluster([spec("b", "a", "c"), spec("b", "a", "c", partition=Q, first_placement=11)], seed=seed)
    c.settle(5)
    c.crash("b")
    c.settle(5)
    assert c.leader("a") == "a" and c.leader("a", Q) == "a"
    keys = c.write_keys("a", range(2))  # in a's memtable: flushed when a stops leading
    fault = _Once(c.role("a").local[P].store.storage, "create", lambda n: n.startswith("seg-"))
    c.restart("b")
    c.settle(5)
    assert fault.fired
    assert c.leader("a") == "b" and c.leader("a", Q) == "b"
    _, error = c.write("a", Q, {"key": [7], "v": ["x"]})
    assert error is not None and "not the leader" in error
    keys_q = c.write_keys("b", range(100, 102), partition=Q)
    c.settle(30)  # a's unflushed rows of P are flushed by its next step as a follower, and pushed to b
    c.assert_identical(NODES, keys)
    c.assert_identical(NODES, keys_q, partition=Q)
    assert c.counters("a").get("flush_errors") == 1 and c.status("a")["failing"] == {}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_read_error_while_checking_a_received_segment_is_acked_and_retried(seed: int) -> None:
    """b's read of a received segment's header fails once (EIO). Raised, it left the transfer unanswered
    as a write error did: the leader waited for the ack and replicated nothing to b again."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.assert_identical(NODES, keys)
    storage = c.role("b").local[P].store.storage
    fault = _Once(storage, "read", lambda n: n.startswith(("seg-", "in-")), err=errno.EIO)
    keys += c.write_keys("a", range(100, 108))  # flushed: offered to b and c
    c.settle(30)
    assert fault.fired
    keys += c.write_keys("a", range(200, 208))
    c.settle(30)
    c.assert_identical(NODES, keys)
    assert c.counters("b").get("incoming_read_errors") == 1
    store = c.role("b").local[P].store
    listed = {f"seg-{e.segment_id}" for e in store.entries}
    assert not [n for n in storage.names() if n.startswith(("seg-", "in-")) and n not in listed]
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_durable_write_whose_flush_fails_is_answered_written(seed: int) -> None:
    """The 4th write reaches flush_rows and the flush in its call fails once. Its log record was fsync'd
    first, so it is durable and served: answered ``write failed``, the client took stored rows for not
    written."""
    c = Cluster([spec(*NODES)], seed=seed)
    c.settle(5)
    fault = _Once(c.role("a").local[P].store.storage, "create", lambda n: n.startswith("seg-"))
    keys = c.write_keys("a", range(4))  # only the writes answered without an error
    assert fault.fired
    assert keys == [0, 1, 2, 3]
    keys += c.write_keys("a", range(100, 104))
    c.settle(30)
    c.assert_identical(NODES, keys)
    assert c.role("a").local[P].store.memtable_rows == 0
    assert c.counters("a").get("flush_errors") == 1 and c.status("a")["failing"] == {}
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_read_error_while_merging_a_received_segment_is_answered_as_one(seed: int) -> None:
    """a merges b's fork on the heal, and its read of the received file fails once (EIO) after the file
    was checked. The ack said ``cannot write``: the sender retried, rightly, but was told of a write
    that never failed; it says ``cannot read`` now, as for a read error while the file is checked."""
    c, keys = _b_forked(seed)
    role = c.role("a")
    store = role.local[P].store
    fault = _Once(store.storage, "open", _nth_open_of_a_received_file(store, 2), err=errno.EIO)
    acks = _acks_of(role)
    _heal_b(c)
    assert fault.fired
    assert [e for e in acks if e] == [f"cannot read: {EIO}"]
    assert c.counters("a").get("incoming_read_errors") == 1
    assert c.counters("a").get("incoming_write_errors") is None
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("stage", ["check", "merge"])
def test_a_read_error_under_arrow_reading_a_received_segment_is_no_damage(seed: int, stage: str) -> None:
    """a merges b's fork on the heal, and its storage fails once (EIO) under Arrow reading a received
    file's body: its schema while the file is checked, or its rows while they are merged. Taken for a
    bad body, the segment was refused and then declined INVALID on every offer (``refused before``):
    a never held b's rows, until a restart. Answered ``cannot read`` now, the next offer is merged."""
    c, keys = _b_forked(seed)
    role = c.role("a")
    store = role.local[P].store
    nth = 1 if stage == "check" else 2
    fault = _Once(store.storage, "open", _nth_open_of_a_received_file(store, nth), err=errno.EIO, reads=True)
    acks = _acks_of(role)
    _heal_b(c)
    assert fault.fired
    assert [e for e in acks if e] == [f"cannot read: {EIO}"]
    assert c.counters("a").get("incoming_read_errors") == 1
    assert c.counters("a").get("incoming_refused") is None and not role.refused
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_read_error_under_arrow_at_start_fails_the_open_and_sets_nothing_aside(seed: int) -> None:
    """b starts again and its storage fails once (EIO) under Arrow reading its newest segment's schema
    as the store opens. Taken for a bad body, it set the whole store aside as damaged: b started empty,
    under a new epoch, and took every row from its peers again. It is an error opening the replica
    now: listed under failing, and the next tick opens the store as it is."""
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.assert_identical(NODES, keys)
    c.crash("b")
    storage = c.storages["b", P]
    epoch = read_manifest(storage)["meta"]["epoch"]
    fault = _Once(storage, "open", lambda n: n.startswith("seg-"), err=errno.EIO, reads=True)
    c.restart("b")
    c.settle(0.1)  # started, not ticked yet
    assert fault.fired
    assert c.status("b")["failing"] == {P: f"cannot open: OSError: {EIO}"}
    c.settle(10)
    status = c.status("b")
    assert status["failing"] == {} and status["damaged"] == {}
    assert status["counters"].get("open_errors") == 1 and status["counters"].get("stores_set_aside") is None
    assert not [n for n in storage.names() if n.startswith("damaged")]
    assert read_manifest(storage)["meta"]["epoch"] == epoch
    keys += c.write_keys("a", range(100, 104))
    c.settle(10)
    c.assert_identical(NODES, keys)
    assert c.quiet() and c.role_errors() == {"a": 0, "b": 1, "c": 0}  # b's: the open error
