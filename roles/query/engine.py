"""The operators: a fragment's plan evaluated over in-memory Arrow tables, whole columns at a time.

A node's partitions live in a ``PartitionStore``. A fragment either scans the store or receives rows
from other members; ``Inbox`` folds received batches as they arrive so the receiver holds what the
operator above the receive needs (one row per group for a final aggregate, and one per distinct value of
each COUNT(DISTINCT) in it; ``count + offset`` rows for a
limit or a merge sort under a limit) rather than everything it was sent.

A node holding no partition of the scanned table produces *no data* (``None``, which has no schema);
only if every member has none is that an error, raised by whoever owns the whole query.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkbus.codecs import DecodeError, decode_batch
from sparkbus.roles.query import aggregate
from sparkbus.roles.query import exchange as x
from sparkbus.roles.query.casts import is_text
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError
from sparkbus.roles.query.expressions import (
    Call,
    Column,
    Expr,
    Literal,
    Param,
    Scalar,
    apply,
    columns_of,
    evaluate,
    evaluate_column,
    fold,
    normalised,
    resolve,
)
from sparkbus.roles.query.plan import (
    Aggregate,
    Filter,
    Limit,
    MergeSort,
    PlanNode,
    Project,
    Receive,
    Scan,
    Send,
    Sort,
    SortKey,
    TopK,
    chain,
)


@dataclass(eq=False)
class ScanSource:
    """One version of a partition as scans read it: one aligned chunk per column, plus dictionaries.

    ``source`` is the table object the store handed out for that version (a publishing role hands out
    the same object until its rows change), so the work here is done once per version, not per query.
    ``dictionary(column)`` dictionary-encodes a string column on first use and keeps it: predicates
    ``column = 'text'`` then compare 32-bit indices instead of strings, and a group key on it hashes
    indices. A column with too many distinct values for that to pay is remembered as None.
    """

    source: pa.Table
    table: pa.Table
    min_rows: int
    dictionaries: dict[str, pa.DictionaryArray | None] = field(default_factory=dict)
    positions: dict[tuple[str, str], int] = field(default_factory=dict)

    def dictionary(self, column: str) -> pa.DictionaryArray | None:
        """The dictionary encoding of string column ``column`` (None: not a string column, or not worth it)."""
        if column in self.dictionaries:
            return self.dictionaries[column]
        encoded: pa.DictionaryArray | None = None
        found = resolve(column, self.table.column_names)
        col = self.table.column(found) if found is not None else None
        rows = self.table.num_rows
        if col is not None and rows >= self.min_rows and is_text(col.type):
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            candidate = pc.dictionary_encode(arr)
            if len(candidate.dictionary) <= max(16, rows // 4):
                encoded = candidate
        self.dictionaries[column] = encoded
        return encoded

    def position(self, column: str, value: str) -> int:
        """Index of ``value`` in ``column``'s dictionary, -1 when no row holds it."""
        key = (column, value)
        found = self.positions.get(key)
        if found is None:
            encoded = self.dictionaries[column]
            assert encoded is not None
            dictionary = encoded.dictionary
            found = int(pc.index(dictionary, pa.scalar(value, dictionary.type)).as_py())
            if len(self.positions) >= 1024:
                self.positions.clear()
            self.positions[key] = found
        return found


@dataclass(eq=False)
class _Order:
    """The stable sort permutation of one version of a partition (None until a key is asked for twice)."""

    table: pa.Table
    indices: pa.Array | None = None


