"""The leader's automatic compaction, in bounded steps over loop turns.

Compacting a chain (its latest major and the minors after it) reads and upserts the chain's rows and
writes them out as a new major segment. Done in one call (``PartitionStore.compact``, still what the
``compact`` call uses), that held the node's loop 0.9 to 3.6 s at 2 million
rows per partition, long enough under load for its peers (``peer_timeout``) to take the node for lost.
Roles run no threads (DESIGN.md section 3), so a ``Compaction`` cuts it into steps instead, as
``serving.ChainBuild`` reads a chain for queries:

* it reads the chain's rows with a ``ChainBuild`` (one record batch, one slice or one column per step;
  none when the store keeps the chain's rows already);
* it writes the new major through a temporary (``SegmentWriter``): the header and schema with the first
  record batches, then ``step_batches`` record batches of ``batch_rows`` rows per step;
* a last step ends the file (trailer, fsync, rename) and installs it as ``compact`` does: the segment
  list, the root and the manifest, in one manifest write.

Both automatic compactions run so: the one a leader starts when ``compact_minors`` minors follow its
major, and the one an OUT_OF_ORDER decline asks for (``Offering._on_declined``). The role
(``Compacting``) takes one step of one compaction per ``COMPACT_TIMER``, set just after ``now``
while a compaction runs (a timer set at ``now`` fires again in the same ``NodeCore.tick``), so the loop
serves its peers between any two steps.

What keeps it right, when the store moves on between two steps:

* the leader's automatic flushes (a memtable at its threshold, rows merged from a fork) wait while the
  compaction runs: the rows are durable in the write-ahead log meanwhile (``PartitionStore.write``
  fsyncs its log record before it returns), and are flushed once the compaction ends;
* anything else that changes the chain (a fast-forwarded segment, a flush on losing leadership or in
  UNLOAD, a ``flush`` or ``compact`` call, a load's ``write_flushed``, a reset), leadership lost (the
  term moved), the lifecycle left for UNLOAD, or the replica closed or re-placed abandons the compaction
  before its next step (``compactions_abandoned``): its temporary is removed, and the next round starts
  a compaction of the chain there is then. A compaction is installed only over the very chain it read
  (its segments' ids and checksums), so its major holds exactly the chain's rows;
* a crash mid-compaction leaves only the temporary, which opening the store discards, unlisted
  (``Storage.discard_partial``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass

from sparkbus.bus.contract import SetTimer
from sparkbus.roles.replication.layout import Lifecycle
from sparkbus.roles.replication.local import Hooks, LocalReplica
from sparkbus.roles.replication.segments import SegmentEntry, SegmentWriter, chain
from sparkbus.roles.replication.serving import STEP_GAP, STEP_ROWS, ChainBuild
from sparkbus.roles.replication.storage import SimulatedCrash
from sparkbus.roles.replication.store import PartitionStore, StoreError, chain_ids, segment_file

#: The timer that takes the next step of the compactions under way.
COMPACT_TIMER = "replication/compact"
#: Record batches (of ``StoreConfig.batch_rows`` rows) of the new major written per step.
STEP_BATCHES = 1

log = logging.getLogger(__name__)


class ChainMoved(StoreError):
    """The chain a compaction read is no longer the store's: it was abandoned."""


class Compaction:
    """The compaction of ``store``'s chain (as it is when made) into a new major, in bounded steps.

    ``step`` does one unit of work (module docstring) and returns the new major's entry once installed.
    """

    def __init__(
        self, store: PartitionStore, *, step_batches: int = STEP_BATCHES, step_rows: int = STEP_ROWS
    ) -> None:
        if step_batches < 1:
            raise ValueError(f"step_batches must be >= 1, got {step_batches}")
        self.store = store
        self.step_batches = step_batches
        self._live = chain(store.entries, store.root)
        self._build = ChainBuild(store, step_rows)
        #: the (id, checksum) of the chain's segments: installed only over that chain
        self.ids = self._build.ids
        self.writer: SegmentWriter | None = None
        self.steps = 0
        self.entry: SegmentEntry | None = None
        self._work = self._run()

    def current(self) -> bool:
        """The store's chain is still the one this compaction reads."""
        return chain_ids(chain(self.store.entries, self.store.root)) == self.ids

    def step(self) -> SegmentEntry | None:
        """One step; the new major's entry when this step installed it, else None.

        Raises:
            ChainMoved: the store's chain changed (the compaction is abandoned first).
            OSError, SegmentCorrupt, StoreError: reading the chain or writing the file failed (the
                temporary is removed, except for a ``SimulatedCrash``: a dead process removes nothing).
        """
        if self.entry is not None:
            return self.entry
        if not self.current():
            self.abort()
            raise ChainMoved(f"{self.store.partition}: the chain changed during its compaction")
        self.steps += 1
        try:
            next(self._work)
        except StopIteration as done:
            self.entry = done.value
            return self.entry
        except SimulatedCrash:
            raise
        except BaseException:
            self.abort()
            raise
        return None

    def abort(self) -> None:
        """Give up: stop reading, and remove the file being written (idempotent)."""
        self._build.close()
        if self.writer is not None and self.entry is None:
            self.writer.abort()

    def _run(self) -> Generator[None, None, SegmentEntry]:
        while not self._build.step():
            yield None
        rows = self._build.rows
        assert rows is not None and self.store.schema is not None
        yield None  # the build's last step made the last column one chunk
        header = self.store.major_header(self._live, rows)
        writer = self.writer = SegmentWriter(
            self.store.storage, segment_file(header.segment_id), header, self.store.schema
        )
        batches = rows.to_batches(max_chunksize=self.store.config.batch_rows)
        for start in range(0, len(batches), self.step_batches):
            for batch in batches[start : start + self.step_batches]:
                writer.write(batch)
            yield None
        entry = header.entry(*writer.finish())
        self.store.install_major(entry, rows)
        return entry


