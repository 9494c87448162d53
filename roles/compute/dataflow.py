"""Views maintained incrementally from ``(row, time, diff)`` updates, on Arrow.

A linear view (maps, filters, project) transforms each update batch on its own: the output updates are the
input updates, mapped and filtered, with their times and diffs. A reduction keeps per-group state:

* accumulators per group: the row count (sum of diffs), and per aggregate the sum of ``value * diff`` and the
  count of non-null values, from which count, sum and avg follow and which retractions simply subtract;
* for min and max, the multiplicity of every (group, value): a retraction lowers it, and the extreme is the
  least (greatest) value whose multiplicity is still positive.

Each step groups the update batch with ``Table.group_by``, merges the result into the state with one
concatenate-and-group, and emits the old output rows retracted and the new ones inserted. Updates are applied
one distinct time at a time, so the output changes carry the time their cause had.

Float sums are accumulated, so a value retracted after many updates can differ in the last bits from a
sum recomputed from scratch; integer aggregates are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.compute.arrangement import (
    DIFF,
    TIME,
    advance_times,
    conform,
    consolidate,
    i64,
    update_schema,
)
from sparkbus.roles.compute.plans import Aggregate, Finishing, MapExpr, Predicate, ViewDef

_COMPARE = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal}
_COMPARE |= {"gt": pc.greater, "ge": pc.greater_equal}
_ARITH = {"add": pc.add, "subtract": pc.subtract, "multiply": pc.multiply, "divide": pc.divide}
_N = "__n"


class ViewError(ValueError):
    """A view definition does not fit the schema of its source (names the view and the column)."""


# ---------------------------------------------------------------- linear operators


def _map_column(table: pa.Table, expr: MapExpr) -> pa.Array | pa.ChunkedArray:
    left = table[expr.left]
    right = table[expr.right] if expr.right is not None else pa.scalar(expr.literal)
    if expr.op == "divide":
        # Integer division by zero raises in Arrow; a maintained view must not fail on data, so division is
        # in float64, where x / 0 is inf or nan, as in most SQL engines' float division.
        left = pc.cast(left, pa.float64())
        right = pc.cast(right, pa.float64())
    return _ARITH[expr.op](left, right)


def _mask(table: pa.Table, pred: Predicate) -> pa.Array | pa.ChunkedArray:
    col = table[pred.column]
    if pred.op == "is_null":
        return pc.is_null(col)
    if pred.op == "is_not_null":
        return pc.is_valid(col)
    return _COMPARE[pred.op](col, pa.scalar(pred.value))


def apply_linear(view: ViewDef, table: pa.Table) -> pa.Table:
    """Maps, then filters (null is false, as in SQL), then the projection; ``__time``/``__diff`` pass through."""
    for expr in view.maps:
        table = table.append_column(expr.name, _map_column(table, expr))
    if view.filters:
        mask = _mask(table, view.filters[0])
        for pred in view.filters[1:]:
            mask = pc.and_kleene(mask, _mask(table, pred))
        table = table.filter(mask)
    if view.project is not None:
        extra = [n for n in (TIME, DIFF) if n in table.column_names]
        table = table.select([*view.project, *extra])
    return table


# ---------------------------------------------------------------- reductions


def _sum_type(tp: pa.DataType, what: str) -> pa.DataType:
    if pa.types.is_integer(tp) or pa.types.is_boolean(tp):
        return pa.int64()
    if pa.types.is_floating(tp):
        return pa.float64()
    raise ViewError(f"{what}: cannot sum a column of type {tp}")


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where aggregate ``agg`` keeps its state: accumulator columns, or a multiplicity table index."""

    agg: Aggregate
    count: str | None = None
    total: str | None = None
    extreme: int | None = None