class PartitionStore:
    """The table partitions this node holds, by table name.

    It also keeps the sort orders that top-k queries ask for repeatedly (see ``sorted_order``).
    """

    #: sort orders kept (partition name and keys); each holds one permutation of the partition's rows
    ORDERS = 8
    #: partitions with fewer rows are scanned without dictionaries (encoding them would not pay)
    DICTIONARY_MIN_ROWS = 4096

    def __init__(self) -> None:
        self.tables: dict[str, pa.Table] = {}
        self._orders: dict[tuple[str, tuple[SortKey, ...]], _Order] = {}
        self._sources: dict[str, ScanSource] = {}

    def names(self) -> list[str]:
        """The tables this node holds a partition of."""
        return list(self.tables)

    def source(self, name: str) -> ScanSource | None:
        """Partition ``name`` as scans read it (see ``ScanSource``), or None when this node holds none.

        Table names compare case-insensitively, as in Spark SQL (a name two tables match is an error).
        Prepared once per version of the partition: a version is the table object ``get`` returns.
        """
        found = resolve(name, self.names(), "table")
        if found is None:
            return None
        name = found
        table = self.read(name)
        if table is None:
            return None
        entry = self._sources.get(name)
        if entry is None or entry.source is not table:
            entry = ScanSource(source=table, table=aligned(table), min_rows=self.DICTIONARY_MIN_ROWS)
            self._sources[name] = entry
        return entry

    def sorted_order(self, name: str, table: pa.Table, keys: Sequence[SortKey]) -> pa.Array | None:
        """The stable sort permutation of ``table`` (partition ``name`` as scanned now) by ``keys``.

        Built the second time the same partition version and keys are asked for (a one-off query is not
        made to pay for a full sort) and kept until the partition changes; None until then. A version is
        the table object itself, so a table replaced by a load or by a publishing role is never confused
        with the one the order was computed for.
        """
        key = (name, tuple(keys))
        entry = self._orders.pop(key, None)
        if entry is None or entry.table is not table:
            entry = _Order(table=table)
        elif entry.indices is None:
            entry.indices = _sort_indices(table, keys, "top_k")
        self._orders[key] = entry  # most recently used last
        while len(self._orders) > self.ORDERS:
            del self._orders[next(iter(self._orders))]
        return entry.indices

    def load(self, name: str, table: pa.Table, *, replace: bool = False) -> int:
        """Add ``table``'s rows to partition ``name`` (or replace it); returns the partition's row count.

        Raises:
            ExecutionError: the rows do not have the partition's schema.
        """
        if not name:
            raise ExecutionError("a table needs a non-empty name")
        old = self.tables.get(name)
        if old is not None and not replace:
            if not old.schema.equals(table.schema):
                raise ExecutionError(
                    f"table {name!r}: rows with schema {table.schema} do not match {old.schema}"
                )
            table = pa.concat_tables([old, table])
        self.tables[name] = aligned(table)
        self._sources.pop(name, None)  # its older version (and that version's dictionaries) is not kept
        for key in [k for k in self._orders if k[0] == name]:
            del self._orders[key]
        return int(table.num_rows)

    def get(self, name: str) -> pa.Table | None:
        """The local partition of ``name``, or None when this node holds none."""
        return self.tables.get(name)

    def read(self, name: str) -> pa.Table | None:
        """What a scan of ``name`` reads: ``get``'s partition here; a store whose rows may not be ready yet
        raises instead (``catalog.SourcePending``), which the scan lets through."""
        return self.get(name)

    def unserved(self, tables: Sequence[str], participants: Sequence[str]) -> str | None:
        """Why a scan of ``tables`` here, in a query run by ``participants``, may not see each of their rows
        exactly once, or None. Loaded tables are whatever each node holds: always None here."""
        return None

    def served(self, tables: Sequence[str]) -> tuple[frozenset[str], ...]:
        """What of each of ``tables`` this node serves now (a published table's partitions): a scan that
        waited and runs again is refused when it changed meanwhile. Loaded tables: nothing to compare."""
        return tuple(frozenset() for _ in tables)


def table_from_ipc(batches: Sequence[bytes]) -> pa.Table:
    """A table from row batches, each one Arrow IPC stream holding one record batch (fully validated).

    Raises:
        ExecutionError: a batch is not a valid IPC stream or the batches' schemas differ.
    """
    try:
        decoded = [decode_batch(b) for b in batches]
    except DecodeError as exc:
        raise ExecutionError(f"bad row batch: {exc}") from None
    if not decoded:
        raise ExecutionError("no row batches given")
    try:
        return pa.Table.from_batches(decoded)
    except pa.ArrowInvalid as exc:
        raise ExecutionError(f"row batches disagree on their schema: {exc}") from None


