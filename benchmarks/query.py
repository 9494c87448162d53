"""Short queries: sparkbus (2 participant processes holding the table in memory) against warm Spark SQL.

The same generated table (user int64, kind string, value float64, ts int64; 1M rows, --quick 200k) is
cached in Spark (local[2]) and loaded into 2 sparkbus participants. For each query: p50 over repeated
runs of ``sql()`` on an initiator node and of Spark SQL's ``toArrow()`` (``collect()`` is recorded too),
their ratio, and whether the results match. ``min_speedup`` is over the short queries (all but the full
sort).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from _common import parser, table, write

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.roles.query import QueryRole, load, sql

KINDS = ["click", "view", "buy", "share", "like", "skip", "open", "close"]
SEED = 20240501
PARTS = ("p1", "p2")

QUERIES: list[tuple[str, str, bool]] = [
    # name, SQL (valid for sparkbus and Spark SQL), short
    ("point_filter_count", "SELECT COUNT(*) AS n FROM t WHERE user = 4242", True),
    (
        "group_by_top10",
        "SELECT kind, COUNT(*) AS n, SUM(value) AS s, MAX(ts) AS mx FROM t WHERE user < 5000 "
        "GROUP BY kind ORDER BY s DESC LIMIT 10",
        True,
    ),
    (
        "order_by_limit",
        "SELECT user, kind, value, ts FROM t WHERE kind = 'buy' ORDER BY ts DESC LIMIT 20",
        True,
    ),
    ("full_sort", "SELECT user, kind, value, ts FROM t ORDER BY ts", False),
]


def generate(rows: int, seed: int = SEED) -> pa.Table:
    """The benchmark table; ts is unique so every ORDER BY ts is deterministic."""
    rng = random.Random(seed)
    users = max(1, rows // 20)
    ts = list(range(1_600_000_000_000, 1_600_000_000_000 + rows))
    rng.shuffle(ts)
    return pa.table(
        {
            "user": pa.array([rng.randrange(users) for _ in range(rows)], pa.int64()),
            "kind": pa.array(rng.choices(KINDS, k=rows), pa.string()),
            "value": pa.array([round(rng.random() * 100.0, 2) for _ in range(rows)], pa.float64()),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def _config() -> BusConfig:
    # A participant busy sorting 500k rows can miss heartbeats on a loaded machine: be patient.
    return BusConfig(cluster_tag="bench-query", hwm=100_000, heartbeat_interval=1.0, peer_timeout=15.0)


# ---------------------------------------------------------------- sparkbus side


def _participant(conn: Any, node_id: str, path: str, index: int) -> None:
    node = Node(node_id, _config(), [QueryRole(node_id)])
    conn.send(node.bind().to_json())
    peers = {k: Endpoints.from_json(v) for k, v in conn.recv().items()}
    node.start(peers)
    try:
        data = pq.read_table(path)
        step = -(-data.num_rows // len(PARTS))
        conn.send(load(node, "t", data.slice(index * step, step), timeout=300))
        conn.recv()  # None: stop
    finally:
        node.stop()


class Cluster:
    """Two participant processes (spawned) and an initiator node in this process."""

    def __init__(self, path: str) -> None:
        ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.node: Node | None = None
        try:
            eps: dict[str, Endpoints] = {}
            for i, name in enumerate(PARTS):
                conn, child = ctx.Pipe()
                proc = ctx.Process(target=_participant, args=(child, name, path, i), daemon=True)
                proc.start()
                self.procs.append(proc)
                self.conns.append(conn)
                eps[name] = Endpoints.from_json(conn.recv())
            self.node = Node("i", _config(), [QueryRole("i")])
            eps["i"] = self.node.bind()
            for conn in self.conns:
                conn.send({k: v.to_json() for k, v in eps.items()})
            self.node.start(eps)
            self.node.wait_ready(timeout=30)
            self.rows = 0
            for conn in self.conns:
                if not conn.poll(300):
                    raise TimeoutError("participant did not load its partition within 300 s")
                self.rows += conn.recv()
        except BaseException:
            self.close()
            raise

    def sql(self, text: str) -> pa.Table:
        assert self.node is not None
        return sql(self.node, text, timeout=120)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        if self.node is not None:
            self.node.stop()
            self.node = None


# ---------------------------------------------------------------- Spark side


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 (participant processes never load pyspark)

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkbus-bench-query")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---------------------------------------------------------------- comparison


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal column names, row counts and values (floats within 1e-9 relative: sums differ in order)."""
    if a.column_names != b.column_names or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name].to_pylist(), b[name].to_pylist()
        if isinstance(next((v for v in x if v is not None), None), float):
            if not all(
                (u is None and v is None)
                or (u is not None and v is not None and math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9))
                for u, v in zip(x, y, strict=True)
            ):
                return False
        elif x != y:
            return False
    return True


def p50_ms(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    rows = 200_000 if args.quick else 1_000_000
    short_repeats, long_repeats = (10, 3) if args.quick else (30, 5)
    tmp = Path(tempfile.mkdtemp(prefix="sparkbus-bench-query-"))
    cluster: Cluster | None = None
    spark = None
    try:
        path = str(tmp / "t.parquet")
        pq.write_table(generate(rows), path)
        cluster = Cluster(path)
        assert cluster.rows == rows, (cluster.rows, rows)
        spark = spark_session()
        df = spark.read.parquet(path).cache()
        assert df.count() == rows
        df.createOrReplaceTempView("t")
        results = []
        for name, text, short in QUERIES:
            reps = short_repeats if short else long_repeats
            ours = cluster.sql(text)
            theirs = spark.sql(text).toArrow()
            bus_ms = p50_ms(lambda text=text: cluster.sql(text), reps)  # type: ignore[union-attr]
            spark_ms = p50_ms(lambda text=text: spark.sql(text).toArrow(), reps)
            collect_ms = p50_ms(lambda text=text: spark.sql(text).collect(), reps)
            results.append(
                {
                    "name": name,
                    "sql": text,
                    "short": short,
                    "rows": ours.num_rows,
                    "repeats": reps,
                    "sparkbus_p50_ms": round(bus_ms, 3),
                    "spark_p50_ms": round(spark_ms, 3),
                    "spark_collect_p50_ms": round(collect_ms, 3),
                    "speedup": round(spark_ms / bus_ms, 2),
                    "results_match": same(ours, theirs),
                }
            )
        min_speedup = min(r["speedup"] for r in results if r["short"])
        write(
            args.out,
            "query",
            {"rows": rows, "participants": len(PARTS), "queries": results, "min_speedup": min_speedup},
            args.quick,
        )
        print(
            table(
                [
                    (
                        r["name"],
                        str(r["rows"]),
                        f"{r['sparkbus_p50_ms']:.2f}",
                        f"{r['spark_p50_ms']:.2f}",
                        f"{r['spark_collect_p50_ms']:.2f}",
                        f"{r['speedup']:.1f}x",
                        str(r["results_match"]),
                    )
                    for r in results
                ],
                (
                    "query",
                    "rows",
                    "sparkbus p50 ms",
                    "spark toArrow p50 ms",
                    "spark collect p50 ms",
                    "speedup",
                    "match",
                ),
            )
        )
        print(f"rows {rows}, min speedup over short queries: {min_speedup:.1f}x (goal >= 20)")
    finally:
        if spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
