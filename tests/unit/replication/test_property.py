"""Random writes, crashes (also in the middle of storage operations), restarts, cuts and leader changes;
after quiescence every replica holds exactly the acknowledged rows.

One allowance: a write whose node crashed while handling it got no answer, acknowledgement or refusal;
its rows may or may not survive (they were durable before the crash if the crash came after the log
fsync), as in any database. Every replica then holds the acknowledged rows plus, identically, some of
those unanswered ones, and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparkbus.roles.replication.layout import PartitionSpec, Replica
from sparkbus.roles.replication.role import ReplicationConfig
from sparkbus.roles.replication.store import StoreConfig

from .harness import Cluster

P = "t/0"
NODES = ["a", "b", "c"]
SPEC = PartitionSpec(
    partition=P, replicas=tuple(Replica(node=n, placement=i + 1) for i, n in enumerate(NODES))
)
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
    st.tuples(st.just("cut"), node, st.sampled_from([1, 2])),
    st.tuples(st.just("heal"), node, st.sampled_from([1, 2])),
    st.tuples(st.just("run"), node, st.integers(0, 3)),
    st.tuples(st.just("step"), node, st.integers(1, 20)),
)


def leader_in_view(c: Cluster, n: str) -> str | None:
    return c.leader(n, P) if n in c.up else None


def play(seed: int, ops: list[tuple[str, str, int]]) -> None:
    c = Cluster(NODES, [SPEC], CONFIG, seed=seed)
    acked: set[int] = set()
    unanswered: set[int] = set()
    next_key = 0
    for kind, n, arg in ops:
        other = NODES[(NODES.index(n) + arg) % 3]
        if kind == "write":
            # Write wherever this node believes the leader is (as a client following refusals would).
            target = leader_in_view(c, n) if n in c.up else None
            if target is None or target not in c.up:
                continue
            keys = list(range(next_key, next_key + arg))
            next_key += arg
            reply = c.write(target, P, {"key": keys, "v": [f"{target}{k}" for k in keys]})
            if reply.error is None:
                acked.update(keys)
            elif "crashed" in reply.error:
                unanswered.update(keys)
        elif kind == "crash":
            c.crash(n)
        elif kind == "crash_mid":
            for (owner, _), storage in c.storages.items():
                if owner == n and n in c.up:
                    storage.arm_crash(arg)
        elif kind == "restart":
            c.restart(n)
        elif kind == "cut":
            c.cut(n, other)
        elif kind == "heal":
            c.heal(n, other)
        elif kind == "run":
            c.run(c.now + arg)
        else:
            for _ in range(arg):
                c.step()
    for storage in c.storages.values():
        storage.disarm()
    for a in NODES:
        for b in NODES:
            if a < b:
                c.heal(a, b)
    for n in NODES:
        c.restart(n)
    c.settle(60)
    reads = {n: c.read(n, P) for n in NODES}
    got = set(reads["a"].get("key", []))
    assert acked <= got, sorted(acked - got)
    assert got <= acked | unanswered, sorted(got - acked - unanswered)
    assert reads["b"] == reads["a"] and reads["c"] == reads["a"]


# A node that crashes while it handles the PeerUp of a heal (here: b, leader of its own side of a cut, whose
# flush on losing leadership hits an armed storage crash) must not leave its peer believing it is up.
CRASH_IN_A_HEAL: list[tuple[str, str, int]] = [
    ("write", "a", 1),
    ("cut", "a", 1),
    ("write", "a", 1),
    ("write", "a", 1),
    ("write", "b", 1),
    ("crash_mid", "b", 1),
    ("heal", "b", 2),
]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), ops=st.lists(op, min_size=10, max_size=60))
@example(seed=0, ops=CRASH_IN_A_HEAL)
def test_every_replica_holds_exactly_the_acknowledged_rows(
    seed: int, ops: list[tuple[str, str, int]]
) -> None:
    play(seed, ops)


@pytest.mark.parametrize("seed", range(5))
def test_fixed_seeds(seed: int) -> None:
    ops: list[Any] = [("write", "a", 3), ("write", "a", 3), ("step", "a", 7), ("crash_mid", "b", 2 + seed)]
    ops += [("write", "a", 2), ("run", "a", 2), ("crash", "a", 0), ("write", "b", 3), ("run", "a", 3)]
    ops += [("restart", "a", 0), ("cut", "a", 1), ("write", "a", 2), ("write", "b", 2), ("run", "a", 2)]
    play(seed, ops)


def test_a_crash_while_handling_the_peer_up_of_a_heal_does_not_wedge_the_leader() -> None:
    """Found by the property test: b crashed in the flush its PeerUp from a triggered, and the harness still
    told a that b was up, then told it again when b restarted. a's offer to the dead b was dropped and
    never answered, so a offered b nothing after the restart and b kept only its own fork."""
    play(0, CRASH_IN_A_HEAL)