def table_to_ipc(table: pa.Table) -> bytes:
    """A whole table as one Arrow IPC stream (what an ``execute`` reply carries); a table of no rows as one
    empty record batch, as ``decode_batch`` (the query role's ``load``) takes exactly one."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if table.num_rows:
            writer.write_table(table)
        else:
            writer.write_batch(pa.RecordBatch.from_pylist([], schema=table.schema))
    return bytes(sink.getvalue())


def read_parquet(path: str | Path) -> pa.Table:
    """A Parquet file as a table, for loading into a ``PartitionStore`` (not used inside roles)."""
    return pq.read_table(path)


# ---------------------------------------------------------------- operators


def aligned(table: pa.Table) -> pa.Table:
    """``table`` with one chunk per column and every buffer aligned to 8 bytes (copied where it was not).

    Batches decoded from bus frames sit wherever the frame put them; Acero (``group_by``) warns about, and
    works slower on, buffers not aligned to their values, and one chunk per column makes every later kernel
    one call. Columns that are already one aligned chunk are kept as they are.
    """
    columns = []
    for col in table.columns:
        chunks = col.chunks
        if len(chunks) == 1 and all(b is None or b.address % 8 == 0 for b in chunks[0].buffers()):
            columns.append(chunks[0])
        elif chunks:
            columns.append(pa.concat_arrays(chunks))
        else:
            columns.append(pa.array([], col.type))
    return pa.Table.from_arrays(columns, schema=table.schema)


def _sort_indices(table: pa.Table, keys: Sequence[SortKey], what: str) -> pa.Array:
    """``sort_indices`` for ``keys``, NULLs placed per key and NaN above every other float (as in Spark).

    Arrow puts NaN next to the NULLs (at the start or the end, as ``null_placement`` says). A float key
    that has no NULLs therefore places its NaN where the direction says (end ascending, start descending);
    one that has NULLs gets a NULL-flag key in front so that its NULLs and NaN can go to different ends.
    """
    columns: dict[str, pa.ChunkedArray] = {}
    order: list[tuple[str, str, str]] = []
    flagged = False
    keys = _found(table, keys, what)
    for i, k in enumerate(keys):
        col = table.column(k.column)
        direction = "descending" if k.descending else "ascending"
        nulls = "at_start" if k.nulls_first else "at_end"
        if pa.types.is_floating(col.type):
            if col.null_count:
                flagged = True
                columns[f"n{i}"] = pc.is_null(col)
                order.append((f"n{i}", "descending" if k.nulls_first else "ascending", "at_end"))
            nulls = "at_start" if k.descending else "at_end"
        columns[f"v{i}"] = col
        order.append((f"v{i}", direction, nulls))
    keyed = (
        pa.table(columns) if flagged else table.select([k.column for k in keys]).rename_columns(list(columns))
    )
    try:
        return pc.sort_indices(keyed, sort_keys=order)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ExecutionError(f"{what}: {exc}") from None


def _found(table: pa.Table, keys: Sequence[SortKey], what: str) -> list[SortKey]:
    """``keys`` naming ``table``'s columns as it spells them (names compare case-insensitively)."""
    out = []
    for k in keys:
        found = resolve(k.column, table.column_names)
        if found is None:
            raise ExecutionError(
                f"{what}: column {k.column!r} does not exist; columns are {table.column_names}"
            )
        out.append(k if found == k.column else replace(k, column=found))
    return out


def sort_table(table: pa.Table, keys: Sequence[SortKey]) -> pa.Table:
    """``table`` stably sorted by ``keys``, NULLs placed per key, NaN above every other float."""
    return table.take(_sort_indices(table, keys, "sort"))


