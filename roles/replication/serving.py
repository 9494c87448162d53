"""What queries see of the partitions a node leads: each one's rows, read from its segments in steps.

A led partition's rows are the upserted rows of its chain (the segments from its latest major up to its
root) with its memtable laid over them. The store keeps the chain's rows from one read to the next
(``PartitionStore.versioned_rows``), so a write or a flush costs the new rows only; but when the chain
changes wholesale (the store opened again at a restart, leadership moved here from another replica, a
major fast-forwarded from a peer), every segment is read again: its file decompressed, its rows upserted
with the others'. That is about a second per 2 million rows, which done in one call held up the node's
loop, and with it the heartbeats its peers expect: past their ``peer_timeout`` they took the node for
lost and the query failed with ``MEMBER_LEAVE``.

Roles run no threads (DESIGN.md section 3), so such a read is cut into steps instead, as the load of
local rows is: a ``ChainBuild`` reads one record batch, or lays one slice of the rows read so far under
a newer segment's, or makes one column one chunk, per step, and the role takes one step per event
(``BUILD_TIMER`` set just after ``now`` while any build runs: the next loop turn), so the loop serves its
peers between any two steps. A chain with few rows to read (``inline_rows``: a flush or a fast-forward on
top of rows kept) is still read at once, in the query's call.

``Serving`` holds what a node serves:

* one build per partition, started as soon as a led partition's chain needs a long read (before any
  query asks: the rows are ready when the first query comes, most of the time), shared by every query
  that asks meanwhile;
* a query that asks for a partition still being read gets ``SourcePending`` (the catalog's): its scan
  waits, and runs again when the role calls the query role's ``SOURCES_READY``, which it does whenever
  a build ends (read, failed, or dropped because the partition is no longer served here);
* a finished build's rows go to the store (``keep_chain_rows``) only if they still stand for the start
  of its chain (a flush or a compaction meanwhile keeps them of use); rows of a chain the store moved
  away from are dropped, and a new build starts if one is still needed. The memtable is laid over them
  when a query asks, on the loop, so a query sees every write acknowledged before it, including those
  acknowledged while the rows were read.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.bus.contract import Action, Call, SetTimer
from sparkbus.roles.query.catalog import SCANNER, SOURCES_READY, SourcePending
from sparkbus.roles.replication.local import LocalReplica
from sparkbus.roles.replication.segments import SegmentEntry, chain, iter_batches
from sparkbus.roles.replication.store import PartitionStore, chain_ids, covered, segment_file
from sparkbus.roles.replication.upserts import HIDDEN, key_set, key_values, overlay, upsert

#: The timer that takes the next step of the builds in progress, set ``STEP_GAP`` after ``now``: the bus
#: (``NodeCore.tick``) fires again, in the same call, a timer set at the time it runs, so set at ``now``
#: every step would be taken before the loop read a socket again.
BUILD_TIMER = "replication/build"
STEP_GAP = 1e-6
#: Rows a chain may have to read from its segments for its rows to be read at once, in the query's call.
INLINE_ROWS = 65_536
#: Rows a build reads, or lays under a newer segment's, per step (one record batch of a segment).
STEP_ROWS = 65_536


class ChainBuild:
    """The upserted rows of one chain of ``store``, read from its segment files in bounded steps.

    Starts from the rows the store keeps when they stand for the start of the chain (``kept_for``), and
    reads the segments after them; ``step`` does one unit of work and returns True once ``rows`` (all
    columns, version columns included, one chunk per column) are ready. Segments are upserted when
    written (a flush or a compaction), so each one's rows are read as they are: the later ones (minors)
    are laid one over the other, and the first one's (or the kept rows) under them, a slice per step
    (``store.overlay``).
    """

    def __init__(self, store: PartitionStore, step_rows: int = STEP_ROWS) -> None:
        self.store = store
        live = chain(store.entries, store.root)
        self.ids = chain_ids(live)
        start = store.kept_for(live)
        self._base = start[1] if start is not None else None
        self._todo = live[start[0] if start is not None else 0 :]
        self._step_rows = step_rows
        self.rows: pa.Table | None = None
        #: the segment being read (None once all are)
        self.reading: SegmentEntry | None = None
        self.steps = 0
        self._work = self._run()

    def step(self) -> bool:
        """One step; True when the rows are ready.

        Raises:
            OSError, KeyError, SegmentCorrupt, StoreError: a segment could not be read (a file deleted
                since the build started is one: ``Serving`` tells that from damage by the chain).
        """
        if self.rows is not None:
            return True
        self.steps += 1
        return next(self._work, True)

    def close(self) -> None:
        """Give up: close the segment file being read."""
        self._work.close()

    def _run(self) -> Generator[bool, None, bool]:
        schema = self.store.schema
        assert schema is not None
        tables = []
        for entry in self._todo:
            self.reading = entry
            batches = []
            for batch in iter_batches(self.store.storage, segment_file(entry.segment_id)):
                batches.append(batch)
                yield False
            table = pa.Table.from_batches(batches) if batches else schema.empty_table()
            tables.append(table if table.schema.equals(schema) else table.cast(schema))
        self.reading = None
        rows = self._base if self._base is not None or not tables else tables.pop(0)
        if tables:
            # The segments after the first (minors: at most the ones a compaction folds) laid one over the
            # other first, then the partition's rows under them in one pass: a pass per segment cost as
            # many hash passes over the whole partition.
            top = tables[0]
            for table in tables[1:]:
                top = overlay(top, table, self.store.config.key)
                yield False
            rows = top if rows is None else (yield from self._overlay(rows, top))
        if rows is None:
            rows = schema.empty_table()
        columns = []
        for column in rows.columns:  # one chunk per column: what a scan wants (engine.aligned)
            columns.append(column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks))
            yield False
        self.rows = pa.Table.from_arrays(columns, schema=rows.schema)
        return True

    def _overlay(self, base: pa.Table, top: pa.Table) -> Generator[bool, None, pa.Table]:
        """``store.overlay(base, top)``, one slice of ``base`` per step: of ``step_rows`` rows, or of as many
        as ``top`` has (each slice's lookup hashes ``top``'s keys again: so it costs at most twice one pass)."""
        key = self.store.config.key
        if top.num_rows == 0:
            return base
        values = key_set(top.column(key[0]))
        size = max(self._step_rows, top.num_rows)
        rest: list[pa.Table] = []
        hits: list[pa.Table] = []
        for offset in range(0, base.num_rows, size):
            part = base.slice(offset, size)
            hit = pc.is_in(key_values(part.column(key[0])), value_set=values)
            if pc.any(hit).as_py():
                rest.append(part.filter(pc.invert(hit)))
                hits.append(part.filter(hit))
            else:
                rest.append(part)
            yield False
        return pa.concat_tables([*rest, upsert(pa.concat_tables([*hits, top]), key) if hits else top])


def _table_of(partition: str) -> str:
    return partition.rsplit("/", 1)[0]


class Serving:
    """The rows a node serves of the partitions it leads, and the builds reading them (module docstring).

    Args:
        node: the node's name (for messages).
        inline_rows: a chain with at most this many rows to read is read at once.
        step_rows: rows per build step.
    """

    def __init__(self, node: str, *, inline_rows: int = INLINE_ROWS, step_rows: int = STEP_ROWS) -> None:
        self.node = node
        self.inline_rows = inline_rows
        self.step_rows = step_rows
        #: each led partition's rows by its version, and each table's concatenation by its parts' versions
        self.rows: dict[str, tuple[tuple[Any, ...], pa.Table]] = {}
        self.tables: dict[str, tuple[tuple[Any, ...], pa.Table | None]] = {}
        self.builds: dict[str, ChainBuild] = {}
        #: a build that failed on a chain the store still has, by partition: raised to the next query
        self.failed: dict[str, tuple[tuple[tuple[str, bytes], ...], Exception]] = {}
        #: builds started (counted for tests and status)
        self.started = 0
        #: a query was told to wait (``SourcePending``) since the last ``SOURCES_READY``
        self._awaited = False
        #: a build ended or was dropped since the last ``turn``
        self._ended = False

    # ------------------------------------------------------------ what a query reads

    def table(self, table: str, led: Sequence[tuple[str, LocalReplica]]) -> pa.Table | None:
        """The rows of ``table`` in the led partitions ``led`` (sorted; each SERVE, with a schema), or
        None when there are none.

        Raises:
            SourcePending: a partition's rows are still being read (a build runs for it).
            Exception: what the last build of a partition raised reading a chain the store still has.
        """
        versions = tuple(
            (p, (rep.me.placement, rep.store.root, rep.store.memtable_rows, rep.store.lamport))
            for p, rep in led
        )
        served = {p for p, _ in led}
        for p in [p for p in self.rows if _table_of(p) == table and p not in served]:
            del self.rows[p]  # served no more: its rows go with it
        cached = self.tables.get(table)
        if cached is not None and cached[0] == versions:
            return cached[1]
        parts = []
        pending = []
        for (p, rep), (_, version) in zip(led, versions, strict=True):
            part = self.rows.get(p)
            if part is None or part[0] != version:
                rows = self._rows_now(p, rep.store)
                if rows is None:
                    pending.append(p)
                    continue
                part = self.rows[p] = (version, rows)
            parts.append(part[1])
        if pending:
            self._awaited = True
            schema = self._schema(led)
            raise SourcePending(
                table,
                f"the rows of {', '.join(pending)} are still being read from disk on {self.node} "
                "(after a restart, a change of leader or a new major segment)",
                pa.schema([f for f in schema if f.name not in HIDDEN]),
            )
        result = pa.concat_tables(parts) if parts else None
        self.tables[table] = (versions, result)
        return result

    @staticmethod
    def _schema(led: Sequence[tuple[str, LocalReplica]]) -> pa.Schema:
        schema = led[0][1].store.schema
        assert schema is not None
        return schema

    def _rows_now(self, partition: str, store: PartitionStore) -> pa.Table | None:
        """The partition's rows (without version columns), or None while a build reads them."""
        failed = self.failed.pop(partition, None)
        if failed is not None and failed[0] == chain_ids(chain(store.entries, store.root)):
            raise failed[1]
        build = self._current_build(partition, store)
        if build is None and store.pending_rows() > self.inline_rows:
            build = self._start(partition, store)
        if build is not None:
            return None
        return store.versioned_rows().drop_columns(list(HIDDEN))

    # ------------------------------------------------------------ builds

    def _current_build(self, partition: str, store: PartitionStore) -> ChainBuild | None:
        """The partition's build, if it still reads rows of use to ``store``'s chain (else dropped)."""
        build = self.builds.get(partition)
        if build is None:
            return None
        if build.store is store and _of_use(build):
            return build
        self._drop(partition)
        return None

    def _start(self, partition: str, store: PartitionStore) -> ChainBuild:
        build = self.builds[partition] = ChainBuild(store, self.step_rows)
        self.started += 1
        return build

    def _drop(self, partition: str) -> None:
        build = self.builds.pop(partition, None)
        if build is not None:
            build.close()
            self._ended = True

    def turn(self, led: Sequence[tuple[str, LocalReplica]], now: float, *, warm: bool = True) -> list[Action]:
        """The serving share of one event of the role: ``warm`` (or, without ``warm``, only drop the builds
        of no use any more), then a step of one build (each in turn).

        Returns the actions: the next step's timer while builds run, and ``SOURCES_READY`` to the query
        role when a build ended (or was dropped) while a query waited.
        """
        self.warm(led, start=warm)
        if self.builds:
            partition = next(iter(self.builds))
            build = self.builds.pop(partition)
            if not self._step(partition, build):
                self.builds[partition] = build  # to the back: every build in turn
            else:
                self.warm(led, start=warm)  # a build of the chain its store moved on to, if one is needed
        out: list[Action] = []
        if self._ended and self._awaited:
            self._awaited = False
            out.append(Call(role=SCANNER, name=SOURCES_READY))
        self._ended = False
        if self.builds:
            out.append(SetTimer(key=BUILD_TIMER, at=now + STEP_GAP))
        return out

    def warm(self, led: Sequence[tuple[str, LocalReplica]], *, start: bool = True) -> None:
        """Drop the builds of partitions no longer in ``led`` (or of a chain their store left), and with
        ``start`` start one for each partition of ``led`` whose chain needs a long read (unless it just
        failed on that chain)."""
        served = {p: rep.store for p, rep in led}
        for p in list(self.builds):
            store = served.get(p)
            if store is None:
                self._drop(p)
            else:
                self._current_build(p, store)
        for p in [p for p in self.failed if p not in served]:
            del self.failed[p]
        if not start:
            return
        for p, store in served.items():
            if p in self.builds or store.pending_rows() <= self.inline_rows:
                continue
            failed = self.failed.get(p)
            if failed is not None and failed[0] == chain_ids(chain(store.entries, store.root)):
                continue
            self._start(p, store)

    def _step(self, partition: str, build: ChainBuild) -> bool:
        """Take a step of ``build``; True when it ended (its rows kept by the store, or given up)."""
        try:
            done = build.step()
        except Exception as exc:
            build.close()
            reading = build.reading
            if reading is None or build.store.entry(reading.segment_id) is not None:
                self.failed[partition] = (build.ids, exc)  # a listed segment could not be read
            # else the segment went (a compaction's, deleted once its peers held the major): a build of
            # the chain the store has now starts
            self._ended = True
            return True
        if done:
            assert build.rows is not None
            build.store.keep_chain_rows(build.ids, build.rows)
            self._ended = True
        return done


def _of_use(build: ChainBuild) -> bool:
    """The chain ``build`` reads still stands for the start of its store's chain (``store.covered``)."""
    return covered(build.ids, chain(build.store.entries, build.store.root)) > 0
