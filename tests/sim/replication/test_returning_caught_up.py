"""A returning replica is caught up only once it holds the leader's memtable too.

The leader said ``ReplicaCaughtUp`` once the returning replica had acked every segment from its latest
major, counting none of the rows in its memtable. A leader that took fewer writes than ``flush_rows``
while the replica was away holds them there only: the replica led at once without them, and a write it
took of such a key got a version below the older row's, which won once the old leader flushed and pushed
it. Now the leader flushes its memtable first and says the replica is caught up when it acks that segment.
"""

from __future__ import annotations

from .cluster import P
from .test_unopened_replica import _first_led, _later_write_wins, _loaded


def test_returning_replica_does_not_lead_without_the_leaders_memtable_rows() -> None:
    c, disk, acked = _loaded(seed=3)
    # Two writes on b while a is away: fewer than flush_rows, younger than flush_age: memtable only.
    meanwhile = c.write_keys("b", range(8, 10), tag="w")
    assert meanwhile == [8, 9]
    assert c.role("b").local[P].store.memtable_rows == 2
    disk.failing = False
    first_led, both = _first_led(c, ("a", "b"), 10.0)
    assert both == [], f"two nodes led at {both[:5]}"
    assert first_led == [sorted(acked + meanwhile)], (
        "a led again before it held what b took while it was away"
    )
    assert c.counters("b")["caught_up"] == 1


def test_a_write_on_the_returned_leader_is_not_overwritten_by_an_older_one() -> None:
    c, disk, _ = _loaded(seed=3)
    assert c.write_keys("b", range(8, 10), tag="old") == [8, 9]
    disk.failing = False
    _later_write_wins(c)
