"""How a partition's rows of one key are found and resolved: the hidden version columns, the upsert that
keeps each key's latest row, the overlay of a small table on a large one, and how key values compare
(``key_values``). Used by the store, its stepped reads (``serving.py``) and its compactions."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

LSN = "_sb_lsn"
ORIGIN = "_sb_origin"
HIDDEN = (LSN, ORIGIN)
#: A row number the upsert sorts by last (never stored).
_ROW = "_sb_row"

_FLOAT_BITS = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}


def key_values(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``column`` as upserts compare it: a float column as the bits of its values, every NaN made one
    (the compute controller's rule, ``canonical_nans``: NaN is one key, 0.0 and -0.0 are two). Hashing
    took floats by their bits and the sorted pass by IEEE comparison, so a NaN key written twice stayed
    two rows, and 0.0 and -0.0 were two keys until a write of some other key twice made them one."""
    if not pa.types.is_floating(column.type):
        return column
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    nan = pc.is_nan(values)
    if pc.any(nan).as_py():
        values = pc.if_else(nan, pa.scalar(float("nan"), values.type), values)
    return values.view(_FLOAT_BITS[values.type.bit_width])


def key_set(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``key_values`` as one array: the value set of an ``is_in`` lookup."""
    values = key_values(column)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def upsert(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """Keep, per key, the row with the highest (lsn, origin), and of one write's rows for a key (the same
    version) the last, as a later write would replace it; identical rows collapse to one. Rows whose keys
    are all distinct come back as they are (in their order); otherwise sorted by key (a float key by its
    bits, ``key_values``)."""
    if table.num_rows <= 1:
        return table
    if len(key) == 1 and pc.count_distinct(key_values(table.column(key[0]))).as_py() == table.num_rows:
        return table  # a hash pass instead of a sort: the common case, a write of new keys
    order = [(k, "ascending") for k in key] + [
        (LSN, "descending"),
        (ORIGIN, "descending"),
        (_ROW, "descending"),
    ]
    keys = pa.table({k: key_values(table.column(k)) for k in key})
    sort_columns = pa.table(
        [*keys.columns, table.column(LSN), table.column(ORIGIN), pa.array(range(table.num_rows), pa.int64())],
        names=[*key, LSN, ORIGIN, _ROW],
    )
    indices = pc.sort_indices(sort_columns, sort_keys=order)
    ordered, keys = table.take(indices), keys.take(indices)
    n = ordered.num_rows
    changed: pa.Array | None = None
    for k in key:
        col = keys.column(k).combine_chunks()
        differs = pc.not_equal(col.slice(1), col.slice(0, n - 1))
        changed = differs if changed is None else pc.or_(changed, differs)
    assert changed is not None
    return ordered.filter(pa.concat_arrays([pa.array([True]), changed]))


def overlay(base: pa.Table, top: pa.Table, key: Sequence[str]) -> pa.Table:
    """``upsert(concat_tables([base, top]))`` for tables each upserted already (every key once in each).

    Only the rows of ``base`` whose first key column's value is in ``top`` are upserted with ``top``
    (a superset of the keys both hold); the rest of ``base`` is kept as it is. A small ``top`` (the
    memtable, a minor segment) over a large ``base`` (the chain) then costs a hash pass over ``base``
    and a filter, not a sort of it: where a key was written twice, the full upsert sorts every row.
    """
    if top.num_rows == 0:
        return base
    if base.num_rows == 0:
        return top
    hit = pc.is_in(key_values(base.column(key[0])), value_set=key_set(top.column(key[0])))
    if not pc.any(hit).as_py():
        return pa.concat_tables([base, top])
    both = upsert(pa.concat_tables([base.filter(hit), top]), key)
    return pa.concat_tables([base.filter(pc.invert(hit)), both])
