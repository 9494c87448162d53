"""Split bounds are values of the key's first column that the column can be compared with.

A bound was checked as ``pa.scalar(bound, type=key_type)``, which takes an int for a timestamp key, while
the rewrite for the range compared the column with the plain int, which has no kernel: every bounded
split of a timestamp or date key was accepted, and the rewrite then failed on every run of the
procedures, so the split never ended. Now the rewrite compares values of the key's type, and a bound the
column cannot be compared with is refused by the split call.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.layout import Lifecycle, SplitTarget
from tests.sim.replication.cluster import Cluster, P, config, spec

SPECS = [
    spec("a", "b"),
    spec("a", "b", partition="t/1", first_placement=21, lifecycle=Lifecycle.LOAD),
    spec("b", "a", partition="t/2", first_placement=31, lifecycle=Lifecycle.LOAD),
]
BASE = dt.datetime(2024, 1, 1)


def _at(bound: int) -> tuple[SplitTarget, SplitTarget]:
    return (SplitTarget(partition="t/1", high=bound), SplitTarget(partition="t/2", low=bound))


@pytest.mark.parametrize("async_split", [True, False])
def test_a_timestamp_key_splits_at_an_int_bound(async_split: bool) -> None:
    c = Cluster(SPECS, config(), seed=1, nodes=("a", "b"))
    days = [BASE + dt.timedelta(days=i) for i in range(6)]
    for i, day in enumerate(days):
        _, error = c.write("a", P, {"key": [day], "v": [f"v{i}"]})
        assert error is None, error
    c.call("a", "flush", partition=P)
    c.settle(5)
    bound = int((BASE + dt.timedelta(days=3)).replace(tzinfo=dt.UTC).timestamp() * 1_000_000)  # microseconds
    c.call("a", "split", partition=P, targets=_at(bound), async_split=async_split)
    c.settle(30)
    for n in ("a", "b"):
        lifecycles = {p: c.status(n)["partitions"][p]["lifecycle"] for p in (P, "t/1", "t/2")}
        assert lifecycles == {P: "UNLOAD_FINAL", "t/1": "SERVE", "t/2": "SERVE"}, (n, lifecycles)
        assert c.read(n, "t/1") == {"key": days[:3], "v": ["v0", "v1", "v2"]}, n
        assert c.read(n, "t/2") == {"key": days[3:], "v": ["v3", "v4", "v5"]}, n
    c.assert_clean()


def test_a_bound_the_key_cannot_be_compared_with_is_refused_by_the_call() -> None:
    c = Cluster(SPECS, config(), seed=1, nodes=("a", "b"))
    rows = pa.RecordBatch.from_pydict({"key": pa.array(np.array([1, 5], dtype=np.float16)), "v": ["x", "y"]})
    _, error = c.try_call("a", "write", partition=P, rows=bytes(encode_batch(rows)))
    assert error is None, error
    c.call("a", "flush", partition=P)
    _, error = c.try_call("a", "split", partition=P, targets=_at(3), async_split=True)
    assert error == "split: split bound 3 of t/1 cannot be compared with a halffloat key"
    status = c.status("a")["partitions"]
    assert status[P]["lifecycle"] == "SERVE" and status["t/1"]["lifecycle"] == "LOAD"
    assert c.role("a").local[P].store.meta.get("split") is None  # nothing saved to resume
    c.settle(10)
    c.assert_clean()
