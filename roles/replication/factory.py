"""The ``replication`` factory: a layout from the topology's tables, stores on disk, rows published to queries.

``layout_for`` assigns every partition of every ``[tables.<name>]`` entry to the nodes that run
``replication``, deterministically, so every node computes the same layout from the same file:

* the nodes are those running ``replication``, in file order (``store-0``, ``store-1``, ...);
* partition ``p`` of a table is ``"<table>/<p>"``; its replicas are ``nodes[(p + j) % n]`` for
  ``j = 0 .. replication - 1``: replica 0 is the designated leader (round-robin over the nodes), the
  next ones its followers;
* placement ids count up from 1 over (table in file order, partition, replica), so they are unique on
  every node (segment ids start with the placement id).

``make_role`` builds a ``ServingReplication``: the replication role plus two duties of a node that
serves a table:

* it loads the node's local data: given whole when the role is built (``RoleContext.local_data``), or
  as it arrives once the node runs, with the local call ``local_rows`` (``LOCAL_ROWS``: args ``batches``,
  record batches, and ``last``, true on the call after which no more rows come). The Spark runtime uses
  the call: it starts the node first and hands it the task's input while Spark still sends it, so the
  node's handshakes and its first writes overlap the transfer. Each row must carry ``_sb_partition``,
  the name of the partition it belongs to (``"events/3"``), and the node must be that partition's
  designated leader: Spark routes rows so (``sparkbus run``). Rows gather per partition into chunks of
  ``LOAD_CHUNK_ROWS``; each chunk is a leader write (logged, then flushed into a segment), one per loop
  turn so the node keeps answering its peers, and replication sends the segments to the followers;
* it publishes, in the node's catalog, each table (the rows of the partitions this node currently
  leads, so that a query over all nodes sees every row exactly once; a partition whose rows must be read
  again from its segments is read in steps over loop turns, ``serving.py``) and ``sparkbus_replicas``, one row
  per local replica (rows, loaded, pending, replicated, error, failing, and on a leader's row unacked: the
  nodes of its other replicas that have not acked all its segments), which the driver and ``sparkbus load``
  query to follow a load.

Replicas live in ``$SPARKBUS_DATA_DIR/<cluster>/<node>``, one directory per node that a restarted node opens
again (``NodeData``); without the variable, in a new temporary directory per start, which a restart does not
find and the node removes when it stops.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.bus.contract import Action, Event, LocalCall, Reply, SetTimer, TimerFired
from sparkbus.roles.replication.layout import Layout, Lifecycle, PartitionSpec, Replica
from sparkbus.roles.replication.local import LocalReplica, ReplicationConfig
from sparkbus.roles.replication.role import ReplicationRole
from sparkbus.roles.replication.serving import BUILD_TIMER, INLINE_ROWS, STEP_GAP, STEP_ROWS, Serving
from sparkbus.roles.replication.storage import DiskStorage, SimulatedCrash
from sparkbus.roles.replication.store import MANIFEST, StoreConfig

#: the column that tells a node which partition a row of its local data belongs to (dropped on write)
PARTITION_COLUMN = "_sb_partition"
#: the catalog table describing every local replica
REPLICAS_TABLE = "sparkbus_replicas"
#: rows written per loop turn while loading local data
LOAD_CHUNK_ROWS = 65_536
#: the local call that hands the role more of its local data once the node runs (module docstring)
LOCAL_ROWS = "local_rows"
LOAD_TIMER = "replication/load"
DATA_DIR_ENV = "SPARKBUS_DATA_DIR"

_REPLICAS_SCHEMA = pa.schema(
    [
        ("node", pa.string()),
        ("partition", pa.string()),
        ("leader", pa.int64()),
        ("rows", pa.int64()),
        ("loaded", pa.int64()),
        ("pending", pa.int64()),
        ("replicated", pa.int64()),
        ("error", pa.string()),
        ("failing", pa.string()),
        ("unacked", pa.string()),
    ]
)


def partition_name(table: str, index: int) -> str:
    return f"{table}/{index}"


def layout_for(topology: Any) -> Layout:
    """Every partition of the topology's tables, placed round-robin over the nodes running replication.

    Raises:
        ValueError: a table asks for more replicas than there are replication nodes.
    """
    nodes = list(topology.hosting("replication"))
    specs: list[PartitionSpec] = []
    placement = 0
    for table in topology.tables:
        if table.replication > len(nodes):
            raise ValueError(
                f"table {table.name}: replication {table.replication} needs that many nodes running "
                f"replication, the topology has {len(nodes)}"
            )
        for p in range(table.partitions):
            replicas = []
            for j in range(table.replication):
                placement += 1
                replicas.append(Replica(node=nodes[(p + j) % len(nodes)], placement=placement))
            specs.append(PartitionSpec(partition=partition_name(table.name, p), replicas=tuple(replicas)))
    return Layout.of(specs)


def split_by_partition(rows: pa.Table) -> list[tuple[str, pa.Table]]:
    """``rows`` grouped by ``_sb_partition`` (the column dropped), in partition order; within a partition
    the rows keep their order."""
    if PARTITION_COLUMN not in rows.column_names:
        raise ValueError(
            f"local data has no {PARTITION_COLUMN} column: each row must say which partition it belongs "
            "to (sparkbus run adds it when Spark routes the rows)"
        )
    if rows.num_rows == 0:
        return []
    # One pass to number the partitions, one stable sort of the numbers and one take, instead of a
    # comparison and a filter over every row per partition.
    codes = pc.dictionary_encode(rows.column(PARTITION_COLUMN)).combine_chunks()
    if codes.null_count:
        raise ValueError(f"local data has rows with a null {PARTITION_COLUMN}")
    indices = codes.indices.to_numpy(zero_copy_only=False)
    names = [str(v) for v in codes.dictionary.to_pylist()]
    order = np.argsort(indices, kind="stable")
    counts = np.bincount(indices, minlength=len(names))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    data = rows.drop_columns([PARTITION_COLUMN]).take(pa.array(order))
    # A dictionary column may name partitions no row has (a router's list of every partition).
    return [
        (names[k], data.slice(int(starts[k]), int(counts[k])))
        for k in sorted(range(len(names)), key=names.__getitem__)
        if counts[k]
    ]


class DataDirInUse(RuntimeError):
    """Another live process (or another node object in this one) holds the node's data directory."""