@dataclass
class _Running:
    """A compaction under way, with the replica and leadership term it was started under."""

    rep: LocalReplica
    term: int
    compaction: Compaction


class Compacting(Hooks):
    """The role's part that runs its leaders' automatic compactions in steps (module docstring)."""

    node: str
    local: dict[str, LocalReplica]
    _now: float
    #: the compactions under way, by partition
    compactions: dict[str, _Running]
    #: partitions whose leader held a flush back while compacting: flushed once it ends
    flush_held: set[str]

    def _flush(self, rep: LocalReplica) -> SegmentEntry | None:
        raise NotImplementedError

    def _may_compact(self, rep: LocalReplica) -> bool:
        """Whether the leader ``rep`` may start a compaction now (a loading node waits for its chunks)."""
        return True

    def _compacting(self, rep: LocalReplica) -> bool:
        run = self.compactions.get(rep.spec.partition)
        return run is not None and run.rep is rep

    def _leader_flush(self, rep: LocalReplica, due: bool) -> None:
        """Flush the leader ``rep``'s memtable if ``due`` or held before, unless it is compacting: then
        the flush is held until the compaction ends (the rows are durable in the log meanwhile)."""
        partition = rep.spec.partition
        if not due and partition not in self.flush_held:
            return
        if self._compacting(rep):
            self.flush_held.add(partition)
            return
        self.flush_held.discard(partition)
        self._flush(rep)

    def _start_compaction(self, rep: LocalReplica) -> bool:
        """Start compacting the leader ``rep``'s chain, unless a compaction of it is under way (or it may
        not now: ``_may_compact``). True if one was started."""
        partition = rep.spec.partition
        run = self.compactions.get(partition)
        if run is not None:
            why = self._void(partition, run)
            if why is None:
                return False
            self._abandon_compaction(partition, why)
        if self.local.get(partition) is not rep or not rep.leads or not self._may_compact(rep):
            return False
        if rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL):
            return False  # abandoned at its first step (``_void``): an OUT_OF_ORDER answer after a split
        self.compactions[partition] = _Running(rep, rep.term, Compaction(rep.store))
        self._emit(SetTimer(key=COMPACT_TIMER, at=self._now + STEP_GAP))
        return True

    def _compact_turn(self) -> bool:
        """On ``COMPACT_TIMER``: one step of one compaction (each in turn). True if one was installed."""
        for partition, run in list(self.compactions.items()):
            why = self._void(partition, run)
            if why is not None:
                self._abandon_compaction(partition, why)
        installed = False
        if self.compactions:
            partition = next(iter(self.compactions))
            run = self.compactions.pop(partition)
            try:
                entry = run.compaction.step()
            except SimulatedCrash:
                raise
            except Exception as exc:
                self._count("compaction_errors")
                log.warning(
                    "replication %s: %s: compaction failed: %s: %s",
                    self.node,
                    partition,
                    type(exc).__name__,
                    exc,
                )
            else:
                if entry is None:
                    self.compactions[partition] = run  # to the back: every compaction in turn
                else:
                    self._count("compactions")
                    installed = True
        if self.compactions:
            self._emit(SetTimer(key=COMPACT_TIMER, at=self._now + STEP_GAP))
        return installed

    def _void(self, partition: str, run: _Running) -> str | None:
        """Why compaction ``run`` cannot be installed any more, or None while it can."""
        rep = self.local.get(partition)
        if rep is not run.rep or rep.store is not run.compaction.store:
            return "the replica was closed or re-placed"
        if not rep.leads or rep.term != run.term:
            return "leadership moved"
        if rep.lifecycle in (Lifecycle.UNLOAD, Lifecycle.UNLOAD_FINAL):
            return f"the partition is in {rep.lifecycle.name}"
        if not run.compaction.current():
            return "its chain changed"
        return None

    def _abandon_compaction(self, partition: str, why: str, rep: LocalReplica | None = None) -> None:
        """Give up the compaction of ``partition`` under way (only one of replica ``rep``'s, if given), if
        any: its partial file is removed."""
        run = self.compactions.get(partition)
        if run is None or (rep is not None and run.rep is not rep):
            return
        del self.compactions[partition]
        try:
            run.compaction.abort()
        except SimulatedCrash:
            raise
        except OSError as exc:  # a temporary left behind, which opening the store discards
            log.warning(
                "replication %s: %s: removing a compaction's file failed: %s", self.node, partition, exc
            )
        self._count("compactions_abandoned")
        log.info("replication %s: %s: compaction abandoned: %s", self.node, partition, why)
