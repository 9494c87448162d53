"""Every decline reason of the receive procedure (spec 3.5) reached through the bus: the offer, the
decline and what the sender does next travel between real node cores, and the cluster still converges."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkbus.roles.replication.layout import Lifecycle, SplitTarget

from .cluster import NODES, Cluster, P, config, spec

SEEDS = [1, 2, 3]


def declined(c: Cluster, sender: str, receiver: str, reason: str) -> None:
    assert c.counters(receiver).get(f"sent_decline_{reason}", 0) > 0, c.counters(receiver)
    assert c.counters(sender).get(f"declined_{reason}", 0) > 0, c.counters(sender)


@pytest.mark.parametrize("seed", SEEDS)
def test_segment_exists_from_a_new_leader(seed: int) -> None:
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(12))
    c.settle(10)
    c.crash("a")  # b leads; c pushes the segments b has not acked, and b already references them
    c.settle(10)
    declined(c, "c", "b", "SEGMENT_EXISTS")
    keys += c.write_keys("b", range(50, 55))
    c.restart("a")
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_overloaded_at_max_incoming(seed: int) -> None:
    q = "t/9"
    c = Cluster(
        [spec(*NODES), spec(*NODES, partition=q, first_placement=11)],
        seed=seed,
        configs={"b": replace(config(), max_incoming=1)},
    )
    keys = c.write_keys("a", range(4))  # a flush in each partition: two offers to b at once
    keys_q = c.write_keys("a", range(4), partition=q)
    c.settle(20)
    declined(c, "a", "b", "OVERLOADED")
    c.assert_identical(NODES, keys)
    c.assert_identical(NODES, keys_q, partition=q)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_inflight_when_two_split_targets_on_one_node_get_the_same_segment(seed: int) -> None:
    # Both targets are led by b, and a split keeps segment ids: a offers the same id for each target at
    # once, and b declines the second while the first is incoming.
    low, high = "t/1", "t/2"
    specs = [
        spec(*NODES),
        spec("b", "a", partition=low, first_placement=21, lifecycle=Lifecycle.LOAD),
        spec("b", "c", partition=high, first_placement=31, lifecycle=Lifecycle.LOAD),
    ]
    c = Cluster(specs, seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.call(
        "a",
        "split",
        partition=P,
        targets=(SplitTarget(partition=low, high=4), SplitTarget(partition=high, low=4)),
    )
    c.settle(30)
    declined(c, "a", "b", "INFLIGHT")
    c.assert_identical(["b", "a"], [k for k in keys if k < 4], partition=low)
    c.assert_identical(["b", "c"], [k for k in keys if k >= 4], partition=high)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_invalid_when_views_of_the_leader_differ(seed: int) -> None:
    # Only a-c is cut: c's view names b leader, b's names a. c pushes its segments to b, which is a
    # follower and declines an offer from a non-leader.
    c = Cluster([spec(*NODES)], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "c")
    assert c.leader("c") == "b" and c.leader("b") == "a"
    c.settle(5)
    declined(c, "c", "b", "INVALID")
    c.heal("a", "c")
    keys += c.write_keys("a", range(20, 28))
    c.settle(30)
    c.assert_identical(NODES, keys)
    c.assert_clean()


# Whether a's stale minor reaches b before a learns of c's major depends on the schedule: with seeds 2, 3, 7
# and 18 of 1 to 20 a learns first and never offers it (the cluster converges all the same). These seeds
# reach the decline under the current bus; a change in the number of control messages (the credit grant
# rule) moves every schedule, and may call for others.
OUT_OF_ORDER_SEEDS = [1, 4, 5]


@pytest.mark.parametrize("seed", OUT_OF_ORDER_SEEDS)
def test_out_of_order_for_a_stale_minor(seed: int) -> None:
    # b holds c's major (c led while a was cut off); a's next minor is based on a segment b dropped.
    c = Cluster([spec("a", "c", "b")], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    c.cut("a", "b")
    c.cut("a", "c")
    keys += c.write_keys("c", range(300, 316), "c")
    keys += c.write_keys("a", range(100, 104), "a")
    c.settle(10)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(40)
    declined(c, "a", "b", "OUT_OF_ORDER")
    c.assert_identical(NODES, keys)
    c.assert_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_segment_that_cannot_join_the_partition_is_refused_not_left_waiting(seed: int) -> None:
    """Two leaders of a new partition during a cut write rows of different schemas.

    When the cut heals, each side's segments reach the other: the leader's merge of b's segment raised
    inside the completion and the transfer got no ack, so its sender waited for ever; a follower
    fast-forwarding the leader's major took a segment its schema could not read. Both are refused now:
    an error ack, then INVALID for the same offer, and each side keeps its acknowledged rows.
    """
    c = Cluster([spec(*NODES)], seed=seed)
    c.cut("a", "b")
    c.cut("a", "c")
    assert c.write("a", P, {"key": [1, 2, 3, 4], "v": ["w", "x", "y", "z"]})[1] is None
    assert c.write("b", P, {"key": [5, 6, 7, 8], "n": [1.0, 2.0, 3.0, 4.0]})[1] is None
    c.settle(10)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(60)
    assert set(c.role_errors().values()) == {0}, c.role_errors()
    assert c.write("a", P, {"key": [9], "v": ["q"]})[1] is None
    c.settle(10)
    assert c.read("a") == {"key": [1, 2, 3, 4, 9], "v": ["w", "x", "y", "z", "q"]}
    for n in "bc":
        assert c.read(n) == {"key": [5, 6, 7, 8], "n": [1.0, 2.0, 3.0, 4.0]}, n
        assert c.counters(n).get("incoming_refused", 0) >= 1, n  # a's major: another schema
    counters = c.counters("a")
    assert 1 <= counters.get("incoming_refused", 0) <= 2, counters  # b's segment, once per sender
    declined(c, "b", "a", "INVALID")  # offered again: declined without travelling
    for role in c.live_roles().values():  # no transfer waits for an answer that never comes
        assert not role.incoming
        assert all(o.state.name == "OFFERED" for o in role.outgoing.values())