class Reduction:
    """Group-by state of one view, updated by batches of ``(row, diff)`` at one time."""

    def __init__(self, view: ViewDef, schema: pa.Schema, where: str) -> None:
        self.keys = list(view.group_by)
        self.global_agg = not self.keys and bool(view.aggregates)
        key_fields = [schema.field(k) for k in self.keys]
        acc_fields = [pa.field(_N, pa.int64())]
        self.slots: list[_Slot] = []
        mult_schemas: list[pa.Schema] = []
        out_fields = list(key_fields)
        for i, agg in enumerate(view.aggregates):
            what = f"{where}: {agg.func}({agg.column or '*'}) AS {agg.name}"
            if agg.column is None:
                self.slots.append(_Slot(agg))
                out_fields.append(pa.field(agg.name, pa.int64()))
                continue
            tp = schema.field(agg.column).type
            if agg.func in ("min", "max"):
                self.slots.append(_Slot(agg, extreme=len(mult_schemas)))
                mult_schemas.append(
                    pa.schema([*key_fields, pa.field("__v", tp), pa.field("__m", pa.int64())])
                )
                out_fields.append(pa.field(agg.name, tp))
                continue
            count, total = f"__c{i}", f"__s{i}"
            acc_fields.append(pa.field(count, pa.int64()))
            if agg.func == "count":
                self.slots.append(_Slot(agg, count=count))
                out_fields.append(pa.field(agg.name, pa.int64()))
                continue
            sum_type = _sum_type(tp, what)
            acc_fields.append(pa.field(total, sum_type))
            self.slots.append(_Slot(agg, count=count, total=total))
            out_fields.append(pa.field(agg.name, sum_type if agg.func == "sum" else pa.float64()))
        self.acc_schema = pa.schema([*key_fields, *acc_fields])
        self.acc = self.acc_schema.empty_table()
        self.mults = [s.empty_table() for s in mult_schemas]
        self.out_schema = pa.schema(out_fields)
        self.output = self.out_schema.empty_table()

    def step(self, delta: pa.Table) -> pa.Table:
        """Apply ``delta`` (rows with ``__diff``) and return the output changes (rows with ``__diff``).

        The changes retract the touched groups' old rows and insert their new ones, not consolidated.
        """
        diff = delta[DIFF]
        cols: dict[str, pa.ChunkedArray | pa.Array] = {k: delta[k] for k in self.keys}
        cols[_N] = diff
        for slot in self.slots:
            column = slot.agg.column
            if column is None or slot.count is None:
                continue
            valid = pc.is_valid(delta[column])
            cols[slot.count] = pc.if_else(valid, diff, i64(0))
            if slot.total is not None:
                tp = self.acc_schema.field(slot.total).type
                value = pc.multiply(pc.cast(delta[column], tp), pc.cast(diff, tp))
                cols[slot.total] = pc.if_else(valid, value, pa.scalar(0, tp))
        ext = conform(pa.table(cols), self.acc_schema)
        # Only the groups the delta touches change: split every state table into those groups and the rest
        # (a cheap membership test), fold the delta into the touched part, and diff only that part's output.
        touched = self._touched(delta)
        acc_hit, acc_rest = self._split(self.acc, touched)
        acc_hit = self._merge(acc_hit, ext, self.keys, _N)
        mult_hits: list[pa.Table] = []
        for i, slot in enumerate(s for s in self.slots if s.extreme is not None):
            assert slot.agg.column is not None
            column = delta[slot.agg.column]
            part = {k: delta[k] for k in self.keys} | {"__v": column, "__m": diff}
            mult = pa.table(part).filter(pc.is_valid(column)).cast(self.mults[i].schema)
            hit, rest = self._split(self.mults[i], touched)
            hit = self._merge(hit, mult, [*self.keys, "__v"], "__m")
            mult_hits.append(hit)
            self.mults[i] = _append(rest, hit)
        self.acc = _append(acc_rest, acc_hit)
        new = self._output(acc_hit, mult_hits)
        old, out_rest = self._split(self.output, touched)
        self.output = _append(out_rest, new)
        # Not consolidated here: a group whose output did not change yields a retraction and an insertion
        # that cancel. Whoever keeps or ships the output consolidates it anyway (the index arrangement when it
        # folds, subscribe batches when they are cut), and a second pass here cost a quarter of the step.
        return pa.concat_tables(
            [
                old.append_column(DIFF, pa.repeat(pa.scalar(-1, pa.int64()), old.num_rows)),
                new.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), new.num_rows)),
            ]
        )

    def _touched(self, delta: pa.Table) -> list[pa.Array]:
        """Per key column, the distinct values ``delta`` has there (computed once per step)."""
        return [pc.unique(delta[k].combine_chunks()) for k in self.keys]

    def _split(self, table: pa.Table, touched: list[pa.Array]) -> tuple[pa.Table, pa.Table]:
        """The rows of ``table`` whose group may occur in the delta (``touched``), and the others.

        Per-column membership over-approximates for several key columns; the extra groups are merged with
        nothing and their old and new output rows cancel, so this stays exact. Null matches null.
        """
        if not self.keys or table.num_rows == 0:
            return table, table.slice(0, 0)
        mask = None
        for k, values in zip(self.keys, touched, strict=True):
            member = pc.is_in(table[k], value_set=values, skip_nulls=False)
            mask = member if mask is None else pc.and_(mask, member)
        return table.filter(mask), table.filter(pc.invert(mask))

    @staticmethod
    def _merge(state: pa.Table, ext: pa.Table, keys: list[str], count: str) -> pa.Table:
        both = pa.concat_tables([state, ext])
        sums = [c for c in state.column_names if c not in keys]
        merged = both.group_by(keys, use_threads=False).aggregate([(c, "sum") for c in sums])
        merged = merged.rename_columns([*keys, *sums] if keys else sums).select(state.column_names)
        return conform(merged.filter(pc.not_equal(merged[count], i64(0))), state.schema)

    def _output(self, acc: pa.Table, mults: list[pa.Table]) -> pa.Table:
        """The output rows of the groups in ``acc`` (and their value multiplicities in ``mults``)."""
        if mults:
            parts = [acc]
            for slot in self.slots:
                if slot.extreme is None:
                    continue
                mult = mults[slot.extreme]
                live = mult.filter(pc.greater(mult["__m"], i64(0)))
                func = "min" if slot.agg.func == "min" else "max"
                best = live.group_by(self.keys, use_threads=False).aggregate([("__v", func)])
                parts.append(best.rename_columns([*self.keys, f"__x{slot.extreme}"]))
            both = pa.concat_tables(parts, promote_options="default")
            aggs = [(c, "sum") for c in acc.column_names if c not in self.keys]
            aggs += [(f"__x{s.extreme}", "max") for s in self.slots if s.extreme is not None]
            acc = both.group_by(self.keys, use_threads=False).aggregate(aggs)
            acc = acc.rename_columns(
                [*self.keys, *(a[0] for a in aggs)] if self.keys else [a[0] for a in aggs]
            )
        acc = acc.filter(pc.greater(acc[_N], i64(0)))
        if acc.num_rows == 0 and self.global_agg:
            # SQL: a global aggregate over no rows is one row (count 0, everything else null).
            return pa.table(
                {
                    f.name: pa.array([0 if f.type == pa.int64() and self._is_count(f.name) else None], f.type)
                    for f in self.out_schema
                },
                schema=self.out_schema,
            )
        out: dict[str, pa.ChunkedArray | pa.Array] = {k: acc[k] for k in self.keys}
        for slot in self.slots:
            name, func = slot.agg.name, slot.agg.func
            if slot.extreme is not None:
                out[name] = acc[f"__x{slot.extreme}"]
            elif slot.count is None:
                out[name] = acc[_N]
            elif slot.total is None:
                out[name] = acc[slot.count]
            else:
                some = pc.greater(acc[slot.count], i64(0))
                if func == "sum":
                    out[name] = pc.if_else(some, acc[slot.total], pa.scalar(None, acc[slot.total].type))
                else:
                    mean = pc.divide(
                        pc.cast(acc[slot.total], pa.float64()), pc.cast(acc[slot.count], pa.float64())
                    )
                    out[name] = pc.if_else(some, mean, pa.scalar(None, pa.float64()))
        return conform(pa.table(out), self.out_schema) if out else self.out_schema.empty_table()

    def _is_count(self, name: str) -> bool:
        return any(s.agg.name == name and s.agg.func == "count" for s in self.slots)


