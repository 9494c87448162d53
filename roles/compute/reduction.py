"""The group-by state of a maintained view: groups interned to dense slots, accumulators in NumPy arrays.

A step of 1,000 updates must cost a fraction of a millisecond, so it cannot afford an Arrow hash
aggregation (an Acero plan costs about 90 us however small its input) nor per-group Python. Instead:

* every distinct group key gets a dense slot number, in order of first appearance (``_Interner``: one
  ``index_in`` against the keys seen so far; unseen keys are appended). Several key columns are interned
  column by column and then pairwise (``slot << 32 | code``), so any key type ``index_in`` hashes works, and
  the groups are the ones ``Table.group_by`` would form (null is a key like any other, NaN equals NaN, as
  the values that enter have one NaN bit pattern, ``arrangement.canonical_nan``; -0.0 and 0.0 differ);
* the accumulators are NumPy arrays indexed by slot: the row count (sum of diffs) and, per aggregate, the
  count of non-null values and the sum of ``value * diff``. A step adds the update batch into them with
  ``np.add.at``, exact for integers: the int64 additions wrap, which leaves the right sum whenever it is in
  range whatever the order, and a step whose sum leaves the range raises ``OverflowError`` (found by adding
  the contributions in float64 too, only when their magnitudes could reach 2**62). A column's
  count of non-null values is the row count until the column's first null, so it gets an accumulator of
  its own only then (one ``np.add.at`` fewer per aggregate and per step in the common case);
* min and max keep the multiplicity of every (slot, value) in an Arrow table (values of any orderable type),
  re-aggregated for the touched slots only.

The output changes of a step retract the touched groups' old rows and insert their new ones; a group whose
accumulators did not change emits nothing. The state is that of the accumulated collection, negative
multiplicities included, as a recomputation from scratch has it: a group with a row count of zero or below
has no row but keeps its sums. Slots of groups that hold nothing are reclaimed once they outnumber the
others.

Float sums are accumulated, so a value retracted after many updates can differ in the last bits from a
sum recomputed from scratch; integer aggregates are exact. A float sum whose values all cancel out is reset
to an exact zero: a fingerprint per slot (``_fingerprint``) tells when they do. Infinities and NaN are not added into a float sum
(``inf - inf`` would leave it NaN after the value is retracted): as in Materialize's ``Accum::Float``, each
slot counts its +inf, -inf and NaN values beside the sum of its finite ones, and the sum is NaN while it
holds a NaN or both infinities, else +-inf while it holds one, else the finite sum. These counts exist only
from a column's first non-finite value on, so a column without any costs one ``isfinite`` check per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.compute.arrangement import DIFF, i64, update_schema
from sparkbus.roles.compute.plans import Aggregate, ViewDef

Ints = npt.NDArray[np.int64]
#: int64 or float64 accumulators (the sum type of a column).
Nums = npt.NDArray[Any]

_SLOT, _VALUE, _MULT = "__slot", "__v", "__m"
#: Vanished groups' slots are reclaimed once there are more than this many and more than live ones.
_RECLAIM_FLOOR = 1024
#: Batches with more rows than this are aggregated per group before their groups are interned.
_PREAGGREGATE = 16384


class ViewError(ValueError):
    """A view definition does not fit the schema of its source (names the view and the column)."""


def _sum_type(tp: pa.DataType, what: str) -> pa.DataType:
    if pa.types.is_integer(tp) or pa.types.is_boolean(tp):
        return pa.int64()
    if pa.types.is_floating(tp):
        return pa.float64()
    raise ViewError(f"{what}: cannot sum a column of type {tp}")


def _np(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
    """A column without nulls as a NumPy array (zero-copy for one chunk of a primitive type)."""
    # ChunkedArray.to_numpy (zero-copy for one chunk) costs a third of chunk(0).to_numpy.
    array: npt.NDArray[Any] = (
        column.to_numpy() if isinstance(column, pa.ChunkedArray) else column.to_numpy(zero_copy_only=False)
    )
    return array


#: Integer keys within +-this are looked up in a direct table (see ``_Interner``).
_DIRECT_BOUND = 1 << 62


class _Interner:
    """Dense codes 0, 1, 2, ... for the distinct values of one Arrow type, in order of first appearance.

    ``index_in`` hashes the values seen so far on every call (Arrow keeps no hash table), about 30 us for
    1,000 of them. Integer values spanning a small range are looked up in a direct table instead
    (``_lut[value - _base]``, -1 for unseen values), a gather of a few microseconds. The table has a -1 at
    either end and the gather clips, so a value outside the range finds -1 like an unseen one: one check.
    Tables are only built for values within +-2**62, so that the padded base cannot wrap around.
    """

    def __init__(self, tp: pa.DataType) -> None:
        self.values: pa.Array = pa.array([], tp)
        self._direct = pa.types.is_integer(tp)
        self._lut: Ints | None = None
        self._base = 0

    def __len__(self) -> int:
        size: int = len(self.values)
        return size

    def codes(self, column: pa.Array | pa.ChunkedArray) -> Ints:
        if self._lut is not None and column.null_count == 0 and len(column):
            found = self._lookup(_np(column).astype(np.int64, copy=False))
            if found is not None:
                return found
        idx = pc.index_in(column, value_set=self.values, skip_nulls=False)
        if idx.null_count:
            unseen = pc.unique(column.filter(pc.is_null(idx)))
            if isinstance(unseen, pa.ChunkedArray):
                unseen = unseen.combine_chunks()
            self.values = pa.concat_arrays([self.values, unseen])
            idx = pc.index_in(column, value_set=self.values, skip_nulls=False)
            self._index()
        return _np(idx).astype(np.int64, copy=False)

    def _lookup(self, values: Ints) -> Ints | None:
        """The codes of ``values`` from the direct table; None if one is outside it or unseen."""
        assert self._lut is not None
        found: Ints = np.take(self._lut, values - self._base, mode="clip")
        return found if found.min() >= 0 else None

    def _index(self) -> None:
        """Rebuild the direct table after new values, if they are integers spanning a small range."""
        self._lut = None
        if not self._direct:
            return
        valid = pc.is_valid(self.values)
        codes = np.flatnonzero(_np(valid).astype(np.bool_))
        if not codes.size:
            return
        known = _np(self.values.filter(valid)).astype(np.int64, copy=False)
        lo, hi = int(known.min()), int(known.max())
        if hi - lo >= max(4096, 8 * known.size) or lo < -_DIRECT_BOUND or hi > _DIRECT_BOUND:
            return
        lut = np.full(hi - lo + 3, -1, np.int64)
        lut[known - lo + 1] = codes
        self._lut, self._base = lut, lo - 1


class _SlotMap:
    """Group keys to dense slots, and back (``keys`` holds the key columns of every slot)."""

    def __init__(self, key_fields: list[pa.Field]) -> None:
        self.key_fields = key_fields
        self._names = [f.name for f in key_fields]
        self._int_key = len(key_fields) == 1 and pa.types.is_integer(key_fields[0].type)
        self.keys = pa.schema(key_fields).empty_table()
        #: Bumped whenever slots are renumbered (``keep``), so that a slot number is only ever compared
        #: with slot numbers of the same epoch.
        self.epoch = 0
        #: A single integer key column without nulls, as NumPy (taking from it is cheaper than Arrow's take).
        self._key_np: npt.NDArray[Any] | None = None
        self._reset()

    def _reset(self) -> None:
        self._columns = [_Interner(f.type) for f in self.key_fields]
        self._pairs = [_Interner(pa.int64()) for _ in self.key_fields[1:]]

    def __len__(self) -> int:
        rows: int = self.keys.num_rows
        return rows

    def slots(self, delta: pa.Table) -> Ints:
        """The slot of each row of ``delta`` (new groups get new slots, and their keys are recorded)."""
        names = self._names
        slots = self._columns[0].codes(delta[names[0]])
        for name, column, pairs in zip(names[1:], self._columns[1:], self._pairs, strict=True):
            pair = (slots << 32) | column.codes(delta[name])
            slots = pairs.codes(pa.array(pair, pa.int64()))
        before = self.keys.num_rows
        if slots.size and int(slots.max()) >= before:
            fresh = np.flatnonzero(slots >= before)
            # The first row of each new slot, in slot order (a sort would cost O(n log n) on a big batch).
            first = np.full(int(slots.max()) + 1 - before, delta.num_rows, np.int64)
            np.minimum.at(first, slots[fresh] - before, fresh)
            added = delta.select(names).take(pa.array(first))
            self.keys = pa.concat_tables([self.keys, added.cast(self.keys.schema)]).combine_chunks()
            self._key_np = None
        return slots

    def key_columns(self, slots: Ints) -> list[pa.Array | pa.ChunkedArray]:
        """The key columns of ``slots`` (a row per slot)."""
        if self._int_key:
            if self._key_np is None and self.keys.column(0).null_count == 0:
                self._key_np = _np(self.keys.column(0))
            if self._key_np is not None:
                return [pa.array(self._key_np[slots], self.key_fields[0].type)]
        columns: list[pa.Array | pa.ChunkedArray] = self.keys.take(pa.array(slots)).columns
        return columns

    def keep(self, live: Ints) -> None:
        """Keep only the slots ``live`` (ascending), renumbered 0, 1, 2, ..."""
        self.epoch += 1
        self._key_np = None
        self.keys = self.keys.take(pa.array(live))
        self._reset()
        empty = pa.schema(self.key_fields).empty_table()
        if self.keys.num_rows:
            kept = self.keys
            self.keys = empty
            self.slots(kept)
        else:
            self.keys = empty


class KeyedStep:
    """One reduction step's output changes, with the group slot of each row.

    The first ``retracted`` rows of ``updates`` retract groups' old rows, the others insert new ones; a slot
    appears at most once in each part, and all rows are at ``time``. ``slots`` are numbered by the slot
    map ``source`` at its ``epoch``, so that an index fed by this reduction can look its own slots up from
    them instead of interning the keys again (``keyed.KeyedArrangement``).
    """

    __slots__ = ("epoch", "retracted", "slots", "source", "time", "updates")

    def __init__(
        self, updates: pa.Table, slots: Ints, retracted: int, time: int, source: object, epoch: int
    ) -> None:
        self.updates = updates
        self.slots = slots
        self.retracted = retracted
        self.time = time
        self.source = source
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where aggregate ``agg`` keeps its state: accumulator arrays, or a multiplicity table index."""

    agg: Aggregate
    count: int | None = None
    total: int | None = None
    extreme: int | None = None
    total_type: pa.DataType | None = None


