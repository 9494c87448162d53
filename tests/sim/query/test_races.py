"""Seeded simulations of spec 3.5's races and failures, and cancel from each side."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus import BusConfig
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.role import QueryRole

from .cluster import Cluster

SEEDS = [1, 2, 3]
SMALL = QueryConfig(edge_credit=4096, batch_bytes=1024)


def rows(t: pa.Table) -> list[dict[str, object]]:
    return sorted(t.to_pylist(), key=repr)


@pytest.mark.parametrize("seed", SEEDS)
def test_queries_match_the_reference(seed: int) -> None:
    c = Cluster(seed)
    got, err = c.outcome(c.execute("SELECT k, count(*) AS n, sum(x) AS s FROM t GROUP BY k"))
    assert err is None and got is not None
    ref = c.data.group_by(["k"]).aggregate([([], "count_all"), ("x", "sum")]).rename_columns(["k", "n", "s"])
    assert rows(got) == rows(ref)
    got, err = c.outcome(
        c.execute("SELECT x, y FROM t WHERE x >= ? ORDER BY x DESC LIMIT 5", parameters=[10])
    )
    assert got is not None and got.column("x").to_pylist() == [399, 398, 397, 396, 395]
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_large_result_streams_under_small_credit(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    got, err = c.outcome(c.execute("SELECT x FROM t"))
    assert err is None and got is not None
    assert sorted(got.column("x").to_pylist()) == list(range(3000))
    sent = c.roles["p1"].counters
    assert sent["batches_out"] > 10  # many batches: the credit bounded each
    # No silly windows: batches stay near full size instead of shrinking to leftover credit.
    assert sent["bytes_out"] / sent["batches_out"] > SMALL.batch_bytes / 2
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_batch_before_start_is_retained_and_replayed(seed: int) -> None:
    c = Cluster(seed)
    got, err = c.outcome(c.execute("SELECT k, count(*) AS n FROM t GROUP BY k", repartition=True))
    assert err is None and got is not None
    assert rows(got) == rows(c.data.group_by(["k"]).aggregate([([], "count_all")]).rename_columns(["k", "n"]))
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


def test_some_seed_delivers_a_batch_before_start() -> None:
    created = 0
    for seed in range(1, 9):
        c = Cluster(seed)
        c.outcome(c.execute("SELECT k, count(*) FROM t GROUP BY k", repartition=True))
        created += c.roles["p1"].counters["created_by_batch"] + c.roles["p2"].counters["created_by_batch"]
    assert created > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_cancel_by_the_user(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    cid = c.execute("SELECT x FROM t")
    cancelled = c.sim.result(c.sim.call("i", "query", "cancel", {"call_id": cid[1]}))
    assert cancelled is True
    got, err = c.outcome(cid)
    assert got is None and err is not None and err.startswith("[1003 CANCELLED_BY_USER]")
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    assert c.sim.result(c.sim.call("i", "query", "cancel", {"call_id": cid[1]})) is False


@pytest.mark.parametrize("seed", SEEDS)
def test_cancel_from_a_participant_goes_through_the_initiator(seed: int) -> None:
    c = Cluster(seed)
    c.load("p2", pa.table({"other": [1, 2]}), name="u")
    c.load("p1", pa.table({"z": [1, 2]}), name="u")
    got, err = c.outcome(c.execute("SELECT z FROM u"))
    assert got is None and err is not None
    assert err.startswith("[2000 DATA_EXCEPTION]") and "on p2" in err and "'z'" in err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    # p2 sent one cancel to i; i sent one to each participant: 3 messages for N = 2. p2 has released the
    # query, and the one back to it finds nothing.
    assert c.roles["p2"].counters["cancelled_remote"] == 0 and c.roles["p2"].counters["cancel_unknown"] == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_every_participant_hears_a_cancel_whatever_origin_it_names(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # p1 fails (no column z) and its cancel names p2 as the origin, which the initiator only reports: p2,
    # still streaming under a small credit, must hear it, or it holds the query for ever (its stream to i
    # is closed). p1, which has released the query, hears it too and finds nothing.
    fail = QueryRole._fail

    def naming_p2(self: QueryRole, *args: Any, **kwargs: Any) -> None:
        if self.member == "p1":
            args = (*args[:3], "p2", *args[4:])
        fail(self, *args, **kwargs)

    monkeypatch.setattr(QueryRole, "_fail", naming_p2)
    c = Cluster(seed, config=SMALL)
    c.load("p1", pa.table({"other": [1, 2]}), name="u")
    c.load("p2", pa.table({"z": pa.array(range(6000), pa.int64())}), name="u")
    got, err = c.outcome(c.execute("SELECT z FROM u"))
    assert got is None and err is not None
    assert err.startswith("[2000 DATA_EXCEPTION]") and "'z'" in err and "on p2)" in err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    assert c.roles["p2"].counters["cancelled_remote"] == 1 and c.roles["p1"].counters["cancel_unknown"] == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_participant_crash_fails_fast_with_member_leave(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    cid = c.execute("SELECT x FROM t")
    c.sim.run_for(0.002)
    c.sim.crash("p2")
    got, err = c.outcome(cid)
    assert got is None and err is not None and err.startswith("[1002 MEMBER_LEAVE]") and "p2" in err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_initiator_crash_releases_participants_silently(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    c.execute("SELECT x FROM t")
    c.sim.run_for(0.003)
    c.sim.crash("i")
    c.settle()
    assert c.leaks() == {"p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_link_between_participants_fails_the_query(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    cid = c.execute("SELECT k, count(*) FROM t GROUP BY k", repartition=True)
    c.sim.cut("p1", "p2")
    _, err = c.outcome(cid)
    assert err is not None and "MEMBER" in err
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_timeout(seed: int) -> None:
    c = Cluster(seed, rows=3000, config=SMALL)
    got, err = c.outcome(c.execute("SELECT x FROM t", timeout=0.001))
    assert got is None and err is not None and err.startswith("[1004 TIMEOUT]")
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


def test_errors_before_start() -> None:
    c = Cluster(1)
    _, err = c.outcome(c.execute("SELECT FROM WHERE"))
    assert err is not None and err.startswith("[1005 PARSING] syntax error")
    _, err = c.outcome(c.execute("SELECT x FROM missing"))
    assert err is not None and "missing is not loaded on any participant" in err
    _, err = c.outcome(c.execute("SELECT x FROM t", participants=["p1", "ghost"]))
    assert err is not None and err.startswith("[1001 MEMBER_CONNECTION]")
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


def test_empty_and_filtered_results_keep_their_schema() -> None:
    c = Cluster(2)
    got, err = c.outcome(c.execute("SELECT k, x FROM t WHERE x < 0"))
    assert err is None and got is not None and got.num_rows == 0 and got.column_names == ["k", "x"]
    got, _ = c.outcome(c.execute("SELECT count(*) AS n, sum(x) AS s FROM t WHERE x < 0"))
    assert got is not None and got.to_pylist() == [{"n": 0, "s": None}]
    got, _ = c.outcome(c.execute("SELECT avg(y) AS a FROM t"))
    assert got is not None and got.column("a")[0].as_py() == pytest.approx(
        pc.mean(c.data.column("y")).as_py()
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_edge_credit_above_the_default_works_when_the_buses_match(seed: int) -> None:
    # Batches overtake start here; the receiving bus accepts their stream with its own initial credit,
    # which must be at least the edge credit (QueryConfig refuses anything else).
    mib = 1 << 20
    config = QueryConfig(edge_credit=8 * mib, batch_bytes=4 * mib, bus_initial_credit=8 * mib)
    c = Cluster(seed, rows=2000, config=config, bus=BusConfig(cluster_tag="sim", initial_credit=8 * mib))
    got, err = c.outcome(c.execute("SELECT x, sum(y) AS s FROM t GROUP BY x", repartition=True))
    assert err is None and got is not None and sorted(got.column("x").to_pylist()) == list(range(2000))
    assert sum(r.counters["created_by_batch"] for r in c.roles.values()) > 0  # a batch did overtake start
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