def _append(rest: pa.Table, part: pa.Table) -> pa.Table:
    """``rest`` with ``part``'s rows added; chunks are merged now and then so filters stay fast."""
    table = pa.concat_tables([rest, part])
    return table.combine_chunks() if table.column(0).num_chunks > 16 else table


# ---------------------------------------------------------------- dataflows


def output_schema(view: ViewDef, source: pa.Schema, where: str) -> pa.Schema:
    """The schema of ``view`` over a source with ``source``'s columns.

    Raises:
        ViewError: naming ``where`` and the offending column or operation.
    """
    try:
        linear = apply_linear(view, source.empty_table()).schema
        if not view.reduces:
            return linear
        for name in view.group_by:
            linear.field(name)
        for agg in view.aggregates:
            if agg.column is not None:
                linear.field(agg.column)
        return Reduction(view, linear, where).out_schema
    except ViewError:
        raise
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ViewError(f"{where}: the view does not fit source {view.source!r}: {exc}") from None


class Dataflow:
    """One view computed from one source collection, as of ``as_of``.

    ``feed`` takes complete source updates (any times) and returns the view's output updates.
    """

    def __init__(self, view: ViewDef, source: pa.Schema, as_of: int, where: str) -> None:
        self.view = view
        self.as_of = as_of
        self.schema = output_schema(view, source, where)
        self._linear_schema = apply_linear(view, source.empty_table()).schema
        self._reduction = Reduction(view, self._linear_schema, where) if view.reduces else None
        self._started = False

    def feed(self, updates: pa.Table) -> pa.Table:
        """Output updates for the source updates ``updates`` (times below ``as_of`` count as ``as_of``)."""
        linear = apply_linear(self.view, advance_times(updates, self.as_of))
        if self._reduction is None:
            return conform(consolidate(linear), update_schema(self.schema))
        outputs: list[pa.Table] = []
        if not self._started:
            # The first step happens at as_of even without input: a global aggregate has a row there.
            self._started = True
            first = linear.filter(pc.equal(linear[TIME], i64(self.as_of)))
            linear = linear.filter(pc.not_equal(linear[TIME], i64(self.as_of)))
            outputs.append(self._step(first, self.as_of))
        if linear.num_rows:
            bounds = pc.min_max(linear[TIME])
            if bounds["min"] == bounds["max"]:
                # One time (a write is one time): no sort and no split needed.
                outputs.append(self._step(linear, bounds["min"].as_py()))
                return outputs[0] if len(outputs) == 1 else pa.concat_tables(outputs)
            ordered = linear.sort_by(TIME)
            counts = pc.value_counts(ordered[TIME])
            offset = 0
            for item in counts:
                t, n = item["values"].as_py(), item["counts"].as_py()
                outputs.append(self._step(ordered.slice(offset, n), t))
                offset += n
        if not outputs:
            return update_schema(self.schema).empty_table()
        return pa.concat_tables(outputs)

    def _step(self, delta: pa.Table, t: int) -> pa.Table:
        assert self._reduction is not None
        changes = self._reduction.step(delta)
        times = pa.repeat(pa.scalar(t, pa.int64()), changes.num_rows)
        return conform(changes.add_column(changes.num_columns - 1, TIME, times), update_schema(self.schema))