def top_k(table: pa.Table, keys: Sequence[SortKey], count: int) -> pa.Table:
    """The first ``count`` rows of ``sort_table(table, keys)``, without sorting all of ``table``.

    A bounded selection (``select_k_unstable``) on the first key finds the value the ``count``-th row has
    there; the rows that come before it or tie with it on that key (the only ones that can be among the
    first ``count``) are kept in their original order and stably sorted. The result is exactly the stable
    sort's prefix, ties included.
    """
    keys = _found(table, keys, "top_k")
    if count == 0:
        return table.slice(0, 0)
    if table.num_rows > 4 * count:
        try:
            mask = _top_k_candidates(table.column(keys[0].column), keys[0], count)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            mask = None  # a type select_k cannot order: the sort below says whether it can be sorted at all
        if mask is not None:
            table = table.filter(mask)
    return table.take(_sort_indices(table, keys, "top_k").slice(0, count))


def _top_k_candidates(col: pa.ChunkedArray, key: SortKey, count: int) -> pa.ChunkedArray | None:
    """A mask of the rows whose ``key`` value is not after the ``count``-th row's (None: every row).

    In ``sort_indices`` order a key's values split into three runs: what always comes first (NULLs if they
    go first, NaN when descending), the ordinary values, and what comes last (NaN ascending, NULLs last).
    """
    floating = pa.types.is_floating(col.type)
    first: pa.ChunkedArray | None = pc.is_null(col) if key.nulls_first else None
    if floating and key.descending:
        nan = pc.fill_null(pc.is_nan(col), False)
        first = nan if first is None else pc.or_(first, nan)
    ahead = int(pc.sum(first, min_count=0).as_py()) if first is not None else 0
    if ahead >= count:
        return first
    need = count - ahead
    ordinary = len(col) - col.null_count
    if floating:
        ordinary -= int(pc.sum(pc.is_nan(col), min_count=0).as_py())
    if ordinary <= need:
        return None
    # select_k places NULLs and NaN after every ordinary value in both directions.
    direction = "descending" if key.descending else "ascending"
    picked = pc.select_k_unstable(col, k=need, sort_keys=[("", direction)])
    bound = col.take(picked.slice(need - 1, 1))[0]
    compare = pc.greater_equal if key.descending else pc.less_equal
    within = compare(col, bound)  # NULL for NULLs, false for NaN
    return within if first is None else pc.or_kleene(first, within)


def run(
    node: PlanNode,
    store: PartitionStore,
    params: Sequence[Scalar] = (),
    received: pa.Table | None = None,
    *,
    folded: bool = False,
) -> pa.Table | None:
    """Evaluate a fragment's plan (up to, not including, its ``Send``).

    Args:
        node: the fragment's root.
        store: the local partitions, for ``Scan``.
        params: the query's parameters.
        received: what the fragment's ``Receive`` yields (already folded by an ``Inbox``).
        folded: ``received`` already holds merged states (one row per group, and per distinct value) for the
            final aggregate right above the
            receive (``Inbox.folded``), which then only finishes the states.

    Returns:
        The rows, or None when the plan scans a table this node holds no partition of (no schema).

    Raises:
        ExecutionError: any operator failed on the data.
    """
    table: pa.Table | None = None
    ops = chain(node)
    skip = False
    for i, op in enumerate(ops):
        if skip:
            skip = False
            continue
        if isinstance(op, Scan):
            table = _scan(op, store, params, ops[i + 1 : i + 3])
        elif isinstance(op, Receive):
            table = received
        elif table is None:
            return None
        elif folded and i == 1 and isinstance(op, Aggregate) and op.phase == "final":
            table = aggregate.finalize(table, op.keys, op.aggs)
        elif isinstance(op, Sort) and i + 1 < len(ops) and isinstance(ops[i + 1], Limit):
            # A sort under a limit keeps only the limit's rows: the bounded selection finds exactly them.
            limit = ops[i + 1]
            assert isinstance(limit, Limit)
            table = top_k(table, op.keys, limit.rows).slice(limit.offset, limit.count)
            skip = True
        else:
            table = _step(op, table, params)
    return table


