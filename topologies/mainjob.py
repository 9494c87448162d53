"""``sparkbus run``: the main job. Spark loads a table into replicated sparkbus nodes, both engines query it.

Phases, in order (``phases_s`` of the report; docs/MAIN_JOB.md explains each figure):

1. ``spark_start``: the embedded SparkSession of the topology.
2. ``data``: the events table, generated (``event_id, user_id, kind, value, ts``) or read from Parquet/CSV
   and checked (``mainjob_data``); cached in Spark and counted (which fills the cache), then ``toArrow()``
   of the cached DataFrame is timed as the load baseline.
3. ``spark_queries``: the reference queries on Spark SQL (before the nodes take every task slot).
4. ``python_workers``: one Python task per executor node starts Spark's Python workers and imports what
   the nodes run (``SparkRuntime.warm_workers``); Spark keeps them (``spark.python.worker.reuse``) for
   the barrier tasks of the load, as the baseline's cache is filled before it is timed.
5. ``load``: the topology starts on Spark (``SparkRuntime``). Spark hands every row to the executor node
   that leads its partition (the barrier tasks pass each other the rows, see ``RoutedFrame``); each node
   writes its rows as leader writes and replication copies the segments to the followers. The load is
   over when the ``sparkbus_replicas`` catalog table says every row is written and every partition
   replicated.
6. ``sparkbus_queries``: the same queries on sparkbus, through the coordinator's query role: results
   compared with Spark's, p50 latencies.
7. ``view``: the events go into the compute controller, a view is created, more rows are written, and
   each peek must reflect them.
8. ``exchange``: one query run with each exchange (push streams, BinX, HTTP), the same rows from each,
   and its participant output moved by each alone (``mainjob_exchange``).

Once the nodes run, everything talks to the cluster through the thin client: ``ClientCluster`` is
``sparkbus.connect`` to the coordinator's control endpoint (its ``client.gateway`` role routes SQL to
the query role, table writes, views and peeks to the compute controller), exactly as user code would.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from sparkbus.bus import security
from sparkbus.topologies.busnode import BusNodeFactory, bus_config
from sparkbus.topologies.keys import key_dir
from sparkbus.topologies.mainjob_report import (
    QueryResult,
    build_report,
    compare_runs,
    print_summary,
    same_value,
    write_chart,
    write_json,
)
from sparkbus.topologies.model import Topology
from sparkbus.topologies.partitioning import partition_of

if TYPE_CHECKING:
    from sparkbus.topologies.client import Client, ClientCurve

TABLE = "events"
KEY = "event_id"
REQUIRED = ("user_id", "kind", "value", "ts")
KINDS = ("view", "click", "cart", "purchase", "share")
VIEW = "events_by_kind"
WRITTEN_ROWS = 1000
WRITE_ROUNDS = 10


@dataclass(frozen=True, kw_only=True)
class RefQuery:
    name: str
    sql: str
    ordered: bool


QUERIES = (
    RefQuery(
        name="point filter + count",
        sql="SELECT COUNT(*) AS n, SUM(value) AS total FROM events WHERE user_id = 42",
        ordered=False,
    ),
    RefQuery(
        name="group-by aggregate",
        sql="SELECT kind, COUNT(*) AS n, SUM(value) AS total, AVG(value) AS mean FROM events GROUP BY kind",
        ordered=False,
    ),
    RefQuery(
        name="top-k",
        sql="SELECT user_id, SUM(value) AS total FROM events GROUP BY user_id "
        "ORDER BY total DESC, user_id LIMIT 10",
        ordered=True,
    ),
    RefQuery(
        name="filter + projection",
        sql="SELECT event_id, user_id, value FROM events WHERE kind = 'purchase' AND value >= 950",
        ordered=False,
    ),
    RefQuery(
        name="count distinct",
        sql="SELECT COUNT(DISTINCT user_id) AS users FROM events WHERE kind = 'click'",
        ordered=False,
    ),
)
#: the query whose participant output the exchange comparison moves
EXCHANGE_QUERY = "filter + projection"


class JobError(Exception):
    """A problem the user can fix (bad input, missing Java, a port): printed as one line."""


@dataclass(frozen=True, kw_only=True)
class Options:
    topology: Path
    rows: int = 1_000_000
    data: Path | None = None
    report: Path = Path("sparkbus-report.json")
    chart: Path = Path("sparkbus-report.png")
    sparkbus_reps: int = 20
    spark_reps: int = 5


# ---------------------------------------------------------------- the cluster, as the job sees it


class Cluster(Protocol):
    """What the main job needs from a running cluster."""

    def sql(self, text: str, *, timeout: float = 60.0, exchange: str | None = None) -> pa.Table: ...

    def create_table(self, name: str, schema: pa.Schema) -> None: ...

    def write(self, table: str, rows: pa.Table) -> int: ...

    def create_view(self, name: str, view: Any) -> None: ...

    def peek(self, view: str) -> pa.Table: ...

    def status(self) -> dict[str, Any]: ...


class ClientCluster:
    """``Cluster`` over the thin client (``sparkbus.connect``) connected to a node running
    ``client.gateway``, ``query`` and ``compute.controller`` (the coordinator)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @classmethod
    def connect(cls, address: str, cluster_tag: str, **kw: Any) -> ClientCluster:
        from sparkbus.topologies.client import connect  # noqa: PLC0415

        return cls(connect(address, cluster_tag=cluster_tag, **kw))

    def sql(self, text: str, *, timeout: float = 60.0, exchange: str | None = None) -> pa.Table:
        """``text``'s result; ``exchange`` picks the query's exchange (the query role's default when None)."""
        return self.client.sql(text, timeout=timeout, exchange=exchange)

    def create_table(self, name: str, schema: pa.Schema) -> None:
        self.client.create_table(name, schema)

    def write(self, table: str, rows: pa.Table) -> int:
        return self.client.write_table(table, rows)

    def create_view(self, name: str, view: Any) -> None:
        self.client.create_view(name, view)

    def peek(self, view: str) -> pa.Table:
        return self.client.peek(view)

    def status(self) -> dict[str, Any]:
        return self.client.status()

    def close(self) -> None:
        self.client.close()


