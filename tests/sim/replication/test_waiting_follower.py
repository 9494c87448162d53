"""Two replicas that each follow the other: opened at start, each waits for a peer that is up but not
heard yet (its hello lost on a silent cut), and so takes the other for the leader. Each pushes its own
fork to the other, which fast-forwards it (its leader's major) and acks; each then deleted its own fork,
acked and no longer referenced, as merged by the leader: the rows each had acknowledged survived only on
the other, and the one that led next had lost them for good."""

from __future__ import annotations

import pytest

from .cluster import NODES, Cluster, P, spec
from .test_property import CONFIG


@pytest.mark.parametrize("seed", [3, 5, 7])
def test_replicas_that_each_follow_the_other_keep_their_acknowledged_rows(seed: int) -> None:
    c = Cluster([spec(*NODES)], CONFIG, seed=seed)
    c.run(2)
    c.cut("a", "b")
    c.cut("a", "c")
    c.run(1)
    assert (c.leader("a"), c.leader("b")) == ("a", "b")  # two sides, each with its leader
    acked = [k for k in (0, 1, 2) if c.write("a", P, {"key": [k], "v": [f"a{k}"]})[1] is None]
    acked += [k for k in (10, 11, 12) if c.write("b", P, {"key": [k], "v": [f"b{k}"]})[1] is None]
    assert acked == [0, 1, 2, 10, 11, 12]
    c.run(1)  # each side flushed its rows as a major segment of its own
    for n in NODES:
        c.crash(n)
    c.heal("a", "b")
    c.heal("a", "c")
    for n in NODES:
        c.restart(n)
    c.sim.run_until(lambda: "c" in c.role("a").live and "c" in c.role("b").live, limit=5)
    c.cut("c", "a", notify=False)  # c's hellos are lost: a and b wait for it, each following the other
    c.cut("c", "b", notify=False)
    c.run(1.45)
    c.heal("c", "a")
    c.heal("c", "b")
    c.run(60)
    for n in NODES:
        assert c.read(n).get("key") == acked, n
    c.assert_clean()
