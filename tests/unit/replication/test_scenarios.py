"""Scenarios of spec sections 3.3-3.8 over the in-memory harness, with fixed seeds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.contract import PeerUp
from sparkbus.roles.replication.layout import Lifecycle, PartitionSpec, Replica, SplitTarget
from sparkbus.roles.replication.role import ReplicationConfig
from sparkbus.roles.replication.storage import FileWriter, Tap
from sparkbus.roles.replication.store import StoreConfig, segment_file

from .harness import Cluster

P = "t/0"
NODES = ["a", "b", "c"]


def spec(*nodes: str, partition: str = P, first_placement: int = 1, **kw: Any) -> PartitionSpec:
    replicas = tuple(Replica(node=n, placement=first_placement + i) for i, n in enumerate(nodes))
    return PartitionSpec(partition=partition, replicas=replicas, **kw)


def config(**store: Any) -> ReplicationConfig:
    base: dict[str, Any] = {"flush_rows": 4, "compact_minors": 3, "flush_age": 5.0}
    base.update(store)
    return ReplicationConfig(store=StoreConfig(**base), chunk_bytes=300, credit_bytes=900, retry_after=0.5)


def write_keys(c: Cluster, node: str, keys: range, tag: str = "v", partition: str = P) -> list[int]:
    acked = []
    for k in keys:
        r = c.write(node, partition, {"key": [k], "v": [f"{tag}{k}"]})
        if r.error is None:
            acked.append(k)
    return acked


def assert_identical(c: Cluster, nodes: list[str], keys: list[int], partition: str = P) -> None:
    first = c.read(nodes[0], partition)
    assert sorted(first["key"]) == sorted(keys)
    for n in nodes[1:]:
        assert c.read(n, partition) == first, n


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_crashed_leaders_unreplicated_write_and_a_later_one_resolve_alike_everywhere(seed: int) -> None:
    # a's write of key 7 (version 11, in its log only) and b's later one (version 9, b never saw a's)
    # are concurrent in Lamport order: (lsn, origin) decides, alike on every replica (docs/REPLICATION.md).
    c = Cluster(NODES, [spec(*NODES)], config(), seed=seed)
    write_keys(c, "a", range(8), "old")
    c.settle(10)
    write_keys(c, "a", range(20, 22), "a")
    assert c.write("a", P, {"key": [7], "v": ["first, on a"]}).error is None
    c.crash("a")
    c.settle(5)
    assert c.write("b", P, {"key": [7], "v": ["second, on b"]}).error is None
    c.settle(10)
    c.restart("a")
    c.settle(60)
    for n in NODES:
        rows = c.read(n, P)
        assert dict(zip(rows["key"], rows["v"], strict=True))[7] == "first, on a", n


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_followers_fast_forward_in_steady_state(seed: int) -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=seed)
    keys = write_keys(c, "a", range(40))
    c.settle(20)
    assert_identical(c, NODES, keys)
    for n in "bc":
        counters = c.status(n)["counters"]
        assert counters.get("fast_forwards", 0) > 0
        assert counters.get("merges", 0) == 0
    assert c.status("a")["counters"].get("merges", 0) == 0


def test_the_receiver_announces_the_offered_size_to_its_storage() -> None:
    c = Cluster(NODES, [spec(*NODES)], config())
    announced: list[tuple[str, int]] = []
    for n in "bc":
        st = c.storages[n, P]
        create = st.create_in_place

        def spy(name: str, tap: Tap | None = None, size: int = 0, create: Any = create) -> FileWriter:
            announced.append((name, size))
            return create(name, tap, size)

        st.create_in_place = spy  # type: ignore[method-assign]
    keys = write_keys(c, "a", range(12))
    c.settle(20)
    assert_identical(c, NODES, keys)
    sizes = {segment_file(e.segment_id): e.size for e in c.role("a").local[P].store.entries}
    assert announced and all(size == sizes[name] > 0 for name, size in announced if name in sizes)
    assert {name for name, _ in announced} >= set(sizes), "every segment of the leader was received"


def test_a_write_to_a_follower_is_refused_with_the_leaders_name() -> None:
    c = Cluster(NODES, [spec(*NODES)], config())
    r = c.write("b", P, {"key": [1], "v": ["x"]})
    assert r.error is not None and "leader: a" in r.error
    assert r.result == {"leader": "a"}


def test_bad_rows_are_refused_and_change_nothing() -> None:
    c = Cluster(NODES, [spec(*NODES)], config())
    assert c.write("a", P, {"key": [1], "v": ["x"]}).error is None
    assert "schema" in (c.write("a", P, {"key": [2], "w": [1.5]}).error or "")
    nulls = pa.RecordBatch.from_pydict({"key": pa.array([None], pa.int64()), "v": pa.array(["y"])})
    assert "nulls" in (c.write("a", P, nulls).error or "")
    assert "key column" in (c.write("a", P, {"id": [3], "v": ["z"]}).error or "")
    assert c.call("a", "write", partition=P, rows=b"junk").error is not None
    assert c.read("a", P)["key"] == [1]


@pytest.mark.parametrize("seed", [4, 5])
def test_two_leaders_fork_the_chain_and_merges_repair_it(seed: int) -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=seed)
    keys = write_keys(c, "a", range(10))
    c.settle(10)
    # a is cut off from b and c: b (first live in their view) leads there, a still leads on its side.
    c.cut("a", "b")
    c.cut("a", "c")
    assert c.leader("a", P) == "a" and c.leader("b", P) == "b"
    keys += write_keys(c, "a", range(100, 112), "a")
    keys += write_keys(c, "b", range(200, 212), "b")
    c.settle(10)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(30)
    assert c.leader("b", P) == "a"
    assert_identical(c, NODES, keys)
    assert c.status("a")["counters"].get("merges", 0) > 0


def test_a_new_leader_answers_segment_exists_for_what_it_has() -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=6)
    keys = write_keys(c, "a", range(12))
    c.settle(10)
    c.crash("a")
    c.settle(10)
    assert c.leader("c", P) == "b"
    assert c.status("c")["counters"].get("declined_SEGMENT_EXISTS", 0) > 0
    keys += write_keys(c, "b", range(50, 55))
    c.settle(10)
    c.restart("a")
    c.settle(30)
    assert_identical(c, NODES, keys)


def test_a_follower_offline_through_several_compactions_catches_up() -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=7)
    keys = write_keys(c, "a", range(8))
    c.settle(10)
    c.crash("c")
    for round_ in range(4):
        keys += write_keys(c, "a", range(100 * (round_ + 1), 100 * (round_ + 1) + 12))
        c.settle(10)
    assert c.status("a")["counters"].get("compactions", 0) >= 2
    c.restart("c")
    c.settle(30)
    assert_identical(c, NODES, keys)
    status = c.status("c")["partitions"][P]
    assert status["segments"][0][2], "c restarted from the leader's major segment"
    assert len(status["segments"]) <= 4, "old segments were deleted once a major included them"


def test_aba_stale_minor_after_another_major_is_out_of_order() -> None:
    # Spec 3.6, first case: b gets a's major and minor, then c's major, then a's minor based on a's
    # previous minor. b declines OUT_OF_ORDER; a forgets b's acks and restarts from its major.
    c = Cluster(NODES, [spec("a", "c", "b")], config(), seed=8)
    keys = write_keys(c, "a", range(8))
    c.settle(10)
    c.cut("a", "b")
    c.cut("a", "c")
    assert c.leader("b", P) == "c"
    keys += write_keys(c, "c", range(300, 316), "c")  # c flushes and compacts: b fast-forwards c's major
    c.settle(10)
    keys += write_keys(c, "a", range(100, 104), "a")  # a's minor, based on the minor b acked
    c.settle(10)
    c.heal("a", "b")
    c.heal("a", "c")
    c.settle(40)
    assert c.status("b")["counters"].get("sent_decline_OUT_OF_ORDER", 0) > 0
    assert c.status("a")["counters"].get("declined_OUT_OF_ORDER", 0) > 0
    assert_identical(c, NODES, keys)


def test_aba_reassigned_leader_gets_a_new_placement_and_loses_nothing() -> None:
    # Spec 3.6, second case: a leads, is unassigned, b leads, a is re-assigned (empty) and leads again.
    # The followers' acked lists name a's old placement, so they push everything to the new one.
    c = Cluster(NODES, [spec(*NODES)], config(), seed=9)
    keys = write_keys(c, "a", range(10))
    c.settle(10)
    without_a = spec("b", "c", first_placement=2)
    for n in NODES:
        assert c.call(n, "assign", spec=without_a).error is None
    c.settle(5)
    keys += write_keys(c, "b", range(50, 56), "b")
    c.settle(10)
    again = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=11), *without_a.replicas))
    for n in NODES:
        assert c.call(n, "assign", spec=again).error is None
    assert c.leader("b", P) == "a"
    c.settle(40)
    assert_identical(c, NODES, keys)
    acked = {p for s in c.status("b")["partitions"][P]["segments"] for p in s[3]}
    assert 11 in acked and 1 not in acked


def test_a_joining_replica_is_never_leader_and_is_finalized() -> None:
    joining = PartitionSpec(
        partition=P,
        replicas=(
            Replica(node="c", placement=3, joining=True),
            Replica(node="a", placement=1),
            Replica(node="b", placement=2),
        ),
    )
    c = Cluster(NODES, [joining], config(), seed=10)
    assert c.leader("c", P) == "a"
    keys = write_keys(c, "a", range(10))
    c.settle(20)
    assert_identical(c, NODES, keys)
    for n in NODES:
        assert not c.role(n).layout.partitions[P].replicas[0].joining, n
    assert c.status("a")["counters"].get("joins_finalized") == 1
    # Finalized, c is first in placement order: it is now eligible and leads.
    assert c.leader("b", P) == "c"


@pytest.mark.parametrize("async_split", [False, True])
def test_split_while_a_replica_is_offline(async_split: bool) -> None:
    low, high = "t/1", "t/2"
    specs = [
        spec(*NODES),
        spec("a", "b", partition=low, first_placement=21, lifecycle=Lifecycle.LOAD),
        spec("b", "a", partition=high, first_placement=31, lifecycle=Lifecycle.LOAD),
    ]
    c = Cluster(NODES, specs, config(), seed=11)
    keys = write_keys(c, "a", range(0, 40, 2))
    c.settle(10)
    c.crash("c")
    keys += write_keys(c, "a", range(1, 20, 2))
    targets = (SplitTarget(partition=low, high=20), SplitTarget(partition=high, low=20))
    assert c.call("a", "split", partition=P, targets=targets, async_split=async_split).error is None
    c.settle(30)
    assert c.status("a")["partitions"][P]["lifecycle"] in ("UNLOAD", "UNLOAD_FINAL")
    c.restart("c")
    c.settle(40)
    for n in NODES:
        assert c.status(n)["partitions"][P]["lifecycle"] == "UNLOAD_FINAL", n
    assert_identical(c, ["a", "b"], [k for k in keys if k < 20], partition=low)
    assert_identical(c, ["b", "a"], [k for k in keys if k >= 20], partition=high)
    for part in (low, high):
        assert c.status("a")["partitions"][part]["lifecycle"] == "SERVE"
    assert c.write("a", low, {"key": [5], "v": ["new"]}).error is None
    assert c.write("a", P, {"key": [5], "v": ["old"]}).error is not None


@pytest.mark.parametrize("crash_at", [1, 2, 3, 5, 8])
def test_a_receiver_crashing_mid_transit_catches_up(crash_at: int) -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=12)
    keys = write_keys(c, "a", range(8))
    c.storages["c", P].arm_crash(crash_at)  # strikes while c writes an incoming segment or its manifest
    c.settle(5)
    assert "c" not in c.up
    leftovers = c.storages["c", P]._temps
    c.restart("c")
    assert not c.storages["c", P]._temps, f"partial files {sorted(leftovers)} were discarded"
    c.settle(30)
    assert_identical(c, NODES, keys)


def test_a_leader_crashing_mid_flush_keeps_every_acknowledged_write() -> None:
    c = Cluster(NODES, [spec(*NODES)], config(), seed=13)
    keys = write_keys(c, "a", range(3))
    c.storages["a", P].arm_crash(3)  # the log append of key 3 succeeds; the flush it triggers dies
    reply = c.write("a", P, {"key": [3], "v": ["v3"]})
    assert reply.error == "a crashed"
    c.restart("a")
    c.settle(30)
    got = c.read("a", P)["key"]
    assert set(keys) <= set(got) <= {*keys, 3}
    assert_identical(c, NODES, got)


def test_a_receiver_crashing_between_the_segment_file_and_its_manifest_takes_nothing_half(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The incoming file is committed (fsync'd) under its final name; the crash strikes the manifest write
    # that would list it. The file looks whole, but it was never listed nor acked: recovery deletes it and
    # the leader offers the segment again.
    c = Cluster(NODES, [spec(*NODES)], config(), seed=14)
    st = c.storages["c", P]
    committed: list[str] = []
    create = st.create_in_place

    def create_then_crash(name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        writer = create(name, tap, size)
        commit = writer.commit

        def commit_then_arm() -> None:
            commit()
            committed.append(name)
            st.arm_crash(1)  # the next mutation: the manifest listing the segment

        monkeypatch.setattr(writer, "commit", commit_then_arm)
        return writer

    monkeypatch.setattr(st, "create_in_place", create_then_crash)
    keys = write_keys(c, "a", range(8))
    c.settle(5)
    assert "c" not in c.up and committed
    name = committed[0]
    crashed = c.storages["c", P]
    assert crashed.exists(name), "the received file survived the crash under its final name"
    segment_id = name.removeprefix("seg-")
    entry = c.role("a").local[P].store.entry(segment_id)
    assert entry is not None and 3 not in entry.acked, "c never acked it"
    c.restart("c")
    assert name in c.status("c")["partitions"][P]["recovered"]["discarded"]
    c.settle(30)
    assert_identical(c, NODES, keys)
    assert c.status("c")["counters"].get("fast_forwards", 0) >= 2


def test_an_ack_lost_in_a_crash_only_causes_a_re_offer_answered_segment_exists() -> None:
    # Acked lists are saved lazily (on the tick): a leader that crashes first forgets that b and c hold
    # the segment, offers it again, and both decline it as SEGMENT_EXISTS; nothing is copied or merged.
    c = Cluster(NODES, [spec(*NODES)], replace(config(), tick=1000.0), seed=15)
    keys = write_keys(c, "a", range(4))  # one segment
    c.drain()
    assert c.status("a")["counters"].get("acked") == 2
    c.crash("a")
    c.restart("a")
    c.drain()
    counters = c.status("a")["counters"]
    assert counters.get("declined_SEGMENT_EXISTS") == 2
    assert "acked" not in counters and "merges" not in counters
    assert_identical(c, NODES, keys)
    for n in "bc":
        assert c.status(n)["counters"].get("fast_forwards") == 1, "nothing arrived a second time"


def test_a_peer_up_without_a_peer_lost_ends_the_transfers_of_the_old_session() -> None:
    """A PeerUp is a new session (bus contract): an offer made on the old one gets no answer on it. The bus
    sends PeerLost before a new PeerUp; should one come without it, the leader must not wait for ever."""
    c = Cluster(NODES, [spec(*NODES)], config())
    keys = write_keys(c, "a", range(4))  # flush_rows=4: a flushes and offers the segment to b and c
    assert c.role("a").outgoing, "the leader has an offer open"
    for key in [k for k in c.queues if k[:2] == ("a", "b")]:
        del c.queues[key]  # the old session's offer to b is lost with it
    c._deliver("a", PeerUp(peer="b"))
    c._deliver("b", PeerUp(peer="a"))
    c.settle(10)
    assert_identical(c, NODES, keys)
    assert c.status("a")["outgoing"] == 0


def test_a_node_crashing_on_the_peer_up_of_a_heal_is_not_reported_up_to_its_peer() -> None:
    """The harness keeps the bus's contract: b, leader of its side of a cut, loses leadership when the cut
    heals and crashes in the flush that follows; a must not be told b is up (it would offer b segments that
    are dropped, and get a second PeerUp when b restarts)."""
    c = Cluster(NODES, [spec(*NODES)], config())
    acked = write_keys(c, "a", range(4))
    c.cut("a", "b")
    assert c.leader("b", P) == "b"
    acked += write_keys(c, "b", range(10, 12), tag="b")
    c.storages["b", P].arm_crash(1)
    c.heal("b", "a")
    assert "b" not in c.up
    assert "b" not in c.role("a").live
    c.restart("b")
    c.settle(30)
    assert c.status("b")["partitions"][P]["recovered"]["log_records"] == 2
    assert_identical(c, NODES, acked)