#: A dense min/max table holds at most this many (slot, value) cells (8 bytes each).
_DENSE_CELLS = 1 << 22


def _dense_type(tp: pa.DataType) -> bool:
    """Integer types whose values fit int64 in order (uint64 does not)."""
    return pa.types.is_signed_integer(tp) or tp in (pa.uint8(), pa.uint16(), pa.uint32())


class _Dense:
    """The multiplicity of every (slot, value) of an integer min/max aggregate, in a slots x values matrix.

    Values spanning a small range (``lo`` .. ``lo + width - 1``) are columns, so a step adds its updates
    with one ``np.add.at`` and finds the touched slots' extremes with one ``argmax`` over their rows,
    instead of re-aggregating their multiplicities through Arrow. ``ext``/``has`` hold each slot's current
    extreme. ``add`` refuses values that would make the matrix too big; the caller then moves to the
    multiplicity table.
    """

    def __init__(self, cap: int) -> None:
        self.lo = 0
        self.mult: Ints = np.zeros((cap, 0), np.int64)
        self.ext: Ints = np.zeros(cap, np.int64)
        self.has: npt.NDArray[np.bool_] = np.zeros(cap, np.bool_)

    def resize(self, cap: int, keep: Ints | None = None) -> None:
        """``cap`` slot rows: the first ones kept (grown), or the rows ``keep`` renumbered 0, 1, 2, ..."""
        rows = keep if keep is not None else np.arange(min(cap, len(self.ext)), dtype=np.int64)
        mult = np.zeros((cap, self.mult.shape[1]), np.int64)
        mult[: rows.size] = self.mult[rows]
        ext = np.zeros(cap, np.int64)
        ext[: rows.size] = self.ext[rows]
        has = np.zeros(cap, np.bool_)
        has[: rows.size] = self.has[rows]
        self.mult, self.ext, self.has = mult, ext, has

    def add(self, slots: Ints, values: Ints, diffs: Ints) -> bool:
        if not values.size:
            return True
        lo, hi = int(values.min()), int(values.max())
        width = self.mult.shape[1]
        if width == 0 or lo < self.lo or hi >= self.lo + width:
            new_lo = lo if width == 0 else min(lo, self.lo)
            new_hi = hi if width == 0 else max(hi, self.lo + width - 1)
            span = new_hi - new_lo + 1
            span += span // 2  # room to grow without a copy each time
            if span * len(self.ext) > _DENSE_CELLS:
                return False
            if width == 0:
                new_lo = max(new_lo - span // 6, -(2**63))
            mult = np.zeros((len(self.ext), span), np.int64)
            shift = self.lo - new_lo
            mult[:, shift : shift + width] = self.mult
            self.mult, self.lo = mult, new_lo
        np.add.at(self.mult, (slots, values - self.lo), diffs)
        return True

    def extremes(self, touched: Ints, func: str) -> tuple[Ints, npt.NDArray[np.bool_]]:
        """Recompute the extremes of ``touched`` slots; returns them (and whether each has one)."""
        if self.mult.shape[1] == 0:
            return self.ext[touched], self.has[touched]
        live = self.mult[touched] > 0
        has: npt.NDArray[np.bool_] = np.asarray(live.any(axis=1), np.bool_)
        at = (
            np.argmax(live, axis=1) if func == "min" else live.shape[1] - 1 - np.argmax(live[:, ::-1], axis=1)
        )
        ext: Ints = np.asarray(at, np.int64) + self.lo
        self.ext[touched] = ext
        self.has[touched] = has
        return ext, has

    def table(self, schema: pa.Schema, size: int) -> pa.Table:
        """The nonzero multiplicities as a (slot, value, multiplicity) table."""
        slot, col = np.nonzero(self.mult[:size])
        values = pa.array(col.astype(np.int64) + self.lo, pa.int64()).cast(schema.field(_VALUE).type)
        return pa.Table.from_arrays(
            [pa.array(slot.astype(np.int64)), values, pa.array(self.mult[slot, col])], schema=schema
        )

    def cache(self, tp: pa.DataType, size: int) -> npt.NDArray[np.object_]:
        """The current extremes as Python values (None for none), as the multiplicity-table path keeps them."""
        values = pa.array(self.ext[:size], pa.int64(), mask=~self.has[:size]).cast(tp).to_pylist()
        out: npt.NDArray[np.object_] = np.full(len(self.ext), None, object)
        out[:size] = values
        return out


class Reduction:
    """Group-by state of one view, updated by batches of ``(row, diff)`` at one time."""

    def __init__(self, view: ViewDef, schema: pa.Schema, where: str) -> None:
        self.keys = list(view.group_by)
        self.global_agg = not self.keys and bool(view.aggregates)
        key_fields = [schema.field(k) for k in self.keys]
        self.slots: list[_Slot] = []
        out_fields = list(key_fields)
        counts = 0
        totals: list[pa.DataType] = []
        mult_types: list[pa.DataType] = []
        for agg in view.aggregates:
            what = f"{where}: {agg.func}({agg.column or '*'}) AS {agg.name}"
            if agg.column is None:
                self.slots.append(_Slot(agg))
                out_fields.append(pa.field(agg.name, pa.int64()))
                continue
            tp = schema.field(agg.column).type
            if agg.func in ("min", "max"):
                self.slots.append(_Slot(agg, extreme=len(mult_types)))
                mult_types.append(tp)
                out_fields.append(pa.field(agg.name, tp))
                continue
            counts += 1
            if agg.func == "count":
                self.slots.append(_Slot(agg, count=counts - 1))
                out_fields.append(pa.field(agg.name, pa.int64()))
                continue
            sum_type = _sum_type(tp, what)
            self.slots.append(_Slot(agg, count=counts - 1, total=len(totals), total_type=sum_type))
            totals.append(sum_type)
            out_fields.append(pa.field(agg.name, sum_type if agg.func == "sum" else pa.float64()))
        self.out_schema = pa.schema(out_fields)
        self.update_schema = update_schema(self.out_schema)
        self._map = _SlotMap(key_fields) if self.keys else None
        self._n: Ints = np.zeros(1, np.int64)
        #: Per counted column, its non-null count per slot; None while the column has had no null, when the
        #: count is the row count ``_n`` (which saves an accumulator per aggregate in the common case).
        self._counts: list[Ints | None] = [None] * counts
        self._totals: list[Nums] = [
            np.zeros(1, np.float64 if t == pa.float64() else np.int64) for t in totals
        ]
        #: Per total, the count of its +inf, -inf and NaN values per slot (float sums only); None until the
        #: column's first non-finite value, so that the common case keeps three accumulators fewer.
        self._specials: list[list[Ints] | None] = [None] * len(totals)
        #: Per float total, a fingerprint per slot of the values summed (``_fingerprint``): zero exactly when
        #: they cancel out, when the total is reset to an exact zero (None for integer totals).
        self._prints: dict[int, Ints] = {
            i: np.zeros(1, np.int64) for i, t in enumerate(totals) if t == pa.float64()
        }
        self._mult_schemas = [
            pa.schema([pa.field(_SLOT, pa.int64()), pa.field(_VALUE, tp), pa.field(_MULT, pa.int64())])
            for tp in mult_types
        ]
        self._mults = [s.empty_table() for s in self._mult_schemas]
        #: Per extreme aggregate, each slot's current extreme (a Python value, None if none), so that a step
        #: re-aggregates only the touched groups' new values, not their old ones too.
        self._ext: list[npt.NDArray[np.object_]] = [np.full(1, None, object) for _ in mult_types]
        #: Per extreme aggregate, its dense matrix while it has one (integer values in a small range).
        self._dense: list[_Dense | None] = [_Dense(1) if _dense_type(tp) else None for tp in mult_types]
        self._flags = np.zeros(1, np.bool_)
        self._live = 0
        self._reclaim_at = 0
        self._started = False
        #: The changes of the last step with their slots (None without group keys or without changes).
        self.last_step: KeyedStep | None = None
        #: Per integer total, its aggregate's name (for the overflow error), a bound on the magnitude of its
        #: sums (``_check_overflow``), and the current step's values and diffs.
        self._int_totals = {
            s.total: s.agg.name for s in self.slots if s.total is not None and s.total_type == pa.int64()
        }
        self._bounds: dict[int, float] = dict.fromkeys(self._int_totals, 0.0)
        self._int_adds: dict[int, tuple[Ints, Ints]] = {}
        self._print_adds: dict[int, Ints] = {}

    # ---------------------------------------------------------------- state

    @property
    def _size(self) -> int:
        return len(self._map) if self._map is not None else 1

    def _reserve(self, size: int) -> None:
        cap = len(self._n)
        if size <= cap:
            return
        cap = max(size, 2 * cap)

        def grown(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            out = _blank(cap, a.dtype)
            out[: len(a)] = a
            return out

        self._n = grown(self._n)  # type: ignore[assignment]
        self._counts = [None if a is None else grown(a) for a in self._counts]  # type: ignore[misc]
        self._totals = [grown(a) for a in self._totals]
        self._specials = [None if s is None else [grown(a) for a in s] for s in self._specials]  # type: ignore[misc]
        self._prints = {i: grown(a) for i, a in self._prints.items()}  # type: ignore[misc]
        self._flags = grown(self._flags)  # type: ignore[assignment]
        self._ext = [grown(a) for a in self._ext]  # type: ignore[misc]
        for i, dense in enumerate(self._dense):
            if dense is None:
                continue
            if cap * dense.mult.shape[1] > _DENSE_CELLS:
                # Too many groups for a matrix of this width: keep a multiplicity table from now on.
                size, schema = len(dense.ext), self._mult_schemas[i]
                self._mults[i] = dense.table(schema, size)
                self._ext[i][:size] = dense.cache(schema.field(_VALUE).type, size)
                self._dense[i] = None
            else:
                dense.resize(cap)

    def _accumulators(self) -> list[Nums]:
        specials = (a for s in self._specials if s is not None for a in s)
        return [self._n, *(c for c in self._counts if c is not None), *self._totals, *specials]

    # ---------------------------------------------------------------- a step

    def step(self, delta: pa.Table, time: int) -> pa.Table:
        """Apply ``delta`` (rows with ``__diff``) and return the output changes at ``time``.

        The changes retract the changed groups' old rows and insert their new ones (consolidated: a touched
        group whose accumulators did not change yields nothing).
        """
        self.last_step = None
        rows = delta.num_rows
        if delta.num_columns and delta.column(0).num_chunks > 1:
            delta = delta.combine_chunks()  # once, rather than per column as each is read
        adds = self._contributions(delta)
        prints = self._print_adds
        shadows: dict[int, Nums] | None = None
        keyed = delta
        if self._map is not None and rows > _PREAGGREGATE and not self._mults:
            # A big batch (a dataflow's first step over a whole snapshot): one hash aggregation per group
            # is cheaper than interning every row, and leaves one contribution per group to add.
            names = [f"__a{i}" for i in range(len(adds))]
            # The int sums' contributions in float64 too, summed per group: what tells an overflow.
            floats: dict[str, Nums] = {
                f"__f{i}": v.astype(np.float64) * d for i, (v, d) in self._int_adds.items()
            }
            floats |= {f"__p{i}": add for i, add in prints.items()}
            parts = pa.table(
                {**{k: delta[k] for k in self.keys}, **dict(zip(names, adds, strict=True)), **floats}
            )
            keyed = parts.group_by(self.keys, use_threads=False).aggregate(
                [(n, "sum") for n in [*names, *floats]]
            )
            adds = [_np(keyed[f"{n}_sum"]) for n in names]
            shadows = {i: _np(keyed[f"__f{i}_sum"]) for i in self._int_adds}
            prints = {i: _np(keyed[f"__p{i}_sum"]) for i in prints}
            rows = keyed.num_rows
        if self._map is None:
            slots: Ints = np.zeros(rows, np.int64)
            touched: Ints = np.zeros(1 if self.global_agg else min(rows, 1), np.int64)
        else:
            slots = self._map.slots(keyed) if rows else np.zeros(0, np.int64)
            if len(self._map) > self._n.size:
                self._reserve(len(self._map))
            self._flags[slots] = True
            touched = np.flatnonzero(self._flags)
            self._flags[touched] = False
        if touched.size == 0:
            return self.update_schema.empty_table()
        accs = self._accumulators()
        before = [a[touched] for a in accs]
        for acc, add in zip(accs, adds, strict=True):
            np.add.at(acc, slots, add)
        after = [a[touched] for a in accs]
        if self._int_adds:
            self._check_overflow(slots, touched, shadows, before, after)
        # The state is that of the accumulated collection, negative multiplicities included, as a
        # recomputation from scratch over the same updates has it: a group whose row count is zero has no
        # row, but keeps its sums (a row retracted before it was inserted leaves them). Integer
        # accumulators are exact; a float total whose values all cancelled out is reset to an exact zero,
        # which drops the residue of rounding their additions left.
        first = 1 + sum(c is not None for c in self._counts)
        for i, add in prints.items():
            fingerprint = self._prints[i]
            np.add.at(fingerprint, slots, add)
            cancelled = fingerprint[touched] == 0
            if cancelled.any():
                accs[first + i][touched[cancelled]] = 0
                after[first + i][cancelled] = 0
        started = self._started
        self._started = True
        old_live = before[0] > 0
        new_live = after[0] > 0
        if self.global_agg:
            old_live[:] = started
            new_live[:] = True
        changed = old_live != new_live
        for b, a in zip(before, after, strict=True):
            changed |= b != a
        old_ext, new_ext = self._extremes(delta, slots, touched, changed)
        if self.global_agg and started and before[0][0] <= 0 and after[0][0] <= 0:
            changed[:] = False  # no rows before or after: one row (count 0, others null) whatever the sums
        retract, insert = old_live & changed, new_live & changed
        retracted, inserted = int(np.count_nonzero(retract)), int(np.count_nonzero(insert))
        if retracted == inserted == touched.size:
            # Every touched group changed, and existed before and after (the common case): no selection.
            out_slots = np.concatenate([touched, touched])
            values = [np.concatenate([b, a]) for b, a in zip(before, after, strict=True)]
            extremes = [pa.concat_arrays([o, n]) for o, n in zip(old_ext, new_ext, strict=True)]
        else:
            self._live += int(np.count_nonzero(new_live)) - int(np.count_nonzero(old_live))
            out_slots = np.concatenate([touched[retract], touched[insert]])
            values = [np.concatenate([b[retract], a[insert]]) for b, a in zip(before, after, strict=True)]
            extremes = [_pick(o, retract, n, insert) for o, n in zip(old_ext, new_ext, strict=True)]
        out = self._rows(out_slots, values, extremes, retracted, time)
        if self._map is not None and out.num_rows:
            self.last_step = KeyedStep(out, out_slots, retracted, time, self._map, self._map.epoch)
        if self._map is not None and len(self._map) > max(_RECLAIM_FLOOR, 2 * self._live, self._reclaim_at):
            self._reclaim()
        return out

    def _check_overflow(
        self,
        slots: Ints,
        touched: Ints,
        shadows: dict[int, Nums] | None,
        before: list[Nums],
        after: list[Nums],
    ) -> None:
        """Raise ``OverflowError`` if an integer sum of a touched group left the int64 range this step.

        The int64 accumulators wrap, so a sum back in range is right whatever the order of the additions
        (a replica that rebuilt the view agrees with one that maintained it); one out of range differs from
        the float64 estimate (``before`` plus the step's contributions in float64, ``shadows`` if the step
        summed them per group) by about 2**64. That is computed only once a bound on every sum's magnitude
        (the last known largest plus the magnitudes added since) reaches 2**62: a few min/max per step
        otherwise.
        """
        first = 1 + sum(c is not None for c in self._counts)
        for i, (values, diff) in self._int_adds.items():
            if shadows is not None:
                added = float(np.abs(shadows[i]).sum())
            elif values.size:
                largest = max(abs(int(values.min())), abs(int(values.max())))
                added = float(largest * max(abs(int(diff.min())), abs(int(diff.max()))) * values.size)
            else:
                added = 0.0
            self._bounds[i] += added
            if self._bounds[i] < 2.0**62:
                continue  # no sum can have left the range
            shadow = shadows[i] if shadows is not None else values.astype(np.float64) * diff
            step = np.zeros(len(self._n), np.float64)
            np.add.at(step, slots, shadow)
            estimate = before[first + i].astype(np.float64) + step[touched]
            if (np.abs(estimate - after[first + i].astype(np.float64)) > 2.0**62).any():
                raise OverflowError(f"integer overflow in {self._int_totals[i]!r}: a sum is beyond int64")
            sums = self._totals[i][: self._size]
            self._bounds[i] = float(np.abs(sums.astype(np.float64)).max()) if sums.size else 0.0

    def _contributions(self, delta: pa.Table) -> list[Nums]:
        """What each row of ``delta`` adds to each accumulator (aligned with ``_accumulators``); the integer
        totals' values and diffs go to ``_int_adds``, the float totals' fingerprints to ``_print_adds``."""
        self._int_adds = {}
        self._print_adds = {}
        diff = _np(delta[DIFF]).astype(np.int64, copy=False)
        counts: list[Nums | None] = [None] * len(self._counts)
        totals: list[Nums] = [diff] * len(self._totals)
        specials: list[list[Nums] | None] = [None] * len(self._totals)
        for slot in self.slots:
            column = slot.agg.column
            if column is None or slot.count is None:
                continue
            values = delta[column]
            nulls = values.null_count
            valid = None if not nulls else _np(pc.is_valid(values)).astype(np.bool_)
            if valid is not None and self._counts[slot.count] is None:
                # The first null of this column: from now on its count differs from the row count.
                self._counts[slot.count] = self._n.copy()
            if self._counts[slot.count] is not None:
                counts[slot.count] = diff if valid is None else diff * valid
            if slot.total is not None:
                assert slot.total_type is not None
                typed = values if values.type == slot.total_type else pc.cast(values, slot.total_type)
                if nulls:
                    typed = pc.fill_null(typed, pa.scalar(0, slot.total_type))
                summed = _np(typed)
                if summed.dtype == np.float64:
                    summed, specials[slot.total] = self._split_specials(slot.total, summed, diff)
                    self._print_adds[slot.total] = _fingerprint(summed) * diff
                else:
                    self._int_adds[slot.total] = (summed, diff)
                totals[slot.total] = summed * diff
        parts = (s for s in specials if s is not None)
        return [diff, *(c for c in counts if c is not None), *totals, *(a for s in parts for a in s)]

    def _split_specials(self, total: int, values: Nums, diff: Ints) -> tuple[Nums, list[Nums] | None]:
        """``values`` with +-inf and NaN as 0, and what they add to total ``total``'s counts of each (None
        while the column has had none)."""
        finite = np.isfinite(values)
        if finite.all():
            if self._specials[total] is None:
                return values, None
            zeros = np.zeros(len(values), np.int64)
            return values, [zeros, zeros, zeros]
        if self._specials[total] is None:
            self._specials[total] = [np.zeros(len(self._n), np.int64) for _ in range(3)]
        kinds = [values == np.inf, values == -np.inf, np.isnan(values)]
        return np.where(finite, values, 0.0), [diff * k for k in kinds]

    def _extremes(
        self, delta: pa.Table, slots: Ints, touched: Ints, changed: npt.NDArray[np.bool_]
    ) -> tuple[list[pa.Array], list[pa.Array]]:
        """Per extreme aggregate, the touched groups' old and new extremes (aligned with ``touched``).

        An extreme can change while the accumulators stay the same (retract 1, insert 5), so every touched
        group counts as changed when the view has min or max.
        """
        olds: list[pa.Array] = []
        news: list[pa.Array] = []
        if not self._mults:
            return olds, news
        changed[:] = True
        keys = pa.array(touched)
        diff = delta[DIFF]
        for slot in self.slots:
            if slot.extreme is None:
                continue
            assert slot.agg.column is not None
            i, func = slot.extreme, slot.agg.func
            schema = self._mult_schemas[i]
            column = delta[slot.agg.column]
            dense = self._dense[i]
            if dense is not None:
                valid = _np(pc.is_valid(column)).astype(np.bool_) if column.null_count else None
                values = _np(column.filter(valid) if valid is not None else column).astype(np.int64)
                at = slots if valid is None else slots[valid]
                diffs = _np(diff).astype(np.int64, copy=False)
                if valid is not None:
                    diffs = diffs[valid]
                old_ext, old_has = dense.ext[touched], dense.has[touched]
                if dense.add(at, values, diffs):
                    new_ext, new_has = dense.extremes(touched, func)
                    tp = schema.field(_VALUE).type
                    olds.append(pa.array(old_ext, pa.int64(), mask=~old_has).cast(tp))
                    news.append(pa.array(new_ext, pa.int64(), mask=~new_has).cast(tp))
                    continue
                # Too wide for a matrix: from now on this aggregate keeps a multiplicity table.
                self._mults[i] = dense.table(schema, self._size)
                self._ext[i] = dense.cache(schema.field(_VALUE).type, self._size)
                self._dense[i] = None
            part = pa.Table.from_arrays([pa.array(slots), column, diff], schema=schema)
            if column.null_count:
                part = part.filter(pc.is_valid(column))
            mult = self._mults[i]
            mask = pc.is_in(mult[_SLOT], value_set=keys)
            hit, rest = mult.filter(mask), mult.filter(pc.invert(mask))
            merged = pa.concat_tables([hit, part]).group_by([_SLOT, _VALUE], use_threads=False)
            merged = merged.aggregate([(_MULT, "sum")]).rename_columns([_SLOT, _VALUE, _MULT])
            merged = merged.filter(pc.not_equal(merged[_MULT], i64(0))).cast(schema)
            self._mults[i] = _append(rest, merged)
            cache = self._ext[i]
            olds.append(pa.array(cache[touched], schema.field(_VALUE).type))
            new = _extreme(merged, keys, func)
            cache[touched] = new.to_pylist()
            news.append(new)
        return olds, news

    def _rows(
        self, slots: Ints, accs: list[Nums], extremes: list[pa.Array], retracted: int, time: int
    ) -> pa.Table:
        """Output updates for ``slots`` from their accumulators: the first ``retracted`` with diff -1."""
        n = accs[0]
        held = sum(c is not None for c in self._counts)
        if self.global_agg and len(n) and (n <= 0).any():
            # A global aggregate over a collection with no row (its row count 0, or below once rows were
            # retracted before they were inserted) is the row of no rows; the accumulators keep their sums.
            accs, extremes, n = _no_rows(accs, extremes, n > 0)
        it = iter(accs[1 : 1 + held])
        counts = [n if c is None else next(it) for c in self._counts]
        totals = accs[1 + held : 1 + held + len(self._totals)]
        special = iter(accs[1 + held + len(self._totals) :])
        for i, kept in enumerate(self._specials):
            if kept is not None:
                totals[i] = _with_specials(totals[i], next(special), next(special), next(special))
        columns: list[pa.Array | pa.ChunkedArray] = []
        if self._map is not None:
            columns.extend(self._map.key_columns(slots))
        for slot in self.slots:
            if slot.extreme is not None:
                columns.append(extremes[slot.extreme])
            elif slot.count is None:
                columns.append(pa.array(n, pa.int64()))
            elif slot.total is None:
                columns.append(pa.array(counts[slot.count], pa.int64()))
            else:
                count, total = counts[slot.count], totals[slot.total]
                # An array built with a mask costs more than checking whether it needs one. A count that is
                # the row count is 0 only for the row of a global aggregate over no rows.
                none = None
                if self._counts[slot.count] is not None or self.global_agg:
                    zero = count == 0
                    none = zero if zero.any() else None
                if slot.agg.func == "sum":
                    columns.append(pa.array(total, slot.total_type, mask=none))
                elif none is None:
                    columns.append(pa.array(np.true_divide(total, count), pa.float64()))
                else:
                    mean = np.divide(total, count, out=np.zeros(len(count)), where=~none)
                    columns.append(pa.array(mean, pa.float64(), mask=none))
        rows = len(slots)
        columns.append(pa.array(np.full(rows, time, np.int64)))
        columns.append(_signs(retracted, rows - retracted))
        return pa.Table.from_arrays(columns, schema=self.update_schema)

    def _reclaim(self) -> None:
        """Drop the slots of groups that hold nothing, renumbering the others (and their multiplicities)."""
        assert self._map is not None
        size = len(self._map)
        # A group with no row may still hold sums (negative multiplicities): it lives while any is non-zero.
        keep = self._n[:size] != 0
        for acc in [*self._accumulators()[1:], *self._prints.values()]:
            keep |= acc[:size] != 0
        for mult in self._mults:
            if mult.num_rows:
                keep[_np(mult[_SLOT])] = True
        for dense in self._dense:
            if dense is not None:
                keep |= (dense.mult[:size] != 0).any(axis=1)
        live = np.flatnonzero(keep)
        self._reclaim_at = 2 * live.size
        renumber = np.full(size, -1, np.int64)
        renumber[live] = np.arange(live.size, dtype=np.int64)
        self._map.keep(live)
        cap = max(1, live.size)

        def cut(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            out = _blank(cap, a.dtype)
            out[: live.size] = a[live]
            return out

        self._n = cut(self._n)  # type: ignore[assignment]
        self._counts = [None if a is None else cut(a) for a in self._counts]  # type: ignore[misc]
        self._totals = [cut(a) for a in self._totals]
        self._specials = [None if s is None else [cut(a) for a in s] for s in self._specials]  # type: ignore[misc]
        self._prints = {i: cut(a) for i, a in self._prints.items()}  # type: ignore[misc]
        self._flags = np.zeros(cap, np.bool_)
        self._ext = [cut(a) for a in self._ext]  # type: ignore[misc]
        for dense in self._dense:
            if dense is not None:
                dense.resize(cap, live)
        for i, mult in enumerate(self._mults):
            slots = renumber[_np(mult[_SLOT])] if mult.num_rows else np.zeros(0, np.int64)
            kept = slots >= 0
            table = mult.filter(pa.array(kept)) if mult.num_rows else mult
            self._mults[i] = table.set_column(0, _SLOT, pa.array(slots[kept], pa.int64())).combine_chunks()


_SIGNS: pa.Array = pa.array([], pa.int64())


def _signs(negative: int, positive: int) -> pa.Array:
    """``negative`` times -1 followed by ``positive`` times 1 (a zero-copy slice of a shared array)."""
    global _SIGNS
    half = len(_SIGNS) // 2
    if negative > half or positive > half:
        half = max(negative, positive, 2 * half, 1024)
        _SIGNS = pa.array(np.concatenate([np.full(half, -1, np.int64), np.ones(half, np.int64)]))
    return _SIGNS.slice(half - negative, negative + positive)


def _fingerprint(values: Nums) -> Ints:
    """A 64-bit hash of each float (a xorshift-multiply-xorshift round over its bits; -0.0 as 0.0, and 0.0
    hashes to 0).

    Added up times the diffs per group (wrapping), it is 0 when the values cancel out as a multiset, and
    otherwise 0 only by a 2**-64 chance: it tells a float total whose true value is exactly 0 from one that
    merely has row count 0 (rows retracted before they were inserted) without comparing floats."""
    x = (values + 0.0).view(np.uint64)
    y = x >> _SHIFT
    x ^= y
    x *= _MIX
    np.right_shift(x, _SHIFT, out=y)
    x ^= y
    out: Ints = x.view(np.int64)
    return out


_SHIFT, _MIX = np.uint64(32), np.uint64(0xBF58476D1CE4E5B9)


def _with_specials(total: Nums, pos: Ints, neg: Ints, nan: Ints) -> Nums:
    """A float sum given its finite part and its counts of +inf, -inf and NaN (``Accum::Float``'s rule)."""
    if not (pos.any() or neg.any() or nan.any()):
        return total
    out: Nums = np.where(pos > 0, np.inf, total)
    out = np.where(neg > 0, -np.inf, out)
    return np.where((nan > 0) | ((pos > 0) & (neg > 0)), np.nan, out)


def _blank(size: int, dtype: np.dtype[np.generic]) -> npt.NDArray[np.generic]:
    """Zeros, or Nones for an object array."""
    return np.full(size, None, object) if dtype == np.object_ else np.zeros(size, dtype)


def _extreme(mult: pa.Table, keys: pa.Array, func: str) -> pa.Array:
    """The least (``min``) or greatest value with a positive multiplicity per slot of ``keys`` (else null)."""
    live = mult.filter(pc.greater(mult[_MULT], i64(0)))
    best = live.group_by([_SLOT], use_threads=False).aggregate([(_VALUE, func)])
    where = pc.index_in(keys, value_set=best[_SLOT].combine_chunks())
    values = best[f"{_VALUE}_{func}"].combine_chunks()
    if pa.types.is_floating(values.type):
        values = _signed_zero(live, best[_SLOT].combine_chunks(), values, func)
    return values.take(where)


def _signed_zero(live: pa.Table, slots: pa.Array, values: pa.Array, func: str) -> pa.Array:
    """``values`` (each slot's extreme) with a zero extreme made 0.0 for ``max`` and -0.0 for ``min`` when
    the slot holds that zero: -0.0 equals 0.0, so which of them Arrow's min/max returns depends on the
    order of the rows, and a maintained view and its recomputation would show different zeros."""
    zero = pa.scalar(0.0, values.type)
    zeros = live.filter(pc.equal(live[_VALUE], zero))
    if zeros.num_rows == 0:
        return values
    negative = np.signbit(_np(zeros[_VALUE]))
    wanted = zeros.filter(pa.array(negative if func == "min" else ~negative))[_SLOT]
    held = pc.and_(pc.equal(values, zero), pc.is_in(slots, value_set=wanted.combine_chunks()))
    return pc.if_else(held, pa.scalar(-0.0 if func == "min" else 0.0, values.type), values)


def _no_rows(
    accs: list[Nums], extremes: list[pa.Array], rows: npt.NDArray[np.bool_]
) -> tuple[list[Nums], list[pa.Array], Nums]:
    """``accs`` and ``extremes`` with the entries where ``rows`` is False made those of no rows: every count
    and sum 0 (a count 0 makes its sum and avg null), every extreme null; also the row count, ``accs[0]``."""
    accs = [np.where(rows, a, np.zeros(1, a.dtype)) for a in accs]
    valid = pa.array(rows)
    extremes = [pc.if_else(valid, e, pa.scalar(None, e.type)) for e in extremes]
    return accs, extremes, accs[0]


def _pick(
    old: pa.Array, retract: npt.NDArray[np.bool_], new: pa.Array, insert: npt.NDArray[np.bool_]
) -> pa.Array:
    return pa.concat_arrays([old.filter(pa.array(retract)), new.filter(pa.array(insert))])


def _append(rest: pa.Table, part: pa.Table) -> pa.Table:
    """``rest`` with ``part``'s rows added; chunks are merged now and then so filters stay fast."""
    table = pa.concat_tables([rest, part])
    return table.combine_chunks() if table.column(0).num_chunks > 16 else table