def _scan(
    op: Scan, store: PartitionStore, params: Sequence[Scalar], above: Sequence[PlanNode] = ()
) -> pa.Table | None:
    """The partition's rows where the predicate holds, with only the columns the operators above read.

    The mask is computed on the whole partition, then only the needed columns are filtered: the scan's
    own list, or the columns a ``Project`` right above reads. Under a top-k (right above, or above a
    renaming ``Project``) whose sort order the store keeps, the rows are read in that order until enough
    match, instead of filtering the whole partition; the operators above then see exactly the rows and
    order the top-k would have kept.
    """
    src = store.source(op.table)
    if src is None:
        return None
    table = src.table
    _refuse_columns_of_group_aliases(op, table)
    wanted = op.columns
    project = above[0] if above and isinstance(above[0], Project) else None
    if wanted is None and project is not None:
        wanted = tuple(sorted(set().union(*(columns_of(e) for _, e in project.items))))
    if wanted is not None:
        # Names compare case-insensitively; the columns keep the table's spelling (and its order, when a
        # project above reads them), and whatever reads them above finds them the same way.
        found = {_column_of(table, c, f"scan {op.table}: no column"): None for c in wanted}
        wanted = tuple(c for c in table.column_names if c in found) if op.columns is None else tuple(found)
    topk = _top_k_above(above, table.column_names)
    order = store.sorted_order(op.table, table, topk[0]) if topk is not None else None
    if topk is not None and order is not None:
        predicate = columns_of(op.predicate) if op.predicate else set()
        needed = None if wanted is None else {*wanted, *(resolve(c, table.column_names) for c in predicate)}
        source = table if needed is None else table.select([c for c in table.column_names if c in needed])
        first = _first_in_order(source, order, op.predicate, params, topk[1])
        if first is not None:
            return first.select(list(wanted)) if wanted is not None else first
    mask = _source_mask(src, op.predicate, params) if op.predicate is not None else None
    if wanted is not None:
        table = table.select(list(wanted))
    for name in _group_key_columns(above):
        column = resolve(name, table.column_names)
        encoded = src.dictionary(column) if column is not None else None
        if column is not None and encoded is not None:
            i = table.column_names.index(column)
            table = table.set_column(i, pa.field(column, encoded.type), encoded)
    if mask is None:
        return table
    if isinstance(mask, pa.Scalar):
        return table if mask.as_py() is True else table.slice(0, 0)
    return table.filter(mask)


def _refuse_columns_of_group_aliases(op: Scan, table: pa.Table) -> None:
    """Refuse a plan that read a GROUP BY name as the select list's alias (``Scan.group_aliases``) over a
    partition that has a column of that name, which Spark SQL groups by before the alias: a refusal, where
    running the plan would answer otherwise than Spark.

    Raises:
        QueryError: ``PARSING``, naming the column.
    """
    for name in op.group_aliases:
        column = next((c for c in table.column_names if fold(c) == fold(name)), None)
        if column is not None:
            raise QueryError(
                ErrorCode.PARSING,
                f"GROUP BY {name} was planned as the select list's alias {name} by a node that holds no "
                f"partition of table {op.table}, but table {op.table} has a column {column}, which GROUP BY "
                f"{name} means before the alias, as in Spark: group by the alias's expression or its position "
                "(or qualify the name for the column)",
            )


def _column_of(table: pa.Table, name: str, missing: str) -> str:
    """The column of ``table`` that ``name`` means (case-insensitively), as the table spells it.

    Raises:
        ExecutionError: ``missing`` and the name when there is none; when it is ambiguous.
    """
    found = resolve(name, table.column_names)
    if found is None:
        raise ExecutionError(f"{missing} {name!r}; columns are {table.column_names}")
    return found


def _group_key_columns(above: Sequence[PlanNode]) -> set[str]:
    """Scan columns that the operators above read only as group keys of a (partial or single) aggregate.

    The scan may hand those over dictionary-encoded: the aggregate hashes the 32-bit indices and decodes
    its (few) output keys back to the column's type, so nothing else ever sees the encoding.
    """
    project = above[0] if above and isinstance(above[0], Project) else None
    agg = above[1] if project is not None and len(above) > 1 else (above[0] if above else None)
    if not isinstance(agg, Aggregate) or not agg.keys or agg.phase == "final":
        return set()
    uses: dict[str, set[str | None]] = {}
    if project is None:
        for name in agg.keys:
            uses.setdefault(name, set()).add(name)
    else:
        for name, e in project.items:
            for c in columns_of(e):
                uses.setdefault(c, set()).add(name if isinstance(e, Column) else None)
    inputs = {a.column for a in agg.aggs}
    if project is None:
        for read in inputs:
            if read is not None:
                uses.setdefault(read, set()).add(None)
    return {
        c
        for c, outs in uses.items()
        if outs and all(o is not None and o in agg.keys and o not in inputs for o in outs)
    }


