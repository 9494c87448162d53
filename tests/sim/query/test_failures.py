"""Seeded simulations: a role's handler that raises, through the real bus, still ends its query."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.query.role import QueryRole

from .cluster import Cluster

SEEDS = [1, 2, 3]


def failing_on(member: str, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``QueryRole.<method>`` raise on ``member`` only (the bus then delivers ``HandlerFailed``)."""
    original = getattr(QueryRole, method)

    def failing(self: QueryRole, *args: Any) -> Any:
        if self.member == member:
            raise KeyError("lost")
        return original(self, *args)

    monkeypatch.setattr(QueryRole, method, failing)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_participant_handler_that_raises_fails_the_query(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster(seed)
    failing_on("p1", "_pump", monkeypatch)
    got, err = c.outcome(c.execute("SELECT x FROM t"))
    assert got is None and err is not None
    assert (
        err.startswith("[-1 GENERIC] internal error on p1 at MessageReceived: KeyError") and "on p1)" in err
    )
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_an_initiator_handler_that_raises_answers_the_call(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster(seed)
    failing_on("i", "_deliver", monkeypatch)
    got, err = c.outcome(c.execute("SELECT k, count(*) AS n FROM t GROUP BY k", repartition=True))
    assert got is None and err is not None
    assert err.startswith("[-1 GENERIC] internal error on i at BatchReceived: KeyError")
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    assert c.roles["i"].counters["handler_failed"] == 1


@pytest.mark.parametrize("parameters", [[[1, 2]], [2**64], "12"])
def test_parameters_that_cannot_cross_the_wire_are_answered_at_once(parameters: object) -> None:
    c = Cluster(1)
    got, err = c.outcome(c.execute("SELECT x FROM t WHERE x < ?", parameters=parameters), limit=1.0)
    assert got is None and err is not None and err.startswith("[1005 PARSING] parameters")
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    assert all(r.counters["handler_failed"] == 0 for r in c.roles.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_row_wider_than_the_batch_limit_fails_instead_of_stalling_its_stream(seed: int) -> None:
    # Default config: a batch is at most 40 % of the 1 MiB edge credit (419,430 bytes). A 500 KB row then
    # a 560 KB one left p1 waiting at 52 % of its credit, above the watermark, for a grant never sent.
    c = Cluster(seed)
    c.load("p1", pa.table({"s": ["a" * 500_000, "b" * 560_000], "x": [1, 2]}), name="w")
    c.load("p2", pa.table({"s": ["c"], "x": [3]}), name="w")
    got, err = c.outcome(c.execute("SELECT x, length(s) AS n FROM w"))
    assert err is None and got is not None and sorted(got.column("n").to_pylist()) == [1, 500_000, 560_000]
    got, err = c.outcome(c.execute("SELECT s, x FROM w"))
    assert got is None and err is not None and err.startswith("[2000 DATA_EXCEPTION] a row of 5")
    assert (
        "exceeds the batch limit of 419430 bytes, 40% of the edge credit 1048576" in err and "on p1)" in err
    )
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}


@pytest.mark.parametrize("seed", SEEDS)
def test_rows_under_the_batch_limit_stream_one_by_one(seed: int) -> None:
    c = Cluster(seed)
    wide = [chr(ord("a") + i) * 400_000 for i in range(6)]
    c.load("p1", pa.table({"s": wide, "x": list(range(6))}), name="w")
    got, err = c.outcome(c.execute("SELECT s, x FROM w"))
    assert err is None and got is not None and sorted(got.column("s").to_pylist()) == wide
    assert c.roles["p1"].counters["batches_out"] >= 6  # one row per batch, each waiting for credit
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