# ---------------------------------------------------------------- peek finishing


def index_key(view: ViewDef, schema: pa.Schema) -> list[str]:
    """The columns literal constraints look up: the group-by keys, or every column of the view."""
    return list(view.group_by) if view.group_by else list(schema.names)


def constrain(rows: pa.Table, key: list[str], constraints: tuple[tuple[object, ...], ...]) -> pa.Table:
    """The rows whose ``key`` columns equal one of ``constraints`` (null matches null, multiplicity kept).

    Hash joins never match null keys, so this groups the union of the rows' keys (tagged with their row
    number) and the wanted keys (tagged -1) and keeps the row numbers of groups that hold a wanted key.

    Raises:
        ValueError: a constraint's arity differs from the key's, or a value does not fit its column.
    """
    for values in constraints:
        if len(values) != len(key):
            raise ValueError(f"a literal constraint has {len(values)} values for the key {key}")
    if rows.num_rows == 0:
        return rows
    try:
        wanted = pa.table(
            {k: pa.array([v[i] for v in constraints], rows.schema.field(k).type) for i, k in enumerate(key)}
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise ValueError(f"a literal constraint does not fit the key {key}: {exc}") from None
    idx = "__row"
    numbered = rows.select(key).append_column(idx, pa.array(range(rows.num_rows), pa.int64()))
    marks = wanted.append_column(idx, pa.repeat(pa.scalar(-1, pa.int64()), wanted.num_rows))
    grouped = pa.concat_tables([numbered, marks]).group_by(key, use_threads=False)
    grouped = grouped.aggregate([(idx, "min"), (idx, "list")])
    grouped = grouped.filter(pc.equal(grouped[f"{idx}_min"], i64(-1)))
    keep = pc.list_flatten(grouped[f"{idx}_list"])
    keep = keep.filter(pc.greater_equal(keep, i64(0)))
    return rows.take(keep.take(pc.array_sort_indices(keep)))


def finish(rows: pa.Table, finishing: Finishing) -> pa.Table:
    """Order, offset, limit and project ``rows`` as ``finishing`` says (nulls last ascending, first descending)."""
    if finishing.order_by:
        keys = [
            (k.column, "descending", "at_start") if k.descending else (k.column, "ascending", "at_end")
            for k in finishing.order_by
        ]
        rows = rows.take(pc.sort_indices(rows, sort_keys=keys))
    if finishing.offset or finishing.limit is not None:
        rows = rows.slice(finishing.offset, finishing.limit)
    if finishing.project is not None:
        rows = rows.select(list(finishing.project))
    return rows