class NodeData:
    """The directory of one node's replicas, and the lock that keeps it to one process.

    With ``$SPARKBUS_DATA_DIR`` set it is ``<that>/<cluster>/<node>``: the same path on every start, so a
    restarted node opens its stores again (recovery: docs/REPLICATION.md). An exclusive ``flock`` on its
    ``LOCK`` file is held until ``close`` (or the process's death, which releases it): two processes
    serving one node's files would corrupt them. Without the variable the directory is a new temporary one, removed by ``close``.

    Calling it gives the ``DiskStorage`` of a partition's replica (``"t/0"`` lives in ``t~0``).

    Raises:
        DataDirInUse: the directory is locked.
    """

    LOCK = "LOCK"

    def __init__(self, node: str, cluster: str, base: str | None) -> None:
        self._lock: IO[bytes] | None = None
        self.temporary = not base
        if not base:
            self.root = Path(tempfile.mkdtemp(prefix=f"{node}-"))
            return
        self.root = Path(base) / cluster / node
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / self.LOCK, "ab")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise DataDirInUse(
                f"node {node}: its data directory {self.root} is in use by another process (or another "
                f"node {node} in this one); two processes must not serve the same replicas"
            ) from None
        self._lock = lock

    def __call__(self, partition: str) -> DiskStorage:
        return DiskStorage(self._dir(partition))

    def held(self, partitions: Iterable[str]) -> list[str]:
        """Those of ``partitions`` with a replica's files here (a manifest), without creating any
        directory: a restarted node drains those its layout no longer places on it."""
        return [p for p in partitions if (self._dir(p) / MANIFEST).exists()]

    def strays(self, partitions: Iterable[str]) -> list[str]:
        """The directories here holding a replica's files (a manifest) of a partition not among
        ``partitions`` (a table or partition the topology no longer has), sorted."""
        known = {self._dir(p).name for p in partitions}
        return sorted(str(d) for d in self.root.iterdir() if d.name not in known and (d / MANIFEST).is_file())

    def _dir(self, partition: str) -> Path:
        return self.root / partition.replace("/", "~")

    def close(self) -> None:
        """Release the lock (idempotent); the files stay for the next start.

        A temporary directory is removed instead: no later start would find it, and each start of a
        node without ``$SPARKBUS_DATA_DIR`` otherwise left its replicas' files behind.
        """
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class ServingReplication(ReplicationRole):
    """The replication role of a node that serves tables: loads its local data, publishes what it leads.

    Args:
        node: this node's name.
        layout: every partition's placement (``layout_for``).
        keys: each table's key columns.
        storage_for: the Storage of a partition replica.
        local_data: rows to load (record batches with ``_sb_partition``).
        catalog: the node's ``TableCatalog``, or None to publish nothing.
        config: role settings (``config.store.key`` is replaced per table by ``keys``).
        inline_rows / step_rows: a led partition's rows are read at once when at most ``inline_rows`` rows
            are to be read from its segments, else ``step_rows`` per loop turn (``serving.py``).
    """

    def __init__(
        self,
        node: str,
        layout: Layout,
        keys: dict[str, tuple[str, ...]],
        storage_for: Any,
        *,
        local_data: tuple[Any, ...] = (),
        catalog: Any = None,
        config: ReplicationConfig | None = None,
        inline_rows: int = INLINE_ROWS,
        step_rows: int = STEP_ROWS,
    ) -> None:
        super().__init__(node, layout, storage_for, config)
        self.keys = keys
        self.local_data = local_data
        self.loading: deque[tuple[str, pa.Table]] = deque()
        #: rows handed over with ``local_rows`` that do not make a whole chunk yet, per partition
        self.gathering: dict[str, list[pa.Table]] = {}
        #: true between the first ``local_rows`` call and the one with ``last``: a partition's chunk
        #: written while more rows may come is not its last, so it is flushed only at the threshold
        self.feeding = False
        self.loaded: dict[str, int] = {}
        self.load_error: str | None = None
        # What queries see: each led partition's rows, read in steps when they take long (serving.py).
        self.serving = Serving(node, inline_rows=inline_rows, step_rows=step_rows)
        self._served = self.serving.rows  # each led partition's rows by its version
        self.publishing = catalog is not None
        # Split before the node starts: done in the first loop turn, it held up the node's handshakes.
        self._prepare_load()
        if catalog is not None:
            for table in keys:
                catalog.publish(
                    table,
                    lambda table=table: self.serve(table),
                    lambda participants, table=table: self.unserved(table, participants),
                    lambda table=table: frozenset(p for p, _ in self._led(table)),
                )
            catalog.publish(REPLICAS_TABLE, self.replicas_table)

    def close(self) -> None:
        """The node stopped: release what the storage holds (``NodeData``'s directory lock)."""
        close = getattr(self.storage_for, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------ placement with per-table keys

    def _host(self, spec: PartitionSpec) -> None:
        with self._keyed(spec):
            super()._host(spec)

    def _resume_drain(self, spec: PartitionSpec) -> None:
        with self._keyed(spec):
            super()._resume_drain(spec)

    @contextmanager
    def _keyed(self, spec: PartitionSpec) -> Iterator[None]:
        """The base role opens every store with config.store; each table has its own key."""
        key = self.keys.get(spec.partition.rsplit("/", 1)[0])
        if key is None:
            yield
            return
        shared = self.config
        self.config = replace(shared, store=replace(shared.store, key=key))
        try:
            yield
        finally:
            self.config = shared

    # ------------------------------------------------------------ loading local data

    #: the local call a runtime uses to hand this role rows after the node started (``BusNodeHandle.feed``)
    local_rows_call = LOCAL_ROWS

    def handle(self, event: Event, now: float) -> list[Action]:
        # A build's step timer is the serving share's alone: the replication procedures need not run.
        building = isinstance(event, TimerFired) and event.key == BUILD_TIMER and not self.loading
        out = [] if building else list(super().handle(event, now))
        self._actions = out
        if self.loading:
            self._load_step(now)
            if self.loading:
                # Just after now: the bus fires a timer set at the time it runs again in the same tick,
                # and the whole load went in one loop turn, no socket read (no heartbeat) until its end.
                out.append(SetTimer(key=LOAD_TIMER, at=now + STEP_GAP))
        if self.publishing or self.serving.builds:
            try:
                out.extend(self.serving.turn(self._led(), now, warm=self.publishing))
            except SimulatedCrash:
                raise
            except Exception as exc:  # counted and logged as the role's own; the node goes on
                self._handler_failed(event, exc)
        return out

    def _prepare_load(self) -> None:
        if self.local_data:
            self._take(self.local_data, last=True)
        self.local_data = ()

    def _on_call(self, call: LocalCall) -> None:
        if call.name == LOCAL_ROWS:
            self._emit(self._on_local_rows(call))
        else:
            super()._on_call(call)

    def _on_local_rows(self, call: LocalCall) -> Reply:
        if self.load_error is not None:
            return Reply(call_id=call.call_id, error=self.load_error)
        try:
            batches = tuple(call.args["batches"])
            last = bool(call.args.get("last", False))
        except (KeyError, TypeError) as exc:
            return Reply(call_id=call.call_id, error=f"{LOCAL_ROWS}: needs batches and last: {exc}")
        self.feeding = not last
        refused = self._take(batches, last=last)
        if refused is not None:
            return Reply(call_id=call.call_id, error=refused)
        return Reply(call_id=call.call_id, result={"rows": sum(b.num_rows for b in batches)})

    def _take(self, batches: tuple[Any, ...], *, last: bool) -> str | None:
        """Gather ``batches`` per partition; queue every whole chunk, and with ``last`` what remains.
        Returns the load error, if the rows were refused."""
        try:
            rows = pa.Table.from_batches(list(batches)) if batches else None
            if rows is not None and rows.num_rows:
                for partition, part in split_by_partition(rows):
                    spec = self.layout.partitions.get(partition)
                    if spec is None:
                        raise ValueError(f"local rows for {partition}, which the layout does not have")
                    if spec.replicas[0].node != self.node:
                        raise ValueError(
                            f"local rows for {partition}, whose designated leader is "
                            f"{spec.replicas[0].node}, not {self.node}: the rows were not routed by partition"
                        )
                    self.gathering.setdefault(partition, []).append(part)
            for partition in sorted(self.gathering):
                parts = self.gathering[partition]
                gathered = sum(p.num_rows for p in parts)
                if not last and gathered < LOAD_CHUNK_ROWS:
                    continue
                # Spark hands the rows over in small Arrow batches (maxRecordsPerBatch, 10,000 rows): write
                # them in chunks of LOAD_CHUNK_ROWS, so each durable (fsync'd) log append carries many.
                chunks = pa.concat_tables(parts).combine_chunks().to_batches(max_chunksize=LOAD_CHUNK_ROWS)
                if not last and chunks[-1].num_rows < LOAD_CHUNK_ROWS:
                    self.gathering[partition] = [pa.Table.from_batches([chunks.pop()])]
                else:
                    del self.gathering[partition]
                for chunk in chunks:
                    self.loading.append((partition, pa.Table.from_batches([chunk])))
        except (ValueError, pa.ArrowInvalid) as exc:
            self.load_error = f"{self.node}: cannot load local data: {exc}"
            self.loading.clear()
            self.gathering.clear()
        return self.load_error

    def _may_compact(self, rep: LocalReplica) -> bool:
        # Each chunk of a load is flushed (``write_flushed``), which would abandon a compaction under way:
        # the partition is compacted once its chunks are written.
        return not any(p == rep.spec.partition for p, _ in self.loading)

    def _load_step(self, now: float) -> None:
        partition, rows = self.loading.popleft()
        rep = self.local.get(partition)
        try:
            if rep is None or not rep.leads:
                raise ValueError(f"{self.node} does not lead {partition}")
            last_chunk = not self.feeding and not any(p == partition for p, _ in self.loading)
            if last_chunk or rep.store.memtable_rows + rows.num_rows >= rep.store.config.flush_rows:
                # A chunk that fills the memtable, or the partition's last one (replication starts at once
                # rather than after flush_age): durable as a segment, without a log record first.
                rep.store.write_flushed(rows, now)
                self._count("flushes")
            else:
                rep.store.write(rows, now)
        except Exception as exc:  # a refused write stops the load and is reported in sparkbus_replicas
            self.load_error = f"{self.node}: writing to {partition} failed: {exc}"
            self.loading.clear()
            self.gathering.clear()
            return
        self.loaded[partition] = self.loaded.get(partition, 0) + rows.num_rows
        self._run_all()

    # ------------------------------------------------------------ what queries see

    def serve(self, table: str) -> pa.Table | None:
        """The rows of ``table`` in the partitions this node leads and serves (None when it serves none).
        Only SERVE replicas: a split's targets in LOAD hold rows their source still serves, and once the
        split is final a source in UNLOAD holds rows its targets serve; served too, they counted twice.

        Each led partition's rows are cached by its version, the table's concatenation too (``Serving``):
        a write to one partition recomputes that partition only. A partition whose chain needs a long read
        is read in steps over loop turns, and meanwhile a query is told to wait.

        Raises:
            SourcePending: a partition's rows are still being read.
        """
        return self.serving.table(table, self._led(table))

    def _led(self, table: str | None = None) -> list[tuple[str, LocalReplica]]:
        """The partitions (of ``table``, or of every table) this node leads and serves, sorted."""
        return sorted(
            (p, rep)
            for p, rep in self.local.items()
            if (p.rsplit("/", 1)[0] == table if table is not None else p.rsplit("/", 1)[0] in self.keys)
            and rep.leads
            and rep.lifecycle == Lifecycle.SERVE
            and rep.store.schema is not None
        )

    def unserved(self, table: str, participants: Sequence[str]) -> str | None:
        """Why, as this node sees it, a query run by ``participants`` may not get each partition of ``table``
        from exactly one of them, or None. A node serves the partitions it leads, and each node names leaders
        from its own view of who is live: while a partition's leadership moves (a node lost to some peers
        and not yet to others, a replica that cannot be opened), the query's initiator may ask a set of
        nodes among which no one, or two, serve a partition. Checked for every partition of the table: its
        leader here must take part; and, for a partition placed here, no replica before it in placement
        order that is not live here may take part (it may still serve the partition in its own view)."""
        taking = set(participants)
        live = frozenset(self.live)
        for partition, spec in sorted(self.layout.partitions.items()):
            if partition.rsplit("/", 1)[0] != table:
                continue
            electable = self._electable(spec)
            leader = self.election.leader(electable, live)
            if leader is None:
                return f"partition {partition} of {table} has no leader up (as {self.node} sees it)"
            if leader.node not in taking:
                return (
                    f"partition {partition} of {table} is led by {leader.node} (as {self.node} sees it), "
                    "which does not take part in this query"
                )
            if spec.replica_on(self.node) is None:
                continue
            for r in electable.replicas:
                if r.placement == leader.placement:
                    break
                if not r.joining and r.node in taking:
                    return (
                        f"partition {partition} of {table}: {r.node} takes part in this query and may still "
                        f"lead it, which {leader.node} does as {self.node} sees it"
                    )
        return None

    def _replicated(self, rep: LocalReplica) -> bool:
        return not rep.store.memtable_rows and not self._unacked(rep)

    def _unacked(self, rep: LocalReplica) -> list[str]:
        """The nodes of the other replicas of ``rep`` that have not acked every segment from its latest
        major, sorted: published so that a load that times out waiting for replication can name the
        replicas it waits on (a node down, or still catching up)."""
        candidates = self._candidates(rep)
        return sorted(
            r.node
            for r in rep.spec.replicas
            if r.node != self.node and any(r.placement not in e.acked for e in candidates)
        )

    def replicas_table(self) -> pa.Table:
        """One row per local replica: what it holds and whether its followers have all of it."""
        pending: dict[str, int] = {}
        for partition, rows in self.loading:
            pending[partition] = pending.get(partition, 0) + rows.num_rows
        for partition, parts in self.gathering.items():
            pending[partition] = pending.get(partition, 0) + sum(p.num_rows for p in parts)
        rows_out: list[dict[str, Any]] = []
        for p, rep in sorted(self.local.items()):
            rows_out.append(
                {
                    "node": self.node,
                    "partition": p,
                    "leader": int(rep.leads),
                    "rows": sum(e.rows for e in self._candidates(rep)) + rep.store.memtable_rows,
                    "loaded": self.loaded.get(p, 0),
                    "pending": pending.get(p, 0),
                    "replicated": int(rep.leads and not pending.get(p) and self._replicated(rep)),
                    "error": self.load_error or "",
                    "failing": self.failing.get(p, ""),
                    "unacked": ", ".join(self._unacked(rep)) if rep.leads else "",
                }
            )
        for p in sorted(self.unopened - self.local.keys()):  # placed here, its store cannot be opened
            rows_out.append(
                dict.fromkeys(_REPLICAS_SCHEMA.names, 0)
                | {"node": self.node, "partition": p, "error": self.load_error or ""}
                | {"failing": self.failing.get(p, "cannot open"), "unacked": ""}
            )
        if not rows_out:
            rows_out.append(
                dict.fromkeys(_REPLICAS_SCHEMA.names, 0)
                | {"node": self.node, "partition": "", "error": self.load_error or "", "failing": ""}
                | {"unacked": ""}
            )
        return pa.Table.from_pylist(rows_out, schema=_REPLICAS_SCHEMA)


def make_role(ctx: Any) -> ServingReplication:
    """The replication role for node ``ctx.node_id`` of ``ctx.topology`` (see the module docstring)."""
    topology = ctx.topology
    tables = list(topology.tables)
    return ServingReplication(
        ctx.node_id,
        layout_for(topology),
        {t.name: tuple(t.key) for t in tables},
        NodeData(
            ctx.node_id, topology.cluster.name, getattr(ctx, "data_dir", None) or os.environ.get(DATA_DIR_ENV)
        ),
        local_data=tuple(getattr(ctx, "local_data", ())),
        catalog=getattr(ctx, "catalog", None),
        config=ReplicationConfig(store=StoreConfig(key=tuple(tables[0].key) if tables else ("key",))),
    )
