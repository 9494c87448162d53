"""The index arrangement of a group-by view: at most one row per group key at every time, kept per key slot.

A group-by view's output changes are, per touched group and time, the retraction of its old row and the
insertion of its new one. A generic arrangement (``arrangement.Arrangement``) folds them by hashing every
row over all columns, and re-hashes the whole collection on every fold because Arrow keeps no hash table
between calls. This one instead interns the key columns to dense slots (``reduction._SlotMap``, as the
group-by state does) and keeps:

* ``_store``: the rows appended so far (an Arrow table; a row is referenced by its position);
* ``_cur``: per slot, the position of its current row, or -1 when the group has none;
* ``_log``: per applied time, the slots that changed and their old and new positions, kept until
  compaction passes the time.

Applying a batch interns its keys, moves the positions of the touched slots (retractions, then insertions)
and appends the batch to the store: no hashing of whole rows and nothing proportional to the collection.
A batch that comes with the reduction steps it is made of (``Dataflow.steps_of``, as a replica passes
them) is not interned: each step carries the reduction's slot of every row, translated to this
arrangement's slots through a table kept per reduction slot map (rebuilt when either side renumbers its
slots), and its shape (one retraction per old row, then one insertion per new row) needs no duplicate
checks. Only inserted rows are stored either way (nothing reads a retraction's row).
A read at time ``t`` takes the current rows, with the slots changed after ``t`` set back to the old
position of their first change after ``t``. Rows no longer referenced by ``_cur`` or the log are dropped,
and slots of vanished keys reclaimed, once they outnumber the referenced ones.

A batch that does not fit (a diff other than +1 or -1, a retraction of a key with no row, a second row for
a key) turns the arrangement into a generic one holding the same updates, so correctness never depends on
the input's shape; a reduction's output always fits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sparkbus.roles.compute.arrangement import (
    DIFF,
    TIME,
    Arrangement,
    conform,
    consolidate,
    empty_updates,
    update_schema,
)
from sparkbus.roles.compute.plans import ViewDef
from sparkbus.roles.compute.reduction import KeyedStep, _np, _SlotMap
from sparkbus.roles.compute.times import CLOSED, Frontier

Ints = npt.NDArray[np.int64]
#: The store is compacted once it holds more than this many rows and more than four times the referenced
#: ones; slots of vanished keys are reclaimed then if they outnumber the others.
_GC_FLOOR = 4096


class _Change:
    """The slots whose row changed at ``time``, with their old and new store positions (-1: no row)."""

    __slots__ = ("new", "old", "slots", "time")

    def __init__(self, time: int, slots: Ints, old: Ints, new: Ints) -> None:
        self.time = time
        self.slots = slots
        self.old = old
        self.new = new


class KeyedArrangement(Arrangement):
    """An arrangement whose collection has at most one row per ``key`` at every time (see the module)."""

    def __init__(self, schema: pa.Schema, key: list[str], *, since: int = 0, upper: int = 0) -> None:
        super().__init__(schema, since=since, upper=upper)
        self.key = key
        self._update_schema = update_schema(schema)  # building a schema costs 20 us: once, not per append
        self._columns = [*schema.names, TIME, DIFF]
        self._keyed = True
        self._map = _SlotMap([schema.field(k) for k in key])
        self._store: pa.Table = schema.empty_table()
        self._store_parts: list[pa.Table] = []
        self._stored = 0
        self._cur: Ints = np.full(0, -1, np.int64)
        self._log: deque[_Change] = deque()
        self._logged = 0
        self._live = 0
        #: Slot of this arrangement per slot of the reduction that feeds it (-1: not looked up yet), valid
        #: for the reduction's slot map ``_xsource`` at ``_xepoch``.
        self._xlat: Ints = np.full(0, -1, np.int64)
        self._xsource: object | None = None
        self._xepoch = -1

    # ---------------------------------------------------------------- generic interface

    @property
    def keyed(self) -> bool:
        """False once a batch that did not fit turned this into a generic arrangement."""
        return self._keyed

    @property
    def updates(self) -> pa.Table:
        if not self._keyed:
            return super().updates
        if not self.since:
            return empty_updates(self.schema)
        since = self.since[0]
        store = self._rows()
        pos = self._positions_at(since)
        parts = [_stamp(store.take(pa.array(pos[pos >= 0])), since, 1)]
        for change in self._log:
            if change.time > since:
                parts.append(_stamp(store.take(pa.array(change.old[change.old >= 0])), change.time, -1))
                parts.append(_stamp(store.take(pa.array(change.new[change.new >= 0])), change.time, 1))
        merged = pa.concat_tables(parts)
        return conform(consolidate(merged), update_schema(self.schema)).combine_chunks()

    def __len__(self) -> int:
        if not self._keyed:
            return super().__len__()
        return self._live + 2 * self._logged

    def append(self, updates: pa.Table, upper: int, steps: Sequence[KeyedStep] | None = None) -> None:
        """As ``Arrangement.append``; with ``steps`` (the reduction steps ``updates`` is made of, from
        ``Dataflow.steps_of``) the group slots are translated from the reduction's instead of interned, and
        each step's shape (one retraction per old row, then one insertion per new row) is relied on."""
        if not self._keyed:
            super().append(updates, upper)
            return
        if updates.num_rows and self.since:
            if steps is not None and sum(s.updates.num_rows for s in steps) == updates.num_rows:
                for i, step in enumerate(steps):
                    if not self._keyed or not self._apply_step(step):
                        for rest in steps[i:]:
                            self._append_rows(rest.updates)
                        break
            else:
                self._append_rows(updates)
        if self.upper and upper > self.upper[0]:
            self.upper = (upper,)

    def _append_rows(self, updates: pa.Table) -> None:
        """Apply ``updates`` checking their shape; become generic if they do not fit."""
        data = conform(updates.select(self._columns), self._update_schema)
        if self._keyed and self._apply(data):
            return
        if self._keyed:
            self._fall_back(data)
        super().append(data, self.upper[0] if self.upper else 0)

    def compact(self, since: Frontier) -> None:
        if not self._keyed:
            super().compact(since)
            return
        if not since:
            self.since = CLOSED
            self.upper = CLOSED
            self._clear_keyed()
            return
        if self.since and since[0] > self.since[0]:
            self.since = since
            # Changes at or below the since are never undone (reads are at times >= since).
            while self._log and self._log[0].time <= since[0]:
                self._logged -= self._log.popleft().slots.size

    def read_at(self, t: int) -> pa.Table:
        if not self._keyed:
            return super().read_at(t)
        latest = t >= self._max_time
        if latest and self._latest is not None:
            return self._latest
        pos = self._positions_at(t)
        rows = self._rows().take(pa.array(pos[pos >= 0]))
        if latest:
            self._latest = rows
        return rows

    # ---------------------------------------------------------------- keyed state

    def _rows(self) -> pa.Table:
        """The store as one table (chunked: parts stay apart, so that dead ones can still be dropped)."""
        if not self._store_parts:
            return self._store
        return pa.concat_tables([self._store, *self._store_parts])

    def _positions_at(self, t: int) -> Ints:
        """Per slot, the store position of its row at time ``t`` (-1 if none)."""
        later = [c for c in self._log if c.time > t]
        if not later:
            return self._cur
        slots = np.concatenate([c.slots for c in later])
        old = np.concatenate([c.old for c in later])
        # The first change after t of each slot holds its position at t: assigning in reverse order lets
        # the earliest write win.
        pos = self._cur.copy()
        pos[slots[::-1]] = old[::-1]
        return pos

    def _apply(self, data: pa.Table) -> bool:
        """Apply ``data`` to the keyed state; False (and nothing changed) if it does not fit."""
        diffs = _np(data[DIFF]).astype(np.int64, copy=False)
        if not np.all((diffs == 1) | (diffs == -1)):
            return False
        times = np.maximum(_np(data[TIME]).astype(np.int64, copy=False), self.since[0])
        slots = self._map.slots(data)
        if len(self._map) > self._cur.size:
            grown = np.full(max(len(self._map), 2 * self._cur.size), -1, np.int64)
            grown[: self._cur.size] = self._cur
            self._cur = grown
        positions = np.arange(self._stored, self._stored + data.num_rows, dtype=np.int64)
        lo, hi = int(times.min()), int(times.max())
        if lo == hi:
            groups: list[tuple[int, Ints]] = [(lo, np.arange(data.num_rows, dtype=np.int64))]
        else:
            order = np.argsort(times, kind="stable")
            distinct, starts = np.unique(times[order], return_index=True)
            groups = [(int(d), part) for d, part in zip(distinct, np.split(order, starts[1:]), strict=True)]
        done: list[_Change] = []
        for time, idx in groups:
            change = self._move(time, slots[idx], diffs[idx], positions[idx])
            if change is None:
                for undo in reversed(done):
                    self._cur[undo.slots] = undo.old
                return False
            done.append(change)
        for change in done:
            self._log.append(change)
            self._logged += change.slots.size
            self._live += int(np.count_nonzero(change.new >= 0)) - int(np.count_nonzero(change.old >= 0))
        self._store_parts.append(data.select(self.schema.names))
        self._stored += data.num_rows
        self._max_time = max(self._max_time, hi)
        self._latest = None
        self._tidy()
        return True

    def _apply_step(self, step: KeyedStep) -> bool:
        """Apply one reduction step; False (and nothing changed) if it does not fit the keyed state.

        A step lists each changed slot at most once among its retractions and once among its insertions,
        so only the first is checked here: a retraction must find a row, an insertion a slot without one.
        """
        data = step.updates
        if not data.schema.equals(self._update_schema):
            return False
        own = self._own_slots(step)
        retracted, rows = step.retracted, data.num_rows
        gone, come = own[:retracted], own[retracted:]
        cur = self._cur
        was = cur[gone]
        if retracted and was.min() < 0:
            return False
        cur[gone] = -1
        if come.size and cur[come].max() >= 0:
            cur[gone] = was
            return False
        inserted = rows - retracted
        positions = np.arange(self._stored, self._stored + inserted, dtype=np.int64)
        cur[come] = positions
        time = max(step.time, self.since[0])
        none = _nothing(max(retracted, inserted))
        self._log.append(
            _Change(
                time,
                own,
                np.concatenate([was, none[:inserted]]),
                np.concatenate([none[:retracted], positions]),
            )
        )
        self._logged += rows
        self._live += inserted - retracted
        # Only inserted rows are stored: nothing reads a retraction's row (the slot held its position).
        self._store_parts.append(data.slice(retracted).select(self.schema.names))
        self._stored += inserted
        self._max_time = max(self._max_time, time)
        self._latest = None
        self._tidy()
        return True

    def _own_slots(self, step: KeyedStep) -> Ints:
        """This arrangement's slots for a step's rows, from the reduction's slots (interning unseen ones)."""
        if step.source is not self._xsource or step.epoch != self._xepoch:
            self._xlat = np.full(0, -1, np.int64)
            self._xsource, self._xepoch = step.source, step.epoch
        theirs = step.slots
        if theirs.size and int(theirs.max()) >= self._xlat.size:
            grown = np.full(max(int(theirs.max()) + 1, 2 * self._xlat.size), -1, np.int64)
            grown[: self._xlat.size] = self._xlat
            self._xlat = grown
        own: Ints = self._xlat[theirs]
        if own.size and own.min() < 0:
            miss = np.flatnonzero(own < 0)
            own[miss] = self._map.slots(step.updates.select(self.key).take(pa.array(miss)))
            self._xlat[theirs[miss]] = own[miss]
            if len(self._map) > self._cur.size:
                grown = np.full(max(len(self._map), 2 * self._cur.size), -1, np.int64)
                grown[: self._cur.size] = self._cur
                self._cur = grown
        return own

    def _move(self, time: int, slots: Ints, diffs: Ints, positions: Ints) -> _Change | None:
        """Retract, then insert, the rows of one time; None (and ``_cur`` unchanged) if they do not fit.

        The change lists the retracted slots (old position, new -1), then the inserted ones (old -1, new
        position): a slot both retracted and inserted appears twice, in that order. A repeated slot among
        the retractions or among the insertions is found without sorting: writing each row's own position
        to its slot leaves a mismatch for every overwritten duplicate.
        """
        out = diffs < 0
        cur = self._cur
        gone, come, at = slots[out], slots[~out], positions[~out]
        was = cur[gone]
        if gone.size:
            if (was < 0).any():
                return None
            mine = positions[out]
            cur[gone] = mine
            if (cur[gone] != mine).any():
                cur[gone] = was
                return None
            cur[gone] = -1
        if come.size:
            if (cur[come] >= 0).any():
                cur[gone] = was
                return None
            cur[come] = at
            if (cur[come] != at).any():
                cur[come] = -1
                cur[gone] = was
                return None
        none_g = np.full(gone.size, -1, np.int64)
        none_c = np.full(come.size, -1, np.int64)
        return _Change(
            time, np.concatenate([gone, come]), np.concatenate([was, none_c]), np.concatenate([none_g, at])
        )

    def _tidy(self) -> None:
        """Once the store outgrows the referenced rows, drop its dead parts, and copy the live rows out of
        the rest only if that was not enough."""
        limit = max(_GC_FLOOR, 4 * (self._live + 2 * self._logged))
        if self._stored <= limit:
            return
        self._drop_dead_parts()
        if self._stored > limit // 2:
            self._collect()

    def _drop_dead_parts(self) -> None:
        """Drop the store parts (and the merged store) that no position references, shifting positions down.

        A group-by view's rows are replaced as their groups change, so most parts die within a few writes
        while a few rows of groups left untouched stay live in older parts: dropping the dead parts is a
        few NumPy calls over the referenced positions, where ``_collect`` copies every live row.
        """
        blocks = [self._store, *self._store_parts]
        sizes = [b.num_rows for b in blocks]
        ends = np.cumsum(sizes)
        referenced = np.concatenate([self._cur, *(c.old for c in self._log), *(c.new for c in self._log)])
        referenced = referenced[referenced >= 0]
        live = np.bincount(np.searchsorted(ends, referenced, side="right"), minlength=len(blocks))
        dead = [size > 0 and not n for size, n in zip(sizes, live.tolist(), strict=True)]
        if not any(dead):
            return
        shift, dropped = [], 0
        for size, gone in zip(sizes, dead, strict=True):
            shift.append(dropped)
            dropped += size if gone else 0
        shifts = np.array([*shift, 0], np.int64)  # the block after the last one: position -1 (no row)

        def moved(positions: Ints) -> Ints:
            block = np.searchsorted(ends, positions, side="right")
            block[positions < 0] = len(blocks)
            out: Ints = positions - shifts[block]
            return out

        self._cur = moved(self._cur)
        for change in self._log:
            change.old = moved(change.old)
            change.new = moved(change.new)
        self._store = self.schema.empty_table() if dead[0] else self._store
        self._store_parts = [b for b, gone in zip(blocks[1:], dead[1:], strict=True) if not gone]
        self._stored -= dropped

    def _marks(self) -> npt.NDArray[np.bool_]:
        """Per store position, whether ``_cur`` or the log references it (one more cell, for -1, unset)."""
        marks = np.zeros(self._stored + 1, np.bool_)
        marks[self._cur] = True
        for change in self._log:
            marks[change.old] = True
            marks[change.new] = True
        marks[-1] = False
        return marks

    def _collect(self) -> None:
        """Drop the store rows nothing references, and the slots of keys that have no row and no change."""
        # Marking the referenced positions is cheaper than sorting them.
        live_pos = np.flatnonzero(self._marks())
        # Taking from the chunks and combining what is kept copies less than combining everything first.
        store = pa.concat_tables([self._store, *self._store_parts]).take(pa.array(live_pos)).combine_chunks()
        repos = np.full(self._stored + 1, -1, np.int64)  # index -1 (no row) maps to -1 through the last cell
        repos[live_pos] = np.arange(live_pos.size, dtype=np.int64)
        self._store = store
        self._store_parts = []
        self._stored = store.num_rows
        self._latest = None
        size = len(self._map)
        if size <= max(_GC_FLOOR, 2 * (self._live + self._logged)):
            self._cur[:size] = repos[self._cur[:size]]
            for change in self._log:
                change.old = repos[change.old]
                change.new = repos[change.new]
            return
        keep = self._cur[:size] >= 0
        for change in self._log:
            keep[change.slots] = True
        live_slots = np.flatnonzero(keep)
        reslot = np.full(size, -1, np.int64)
        reslot[live_slots] = np.arange(live_slots.size, dtype=np.int64)
        self._map.keep(live_slots)
        self._xsource = None  # the translation from a reduction's slots names the old slots
        cur = np.full(max(1, live_slots.size), -1, np.int64)
        cur[: live_slots.size] = repos[self._cur[live_slots]]
        self._cur = cur
        for change in self._log:
            change.slots = reslot[change.slots]
            change.old = repos[change.old]
            change.new = repos[change.new]

    def _clear_keyed(self) -> None:
        """Forget every keyed row, slot and logged change (a dropped collection, or the generic fall-back)."""
        self._map = _SlotMap(self._map.key_fields)
        self._xsource = None
        self._store = self.schema.empty_table()
        self._store_parts = []
        self._stored = 0
        self._cur = np.full(0, -1, np.int64)
        self._log.clear()
        self._logged = 0
        self._live = 0
        self._latest = None

    def _fall_back(self, data: pa.Table) -> None:
        """Become a generic arrangement holding the updates so far (``data`` is appended by the caller)."""
        held = self.updates
        self._keyed = False
        self._clear_keyed()
        self._max_time = -1
        upper = self.upper[0] if self.upper else 0
        super().append(held, upper)


_NOTHING: Ints = np.zeros(0, np.int64)


def _nothing(size: int) -> Ints:
    """At least ``size`` times -1 (a shared read-only array: slice it, do not write to it)."""
    global _NOTHING
    if _NOTHING.size < size:
        _NOTHING = np.full(max(size, 2 * _NOTHING.size, 1024), -1, np.int64)
        _NOTHING.flags.writeable = False
    return _NOTHING


def _stamp(rows: pa.Table, time: int, diff: int) -> pa.Table:
    n = rows.num_rows
    rows = rows.append_column(TIME, pa.array(np.full(n, time, np.int64)))
    return rows.append_column(DIFF, pa.array(np.full(n, diff, np.int64)))


def index_arrangement(view: ViewDef, schema: pa.Schema, *, since: int, upper: int) -> Arrangement:
    """The arrangement for a view's index: keyed by the group key for a group-by view, else generic."""
    if view.group_by:
        return KeyedArrangement(schema, list(view.group_by), since=since, upper=upper)
    return Arrangement(schema, since=since, upper=upper)