_LOGIC = frozenset({"and", "or"})


def _source_mask(src: ScanSource, predicate: Expr, params: Sequence[Scalar]) -> pa.Scalar | pa.ChunkedArray:
    """``_mask`` over a scan source: ``column = 'text'`` (or ``<>``) on a dictionary-encoded column compares
    the column's indices with the text's index (NULL rows stay NULL, text no row holds matches none)."""
    return _boolean(_dictionary_eval(src, predicate, params))


def _dictionary_eval(src: ScanSource, expr: Expr, params: Sequence[Scalar]) -> Any:
    if isinstance(expr, Call):
        if expr.op in _LOGIC:
            return apply(expr.op, [_dictionary_eval(src, a, params) for a in expr.args])
        if expr.op in ("eq", "ne"):
            a, b = expr.args
            col, const = (a, b) if isinstance(a, Column) else (b, a)
            if isinstance(col, Column) and isinstance(const, Literal | Param):
                value = const.value if isinstance(const, Literal) else _param(params, const.index)
                encoded = src.dictionary(col.name) if isinstance(value, str) else None
                if encoded is not None:
                    assert isinstance(value, str)
                    index = pa.scalar(src.position(col.name, value), encoded.indices.type)
                    compare = pc.equal if expr.op == "eq" else pc.not_equal
                    return compare(encoded.indices, index)
    return evaluate(expr, src.table, params)


def _param(params: Sequence[Scalar], index: int) -> Scalar:
    if index >= len(params):
        raise ExecutionError(f"parameter {index} is not given ({len(params)} parameters)")
    return params[index]


def _top_k_above(above: Sequence[PlanNode], columns: Sequence[str]) -> tuple[list[SortKey], int] | None:
    """The keys (as scan columns) and count of a top-k right above the scan, or above a plain renaming."""
    project = above[0] if above and isinstance(above[0], Project) else None
    top = above[1] if project is not None and len(above) > 1 else (above[0] if above else None)
    if not isinstance(top, TopK):
        return None
    source = {name: e.name for name, e in project.items if isinstance(e, Column)} if project else None
    keys = []
    for k in top.keys:
        name = k.column if source is None else source.get(k.column)
        column = resolve(name, columns) if name is not None else None
        if column is None:
            return None
        keys.append(replace(k, column=column))
    return keys, top.count


def _first_in_order(
    table: pa.Table, order: pa.Array, predicate: Expr | None, params: Sequence[Scalar], count: int
) -> pa.Table | None:
    """The first ``count`` rows of ``table`` in ``order`` where ``predicate`` holds (None: give up).

    Walks the order in growing slices (four times larger each), taking each slice's rows and filtering
    them, until ``count`` rows matched. The rows keep the order's sequence, which restricted to the
    matching rows is their own stable sort order. A predicate so selective that an eighth of the
    partition has not produced ``count`` rows gives up: filtering the whole partition is cheaper then.
    """
    found: list[pa.Table] = []
    got, start, n = 0, 0, len(order)
    step = max(256, 8 * min(count, n))
    while got < count and start < n:
        if start > n // 8:
            return None
        part = table.take(order.slice(start, step))
        start += step
        step *= 4
        if predicate is not None:
            mask = _mask(part, predicate, params)
            if isinstance(mask, pa.Scalar):
                if mask.as_py() is not True:
                    return table.slice(0, 0)
            else:
                part = part.filter(mask)
        found.append(part)
        got += part.num_rows
    return concat(found).slice(0, count) if found else table.slice(0, 0)


def _mask(table: pa.Table, predicate: Expr, params: Sequence[Scalar]) -> pa.Scalar | pa.ChunkedArray:
    return _boolean(evaluate(predicate, table, params))


