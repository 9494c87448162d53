"""Multiversioned collections on Arrow: consolidated ``(row, time, diff)`` updates with a since and an upper.

An arrangement answers "what are the rows at time t" for every ``t`` with ``since <= t < upper``. Updates
are kept as one Arrow table whose data columns are followed by ``__time`` and ``__diff`` (int64). Every
operation is a handful of ``pyarrow.compute`` calls over whole columns; nothing loops over rows in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.compute.times import CLOSED, Frontier

if TYPE_CHECKING:
    from sparkbus.roles.compute.reduction import KeyedStep

TIME = "__time"
DIFF = "__diff"
_UPDATE_FIELDS = (pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64()))


def i64(value: int) -> pa.Scalar:
    """An int64 scalar. Compute functions given a plain Python int convert it on every call, which in
    pyarrow means a failed ``dateutil`` import each time (0.2 ms); a typed scalar costs nothing."""
    return pa.scalar(value, pa.int64())


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``; a table that has it already is returned as it is (a cast costs 20 us)."""
    return table if table.schema.equals(schema) else table.cast(schema)


def update_schema(data: pa.Schema) -> pa.Schema:
    """``data``'s columns followed by ``__time`` and ``__diff``."""
    return pa.schema([*data, *_UPDATE_FIELDS])


def data_schema(updates: pa.Schema) -> pa.Schema:
    """The data columns of an update schema (without ``__time`` and ``__diff``)."""
    return pa.schema([f for f in updates if f.name not in (TIME, DIFF)])


def empty_updates(data: pa.Schema) -> pa.Table:
    return update_schema(data).empty_table()


def consolidate(updates: pa.Table) -> pa.Table:
    """Sum the diffs of equal ``(row, time)`` pairs and drop the ones that cancel out."""
    if updates.num_rows == 0:
        return updates
    keys = [n for n in updates.column_names if n != DIFF]
    summed = updates.group_by(keys, use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.rename_columns([*keys, DIFF])
    summed = summed.filter(pc.not_equal(summed[DIFF], i64(0)))
    return conform(summed.select(updates.column_names), updates.schema)


def canonical_nan(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A float column with every NaN as the one NaN ``float("nan")`` is (other columns as they are).

    Arrow's hash kernels (``group_by``, ``index_in``, joins) compare floats by their bits, and NaNs have
    many: Arrow's own ``0.0 / 0.0`` yields the one with the sign bit set. Made one where values enter
    (writes, appends, map results), NaN equals NaN in every group, consolidation and key lookup, as in SQL.
    Costs an ``is_nan`` and an ``any`` per float column, and a copy only of a column that holds a NaN.
    """
    if not pa.types.is_floating(column.type) or column.null_count == len(column):
        return column
    nan = pc.is_nan(column)
    if not pc.any(nan).as_py():
        return column
    return pc.if_else(nan, pa.scalar(float("nan"), column.type), column)


def canonical_nans(table: pa.Table) -> pa.Table:
    """``table`` with the NaNs of its float columns made one (``canonical_nan``)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_floating(field.type):
            column = canonical_nan(table.column(i))
            if column is not table.column(i):
                table = table.set_column(i, field, column)
    return table


def value_type(type_: pa.DataType) -> pa.DataType:
    """The type a column of ``type_`` is held as: a dictionary type's value type, other types as they are."""
    while pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return type_


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each dictionary column given its value type (``value_type``)."""
    if not any(pa.types.is_dictionary(f.type) for f in schema):
        return schema
    return pa.schema([f.with_type(value_type(f.type)) for f in schema], metadata=schema.metadata)


def decoded(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns decoded to their value type.

    A dictionary column enters as plain values: Arrow groups a dictionary column by index, so a value its
    dictionary repeats would be two groups, and it cannot consolidate chunks whose dictionaries differ.
    """
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            plain = value_type(field.type)
            table = table.set_column(i, field.with_type(plain), table.column(i).cast(plain))
    return table


def ungroupable(data: pa.Schema) -> str | None:
    """Why updates of ``data``'s columns cannot be consolidated (Arrow cannot group rows by a column of
    that type, such as a list, struct or map), or None if they can. Tried on one row of nulls: one Acero
    ``group_by``, cheap enough for a table's creation."""
    arrays = [pa.nulls(1, f.type) for f in data]
    sample = pa.Table.from_arrays(
        [*arrays, pa.array([0], pa.int64()), pa.array([1], pa.int64())], schema=update_schema(data)
    )
    try:
        consolidate(sample)
    except pa.ArrowException as exc:
        return str(exc)
    return None


def advance_times(updates: pa.Table, since: int) -> pa.Table:
    """Updates with every time below ``since`` moved up to ``since`` (what compaction does)."""
    if updates.num_rows == 0:
        return updates
    i = updates.schema.get_field_index(TIME)
    return updates.set_column(i, updates.schema.field(i), pc.max_element_wise(updates[TIME], i64(since)))


def expand(rows: pa.Table, counts: pa.ChunkedArray | pa.Array) -> pa.Table:
    """``rows`` with row i repeated ``counts[i]`` times (counts are >= 0), without a Python loop."""
    counts = counts.combine_chunks() if isinstance(counts, pa.ChunkedArray) else counts
    if rows.num_rows == 0 or pc.all(pc.equal(counts, i64(1))).as_py():
        return rows
    total = pc.sum(counts).as_py() or 0
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(counts.cast(pa.int64()))])
    lists = pa.LargeListArray.from_arrays(offsets, pa.nulls(total))
    return rows.take(pc.list_parent_indices(lists))


