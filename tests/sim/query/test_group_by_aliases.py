"""GROUP BY of a select-list alias across members: the initiator resolves the name with its own partition's
columns (the table's column first, else the alias, as Spark SQL does), and every participant groups by the
same expression. An initiator that holds no partition of the table plans the alias, and every participant
holding a column of that name refuses the plan."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from sparkbus.codecs import encode_batch
from tests.sim.query.cluster import Cluster, table

SQL = "SELECT x % 3 AS p, count(*) AS n, sum(y) AS s FROM t GROUP BY p ORDER BY p"


def holding(seed: int) -> Cluster:
    """The usual cluster, with a partition of ``t`` on the initiator too (rows 0..59 once more)."""
    c = Cluster(seed=seed, rows=400)
    c.load("i", table(60))
    return c


def expected(parts: list[pa.Table]) -> list[dict[str, object]]:
    n: Counter[int] = Counter()
    s: Counter[int] = Counter()
    for part in parts:
        for row in part.to_pylist():
            n[row["x"] % 3] += 1
            s[row["x"] % 3] += row["y"]
    return [{"p": p, "n": n[p], "s": s[p]} for p in sorted(n)]


@pytest.mark.parametrize("repartition", [False, True])
def test_the_groups_of_an_alias_hold_every_participants_rows(repartition: bool) -> None:
    c = holding(seed=11)
    result, error = c.outcome(c.execute(SQL, repartition=repartition))
    assert error is None and result is not None
    assert result.to_pylist() == expected([c.data, table(60)])
    assert sum(result.column("n").to_pylist()) == 460  # i's 60 rows and p1's and p2's 200 each


@pytest.mark.parametrize("repartition", [False, True])
def test_an_initiator_holding_no_partition_groups_by_the_alias(repartition: bool) -> None:
    # as processes.toml's coordinator, where the client enters: the participants' partitions have no column p
    c = Cluster(seed=12, rows=400)
    result, error = c.outcome(c.execute(SQL, repartition=repartition))
    assert error is None and result is not None
    assert result.to_pylist() == expected([c.data])
    assert sum(result.column("n").to_pylist()) == 400


def with_column_p(c: Cluster, nodes: tuple[str, ...]) -> None:
    """Give the partitions of ``t`` on ``nodes`` (the rows they hold) a column ``P``, as the table spells it."""
    halves = {"p1": c.data.slice(0, 200), "p2": c.data.slice(200)}
    for node in nodes:
        part = halves[node].append_column("P", pa.array([r % 2 for r in range(200)], pa.int64()))
        batches = [bytes(encode_batch(b)) for b in part.to_batches(max_chunksize=100)]
        c.sim.result(c.sim.call(node, "query", "load", {"table": "t", "batches": batches, "replace": True}))


@pytest.mark.parametrize(("nodes", "repartition"), [(("p1", "p2"), False), (("p2",), True)])
def test_participants_with_a_column_of_the_name_refuse_what_an_initiator_without_rows_planned(
    nodes: tuple[str, ...], repartition: bool
) -> None:
    # Spark groups by the column P there; the plan read p as the alias, so a participant holding P refuses it
    c = Cluster(seed=14, rows=400)
    with_column_p(c, nodes)
    result, error = c.outcome(c.execute(SQL, repartition=repartition))
    assert result is None and error is not None
    assert error.startswith(
        "[1005 PARSING] GROUP BY p was planned as the select list's alias p by a node that holds no partition "
        "of table t, but table t has a column P, which GROUP BY p means before the alias, as in Spark: group by "
        "the alias's expression or its position (or qualify the name for the column)"
    )
    assert any(error.endswith(f"on {n})") for n in nodes), error  # a participant holding P refused it
    c.settle()
    assert c.leaks() == {"i": 0, "p1": 0, "p2": 0}
    # the expression and the position are planned alike wherever the query enters
    for text in (
        "SELECT x % 3 AS p, count(*) AS n, sum(y) AS s FROM t GROUP BY x % 3 ORDER BY p",
        "SELECT x % 3 AS p, count(*) AS n, sum(y) AS s FROM t GROUP BY 1 ORDER BY p",
    ):
        result, error = c.outcome(c.execute(text, repartition=repartition))
        assert error is None and result is not None
        assert result.to_pylist() == expected([c.data])


def test_a_kept_plan_is_made_again_when_the_table_gains_a_column_of_the_name() -> None:
    c = holding(seed=13)
    grouped = "SELECT 1 AS p, count(*) AS n FROM t GROUP BY p"
    result, error = c.outcome(c.execute(grouped))
    assert error is None and result is not None
    assert result.to_pylist() == [{"p": 1, "n": 460}]  # by the alias: one group
    for node, rows in (("i", 60), ("p1", 200), ("p2", 200)):
        part = table(rows).append_column("p", pa.array([r % 2 for r in range(rows)], pa.int64()))
        batches = [bytes(encode_batch(b)) for b in part.to_batches(max_chunksize=100)]
        args = {"table": "t", "batches": batches, "replace": True}
        c.sim.result(c.sim.call(node, "query", "load", args))
    result, error = c.outcome(c.execute(grouped))
    assert error is None and result is not None
    assert sorted(result.column("n").to_pylist()) == [230, 230]  # by the column p: two groups of p = 1
    assert result.column("p").to_pylist() == [1, 1]