def _boolean(mask: Any) -> Any:
    """``mask`` when it is BOOLEAN (a NULL literal or parameter included), else the query's error: a
    constant such as ``3`` filtered every row out silently (the SQL path refuses it when planning)."""
    if not (pa.types.is_boolean(mask.type) or (isinstance(mask, pa.Scalar) and pa.types.is_null(mask.type))):
        raise ExecutionError(f"a predicate must be boolean, got {mask.type}")
    return mask


def _filter(table: pa.Table, predicate: Expr, params: Sequence[Scalar]) -> pa.Table:
    mask = _mask(table, predicate, params)
    if isinstance(mask, pa.Scalar):
        return table if mask.as_py() is True else table.slice(0, 0)
    return table.filter(mask)


def _step(op: PlanNode, table: pa.Table, params: Sequence[Scalar]) -> pa.Table:
    if isinstance(op, Filter):
        return _filter(table, op.predicate, params)
    if isinstance(op, Project):
        return pa.table({name: evaluate_column(e, table, params) for name, e in op.items})
    if isinstance(op, Aggregate):
        phase = {"single": aggregate.single, "partial": aggregate.partial, "final": aggregate.final}[op.phase]
        return phase(table, op.keys, op.aggs)
    if isinstance(op, Sort | MergeSort):
        # pyarrow has no k-way merge; its sort of the concatenated runs is vectorised and stable.
        return sort_table(table, op.keys)
    if isinstance(op, TopK):
        return top_k(table, op.keys, op.count)
    if isinstance(op, Limit):
        return table.slice(op.offset, op.count)
    if isinstance(op, Send):
        return table
    raise ExecutionError(f"operator {type(op).__name__} cannot run here")


# ---------------------------------------------------------------- receiving


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Rows of ``tables`` in order, in one schema (``exchange.concat_rows``: a column of Arrow's null type
    takes the other members' type, numeric types widen; no common type is an ExecutionError)."""
    return x.concat_rows(tables)


class Inbox:
    """The rows a fragment has received so far, folded by the operator above its ``Receive``."""

    def __init__(self, root: PlanNode) -> None:
        ops = chain(root)
        self._above = ops[1] if len(ops) > 1 else None
        self._above2 = ops[2] if len(ops) > 2 else None
        self.table: pa.Table | None = None
        self.batches = 0
        #: ``table`` holds merged states of the final aggregate above (two batches or more were merged)
        self.folded = False

    def add(self, data: bytes) -> int:
        """Fold one received batch (an Arrow IPC stream; empty means "no data here"); returns its rows.

        Raises:
            ExecutionError: the bytes are not a valid batch, or its schema differs from earlier ones.
        """
        self.batches += 1
        if not data:
            return 0
        try:
            batch = decode_batch(data)
        except DecodeError as exc:
            raise ExecutionError(f"bad row batch: {exc}") from None
        incoming = aligned(pa.Table.from_batches([batch]))
        if self.table is None:
            self.table = incoming
        else:
            self.table = self._compact(concat([self.table, incoming]))
            self.folded = isinstance(self._above, Aggregate) and self._above.phase == "final"
        return int(batch.num_rows)

    def _compact(self, table: pa.Table) -> pa.Table:
        above, above2 = self._above, self._above2
        if isinstance(above, Aggregate) and above.phase == "final":
            return aggregate.combine(table, above.keys, above.aggs)
        if isinstance(above, MergeSort) and isinstance(above2, Limit):
            return top_k(table, above.keys, above2.rows)
        if isinstance(above, Limit):
            return table.slice(0, above.rows)
        return table


# ---------------------------------------------------------------- hash partitioning

_U64 = pa.uint64()


def _u(value: int) -> pa.Scalar:
    return pa.scalar(value, _U64)


def _mix(h: pa.Array) -> pa.Array:
    """splitmix64's finaliser (wrapping uint64 arithmetic): spreads every input bit over the output."""
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u(30)))
    h = pc.multiply(h, _u(0xBF58476D1CE4E5B9))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u(27)))
    h = pc.multiply(h, _u(0x94D049BB133111EB))
    return pc.bit_wise_xor(h, pc.shift_right(h, _u(31)))


