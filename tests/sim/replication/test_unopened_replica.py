"""A replica that cannot be opened (its store's manifest unreadable) while its node is up.

The node lists it under ``failing`` and hosts nothing of the partition. Election used to look at node
liveness only, so every node went on naming that node the leader: the follower that held every row never
took over, and no node served the partition or took its writes for as long as the disk failed. Now the node
says so (``ReplicaAbsent``, on each tick) and its peers elect another replica; once it opens again it
returns as a follower and leads again only when the leader has caught it up (``ReplicaCaughtUp``).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import MANIFEST

from .cluster import Cluster, P, spec


class _Disk:
    """Makes the manifest of ``node``'s replica unreadable (EIO) while ``failing``."""

    def __init__(self, c: Cluster, node: str) -> None:
        self.c, self.node, self.failing = c, node, False
        self.wrap(c.storages[node, P])

    def wrap(self, storage: MemoryStorage) -> None:
        readable = storage.read

        def read(name: str, offset: int = 0, size: int = -1) -> bytes:
            if self.failing and name == MANIFEST:
                raise OSError(errno.EIO, "Input/output error")
            return readable(name, offset, size)

        storage.read = read  # type: ignore[method-assign]

    def restart_failing(self) -> None:
        """SIGKILL the node, then start it again with the manifest unreadable."""
        self.c.crash(self.node)
        self.wrap(self.c.storages[self.node, P])  # the crash gave the node a new storage object
        self.failing = True
        self.c.restart(self.node)


def _leaders(c: Cluster, nodes: tuple[str, ...]) -> dict[str, str | None]:
    return {n: (rep.leader.node if (rep := c.role(n).local.get(P)) and rep.leader else None) for n in nodes}


def _leading(c: Cluster, nodes: tuple[str, ...]) -> list[str]:
    return [n for n in nodes if (rep := c.role(n).local.get(P)) is not None and rep.leads]


def _watch(c: Cluster, seconds: float, seen: Callable[[], None]) -> None:
    """Run ``seconds`` of simulated time, calling ``seen`` after every step."""
    until = c.sim.now + seconds

    def done() -> bool:
        seen()
        return c.sim.now >= until

    c.sim.run_until(done, limit=seconds + 5)


def _first_led(c: Cluster, nodes: tuple[str, ...], seconds: float) -> tuple[list[list[int]], list[float]]:
    """Run ``seconds``: the keys a holds when it first leads, and the steps at which two nodes led."""
    both: list[float] = []
    first: list[list[int]] = []

    def seen() -> None:
        leading = _leading(c, nodes)
        if len(leading) > 1:
            both.append(c.sim.now)
        if "a" in leading and not first:
            first.append(sorted(c.read("a").get("key", [])))

    _watch(c, seconds, seen)
    return first, both


def _later_write_wins(c: Cluster, nodes: tuple[str, ...] = ("a", "b")) -> None:
    """Once a leads, the client writes key 8 again to it (after b acknowledged "old8"); it must win."""
    c.sim.run_until(lambda: "a" in _leading(c, nodes), limit=10)
    _, error = c.write("a", P, {"key": [8], "v": ["new8"]})
    assert error is None, error
    c.call("a", "flush", partition=P)
    c.settle(10.0)
    for node in nodes:
        rows = c.read(node)
        got = dict(zip(rows["key"], rows["v"], strict=True))
        assert got[8] == "new8", f"{node}: the acknowledged later write of key 8 was lost: {got[8]!r}"
        assert got[9] == "old9"


def _loaded(seed: int, nodes: tuple[str, ...] = ("a", "b")) -> tuple[Cluster, _Disk, list[int]]:
    """8 keys written on a (the designated leader), flushed and replicated; then a restarts with its
    replica of t/0 unreadable."""
    c = Cluster([spec(*nodes)], nodes=nodes, seed=seed)
    acked = c.write_keys("a", range(8))
    c.call("a", "flush", partition=P)
    c.settle(5.0)
    c.assert_identical(list(nodes), acked)
    disk = _Disk(c, "a")
    disk.restart_failing()
    c.settle(10.0)
    return c, disk, acked


