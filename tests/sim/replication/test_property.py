"""Property on SimBus: random writes, crashes (also in the middle of a storage operation, or noticed only
by silence), restarts, cuts (with or without a disconnect notice) and so leader changes; after quiescence every replica holds exactly the acknowledged rows.

The allowance is the unit property test's: a write whose node died while handling it got no answer; its
rows may or may not survive (identically on every replica). Everything goes through the real node core,
so a crash also drops every session and stream of the node mid-transit.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparkbus.roles.replication.role import ReplicationConfig
from sparkbus.roles.replication.store import StoreConfig

from .cluster import NODES, Cluster, P, spec

CONFIG = ReplicationConfig(
    store=StoreConfig(flush_rows=3, compact_minors=2, flush_age=2.0),
    chunk_bytes=200,
    credit_bytes=600,
    retry_after=0.5,
)

node = st.sampled_from(NODES)
op = st.one_of(
    st.tuples(st.just("write"), node, st.integers(1, 3)),
    st.tuples(st.just("crash"), node, st.just(0)),
    st.tuples(st.just("crash_mid"), node, st.integers(1, 8)),
    st.tuples(st.just("restart"), node, st.just(0)),
    st.tuples(st.just("crash_silent"), node, st.just(0)),
    st.tuples(st.just("cut"), node, st.sampled_from([1, 2])),
    st.tuples(st.just("cut_silent"), node, st.sampled_from([1, 2])),
    st.tuples(st.just("heal"), node, st.sampled_from([1, 2])),
    st.tuples(st.just("run"), node, st.integers(0, 3)),
    st.tuples(st.just("step"), node, st.integers(1, 20)),
)


def play(seed: int, ops: list[tuple[str, str, int]]) -> None:
    c = Cluster([spec(*NODES)], CONFIG, seed=seed)
    acked: set[int] = set()
    unanswered: set[int] = set()
    next_key = 0
    for kind, n, arg in ops:
        other = NODES[(NODES.index(n) + arg) % 3]
        if kind == "write":
            # Write where this node believes the leader is (as a client following refusals would).
            target = c.leader(n) if c.alive(n) else None
            if target is None or not c.alive(target):
                continue
            keys = list(range(next_key, next_key + arg))
            next_key += arg
            _, error = c.write(target, P, {"key": keys, "v": [f"{target}{k}" for k in keys]})
            if error is None:
                acked.update(keys)
            elif "no answer" in error:
                unanswered.update(keys)
            c.reap_struck()
        elif kind in ("crash", "crash_silent"):  # silent: peers only notice the silence (SIGSTOP-like)
            assert not c.alive(n) or set(c.role_errors().values()) == {0}, c.role_errors()
            c.crash(n, notify=kind == "crash")
        elif kind == "crash_mid":
            for (owner, _), storage in c.storages.items():
                if owner == n and c.alive(n):
                    storage.arm_crash(arg)
        elif kind == "restart":
            c.restart(n)
        elif kind in ("cut", "cut_silent"):
            c.cut(n, other, notify=kind == "cut")
        elif kind == "heal":
            c.heal(n, other)
        elif kind == "run":
            c.run(arg)
        else:
            c.run(0.0005 * arg)  # a few deliveries: faults land mid-transit
    for storage in c.storages.values():
        storage.disarm()
    for a in NODES:
        for b in NODES:
            if a < b:
                c.heal(a, b)
    for n in NODES:
        c.restart(n)
    c.run(60)
    reads = {n: c.read(n) for n in NODES}
    got = set(reads["a"].get("key", []))
    assert acked <= got, sorted(acked - got)
    assert got <= acked | unanswered, sorted(got - acked - unanswered)
    assert reads["b"] == reads["a"] and reads["c"] == reads["a"]
    c.assert_clean()


# A silent cut shorter than the heartbeat interval lost the last chunks of a transfer, and no control
# message: no sequence showed a gap, and sender and receiver waited for each other for ever (bus/core.py,
# HEARTBEAT's count of data batches, now finds the loss).
_SEVEN_WRITES: list[Any] = [("write", "a", 1)] * 7


# A crash or cut noticed at once makes the peers handle the disconnect inside ``SimBus.crash``/``cut``; a
# peer whose armed storage crash struck there was left running (the harness reaped only while running the
# clock), went on handling events with a dead storage and counted role errors, or was reaped at the start
# of the final run and never restarted (SimTimeout on the final read). ``Cluster`` now reaps after both.
_STRUCK_ON_PEER_CRASH: list[Any] = [("crash", "c", 0), ("crash", "c", 0), ("write", "a", 1)]
_STRUCK_ON_PEER_CRASH += [("crash_mid", "a", 1), *[("crash", "c", 0)] * 3, ("run", "a", 2)]
_STRUCK_ON_CUT: list[Any] = [("restart", "b", 0), ("cut", "b", 1), ("crash_mid", "a", 8)]
_STRUCK_ON_CUT += [("cut_silent", "a", 1), ("write", "a", 2), ("run", "a", 2), ("cut_silent", "b", 1)]
_STRUCK_ON_CUT += [
    ("restart", "b", 0),
    ("step", "c", 15),
    ("heal", "b", 2),
    ("step", "b", 8),
    ("cut", "a", 2),
]

# After every node restarted, a and b waited at start for peers their stores knew while c (whose store knew
# none) led alone: a took c for the leader and c took a, each fast-forwarded the other's pushed major and
# deleted its own fork as merged, and a, leading next, had lost acknowledged 0, 1 and 2. A replica that
# waits at start now pushes and deletes nothing.
_CROSSED_AT_START: list[Any] = [("crash", "a", 0), ("restart", "a", 0), ("write", "a", 1), ("write", "a", 1)]
_CROSSED_AT_START += [("run", "a", 1), ("write", "a", 1), ("crash_mid", "a", 1), ("write", "a", 1)]
_CROSSED_AT_START += [("crash", "b", 0), ("write", "c", 1)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), ops=st.lists(op, min_size=10, max_size=40))
@example(seed=0, ops=[("restart", "a", 0), *_SEVEN_WRITES, ("step", "a", 4), ("cut_silent", "a", 1)])
@example(seed=1, ops=[*_SEVEN_WRITES, ("crash", "b", 0), ("step", "a", 1), ("cut_silent", "c", 1)])
@example(seed=0, ops=[*_STRUCK_ON_PEER_CRASH, ("crash", "b", 0), ("crash", "b", 0)])
@example(seed=0, ops=[*_STRUCK_ON_PEER_CRASH, ("crash", "b", 0), ("crash", "a", 0)])
@example(seed=27473, ops=_STRUCK_ON_CUT)
@example(seed=0, ops=_CROSSED_AT_START)
def test_every_replica_holds_exactly_the_acknowledged_rows(
    seed: int, ops: list[tuple[str, str, int]]
) -> None:
    play(seed, ops)


@pytest.mark.parametrize("seed", range(4))
def test_fixed_seeds(seed: int) -> None:
    ops: list[Any] = [("write", "a", 3), ("write", "a", 3), ("step", "a", 7), ("crash_mid", "b", 2 + seed)]
    ops += [("write", "a", 2), ("run", "a", 2), ("crash", "a", 0), ("write", "b", 3), ("run", "a", 3)]
    ops += [("restart", "a", 0), ("cut", "a", 1), ("write", "a", 2), ("write", "b", 2), ("run", "a", 2)]
    play(seed, ops)


@pytest.mark.parametrize("notify", ["crash", "cut"])
def test_a_node_struck_while_handling_a_disconnect_dies_there(notify: str) -> None:
    """The leader's storage crashes in the flush it starts on a peer's disconnect notice: the node is dead
    from then on (never a live node with role errors), and after restarts no acknowledged row is lost."""
    c = Cluster([spec(*NODES)], CONFIG, seed=0)
    assert c.leader("a") == "a"
    _, error = c.write("a", P, {"key": [0], "v": ["a0"]})
    assert error is None
    # Up to the moment the row is old enough to flush, with the flush not yet done: the next event the
    # role handles flushes.
    store = c.role("a").local[P].store
    c.sim.run_until(lambda: store.should_flush(c.sim.now), limit=10)
    armed = [storage for (owner, _), storage in c.storages.items() if owner == "a"]
    for storage in armed:
        storage.arm_crash(1)
    if notify == "crash":
        c.crash("b")
    else:
        c.cut("a", "b")
    assert any(storage.struck for storage in armed)
    assert not c.alive("a")
    assert set(c.role_errors().values()) == {0}, c.role_errors()
    for n in NODES:
        c.restart(n)
    c.heal("a", "b")
    c.run(30)
    for n in NODES:
        assert c.read(n).get("key") == [0], n
    c.assert_clean()