def client_keys(topo: Topology, address: str, coordinator: str) -> ClientCurve | None:
    """The job's CURVE keys for the coordinator at ``address`` (None when the topology is plain): a
    ``client`` or shared ``cluster`` pair of the key directory, else the coordinator's own pair (the job
    runs in the coordinator's process, so it may speak with its key)."""
    from sparkbus.topologies.client import ClientCurve  # noqa: PLC0415

    where = key_dir(topo)
    if where is None:
        return None
    return ClientCurve.from_key_dir(where, nodes={address: coordinator}, fallback_names=(coordinator,))


# ---------------------------------------------------------------- data


def check_topology(topo: Topology) -> tuple[int, int, int]:
    """(executor nodes, partitions, replication) of the events table; JobError when the job cannot run."""
    if topo.spark is None:
        raise JobError(f"{topo.source}: sparkbus run needs a topology with a [spark] section")
    table = next((t for t in topo.tables if t.name == TABLE), None)
    if table is None or tuple(table.key) != (KEY,):
        raise JobError(f'{topo.source}: sparkbus run needs [tables.{TABLE}] with key = "{KEY}"')
    executors = [nid for nid, _ in topo.placed("executor")]
    if topo.hosting("replication") != executors or not executors:
        raise JobError(
            f"{topo.source}: sparkbus run needs every executor node, and only those, to run replication"
        )
    if table.partitions % len(executors):
        raise JobError(
            f"{topo.source}: tables.{TABLE}.partitions ({table.partitions}) must be a multiple of the "
            f"{len(executors)} executor nodes, so Spark can route each row to its partition's leader"
        )
    if not any(set(spec.roles) >= _COORDINATOR_ROLES for _, spec in topo.placed("driver")):
        raise JobError(
            f"{topo.source}: sparkbus run needs a driver node running {', '.join(sorted(_COORDINATOR_ROLES))}"
        )
    # Under CURVE no node serves the plain HTTP exchange: the job runs push and BinX only.
    needed = _EXCHANGE_ROLES - ({"http.client"} if _curve(topo) else set())
    short = [
        f"{spec.name} lacks {', '.join(sorted(needed - set(spec.roles)))}"
        for spec in topo.nodes
        if "query" in spec.roles and not set(spec.roles) >= needed
    ]
    if short:
        # Found now rather than in the last phase, after Spark has loaded and queried everything.
        raise JobError(
            f"{topo.source}: sparkbus run queries with every exchange, so every node running query needs "
            f"{', '.join(sorted(needed))}: {'; '.join(short)}"
        )
    return len(executors), table.partitions, table.replication


