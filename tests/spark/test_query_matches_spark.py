"""The query family's results equal Spark SQL's on the same generated data (2 simulated participants)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.query import QueryConfig, QueryRole, load, sql

pytestmark = pytest.mark.spark
ROWS = 4000
KINDS = ["click", "view", "buy", "share", "like"]


def generate(rows: int, seed: int = 5) -> pa.Table:
    rng = random.Random(seed)
    ts = list(range(1_000_000, 1_000_000 + rows))
    rng.shuffle(ts)
    return pa.table(
        {
            "user": pa.array([rng.randrange(200) for _ in range(rows)], pa.int64()),
            "kind": pa.array(rng.choices(KINDS, k=rows), pa.string()),
            "value": pa.array(
                [None if rng.random() < 0.05 else round(rng.random() * 100.0, 2) for _ in range(rows)],
                pa.float64(),
            ),
            "ts": pa.array(ts, pa.int64()),
        }
    )


class SimTarget:
    def __init__(self, sim: SimBus, node: str) -> None:
        self.sim, self.node = sim, node

    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        return self.sim.result(self.sim.call(self.node, role, name, args), limit=timeout)


QUERIES = [
    "SELECT COUNT(*) AS n FROM t WHERE user = 17",
    "SELECT kind, COUNT(*) AS n, COUNT(value) AS nv, SUM(value) AS s, AVG(value) AS a, MIN(ts) AS lo, "
    "MAX(ts) AS hi FROM t GROUP BY kind ORDER BY kind",
    "SELECT kind, COUNT(DISTINCT user) AS users FROM t GROUP BY kind ORDER BY users DESC, kind",
    "SELECT user, COUNT(*) AS n FROM t WHERE value > 50 GROUP BY user HAVING COUNT(*) >= 12 ORDER BY n DESC, user",
    "SELECT user, ts FROM t ORDER BY ts DESC LIMIT 10 OFFSET 5",
    "SELECT user, value * 2 + 1 AS v2, ABS(value - 50) AS d FROM t "
    "WHERE kind IN ('buy', 'view') AND value BETWEEN 10 AND 20 ORDER BY ts LIMIT 50",
    "SELECT kind, COUNT(*) AS n FROM t WHERE kind LIKE '%i%' OR value IS NULL GROUP BY kind ORDER BY kind",
    "SELECT kind, SUM(value) / COUNT(*) AS m FROM t GROUP BY kind ORDER BY m DESC",
    "SELECT ts, value FROM t ORDER BY value, ts LIMIT 30",
    "SELECT ts, value FROM t ORDER BY value DESC, ts LIMIT 30",
    "SELECT user, LOWER(kind) AS k, LENGTH(kind) AS l FROM t WHERE user < 3 ORDER BY ts",
    "SELECT COUNT(*) AS n, SUM(user) AS su, MIN(value) AS mn FROM t WHERE value IS NOT NULL AND user <> 4",
]


@pytest.fixture(scope="module")
def both(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[SimTarget, Any]:
    data = generate(ROWS)
    path = Path(tmp_path_factory.mktemp("query-vs-spark")) / "t.parquet"
    pq.write_table(data, path)
    spark.read.parquet(str(path)).createOrReplaceTempView("t")
    sim = SimBus(seed=3)
    for name in ("i", "p1", "p2"):
        sim.add_node(name, roles=[QueryRole(name, config=QueryConfig(), incarnation=f"{name}0")])
    sim.start()
    sim.run_until(sim.all_up)
    half = ROWS // 2
    load(SimTarget(sim, "p1"), "t", data.slice(0, half))
    load(SimTarget(sim, "p2"), "t", data.slice(half))
    return SimTarget(sim, "i"), spark


def _close(u: Any, v: Any) -> bool:
    if isinstance(u, float) or isinstance(v, float):
        return u is not None and v is not None and math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9)
    return bool(u == v)


@pytest.mark.parametrize("text", QUERIES)
def test_results_equal_spark_sql(both: tuple[SimTarget, Any], text: str) -> None:
    target, spark = both
    ours = sql(target, text)
    theirs = spark.sql(text).toArrow()
    assert ours.column_names == theirs.column_names
    assert ours.num_rows == theirs.num_rows
    assert ours.num_rows > 0
    for name in theirs.column_names:
        got, want = ours[name].to_pylist(), theirs[name].to_pylist()
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _close(g, w)]
        assert not bad, f"{name}: first differences {bad[:5]}"
