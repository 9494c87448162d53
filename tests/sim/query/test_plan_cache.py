"""The initiator reuses a query's fragments by SQL text; the participants and options still count."""

from __future__ import annotations

from tests.sim.query.cluster import Cluster

SQL = "SELECT COUNT(*) AS n FROM t"


def count(c: Cluster, **args: object) -> int:
    result, error = c.outcome(c.execute(SQL, **args))
    assert error is None and result is not None
    return int(result.column("n")[0].as_py())


def test_the_same_sql_over_other_participants_is_planned_again() -> None:
    c = Cluster(seed=3, rows=400)
    assert count(c) == 400
    assert count(c) == 400  # the kept plan
    assert count(c, participants=["p1"]) == 200  # not the plan of all three members
    assert count(c, participants=["p2"]) == 200
    assert count(c, participants=["p1", "p2"]) == 400


def test_repartition_is_part_of_what_a_kept_plan_is_kept_for() -> None:
    c = Cluster(seed=4, rows=400)
    grouped = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    plain, error = c.outcome(c.execute(grouped))
    assert error is None and plain is not None
    shuffled, error = c.outcome(c.execute(grouped, repartition=True))
    assert error is None and shuffled is not None
    assert sorted(plain.to_pylist(), key=str) == sorted(shuffled.to_pylist(), key=str)
    assert len(c.roles["i"]._plans) == 2
