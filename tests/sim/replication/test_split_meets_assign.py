"""An ``assign`` that removes a split's leader before its finalize arrived (spec 3.6 meets 3.8).

A node takes a finalize only from a replica of the partition. The leader of an async split sends
SPLIT_FINALIZE at once; an ``assign`` that reached the other nodes first made it a stranger to them,
so they refused its finalize: the source's replicas kept serving, and the target stayed in LOAD for good
with only the rows the removed leader drained into it. A node now also takes the finalize from a node an
``assign`` removed from the partition (kept in its replica's manifest), or from a node whose store its own
store heard (the finalize names the sender's store: a node restarted with the new layout never saw the
assign), and a draining replica in UNLOAD tells every node of the split, again each tick, until a current
replica of the partition answers that it knows of the split; only then is it dropped.
"""

from __future__ import annotations

import pytest

from sparkbus.roles.replication.layout import Lifecycle, PartitionSpec, SplitTarget

from .cluster import Cluster, P, spec

SEEDS = [1, 2, 3]
T = "t/1"
TARGET = spec("c", partition=T, first_placement=21, lifecycle=Lifecycle.LOAD)


def _cluster(seed: int) -> tuple[Cluster, list[int]]:
    """P on a, b (a leads), written and replicated; the split target T on c, in LOAD."""
    c = Cluster([spec("a", "b"), TARGET], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    keys += c.write_keys("a", range(50, 52))  # acknowledged, in a's log only
    return c, keys


def _lifecycle(c: Cluster, node: str, partition: str = P) -> str:
    lifecycle: str = c.status(node)["partitions"][partition]["lifecycle"]
    return lifecycle


def _assert_split_done(c: Cluster, keys: list[int]) -> None:
    assert _lifecycle(c, "c", T) == "SERVE"
    assert sorted(c.read("c", T)["key"]) == sorted(keys)
    assert _lifecycle(c, "b") == "UNLOAD_FINAL"
    assert c.status("a")["draining"] == {}, "a holds no row of P any more"
    c.assert_clean()


def _move_p_to_b(c: Cluster, nodes: tuple[str, ...], new: PartitionSpec | None = None) -> None:
    new = new or spec("b", first_placement=2)
    for n in nodes:
        c.call(n, "assign", spec=new)
    c.specs = [new, TARGET]  # the topology places P on b alone from now on


def _split_while_b_and_c_are_down(c: Cluster, new: PartitionSpec | None = None, *, told: bool = True) -> None:
    """a splits P, async, with b and c down, then is unassigned: it drains into the target, which is
    down. With ``told``, b and c had the assign before they went down."""
    if told:
        _move_p_to_b(c, ("b", "c"), new)
    c.crash("b")  # restarted from its manifest, which keeps that a was a replica of P
    c.crash("c")  # restarted knowing nothing of a: it hears the split from b
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(2)
    _move_p_to_b(c, ("a",), new)
    c.settle(2)
    assert c.status("a")["draining"], "a drains into the target, which is down"


def _restart(c: Cluster, first: str, second: str) -> None:
    c.restart(first)
    c.settle(5)
    c.restart(second)
    c.settle(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_finalize_of_a_leader_an_assign_removed_still_splits_the_partition(seed: int) -> None:
    c, keys = _cluster(seed)
    _move_p_to_b(c, ("b", "c"))  # a has not heard of it yet and still leads
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(2)
    _move_p_to_b(c, ("a",))  # a drains its rows, in UNLOAD, into the target
    c.settle(60)
    _assert_split_done(c, keys)
    assert "finalize_refused" not in c.counters("b") and "finalize_refused" not in c.counters("c")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("order", [("b", "c"), ("c", "b")])
def test_replicas_down_when_the_removed_leader_finalized_hear_it_from_its_drain(
    seed: int, order: tuple[str, str]
) -> None:
    """c refuses a's finalize (a restarted node has forgotten a); b takes it and relays it to c, or
    repeats it when c comes up after it."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c)
    _restart(c, *order)
    _assert_split_done(c, keys)
    assert c.counters("a").get("drains_done") == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_finalize_lost_when_its_receiver_crashes_is_told_again(seed: int) -> None:
    """A finalize sent is not a finalize taken: a drops its drain only on a replica's answer."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c)
    c.restart("b")
    since = c.role("a").draining[P].told_at
    c.sim.run_until(lambda: c.role("a").draining[P].told_at > since, limit=10)
    c.crash("b")  # a's finalize to b is lost with it
    _restart(c, "b", "c")
    _assert_split_done(c, keys)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_replica_the_assign_re_placed_keeps_the_removed_leader_across_a_restart(seed: int) -> None:
    """The new placement's manifest keeps the removed nodes too, not only the old placement's."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c, spec("b", first_placement=5))
    _restart(c, "b", "c")
    _assert_split_done(c, keys)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_drain_ends_once_a_replica_knows_of_the_split_though_another_is_down(seed: int) -> None:
    """P moves to b and d, and d stays down: b knows of the split and tells d when it comes up."""
    c = Cluster([spec("a", "b"), TARGET], seed=seed, nodes=("a", "b", "c", "d"))
    keys = c.write_keys("a", range(8))
    c.settle(10)
    keys += c.write_keys("a", range(50, 52))
    c.crash("d")
    new = spec("b", "d", first_placement=2)
    for n in ("b", "c"):
        c.call(n, "assign", spec=new)
    c.crash("c")  # the target: a cannot finish its unload before it is unassigned
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(2)
    c.call("a", "assign", spec=new)
    c.specs = [new, TARGET]
    c.settle(2)
    assert c.status("a")["draining"]
    c.restart("c")
    c.settle(60)
    _assert_split_done(c, keys)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("order", [("b", "c"), ("c", "b")])
def test_a_replica_restarted_with_the_new_layout_takes_the_finalize_naming_a_store_it_heard(
    seed: int, order: tuple[str, str]
) -> None:
    """b and c were down during the assign: restarted with the new layout, they never knew a as a
    replica. b's store heard a's hello before, and a's finalize names a's store, so b takes it."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c, told=False)
    _restart(c, *order)
    _assert_split_done(c, keys)
    assert c.counters("a").get("drains_done") == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_drainer_that_restarts_resumes_its_drain_and_its_finalize(seed: int) -> None:
    """a alone knows of the split when it is killed mid-drain; restarted with a layout that does not
    place it on P, it drains its files again and tells b and c of the split."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c)
    c.crash("a")
    c.restart("a")
    assert c.status("a")["draining"], "a resumed its drain from its files"
    _restart(c, "b", "c")
    _assert_split_done(c, keys)
    assert c.counters("a").get("drains_resumed") == 1 and c.counters("a").get("drains_done") == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_drainer_nobody_takes_the_split_from_keeps_its_rows_and_tells_again(seed: int) -> None:
    """b was down during the assign and lost its disk: its new store never heard of a, so it refuses
    a's finalize. The split does not finish by itself then, but a keeps its drain and its rows, tells
    them again each tick, and says so in its status; the operator finishes it by splitting P again,
    with the same targets, on its leader (docs/REPLICATION.md)."""
    c, keys = _cluster(seed)
    _split_while_b_and_c_are_down(c, told=False)
    c.lose_disk("b")
    c.restart("c")
    c.settle(30)
    draining = c.status("a")["draining"][P]
    assert draining["lifecycle"] == "UNLOAD" and not draining["split_known"], "a keeps what it alone holds"
    assert c.counters("b").get("finalize_refused", 0) > 10
    assert _lifecycle(c, "b") == "SERVE" and _lifecycle(c, "c", T) == "LOAD"
    c.call("b", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(30)
    _assert_split_done(c, keys)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("u_on_a", [False, True], ids=["u-on-c", "u-on-c-and-a"])
def test_a_stale_finalize_of_another_split_does_not_re_route_a_split_made_since(
    seed: int, u_on_a: bool
) -> None:
    """a splits P into T and is removed while b and c are down; b and c restart with the new layout, cut
    off from a, and P is split into U on b. Then a's finalize of P into T reaches b, which heard a's
    store: taken, it re-routed b's split to T (U then lacked a's rows, and once c restarted T and U
    both served P's range). b refuses it: a keeps its rows and says where they go. With a replica of U
    on a, b's finalize reaches a too: a refuses it (its split is in its manifest, not its spec); taken,
    it ended a's drain with a's rows in T only, served nowhere."""
    u = "t/2"
    target_u = spec("c", *("a",) * u_on_a, partition=u, first_placement=31, lifecycle=Lifecycle.LOAD)
    c = Cluster([spec("a", "b"), TARGET, target_u], seed=seed)
    c.write_keys("a", range(8))
    c.settle(10)
    c.write_keys("a", range(50, 52))
    c.crash("b")
    c.crash("c")
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),), async_split=True)
    c.settle(2)
    new = spec("b", first_placement=2)
    c.call("a", "assign", spec=new)
    c.specs = [new, TARGET, target_u]
    c.cut("a", "b")
    c.cut("a", "c")
    _restart(c, "b", "c")
    c.call("b", "split", partition=P, targets=(SplitTarget(partition=u),), async_split=True)
    c.settle(5)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(30)
    c.crash("c")
    c.restart("c")
    c.settle(20)
    assert c.role("b").local[P].spec.split_targets == (SplitTarget(partition=u),)
    assert c.counters("b").get("finalize_refused", 0) > 0
    assert _lifecycle(c, "c", u) == "SERVE" and _lifecycle(c, "c", T) == "LOAD", "one split of P serves"
    draining = c.status("a")["draining"][P]
    assert not draining["split_known"] and draining["split_targets"] == [[T, None, None]]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_split_made_again_with_the_same_targets_in_another_order_ends_the_drain(seed: int) -> None:
    """Targets are a set: the same split, its targets named in another order, is the same split."""
    low, high = SplitTarget(partition=T, high=4), SplitTarget(partition="t/3", low=4)
    t3 = spec("c", partition="t/3", first_placement=41, lifecycle=Lifecycle.LOAD)
    c = Cluster([spec("a", "b"), TARGET, t3], seed=seed)
    keys = c.write_keys("a", range(8))
    c.settle(10)
    keys += c.write_keys("a", range(50, 52))
    c.crash("b")
    c.crash("c")
    c.call("a", "split", partition=P, targets=(low, high), async_split=True)
    c.settle(2)
    new = spec("b", first_placement=2)
    c.call("a", "assign", spec=new)
    c.specs = [new, TARGET, t3]
    c.lose_disk("b")
    c.restart("c")
    c.settle(30)
    c.call("b", "split", partition=P, targets=(high, low), async_split=True)
    c.settle(40)
    assert c.status("a")["draining"] == {}
    assert sorted(c.read("c", T)["key"] + c.read("c", "t/3")["key"]) == sorted(keys)


def test_two_unloaded_replicas_that_take_each_other_for_strangers_answer_once_a_tick() -> None:
    """Layouts that disagree (a topology mistake): a's places P on a alone, b's on b alone, both split
    already. Each answers the other's finalize with its own, which the other refuses and answers:
    that went on without end, about 400 messages a simulated second each way."""
    target = spec("c", "b", partition=T, first_placement=21, lifecycle=Lifecycle.LOAD)
    c = Cluster([spec("a", "b"), target], seed=1)
    c.write_keys("a", range(8))
    c.settle(10)
    c.call("a", "split", partition=P, targets=(SplitTarget(partition=T),))
    c.settle(30)
    c.crash("a")
    c.crash("b")
    c.specs = [spec("a"), target]
    c.restart("a")
    c.specs = [spec("b", first_placement=2), target]
    c.restart("b")
    before = {n: c.sim.node(n).core.counters["messages_in"] for n in ("a", "b")}
    c.settle(5)
    received = {n: c.sim.node(n).core.counters["messages_in"] - before[n] for n in ("a", "b")}
    assert all(got < 100 for got in received.values()), received