def check_keys(topo: Topology) -> None:
    """JobError when this machine lacks a CURVE key the driver's nodes need: each one's pair and every node's
    public key (they connect to all). Found before Spark starts, not when the nodes do, after the data
    phase and Spark's queries."""
    where = key_dir(topo)
    if where is None:
        return
    try:
        for nid, _ in topo.placed("driver"):
            security.node_keys(where, nid)
        for nid in topo.node_ids():
            security.server_key(where, nid)
    except security.MissingKey as exc:
        raise JobError(f"{topo.source}: {exc}") from None


def spark_start_failure(exc: Exception, master: str) -> str:
    """What starting Spark raised, as one line naming the master. For a Py4J error that is the Java
    exception's line (with its root cause when it has one), not Py4J's own first line ("An error occurred
    while calling None.org.apache.spark.sql.classic.SparkSession."), which says nothing of the cause."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    java = next((line.removeprefix(": ") for line in lines[1:] if line.startswith(": ")), None)
    text = java or (lines[0] if lines else type(exc).__name__)
    root = next((line for line in reversed(lines) if line.startswith("Caused by: ")), None)
    if java is not None and root is not None:
        text += f"; caused by {root.removeprefix('Caused by: ')}"
    return f"Spark did not start (master {master}): {text}"


def check_outputs(opts: Options) -> None:
    """JobError when the report or the chart cannot be written where ``opts`` says: found before Spark
    starts, not after the whole job has run."""
    for what, target in (("report", opts.report), ("chart", opts.chart)):
        if not target.parent.is_dir():
            raise JobError(f"--report {opts.report}: directory {target.parent} does not exist")
        if target.is_dir():
            raise JobError(f"--report {opts.report}: the {what} {target} is a directory")
        if not os.access(target.parent, os.W_OK):
            raise JobError(f"--report {opts.report}: directory {target.parent} is not writable")
    if opts.report.resolve() == opts.chart.resolve():
        raise JobError(
            f"--report {opts.report}: the PNG chart would overwrite the report; give the report another "
            "name (such as report.json)"
        )
    _check_not_an_input(opts)


def _check_not_an_input(opts: Options) -> None:
    """JobError when the report or the chart would land on one of the job's inputs: the topology file, the
    ``--data`` file, or inside the ``--data`` directory (Spark would read it as data the next time)."""
    topology = opts.topology.resolve()
    data = opts.data.resolve() if opts.data is not None else None
    for what, target in (("report", opts.report), ("chart", opts.chart)):
        where = target.resolve()
        if where == topology:
            raise JobError(f"--report {opts.report}: the {what} would overwrite the topology {opts.topology}")
        if data is not None and where == data:
            raise JobError(f"--report {opts.report}: the {what} would overwrite the --data file {opts.data}")
        if data is not None and data.is_dir() and where.is_relative_to(data):
            raise JobError(
                f"--report {opts.report}: the {what} would be written inside the --data directory {opts.data}"
            )


#: what the driver node the job connects to runs: the thin client's gateway and the roles it routes to
_COORDINATOR_ROLES = frozenset({"client.gateway", "query", "compute.controller"})
#: what a query's participants run to exchange rows with BinX and HTTP (docs/QUERY.md, Exchanges)
_EXCHANGE_ROLES = frozenset({"binx.server", "binx.client", "http.client"})


def _curve(topo: Topology) -> bool:
    return topo.bus.security.mode == "curve"


def _coordinator(topo: Topology) -> str:
    return next(nid for nid, spec in topo.placed("driver") if set(spec.roles) >= _COORDINATOR_ROLES)


class RoutedFrame:
    """The data handed to ``SparkRuntime``: each row goes to the executor node leading its partition.

    The layout (``layout_for``) puts partition ``p`` of the table on node ``p % n`` as leader, and the row's
    partition is ``pmod(hash(key), partitions)`` (Spark's Murmur3 ``hash``). ``repartition(n)`` answers
    ``SparkRuntime`` with the cached frame cut into ``n`` partitions without a shuffle (``coalesce``), and
    ``router`` (a ``KeyRouter``) works out each row's partition in the barrier task, with NumPy
    (``sparkbus.topologies.partitioning``, the same hash as Spark's): it names the partition
    (``_sb_partition``, which the node checks it leads) and hands each row to its leader's task
    (``SparkRuntime``'s row exchange). Spark only converts the cached rows to Arrow: a hash and a string
    per row as Spark expressions cost the first run of the load plan more than the whole task-side work.
    Spark's own shuffle (``repartition(n, key)``, whose hash partition is that same leader) writes every
    row to disk and reads it back in a stage of its own; ``exchange=False`` has it route the rows instead
    (the tasks then only add the partition name). In a CURVE topology the exchange speaks CURVE with the
    nodes' key pairs, as the bus does.
    """

    def __init__(self, frame: Any, partitions: int, *, exchange: bool = True) -> None:
        self.frame = frame
        self.partitions = partitions
        self.router = KeyRouter(key=KEY, table=TABLE, partitions=partitions, exchange=exchange)

    def repartition(self, n: int) -> Any:
        from pyspark.sql import functions as F  # noqa: PLC0415

        if not self.router.exchange:
            # Spark's hash partition of the key is pmod(hash(key), n): the leader, as partitions % n == 0.
            return self.frame.repartition(n, F.col(KEY))
        frame = self.frame
        # A barrier stage has one task per partition: fewer input partitions than nodes need a shuffle.
        return frame.coalesce(n) if frame.rdd.getNumPartitions() >= n else frame.repartition(n)


@dataclass(frozen=True, kw_only=True)
class KeyRouter:
    """A ``RowRouter``: adds each row's partition name of ``table`` (``_sb_partition``, a dictionary
    column) from ``pmod(hash(key), partitions)``, and with ``exchange`` names its leader's task
    (``partition % tasks``, as ``layout_for`` places leaders)."""

    key: str
    table: str
    partitions: int
    exchange: bool = True

    def __call__(self, batch: pa.RecordBatch, tasks: int) -> tuple[pa.RecordBatch, Any]:
        from sparkbus.roles.replication import PARTITION_COLUMN  # noqa: PLC0415

        index = partition_of(pa.Table.from_batches([batch]), [self.key], self.partitions)
        names = pa.array([f"{self.table}/{p}" for p in range(self.partitions)], pa.string())
        column = pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), names)
        rows = batch.append_column(PARTITION_COLUMN, column)
        return rows, (index % tasks if self.exchange else None)


def written_rows(first_id: int, count: int, users: int) -> pa.Table:
    """``count`` new events with ids from ``first_id`` (the rows the view phase writes)."""
    ids = list(range(first_id, first_id + count))
    return pa.table(
        {
            KEY: pa.array(ids, pa.int64()),
            "user_id": pa.array([i % max(1, users) for i in ids], pa.int64()),
            "kind": pa.array([KINDS[i % len(KINDS)] for i in ids], pa.string()),
            "value": pa.array([float(i % 1000) for i in ids], pa.float64()),
            "ts": pa.array([1_700_000_000_000_000 + i * 1_000_000 for i in ids], pa.timestamp("us")),
        }
    )


# ---------------------------------------------------------------- timing


def _timed(fn: Callable[[], Any], reps: int, warmup: int = 1) -> tuple[list[Any], list[float]]:
    """Every result of ``warmup`` untimed then ``reps`` timed calls of ``fn``, and the timed calls' ms."""
    results = [fn() for _ in range(warmup)]
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        results.append(fn())
        samples.append((time.perf_counter() - t0) * 1e3)
    return results, samples


def _commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


@contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases[f"{name}"] = time.perf_counter() - t0


def _check_java() -> None:
    """JobError unless Spark's launcher will find Java: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set (it
    then ignores PATH, as ``spark-class`` does), else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not (java.is_file() and os.access(java, os.X_OK)):
            raise JobError(
                f"JAVA_HOME is {home}, which has no bin/java; Spark runs $JAVA_HOME/bin/java when JAVA_HOME is "
                "set: point it at a Java 17 installation, or unset it to use java on PATH"
            )
    elif shutil.which("java") is None:
        raise JobError("Java not found: Spark needs Java 17 (install it, or set JAVA_HOME)")


# ---------------------------------------------------------------- the phases


def _load(
    rows: int,
    partitions: int,
    console: Console,
    runtime_start: Callable[[], Cluster],
    marks: dict[str, float] | None = None,
) -> tuple[float, Cluster]:
    """Start the runtime, connect, and wait until every row is written and replicated; returns the seconds
    and the connected cluster. ``marks`` gets the seconds to ``job:connected``, ``job:rows_written`` and
    ``job:replicated`` (as the job saw them, polling) and the number of ``job:polls``."""
    from sparkbus.roles.replication import REPLICAS_TABLE  # noqa: PLC0415

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
        TimeElapsedColumn(),
    ]
    t0 = time.perf_counter()
    with Progress(SpinnerColumn(), *columns, console=console, transient=False) as progress:
        start = progress.add_task("Spark: route rows to their leaders, start nodes", total=1)
        cluster = runtime_start()
        marks = {} if marks is None else marks
        marks["job:connected"] = round(time.perf_counter() - t0, 3)
        polls = 0
        progress.update(start, completed=1)
        loaded = progress.add_task("rows written on leaders", total=rows)
        replicated = progress.add_task("partitions replicated", total=partitions)
        while True:
            status = cluster.sql(
                f"SELECT node, partition, leader, loaded, pending, replicated, error FROM {REPLICAS_TABLE}"
            )
            errors = sorted({e for e in status.column("error").to_pylist() if e})
            if errors:
                raise JobError(errors[0])
            done_rows = int(pc.sum(status.column("loaded")).as_py() or 0)
            ours = pc.starts_with(status.column("partition"), f"{TABLE}/")
            leaders = status.filter(pc.and_(ours, pc.equal(status.column("leader"), 1)))
            repl = int(pc.sum(leaders.column("replicated")).as_py() or 0)
            pending = int(pc.sum(status.column("pending")).as_py() or 0)
            progress.update(loaded, completed=done_rows)
            progress.update(replicated, completed=repl)
            polls += 1
            marks["job:polls"] = polls
            if pending == 0 and done_rows >= rows:
                marks.setdefault("job:rows_written", round(time.perf_counter() - t0, 3))
            if pending == 0 and done_rows >= rows and repl >= partitions and leaders.num_rows >= partitions:
                break
            if time.perf_counter() - t0 > 600:
                raise JobError("the load did not finish within 600 s")
            time.sleep(0.02)  # the nodes report ready once their rows are in: the wait left is short
    marks["job:replicated"] = round(time.perf_counter() - t0, 3)
    return time.perf_counter() - t0, cluster


def _spinner(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True)


def _spark_sql(spark: Any, text: str) -> pa.Table:
    result: pa.Table = spark.sql(text).toArrow()
    return result


def _spark_queries(spark: Any, opts: Options, console: Console) -> dict[str, tuple[pa.Table, list[float]]]:
    """Every reference query on Spark SQL (cached table): the result and the timings.

    Runs before the sparkbus nodes start: they hold every task slot of the session while they run (one
    barrier task each), so a Spark SQL query would wait for them; and neither engine shares the CPU.
    """
    out = {}
    with _spinner(console) as progress:
        task = progress.add_task("Spark SQL")
        for q in QUERIES:
            progress.update(task, description=f"Spark SQL: {q.name}")
            results, ms = _timed(partial(_spark_sql, spark, q.sql), opts.spark_reps, warmup=1)
            out[q.name] = results[-1], ms
    return out


def _sparkbus_queries(
    cluster: Cluster, theirs: dict[str, tuple[pa.Table, list[float]]], opts: Options, console: Console
) -> list[QueryResult]:
    results = []
    with _spinner(console) as progress:
        task = progress.add_task("sparkbus")
        for q in QUERIES:
            progress.update(task, description=f"sparkbus: {q.name}")
            runs, ours_ms = _timed(partial(cluster.sql, q.sql), opts.sparkbus_reps, warmup=2)
            spark_table, spark_ms = theirs[q.name]
            # Every run, warm-ups included: a wrong answer in any of them is a wrong answer.
            match, detail = compare_runs(runs, spark_table, ordered=q.ordered)
            ours = runs[-1]
            results.append(
                QueryResult(
                    name=q.name,
                    sql=q.sql,
                    ordered=q.ordered,
                    match=match,
                    detail=detail,
                    rows=ours.num_rows,
                    sparkbus_ms=ours_ms,
                    spark_ms=spark_ms,
                )
            )
    return results


def _by_kind(table: pa.Table, count: str, total: str) -> dict[str | None, tuple[int, float | None]]:
    return {
        k: (int(n), s)
        for k, n, s in zip(
            table.column("kind").to_pylist(),
            table.column(count).to_pylist(),
            table.column(total).to_pylist(),
            strict=True,
        )
    }


def _expected_by_kind(table: pa.Table) -> dict[str | None, tuple[int, float | None]]:
    """What the view must hold for ``table``, as Spark SQL would: COUNT(*) of every group (a null ``kind``
    is a group, its rows counted), and SUM(value) null in a group whose values are all null."""
    grouped = table.group_by("kind").aggregate([([], "count_all"), ("value", "sum")])
    return _by_kind(grouped, "count_all", "value_sum")


def _view_matches(peeked: pa.Table, expected: dict[str | None, tuple[int, float | None]]) -> bool:
    got = _by_kind(peeked, "n", "total")
    return set(got) == set(expected) and all(
        got[k][0] == expected[k][0] and same_value(got[k][1], expected[k][1]) for k in got
    )


def events_view() -> Any:
    """The view the job creates: ``SELECT kind, COUNT(*) AS n, SUM(value) AS total FROM events GROUP BY
    kind`` (a ``ViewDef``)."""
    from sparkbus.roles.compute import Aggregate, ViewDef  # noqa: PLC0415

    return ViewDef(
        source=TABLE,
        group_by=("kind",),
        aggregates=(
            Aggregate(func="count", column=None, name="n"),
            Aggregate(func="sum", column="value", name="total"),
        ),
    )


def _view(cluster: Cluster, events: pa.Table, rows: int) -> dict[str, Any]:
    """Events into the compute controller, a view, more writes, and a peek after each."""
    t0 = time.perf_counter()
    cluster.create_table(TABLE, events.schema)
    for batch in events.to_batches(max_chunksize=131_072):
        cluster.write(TABLE, pa.Table.from_batches([batch]))
    fed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cluster.create_view(VIEW, events_view())
    first = cluster.peek(VIEW)
    create_s = time.perf_counter() - t0
    fresh = _view_matches(first, _expected_by_kind(events))
    users = max(1, rows // 100)
    per_round = max(1, WRITTEN_ROWS // WRITE_ROUNDS)
    seen = events
    latencies = []
    for i in range(WRITE_ROUNDS):
        new = written_rows(rows + i * per_round, per_round, users).cast(events.schema)
        t0 = time.perf_counter()
        cluster.write(TABLE, new)
        peeked = cluster.peek(VIEW)
        latencies.append((time.perf_counter() - t0) * 1e3)
        seen = pa.concat_tables([seen, new])
        fresh = fresh and _view_matches(peeked, _expected_by_kind(seen))
    return {
        "name": VIEW,
        "definition": "SELECT kind, COUNT(*) AS n, SUM(value) AS total FROM events GROUP BY kind",
        "fed_rows": events.num_rows,
        "feed_s": round(fed_s, 3),
        "create_and_first_peek_s": round(create_s, 3),
        "written_rows": per_round * WRITE_ROUNDS,
        "write_rounds": WRITE_ROUNDS,
        "rows_after_writes": seen.num_rows,
        "write_to_peek_p50_ms": round(statistics.median(latencies), 3),
        "fresh": fresh,
    }


def run_job(opts: Options, console: Console) -> dict[str, Any]:
    """Run every phase; returns the report (also written to ``opts.report`` and charted to ``opts.chart``)."""
    from sparkbus.topologies.schema import load  # noqa: PLC0415

    if opts.rows <= 0 and opts.data is None:
        raise JobError(f"--rows must be a positive number of rows, got {opts.rows}")
    topo = load(opts.topology)
    executors, partitions, replication = check_topology(topo)
    check_keys(topo)
    if opts.data is not None and not opts.data.exists():
        raise JobError(f"--data {opts.data}: no such file or directory")
    check_outputs(opts)
    _check_java()

    from sparkbus.roles.client import ClientError  # noqa: PLC0415
    from sparkbus.topologies.mainjob_data import events as events_frame  # noqa: PLC0415
    from sparkbus.topologies.mainjob_exchange import (  # noqa: PLC0415
        HTTP_NOT_RUN,
        compare_exchanges,
        query_per_exchange,
    )
    from sparkbus.topologies.spark import SparkRuntime, SparkRuntimeError, embedded_session  # noqa: PLC0415

    phases: dict[str, float] = {}
    wall = time.perf_counter()
    # The nodes keep their replicas in SparkRuntime's data directory of this start, which it removes.
    spark = None
    try:
        with _phase(phases, "spark_start"):
            console.print(
                f"[bold]sparkbus run[/bold]: {topo.source} on Spark {topo.spark.master if topo.spark else ''}"
            )
            try:
                spark = embedded_session(
                    topo, **{"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}
                )
            except Exception as exc:
                raise JobError(spark_start_failure(exc, topo.spark.master if topo.spark else "")) from None
            spark.sparkContext.setLogLevel("ERROR")
        with _phase(phases, "data"):
            # Both engines, and the toArrow() baseline, read the same cached rows.
            frame, rows = events_frame(spark, opts)
            frame.createOrReplaceTempView(TABLE)
            t0 = time.perf_counter()
            events = frame.toArrow()
            toarrow_s = time.perf_counter() - t0
        with _phase(phases, "spark_queries"):
            theirs = _spark_queries(spark, opts, console)
        runtime = SparkRuntime(
            topo,
            spark,
            BusNodeFactory(),
            data=RoutedFrame(frame, partitions),
            ready_timeout=max(60.0, rows / 10_000),
        )
        coordinator = _coordinator(topo)
        clusters: list[ClientCluster] = []

        def start() -> Cluster:
            runtime.start()
            address = runtime.endpoints[coordinator].control
            cluster = ClientCluster.connect(
                address,
                bus_config(topo).cluster_tag,
                curve=client_keys(topo, address, coordinator),
                connect_timeout=30.0,
            )
            clusters.append(cluster)
            return cluster

        stopped = False
        try:
            load_marks: dict[str, float] = {}
            with _phase(phases, "python_workers"):
                console.print("Spark: starting the executors' Python workers")
                workers = runtime.warm_workers()
            with _phase(phases, "load"):
                load_s, cluster = _load(rows, partitions, console, start, load_marks)
            start_s = runtime.rendezvous_seconds or 0.0
            count = cluster.sql(f"SELECT COUNT(*) AS n FROM {TABLE}").column("n")[0].as_py()
            if count != rows:
                raise JobError(f"sparkbus holds {count} rows after the load, Spark produced {rows}")
            with _phase(phases, "sparkbus_queries"):
                results = _sparkbus_queries(cluster, theirs, opts, console)
            with _phase(phases, "view"):
                console.print("view: feeding the compute controller, creating the view, writing more rows")
                view = _view(cluster, events, rows)
            with _phase(phases, "exchange"):
                curve = _curve(topo)
                console.print(
                    f"exchange: running '{EXCHANGE_QUERY}' with push and BinX; HTTP {HTTP_NOT_RUN}"
                    if curve
                    else f"exchange: running '{EXCHANGE_QUERY}' with push, BinX and HTTP"
                )
                ex_query = next(q for q in QUERIES if q.name == EXCHANGE_QUERY)
                exchange = {
                    "query": ex_query.name,
                    **compare_exchanges(cluster.sql(ex_query.sql), bus_config(topo)),
                    **query_per_exchange(cluster, ex_query.sql, curve=curve),
                }
                if not exchange["query_results_match"]:
                    raise JobError(
                        f"'{EXCHANGE_QUERY}' gave different rows by exchange: {exchange['query_mismatch']}"
                    )
            for c in clusters:
                c.close()
            clusters.clear()
            stopped = True
            runtime.stop()
        except SparkRuntimeError as exc:
            raise JobError(str(exc).splitlines()[0]) from None
        except ClientError as exc:
            raise JobError(f"the thin client: {str(exc).splitlines()[0]}") from None
        finally:
            for c in clusters:
                c.close()
            if not stopped:
                with suppress(Exception):  # the failure being raised is the one to report
                    runtime.stop(timeout=30)
    finally:
        if spark is not None:
            # Under a failure or a signal being raised, Spark may be going down too: its error here would
            # replace the one to report.
            with suppress(Exception) if sys.exc_info()[0] is not None else nullcontext():
                spark.catalog.clearCache()
    phases["total"] = time.perf_counter() - wall
    load_info = {
        "seconds": round(load_s, 3),
        "start_seconds": round(start_s, 3),
        "rows_per_s": round(rows / load_s, 1),
        "toarrow_seconds": round(toarrow_s, 3),
        "toarrow_rows_per_s": round(rows / toarrow_s, 1),
        "load_vs_toarrow": round((rows / load_s) / (rows / toarrow_s), 3),
        "executor_nodes": executors,
        "partitions": partitions,
        "replication": replication,
        "status_polls": int(load_marks.pop("job:polls", 0)),
        "python_workers": workers,
        "timeline_s": dict(sorted({**runtime.timeline, **load_marks}.items(), key=lambda kv: kv[1])),
        "what": "from SparkRuntime.start() (Spark computes and routes the rows, nodes start) until every row is "
        "written on its leader and every partition's segments are acked by its followers",
    }
    report = build_report(
        rows=rows,
        topology=str(topo.source),
        commit=_commit(),
        phases=phases,
        queries=results,
        load=load_info,
        view=view,
        exchange=exchange,
    )
    write_json(report, opts.report)
    write_chart(report, opts.chart)
    return report


def _stopped(by: signal.Signals) -> int:
    print(f"sparkbus run: stopped by {by.name}; nodes stopped, temporary data removed", file=sys.stderr)
    return 128 + by


class _Terminated(BaseException):
    """SIGTERM while the job runs: unwinds ``run_job`` through the cleanup of every phase (nodes stopped,
    the nodes' data directory removed), which the signal's default action would skip."""


#: the signal that is stopping the job, once one came: PySpark's own cleanup may replace the exception the
#: signal raised (a Py4J error from a JVM shutting down too), and the job still ended by that signal
_stopping: list[signal.Signals] = []


def _ignore_more() -> None:
    """Once a signal stops the job, a second one (Ctrl-C pressed twice, SIGTERM during Ctrl-C's cleanup or
    the other way round) must not cut the cleanup short: both are ignored until ``main_job`` restores them.
    SIGINT is touched only where it is ours (a run in the background keeps ignoring it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _terminated(_signum: int, _frame: object) -> None:
    _ignore_more()
    _stopping.append(signal.SIGTERM)
    raise _Terminated


def _interrupted(_signum: int, _frame: object) -> None:
    _ignore_more()
    _stopping.append(signal.SIGINT)
    raise KeyboardInterrupt


def main_job(opts: Options, console: Console | None = None) -> int:
    """``sparkbus run``: 0 when every result matches Spark SQL and the view is fresh, 1 otherwise, 128 plus
    the signal's number when SIGINT (Ctrl-C) or SIGTERM stops it."""
    console = console or Console()
    _stopping.clear()
    previous = signal.signal(signal.SIGTERM, _terminated)
    # Ctrl-C is noted only where Python turns it into KeyboardInterrupt: a run started in the background
    # of a non-interactive shell ignores SIGINT and goes on doing so.
    int_default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if int_default:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        report = run_job(opts, console)
    except Exception as exc:
        if _stopping:  # the signal's exception was replaced on its way out (by PySpark's cleanup)
            return _stopped(_stopping[0])
        if isinstance(exc, JobError):
            print(f"sparkbus run: {exc}", file=sys.stderr)  # one line, never wrapped
            return 1
        raise
    except (KeyboardInterrupt, _Terminated) as exc:
        if _stopping:  # the first signal stops the job, whichever exception reached here
            return _stopped(_stopping[0])
        return _stopped(signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if int_default:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    print_summary(report, console)
    console.print(f"report: {opts.report}\nchart:  {opts.chart}", markup=False, highlight=False)
    return 0 if report["all_results_match"] and report["view"]["fresh"] else 1
