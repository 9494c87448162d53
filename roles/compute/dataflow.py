"""Views maintained incrementally from ``(row, time, diff)`` updates, on Arrow.

A linear view (maps, filters, project) transforms each update batch on its own: the output updates are the
input updates, mapped and filtered, with their times and diffs. A reduction keeps per-group state
(``reduction.py``): per group the row count and, per aggregate, the count of non-null values and the sum of
``value * diff`` (retractions simply subtract), and for min and max the multiplicity of every (group, value).
Updates are applied one distinct time at a time, so the output changes carry the time their cause had.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.compute.arrangement import (
    DIFF,
    TIME,
    advance_times,
    canonical_nan,
    canonical_nans,
    conform,
    consolidate,
    i64,
    update_schema,
)
from sparkbus.roles.compute.plans import Finishing, MapExpr, Predicate, ViewDef
from sparkbus.roles.compute.reduction import KeyedStep, Reduction, ViewError, _np

_COMPARE = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal}
_COMPARE |= {"gt": pc.greater, "ge": pc.greater_equal}
#: Checked arithmetic: an integer result out of its type's range raises (``ArrowInvalid: overflow``), which
#: fails the view, as Materialize's overflow errors do, instead of wrapping to a wrong number.
_ARITH = {"add": pc.add_checked, "subtract": pc.subtract_checked, "multiply": pc.multiply_checked}
_ARITH["divide"] = pc.divide
_N = "__n"


# ---------------------------------------------------------------- linear operators


def _numeric(tp: pa.DataType) -> bool:
    return bool(pa.types.is_integer(tp) or pa.types.is_floating(tp) or pa.types.is_decimal(tp))


def _map_column(table: pa.Table, expr: MapExpr) -> pa.Array | pa.ChunkedArray:
    left = table[expr.left]
    right = table[expr.right] if expr.right is not None else pa.scalar(expr.literal)
    if not (_numeric(left.type) and _numeric(right.type)):
        # Arrow would parse strings as numbers in the cast below, so a view creation's check on an empty
        # table would pass and the view fail on its first row that is not a number.
        raise TypeError(f"map {expr.name!r}: {expr.op} needs numbers, got {left.type} and {right.type}")
    if expr.op == "divide":
        # Integer division by zero raises in Arrow; a maintained view must not fail on data, so division is
        # in float64, where x / 0 is inf or nan, as in most SQL engines' float division.
        left = pc.cast(left, pa.float64())
        right = pc.cast(right, pa.float64())
    return canonical_nan(_ARITH[expr.op](left, right))


def _mask(table: pa.Table, pred: Predicate) -> pa.Array | pa.ChunkedArray:
    col = table[pred.column]
    if pred.op == "is_null":
        return pc.is_null(col)
    if pred.op == "is_not_null":
        return pc.is_valid(col)
    return _COMPARE[pred.op](col, pa.scalar(pred.value))


def apply_linear(view: ViewDef, table: pa.Table) -> pa.Table:
    """Maps, then filters (null is false, as in SQL), then the projection; ``__time``/``__diff`` pass through.

    A map's column goes after the data columns, before ``__time``/``__diff`` (which stay last, as in every
    update batch).
    """
    for expr in view.maps:
        at = table.schema.get_field_index(TIME)
        table = table.add_column(at if at >= 0 else table.num_columns, expr.name, _map_column(table, expr))
    if view.filters:
        mask = _mask(table, view.filters[0])
        for pred in view.filters[1:]:
            mask = pc.and_kleene(mask, _mask(table, pred))
        table = table.filter(mask)
    if view.project is not None:
        extra = [n for n in (TIME, DIFF) if n in table.column_names]
        table = table.select([*view.project, *extra])
    return table


# ---------------------------------------------------------------- dataflows


def output_schema(view: ViewDef, source: pa.Schema, where: str) -> pa.Schema:
    """The schema of ``view`` over a source with ``source``'s columns.

    Raises:
        ViewError: naming ``where`` and the offending column or operation.
    """
    try:
        linear = apply_linear(view, source.empty_table()).schema
        if len(set(linear.names)) != len(linear.names):
            # A map named like a column: the view's every later lookup of that name would fail on data.
            repeated = sorted({n for n in linear.names if linear.names.count(n) > 1})
            raise ViewError(f"{where}: a map repeats the name of a column: {repeated}")
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
    except (KeyError, TypeError, ArithmeticError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        # ArithmeticError: a literal beyond its column's type, such as 2**63 for int64 (OverflowError).
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
        #: The last ``feed``'s result and the reduction steps it is made of (see ``steps_of``).
        self._out: pa.Table | None = None
        self._steps: list[KeyedStep] = []

    def steps_of(self, out: pa.Table) -> list[KeyedStep] | None:
        """The keyed reduction steps that ``out`` (the last ``feed``'s result) is made of, in order; None if
        ``out`` is not that result or the view is not a group-by. An index given them with ``out`` takes
        the group slots from them instead of interning the group keys again."""
        if out is not self._out or self._reduction is None or not self.view.group_by:
            return None
        return self._steps

    def feed(self, updates: pa.Table) -> pa.Table:
        """Output updates for the source updates ``updates`` (times below ``as_of`` count as ``as_of``)."""
        self._steps = []
        self._out = out = self._feed(updates)
        return out

    def _feed(self, updates: pa.Table) -> pa.Table:
        lo = hi = self.as_of
        if updates.num_rows:
            # NumPy's min and max over the (zero-copy) times cost a few microseconds, pc.min_max 20.
            times = _np(updates[TIME])
            earliest, latest = int(times.min()), int(times.max())
            lo, hi = max(earliest, self.as_of), max(latest, self.as_of)
            if earliest < self.as_of:
                updates = advance_times(updates, self.as_of)
        linear = apply_linear(self.view, updates)
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
            if lo == hi:
                # One time (a write is one time): no sort and no split needed.
                outputs.append(self._step(linear, lo))
            else:
                ordered = linear.sort_by(TIME)
                counts = pc.value_counts(ordered[TIME])
                offset = 0
                for item in counts:
                    t, n = item["values"].as_py(), item["counts"].as_py()
                    outputs.append(self._step(ordered.slice(offset, n), t))
                    offset += n
        if not outputs:
            return update_schema(self.schema).empty_table()
        return outputs[0] if len(outputs) == 1 else pa.concat_tables(outputs)

    def _step(self, delta: pa.Table, t: int) -> pa.Table:
        assert self._reduction is not None
        out = self._reduction.step(delta, t)
        if self._reduction.last_step is not None:
            self._steps.append(self._reduction.last_step)
        return out


# ---------------------------------------------------------------- peek finishing


def index_key(view: ViewDef, schema: pa.Schema) -> list[str]:
    """The columns literal constraints look up: the group-by keys, or every column of the view."""
    return list(view.group_by) if view.group_by else list(schema.names)


def constrain(rows: pa.Table, key: list[str], constraints: tuple[tuple[object, ...], ...]) -> pa.Table:
    """The rows whose ``key`` columns equal one of ``constraints`` (null matches null, multiplicity kept).

    Hash joins never match null keys, so this groups the union of the rows' keys (tagged with their row
    number) and the wanted keys (tagged -1) and keeps the row numbers of groups that hold a wanted key.

    Raises:
        ValueError: a constraint's arity differs from the key's, or a value does not fit its column (another
            type, or an integer outside the column's range).
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
        wanted = canonical_nans(wanted)  # NaN matches NaN, whichever NaN each is
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
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
