"""GROUP BY of a select-list alias across members: the initiator resolves the name with its own partition's
columns (the table's column first, else the alias, as Spark SQL does), and every participant groups by the
same expression."""

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


def test_an_initiator_holding_no_partition_cannot_tell_and_says_so() -> None:
    c = Cluster(seed=12, rows=400)
    result, error = c.outcome(c.execute(SQL))
    assert result is None and error is not None
    assert error.startswith(
        "[1005 PARSING] column 'x' must appear in GROUP BY or inside an aggregate; GROUP BY p"
    )
    assert "holds no partition of table t" in error


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