def _hash_bytes(arr: pa.Array) -> pa.Array:
    """Per value, the sum over its bytes of ``byte * mix(position in the value)``: the same on any node."""
    arr = pc.cast(arr, pa.large_binary())
    bufs = arr.buffers()
    offsets = pa.Array.from_buffers(pa.int64(), len(arr) + 1, [None, bufs[1]], offset=arr.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    data = (
        pa.Array.from_buffers(pa.uint8(), end, [None, bufs[2]]).slice(start)
        if end
        else pa.array([], pa.uint8())
    )
    rebased = pc.subtract(offsets, pa.scalar(start, pa.int64()))
    parents = pc.list_parent_indices(pa.LargeListArray.from_arrays(rebased, data))
    position = pc.subtract(aggregate.arange(len(data)), pc.take(rebased, parents))
    weighted = pc.multiply(pc.cast(data, _U64), _mix(pc.cast(pc.add(position, 1), _U64)))
    sums = pa.concat_arrays([pa.array([0], _U64), pc.cumulative_sum(weighted)])
    lengths = pc.cast(pc.subtract(offsets.slice(1), offsets.slice(0, len(arr))), _U64)
    per_value = pc.subtract(pc.take(sums, rebased.slice(1)), pc.take(sums, rebased.slice(0, len(arr))))
    return pc.add(per_value, lengths)


def _hash_column(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_null(t):
        return pa.repeat(_u(0), len(arr))  # every value NULL, which hashes to 0 in any type
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        h = _hash_bytes(arr)
    elif pa.types.is_floating(t):
        # As keys group (normalised): -0.0 is 0.0 and every NaN is one NaN, so they hash alike.
        h = normalised(pc.fill_null(pc.cast(arr, pa.float64()), 0.0)).view(_U64)
    elif t == _U64:
        # Its own bits: a value past 2**63 has no int64 (and below it, the bits are the int64's).
        h = pc.fill_null(arr, _u(0))
    elif pa.types.is_date32(t) or pa.types.is_time32(t):  # no cast from these to int64 but through int32
        h = pc.fill_null(pc.cast(pc.cast(arr, pa.int32()), pa.int64()), 0).view(_U64)
    elif pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t):
        h = pc.cast(pc.fill_null(pc.cast(arr, pa.int64()), 0), pa.int64()).view(_U64)
    elif pa.types.is_decimal(t):
        h = _hash_bytes(_decimal_text(arr))
    else:
        raise ExecutionError(f"cannot hash-partition on a column of type {t}")
    return pc.if_else(pc.is_valid(arr), _mix(pc.add(h, _u(1))), _u(0))


def _decimal_text(arr: pa.Array) -> pa.Array:
    """Decimal values as text that equal values share at any precision and scale (``1.10`` and ``1.1`` as
    ``1.1``, ``100.00`` as ``1E+2``): members may hold a column at different scales (loaded tables), and
    equal keys must hash alike on every one. Python's decimals: a key type rarely hashed."""
    with decimal.localcontext() as ctx:
        ctx.prec = 100  # normalize rounds to the context's precision: past any decimal's 76 digits
        return pa.array([None if v is None else str(v.normalize()) for v in arr.to_pylist()], pa.string())


def hash_partition(table: pa.Table, keys: Sequence[str], parts: int) -> list[pa.Table]:
    """Split ``table`` into ``parts`` tables; equal key values always land in the same part, on any node."""
    if parts == 1:
        return [table]
    h = pa.repeat(_u(0), table.num_rows)
    for k in keys:
        if k not in table.column_names:
            raise ExecutionError(
                f"hash partition: column {k!r} does not exist; columns are {table.column_names}"
            )
        h = _mix(pc.add(pc.multiply(h, _u(31)), _hash_column(table.column(k))))
    target = pc.subtract(h, pc.multiply(pc.divide(h, _u(parts)), _u(parts)))
    return [table.filter(pc.equal(target, _u(i))) for i in range(parts)]