def test_a_partition_whose_leader_cannot_open_it_is_led_by_a_replica_that_holds_it() -> None:
    c, _, acked = _loaded(seed=3)
    a = c.role("a")
    assert P in a.failing and P not in a.local
    assert c.role("b").local[P].leads, f"nobody leads {P}: {_leaders(c, ('b',))}, a failing: {a.failing}"
    assert "a" in c.status("b")["partitions"][P]["absent"]
    more = c.write_keys("b", range(8, 12))
    assert more == [8, 9, 10, 11]
    c.assert_identical(["b"], acked + more)
    # The failing node names the leader instead of claiming the partition.
    _, error = c.write("a", P, {"key": [99], "v": ["x"]})
    assert error is not None and "leader: b" in error and "cannot be opened" in error


@pytest.mark.parametrize("nodes", [("a", "b"), ("a", "b", "c")])
def test_a_replica_that_opens_again_returns_as_a_follower_and_leads_once_caught_up(
    nodes: tuple[str, ...],
) -> None:
    c, disk, acked = _loaded(seed=3, nodes=nodes)
    written_meanwhile = c.write_keys("b", range(8, 20), tag="w")
    assert written_meanwhile == list(range(8, 20))
    keys = acked + written_meanwhile
    disk.failing = False  # the disk is back: the next tick opens the replica
    stale, both = _first_led(c, nodes, 15.0)
    assert P not in c.role("a").failing
    assert both == [], f"two nodes led at {both[:5]}"
    assert stale == [sorted(keys)], "a led again before it held what b took while it was away"
    assert _leaders(c, nodes) == dict.fromkeys(nodes, "a")
    assert c.counters("a")["reopened"] == 1 and c.counters("b")["caught_up"] == 1
    assert all(c.status(n)["partitions"][P]["returning"] == [] for n in nodes)
    c.assert_identical(list(nodes), keys)
    later = c.write_keys("a", range(20, 24))
    c.call("a", "flush", partition=P)
    c.settle(5.0)
    c.assert_identical(list(nodes), keys + later)
    assert c.quiet()
    for n in nodes:  # a's failed opens are counted (open_errors): nothing else raised
        counters = c.counters(n)
        assert counters.get("handler_errors", 0) == counters.get("procedure_errors", 0) == 0, counters


def test_the_only_replica_that_cannot_be_opened_leaves_the_partition_without_a_leader() -> None:
    c, disk, acked = _loaded(seed=5, nodes=("a",))
    assert P not in c.role("a").local
    _, error = c.write("a", P, {"key": [99], "v": ["x"]})
    assert error is not None and "leader: None" in error and "cannot be opened" in error, error
    assert "Input/output error" in error
    disk.failing = False
    c.settle(3.0)
    assert c.role("a").local[P].leads, "no other replica: the replica that opens again leads at once"
    assert c.status("a")["partitions"][P]["returning"] == []
    more = c.write_keys("a", range(8, 10))
    c.assert_identical(["a"], acked + more)


def test_a_replica_that_keeps_failing_moves_leadership_once_not_on_every_tick() -> None:
    nodes = ("a", "b", "c")
    c, disk, acked = _loaded(seed=7, nodes=nodes)
    others = ("b", "c")
    assert _leaders(c, others) == {"b": "b", "c": "b"}
    terms = {n: c.role(n).local[P].term for n in others}
    changes: list[tuple[float, dict[str, str | None]]] = []

    def seen() -> None:
        now = _leaders(c, others)
        if now != {"b": "b", "c": "b"}:
            changes.append((c.sim.now, now))

    _watch(c, 20.0, seen)  # 20 ticks, each with a's failed open and its REPLICA_ABSENT
    disk.restart_failing()  # and a restart that still cannot open it: the peers keep what they heard
    _watch(c, 10.0, seen)
    assert changes == []
    assert {n: c.role(n).local[P].term for n in others} == terms
    assert c.counters("b")["peers_absent"] == 1
    c.assert_identical(list(others), acked)


def test_a_replica_that_opens_again_while_the_leader_is_down_leads_and_takes_its_rows_later() -> None:
    c, disk, acked = _loaded(seed=11)
    meanwhile = c.write_keys("b", range(8, 14), tag="w")
    c.crash("b")
    disk.failing = False
    c.settle(3.0)
    assert c.role("a").local[P].leads, "no other replica can lead: a leads, as after a restart"
    assert c.status("a")["partitions"][P]["returning"] == []
    c.restart("b")
    c.settle(10.0)
    assert _leaders(c, ("a", "b")) == {"a": "a", "b": "a"}
    c.assert_identical(["a", "b"], acked + meanwhile)