def encode_table(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream holding one record batch."""
    batch = table.combine_chunks().to_batches()
    record = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=table.schema)
    data: bytes = encode_batch(record).to_pybytes()
    return data


def decode_table(data: bytes) -> pa.Table:
    """The table of one Arrow IPC stream (validated; raises ``DecodeError``)."""
    return pa.Table.from_batches([decode_batch(data)])


class Arrangement:
    """A collection's updates between ``since`` and ``upper``.

    Attributes:
        schema: the data columns (without ``__time`` / ``__diff``).
        since: reads are correct at times ``>= since[0]``; ``()`` once dropped.
        upper: times ``< upper[0]`` are complete; ``()`` once closed or dropped.
    """

    def __init__(self, schema: pa.Schema, *, since: int = 0, upper: int = 0) -> None:
        self.schema = schema
        self.since: Frontier = (since,)
        self.upper: Frontier = (upper,)
        self._parts: list[pa.Table] = []
        self._consolidated = empty_updates(schema)
        self._pending_rows = 0
        self._dirty = False
        self._max_time = -1
        #: The rows at every time >= ``_max_time`` (reads at the latest time are the common case).
        self._latest: pa.Table | None = None

    @property
    def updates(self) -> pa.Table:
        """All updates, consolidated and with times advanced to ``since``."""
        self._fold()
        return self._consolidated

    def __len__(self) -> int:
        rows: int = self._consolidated.num_rows
        return rows + self._pending_rows

    def append(self, updates: pa.Table, upper: int, steps: Sequence[KeyedStep] | None = None) -> None:
        """Add complete updates (times below ``upper``) and advance the upper to ``upper``.

        ``steps`` (``Dataflow.steps_of``) describe ``updates`` as a reduction's steps; a generic arrangement
        has no use for them.
        """
        if updates.num_rows:
            self._parts.append(
                conform(updates.select([*self.schema.names, TIME, DIFF]), update_schema(self.schema))
            )
            self._pending_rows += updates.num_rows
            self._dirty = True
            self._latest = None
            self._max_time = max(self._max_time, pc.max(updates[TIME]).as_py())
            # Consolidating on every append would cost O(size) per write; folding once the pending
            # updates outnumber the consolidated ones twice keeps appends amortised O(batch) and lets
            # a maintained view's changes (about one row per touched group) pile up over a few writes.
            if self._pending_rows > max(4096, 2 * self._consolidated.num_rows):
                self._fold()
        if self.upper and upper > self.upper[0]:
            self.upper = (upper,)

    def compact(self, since: Frontier) -> None:
        """Allow compaction to ``since``; the empty frontier drops the contents."""
        if not since:
            self.since = CLOSED
            self.upper = CLOSED
            self._parts = []
            self._consolidated = empty_updates(self.schema)
            self._pending_rows = 0
            self._latest = None
            return
        if self.since and since[0] > self.since[0]:
            # Folding is left to the next read or to the append threshold: reads consolidate at the
            # since, and a view compacted after every write would otherwise consolidate every time.
            self.since = since
            self._dirty = True

    def _fold(self) -> None:
        if not self._dirty:
            return
        merged = pa.concat_tables([self._consolidated, *self._parts])
        if self.since:
            merged = advance_times(merged, self.since[0])
        # The pending updates are let go only once consolidated: a read that fails here loses nothing.
        self._consolidated = consolidate(merged).combine_chunks()
        self._parts = []
        self._pending_rows = 0
        self._dirty = False

    def snapshot(self, as_of: int) -> pa.Table:
        """Every update, with times below ``as_of`` moved up to it (what a dataflow built at ``as_of`` reads)."""
        return advance_times(self.updates, as_of)

    def read_at(self, t: int) -> pa.Table:
        """The rows at time ``t`` (each repeated by its multiplicity); negative multiplicities are dropped."""
        latest = t >= self._max_time
        if latest and self._latest is not None:
            return self._latest
        updates = self.updates
        if updates.num_rows == 0:
            return self.schema.empty_table()
        at = updates if latest else updates.filter(pc.less_equal(updates[TIME], i64(t)))
        names = self.schema.names
        counts = (
            at.group_by(names, use_threads=False).aggregate([(DIFF, "sum")]).rename_columns([*names, DIFF])
        )
        counts = counts.filter(pc.greater(counts[DIFF], i64(0)))
        rows = expand(counts.select(names), counts[DIFF]).cast(self.schema).combine_chunks()
        if latest:
            self._latest = rows
        return rows
