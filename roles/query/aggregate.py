"""Grouped aggregation in three phases, vectorised on Arrow.

``partial`` turns rows into mergeable states, ``combine`` merges states (partial -> partial, so the
initiator can fold batches as they arrive and hold one row per group, and per distinct value of a
``count_distinct``), and ``finalize`` turns merged
states into answers. ``single(t) == finalize(partial(t))`` and for any split of ``t`` into parts,
``finalize(combine(concat(partial(part) ...))) == single(t)``.

States per aggregate ``name``: ``count`` -> int64 count; ``sum``/``min``/``max`` -> the value; ``avg`` ->
``name$sum`` (float64: as Spark SQL's ``Average``, every value is cast to double before it is added, so an
average of large integers neither overflows nor meets a lossy cast) and ``name$count``; ``count_distinct``
-> one value per row. A state table holds one *group row* per group, whose ``count_distinct`` columns are
NULL, and one *value row* per distinct non-null value of each ``count_distinct`` (its group's keys, the
value in that aggregate's column, NULL in every other state column; NULL is every state's neutral
element). So no row grows with the number of distinct values: however many there are, the rows stay as
narrow as the input's and a sender can cut the states into batches of any size.

Groups are numbered densely (``dictionary_encode`` per key column, combined), then one Arrow hash
aggregation over the group number computes every state; NULL is a group of its own, as in SQL.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.expressions import INT64_MAX, INT64_MIN, normalised
from sparkbus.roles.query.plan import AggCall

#: scratch arrays up to this many elements are kept and reused
_SCRATCH_KEPT = 1 << 22
#: free scratch arrays by (purpose, dtype); list pop and append are atomic, so nodes that run in threads
#: of one process never share an array
_FREE: dict[tuple[str, Any], list[npt.NDArray[Any]]] = {}
_AR: list[npt.NDArray[np.intp]] = [np.arange(1024, dtype=np.intp)]


@contextmanager
def _copied(name: str, values: pa.Array, dtype: type[Any]) -> Iterator[npt.NDArray[Any]]:
    """``values`` (no nulls) as a writable NumPy array of ``dtype`` in reused memory, for the block.

    NumPy copies a read-only input (every Arrow buffer seen through ``to_numpy``) before ``np.bincount``
    reads it, and a fresh 4 MB array costs its page faults again and again: on the development VM that
    made one 500k-row ``bincount`` 4 to 6 ms instead of 0.7 ms. Copying into kept memory costs 0.1 ms.
    """
    n = len(values)
    pool = _FREE.setdefault((name, dtype), [])
    try:
        buf = pool.pop()
    except IndexError:
        buf = np.empty(0, dtype)
    if len(buf) < n:
        buf = np.empty(n if n > _SCRATCH_KEPT else 1 << max(10, (n - 1).bit_length()), dtype)
    out = buf[:n]
    np.copyto(out, values.to_numpy(), casting="unsafe")
    try:
        yield out
    finally:
        if len(buf) <= _SCRATCH_KEPT and len(pool) < 4:
            pool.append(buf)


def _arange_np(n: int) -> npt.NDArray[np.intp]:
    """0, 1, ..., n - 1 (read only: a slice of a kept array, regrown when too short)."""
    kept = _AR[0]
    if len(kept) < n:
        if n > _SCRATCH_KEPT:
            return np.arange(n, dtype=np.intp)
        kept = _AR[0] = np.arange(1 << max(10, (n - 1).bit_length()), dtype=np.intp)
    return kept[:n]


# (output column, input column or None for every row, kernel)
_Spec = tuple[str, str | None, str]


def _partial_specs(aggs: Sequence[AggCall], table: pa.Table | None = None) -> list[_Spec]:
    """The states of ``aggs`` over the rows of ``table``. A SUM of the untyped NULL (Arrow's null type: the
    literal NULL, a ``?`` bound to None, a column loaded all NULL) keeps an untyped NULL state (Arrow's MIN
    of the null type), where Arrow's sum would answer int64: merged with another member's state, it takes
    that state's type (a member whose partition has the column as BIGINT sums BIGINT, and so does the
    answer); only when every state is untyped does ``finalize`` answer a DOUBLE NULL, as Spark SQL casts
    SUM(NULL)'s NULL to DOUBLE."""
    out: list[_Spec] = []
    for a in aggs:
        if a.func == "avg":
            exact = table is not None and a.column is not None and _decimal(table, a.column)
            out += [(f"{a.name}$sum", a.column, "sum" if exact else "fsum")]
            out += [(f"{a.name}$count", a.column, "count")]
        elif a.func == "count_distinct":
            out.append((a.name, a.column, "distinct"))  # names the column only: see ``partial``
        elif a.func == "sum" and table is not None and _untyped(table, a.column):
            out.append((a.name, a.column, "min"))
        else:
            out.append((a.name, a.column, a.func))
    return out


def _decimal(table: pa.Table, column: str) -> bool:
    """Whether ``column`` of ``table`` holds decimals: their AVG is summed exactly, as Spark SQL's."""
    return bool(pa.types.is_decimal(_column(table, column).type))


def _decimal_avg(total: pa.ChunkedArray | pa.Array, count: pa.ChunkedArray | pa.Array) -> pa.Array:
    """AVG of decimals as Spark SQL answers it: exact, at 4 more decimal places than the values (rounded
    half up), typed DECIMAL(38, s + 4) here (Spark: DECIMAL(p + 4, s + 4)); NULL for a group of none."""
    scale = min(38, total.type.scale + 4)
    quantum = decimal.Decimal(1).scaleb(-scale)
    out: list[decimal.Decimal | None] = []
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        for t, n in zip(total.to_pylist(), count.to_pylist(), strict=True):
            out.append(None if t is None or not n else (t / n).quantize(quantum, decimal.ROUND_HALF_UP))
    return pa.array(out, pa.decimal128(38, scale))


def _untyped(table: pa.Table, column: str | None) -> bool:
    """Whether ``column`` of ``table`` has Arrow's null type (every value NULL, of no type)."""
    return column is not None and pa.types.is_null(_column(table, column).type)


def _combine_specs(aggs: Sequence[AggCall], table: pa.Table) -> list[_Spec]:
    out: list[_Spec] = []
    for a in aggs:
        if a.func == "avg":
            out += [(f"{a.name}$sum", f"{a.name}$sum", "sum"), (f"{a.name}$count", f"{a.name}$count", "sum0")]
        elif a.func == "count":
            out.append((a.name, a.name, "sum0"))
        elif a.func == "sum" and _untyped(table, a.name):
            out.append((a.name, a.name, "min"))  # untyped states stay untyped (see ``_partial_specs``)
        else:
            out.append((a.name, a.name, a.func))
    return out


def partial(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    """Partial states of ``aggs`` per group of ``keys`` over the rows of ``table``.

    The groups come in the hash aggregation's own (deterministic) order, not in order of first
    appearance: whoever merges partial states (``combine``) orders groups by first appearance in what it
    merged, and that already depends on the order in which members' batches arrived.
    """
    _refuse_non_numeric(table, aggs)
    plain, distinct = _split(aggs)
    if not distinct:
        return _apply(table, keys, _partial_specs(aggs, table), ordered=False)
    groups = _groups(table, keys, _partial_specs(plain, table), ordered=False)
    values = {a.name: _value_rows(table, keys, _column(table, a.column or "")) for a in distinct}
    return _states(groups, keys, aggs, values)


def _refuse_non_numeric(table: pa.Table, aggs: Sequence[AggCall]) -> None:
    """Refuse a SUM or AVG of anything but numbers (integers, floats, decimals, or the untyped NULL), as
    Spark SQL refuses it (DATATYPE_MISMATCH.UNEXPECTED_INPUT_TYPE), where Arrow would count a BOOLEAN's
    TRUE values as an unsigned sum or average them as 0 and 1.

    Raises:
        ExecutionError: naming the aggregate and the type.
    """
    for a in aggs:
        if a.func in ("sum", "avg") and a.column is not None:
            kind = _column(table, a.column).type
            if not (
                pa.types.is_integer(kind)
                or pa.types.is_floating(kind)
                or pa.types.is_decimal(kind)
                or pa.types.is_null(kind)
            ):
                raise ExecutionError(
                    f"{a.func.upper()} takes numbers (integer, floating point or decimal), not {kind}, "
                    "as in Spark SQL"
                )


def combine(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    """Merge partial states (possibly several rows per group) into one group row per group (and, for
    ``count_distinct``, one value row per distinct value of the group)."""
    plain, distinct = _split(aggs)
    if not distinct:
        return _apply(table, keys, _combine_specs(aggs, table))
    # Value rows hold NULL in every state column: the other states of their group merge unchanged.
    groups = _groups(table.drop_columns([a.name for a in distinct]), keys, _combine_specs(plain, table))
    values = {a.name: _value_rows(table, keys, table.column(a.name)) for a in distinct}
    return _states(groups, keys, aggs, values)


def finalize(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    """Answers from merged states (one group row per group): avg divides, count_distinct counts."""
    with _arrow_errors():
        return _finalize(table, keys, aggs)


def _finalize(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    _, distinct = _split(aggs)
    counts: dict[str, pa.Array] = {}
    if distinct:
        table, counts = _count_values(table, keys, [a.name for a in distinct])
    columns: dict[str, pa.ChunkedArray | pa.Array] = {k: table.column(k) for k in keys}
    for a in aggs:
        if a.func == "avg" and _decimal(table, f"{a.name}$sum"):
            columns[a.name] = _decimal_avg(table.column(f"{a.name}$sum"), table.column(f"{a.name}$count"))
        elif a.func == "avg":
            total = pc.cast(table.column(f"{a.name}$sum"), pa.float64(), safe=False)
            count = pc.cast(table.column(f"{a.name}$count"), pa.float64())
            columns[a.name] = pc.if_else(
                pc.equal(count, 0.0), pa.scalar(None, pa.float64()), pc.divide(total, count)
            )
        elif a.func == "count_distinct":
            columns[a.name] = counts[a.name]
        elif a.func == "sum" and _untyped(table, a.name):
            columns[a.name] = pa.nulls(table.num_rows, pa.float64())  # SUM(NULL) is a DOUBLE NULL in Spark
        else:
            columns[a.name] = table.column(a.name)
    return pa.table(columns)


# ---------------------------------------------------------------- count distinct


def _split(aggs: Sequence[AggCall]) -> tuple[list[AggCall], list[AggCall]]:
    """``aggs`` without and with ``count_distinct``."""
    return [a for a in aggs if a.func != "count_distinct"], [a for a in aggs if a.func == "count_distinct"]


def _groups(table: pa.Table, keys: Sequence[str], specs: list[_Spec], *, ordered: bool = True) -> pa.Table:
    """One row per group with the states of ``specs`` (a global aggregate: exactly one row)."""
    if keys or specs:
        return _apply(table, keys, specs, ordered=ordered)
    return pa.table({"__one": pa.nulls(1, pa.int8())})  # one row, no states: dropped by ``_states``


def _value_rows(table: pa.Table, keys: Sequence[str], values: pa.ChunkedArray) -> pa.Table:
    """The distinct ``(keys..., value)`` pairs of ``table`` whose value is not NULL, values normalised as
    Spark counts them distinct (-0.0 is 0.0, every NaN one NaN); the value column is ``__v``.

    Groups and values are numbered densely (``dictionary_encode``), each pair is one int64
    (``group * values + value``), and the distinct pairs are one hash pass over those numbers: a tenth of
    an Arrow grouping by the key columns and the value (Acero hashes the columns themselves).
    """
    with _arrow_errors():
        if pa.types.is_null(values.type):
            # Every value is NULL, so there are no value rows. Their column keeps the null type, which takes
            # the type of another member's values where states merge. (Arrow's grouping crashes the process
            # (SIGSEGV) on the null type.)
            rows = _decoded(table.select(list(keys)).slice(0, 0), keys)
            return rows.append_column("__v", pa.nulls(0))
        values = normalised(values).combine_chunks()
        if not keys:
            return pa.table({"__v": _distinct(values)})
        codes: dict[str, pa.Array] = {}
        for k in keys:
            col = _column(table, k).combine_chunks()
            # A dictionary column is numbered by its indices; floats as they group (normalised).
            codes[k] = col.indices if pa.types.is_dictionary(col.type) else normalised(col)
        g, _ = group_ids(pa.table(codes), keys)
        encoded = pc.dictionary_encode(values)
        width = len(encoded.dictionary)
        pairs = pc.unique(pc.drop_null(pc.add(pc.multiply(g, width), pc.cast(encoded.indices, pa.int64()))))
        ids = g.to_numpy()
        # Group numbers count up in order of first appearance: a group's first row raises the running maximum.
        first = np.flatnonzero(np.diff(np.maximum.accumulate(ids), prepend=-1) > 0) if len(ids) else ids
        group_keys = _decoded(table.select(list(keys)).take(pa.array(first)), keys)
        of_group = pc.divide(pairs, width) if width else pairs
        out = group_keys.take(of_group)
        value_of = pc.subtract(pairs, pc.multiply(of_group, width))
        return out.append_column("__v", encoded.dictionary.take(value_of))


def _states(
    groups: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall], values: dict[str, pa.Table]
) -> pa.Table:
    """The state table: ``groups`` (keys and the other states) as group rows, then each ``count_distinct``'s
    value rows; columns in the order of the aggregates' states."""
    names = [*keys, *(name for name, _, _ in _partial_specs(aggs))]
    kinds = {name: values[name].schema.field("__v").type for name in values}
    types = {**{f.name: f.type for f in groups.schema}, **kinds}
    parts = [_widened(groups, names, types, groups.num_rows, {})]
    for name, rows in values.items():
        given = {k: rows.column(k) for k in keys} | {name: rows.column("__v")}
        parts.append(_widened(None, names, types, rows.num_rows, given))
    return pa.concat_tables(parts)


def _widened(
    base: pa.Table | None, names: list[str], types: dict[str, pa.DataType], rows: int, given: dict[str, Any]
) -> pa.Table:
    """``rows`` rows with columns ``names``: from ``given``, else from ``base``, else NULL."""
    columns = []
    for name in names:
        if name in given:
            columns.append(given[name])
        elif base is not None and name in base.column_names:
            columns.append(base.column(name))
        else:
            columns.append(pa.nulls(rows, types[name]))
    return pa.table(dict(zip(names, columns, strict=True)))


def _count_values(
    table: pa.Table, keys: Sequence[str], names: list[str]
) -> tuple[pa.Table, dict[str, pa.Array]]:
    """The group rows of a state table, and per ``count_distinct`` column the number of its value rows in
    each of those groups (aligned with them)."""
    valid = {name: pc.is_valid(table.column(name)) for name in names}
    is_group = pc.invert(functools.reduce(pc.or_, valid.values()))
    groups = table.filter(is_group)
    if not keys:
        return groups, {n: pa.array([pc.sum(v, min_count=0).as_py()], pa.int64()) for n, v in valid.items()}
    g, n = group_ids(table, keys)
    ids = g.to_numpy()
    at = np.asarray(is_group)
    counts = {}
    for name, v in valid.items():
        per_group = np.bincount(ids[np.asarray(v)], minlength=n)
        counts[name] = pa.array(per_group[ids[at]], pa.int64())
    return groups, counts


def final(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    """Answers from partial states."""
    return finalize(combine(table, keys, aggs), keys, aggs)


def single(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggCall]) -> pa.Table:
    """Answers straight from rows."""
    return finalize(partial(table, keys, aggs), keys, aggs)


# ---------------------------------------------------------------- kernels


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise ExecutionError(f"column {name!r} does not exist; columns are {table.column_names}")
    return table.column(name)


@contextmanager
def _arrow_errors() -> Iterator[None]:
    """Arrow's complaints about the data (a type it cannot aggregate, a value it cannot cast) as
    ``ExecutionError``, so the query fails with ``DATA_EXCEPTION`` naming them."""
    try:
        yield
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise ExecutionError(f"aggregate: {exc}") from None


def _apply(table: pa.Table, keys: Sequence[str], specs: list[_Spec], *, ordered: bool = True) -> pa.Table:
    with _arrow_errors():
        specs = _resolved(table, specs)
        for k in keys:
            col = _column(table, k)
            if col.type in _FLOATS:
                table = table.set_column(table.column_names.index(k), k, normalised(col))
        if not keys:
            return _apply_global(table, specs)
        return _decoded(_apply_grouped(table, keys, specs, ordered=ordered), keys)


def _resolved(table: pa.Table, specs: list[_Spec]) -> list[_Spec]:
    """``fsum`` (a sum in float64) over a float64 column is a plain ``sum``, which it then shares."""
    return [
        (name, col, "sum")
        if kernel == "fsum" and col is not None and _column(table, col).type == pa.float64()
        else (name, col, kernel)
        for name, col, kernel in specs
    ]


_FLOATS = (pa.float32(), pa.float64())


def _nan_on_top(kernel: str, values: pa.ChunkedArray | pa.Array) -> bool:
    """A MAX of floats: Spark orders NaN above everything, where Arrow's min and max skip it."""
    return kernel == "max" and values.type in _FLOATS


def _nan_tops(maxima: pa.ChunkedArray | pa.Array, any_nan: pa.ChunkedArray | pa.Array) -> Any:
    """MAX as Spark orders floats, NaN above everything: NaN where the group holds one (Arrow skips NaN)."""
    return pc.if_else(pc.fill_null(any_nan, False), pa.scalar(float("nan"), maxima.type), maxima)


def _as_float(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Values cast to float64 as Spark casts a sum's input to double (large integers round)."""
    return pc.cast(values, pa.float64(), safe=False)


_ARANGE: list[pa.Array] = [pa.array([], pa.int64())]
_ARANGE_KEPT = 1 << 21


def arange(n: int) -> pa.Array:
    """0, 1, ..., n - 1 as int64, without a Python loop.

    A slice of one kept array, regrown to the next power of two when too short: building it costs 3 ns
    a row (0.17 ms for the 50k rows of a group-by), a slice nothing. Beyond 2M rows (16 MB kept) it is
    built for the call only.
    """
    if n > _ARANGE_KEPT:
        return pc.cast(pc.indices_nonzero(pa.repeat(pa.scalar(True), n)), pa.int64())
    if len(_ARANGE[0]) < n:
        size = 1 << max(10, (n - 1).bit_length())
        _ARANGE[0] = pc.cast(pc.indices_nonzero(pa.repeat(pa.scalar(True), size)), pa.int64())
    return _ARANGE[0].slice(0, n)


#: integer types Arrow sums in their own width (wrapping on overflow), and the range of that width
_WIDE = {pa.int64(): (INT64_MIN, INT64_MAX), pa.uint64(): (0, (1 << 64) - 1)}


def _check_sums(table: pa.Table, keys: Sequence[str], specs: list[_Spec]) -> None:
    """Fail a SUM of 64-bit integers that passes their range, as Spark SQL (ANSI) fails a sum of longs.

    Arrow's sums wrap silently. Most columns are cleared by one bound (largest magnitude times the
    values' count); only where that bound passes the range are the exact sums computed, per group, from
    the values' high and low 32 bits (each summed without overflow).

    Raises:
        ExecutionError: a sum overflows.
    """
    for _, col, kernel in specs:
        if kernel not in ("sum", "sum0") or col is None:
            continue
        values = _column(table, col)
        if pa.types.is_decimal(values.type):
            _check_decimal_sums(table, keys, values)
            continue
        bounds = _WIDE.get(values.type)
        if bounds is None:
            continue
        least, most = bounds
        extremes = pc.min_max(values)
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        if low is None or max(-low, high) * (len(values) - values.null_count) <= most:
            continue
        high_bits = pc.shift_right(values, pa.scalar(32, values.type))
        low_bits = pc.bit_wise_and(values, pa.scalar(0xFFFFFFFF, values.type))
        if keys:
            inputs = {f"__k{j}": _column(table, k) for j, k in enumerate(keys)}
            sums = (
                pa.table({**inputs, "h": high_bits, "l": low_bits})
                .group_by(list(inputs), use_threads=False)
                .aggregate([("h", "sum"), ("l", "sum")])
            )
            pairs = zip(sums.column("h_sum").to_pylist(), sums.column("l_sum").to_pylist(), strict=True)
        else:
            pairs = zip([pc.sum(high_bits).as_py()], [pc.sum(low_bits).as_py()], strict=True)
        for h, lo in pairs:
            if h is not None and not least <= (h << 32) + lo <= most:
                raise ExecutionError(f"sum: overflow (a sum of {values.type} values passes its range)")


def _check_decimal_sums(table: pa.Table, keys: Sequence[str], values: pa.ChunkedArray | pa.Array) -> None:
    """Fail a SUM of decimals that passes its type's 38 digits (76 for decimal256), as Spark SQL fails
    with ARITHMETIC_OVERFLOW: Arrow's decimal sums wrap in 128 bits (four values of 10**38 - 1 summed to
    59717633079061536536625392568231788544). Cleared by one bound (largest magnitude times the values'
    count) as a rule; past it, the exact sums per group, in Python's decimals.

    Raises:
        ExecutionError: a sum overflows.
    """
    digits = 76 if pa.types.is_decimal256(values.type) else 38
    with decimal.localcontext() as ctx:
        ctx.prec = 200  # exact for any sum of such values
        limit = decimal.Decimal(10) ** (digits - values.type.scale)
        extremes = pc.min_max(values)
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        if low is None or max(-low, high) * (len(values) - values.null_count) < limit:
            return
        groups = list(zip(*(_column(table, k).to_pylist() for k in keys), strict=True)) if keys else None
        sums: dict[Any, decimal.Decimal] = {}
        for i, v in enumerate(values.to_pylist()):
            if v is not None:
                group = groups[i] if groups is not None else ()
                sums[group] = sums.get(group, decimal.Decimal(0)) + v
        if any(abs(total) >= limit for total in sums.values()):
            raise ExecutionError(f"sum: overflow (a sum of {values.type} values passes its range)")


def _apply_global(table: pa.Table, specs: list[_Spec]) -> pa.Table:
    """Without keys: exactly one output row, also for an empty input (SQL's global aggregate)."""
    _check_sums(table, (), specs)
    out: dict[str, pa.Array] = {}
    for name, col, kernel in specs:
        if col is None:
            out[name] = pa.array([table.num_rows], pa.int64())
            continue
        values = _column(table, col)
        if kernel == "count":
            result: pa.Scalar = pc.count(values)
        elif kernel == "sum":
            result = pc.sum(values, min_count=1)
        elif kernel == "fsum":
            result = pc.sum(_as_float(values), min_count=1)
        elif kernel == "sum0":
            result = pc.sum(values, min_count=0)
        elif kernel in ("min", "max"):
            result = pc.min_max(values)[kernel]
            if _nan_on_top(kernel, values) and pc.any(pc.is_nan(values)).as_py():
                result = pa.scalar(float("nan"), values.type)
        else:
            raise ExecutionError(f"aggregate: no kernel {kernel!r}")
        out[name] = pa.array([result.as_py()], result.type)
    return pa.table(out)


def _distinct(values: pa.Array) -> pa.Array:
    """The distinct non-null values; few-valued integers by marking bins (ascending), others by hashing."""
    if values.type in _SIGNED and len(values) > 64:
        present = pc.drop_null(values) if values.null_count else values
        bounds = pc.min_max(present)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo is not None and hi - lo < max(_DENSE_SPAN, 2 * len(present)):
            with _copied("ids", present, np.intp) as ids:
                np.subtract(ids, lo, out=ids)
                seen = np.bincount(ids, minlength=hi - lo + 1)
            return pa.array(np.flatnonzero(seen) + lo, values.type)
    return pc.drop_null(pc.unique(values))


def group_ids(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Array, int]:
    """Dense group numbers (0.. in order of first appearance) for the rows of ``table`` by ``keys``."""
    acc: pa.Array | None = None
    groups = 0
    for k in keys:
        encoded = pc.dictionary_encode(_column(table, k).combine_chunks(), null_encoding="encode")
        ids = pc.cast(encoded.indices, pa.int64())
        n = len(encoded.dictionary)
        acc = ids if acc is None else pc.add(pc.multiply(acc, n), ids)
        if len(keys) > 1:
            encoded = pc.dictionary_encode(acc)
            acc = pc.cast(encoded.indices, pa.int64())
            n = len(encoded.dictionary)
        groups = n
    assert acc is not None
    return acc, groups


def _decoded(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Key columns a scan handed over dictionary-encoded, back in their own type (one value per group)."""
    for k in keys:
        t = table.schema.field(k).type
        if pa.types.is_dictionary(t):
            i = table.column_names.index(k)
            table = table.set_column(i, pa.field(k, t.value_type), pc.cast(table.column(i), t.value_type))
    return table


_HASH = {
    "count": "count",
    "sum": "sum",
    "sum0": "sum",
    "fsum": "sum",
    "min": "min",
    "max": "max",
}


def _apply_grouped(
    table: pa.Table, keys: Sequence[str], specs: list[_Spec], *, ordered: bool = True
) -> pa.Table:
    dense = _apply_dense(table, keys, specs, ordered=ordered)
    if dense is not None:
        return dense  # its integer sums are exact in float64, far from overflowing
    _check_sums(table, keys, specs)
    return _apply_hashed(table, keys, specs, ordered=ordered)


def _apply_hashed(
    table: pa.Table, keys: Sequence[str], specs: list[_Spec], *, ordered: bool = True
) -> pa.Table:
    # One hash aggregation straight over the key columns (NULL keys form groups of their own). Its
    # output order is its own; with ``ordered``, each group's first row number puts the groups in order
    # of first appearance, as the numbered path does. Inputs get names we control; several specs that
    # read the same column with the same kernel share one aggregation.
    inputs: dict[str, pa.Array | pa.ChunkedArray] = {}
    aggregations: list[tuple[str, str] | tuple[str, str, pc.FunctionOptions]] = []
    if ordered:
        inputs["__i"] = arange(table.num_rows)
        aggregations.append(("__i", "min"))
    for j, k in enumerate(keys):
        inputs[f"__k{j}"] = _column(table, k)
    outputs: list[str] = []
    shared: dict[tuple[str | None, str], str] = {}
    nan_of: dict[str, str] = {}  # a float MAX's output -> whether its group holds a NaN
    for i, (_, col, kernel) in enumerate(specs):
        key = (col, kernel if kernel == "fsum" else _HASH[kernel])
        if key not in shared:
            if col is None:
                # COUNT(*): every row of the group, NULL keys included.
                aggregations.append(("__k0", "count", pc.CountOptions(mode="all")))
                shared[key] = "__k0_count"
            else:
                values = _column(table, col)
                inputs[f"__c{i}"] = _hash_input(values, kernel)
                aggregations.append((f"__c{i}", _HASH[kernel]))
                shared[key] = f"__c{i}_{_HASH[kernel]}"
                if _nan_on_top(kernel, values):
                    inputs[f"__n{i}"] = pc.is_nan(values)
                    aggregations.append((f"__n{i}", "any"))
                    nan_of[shared[key]] = f"__n{i}_any"
        outputs.append(shared[key])
    grouped = pa.table(inputs).group_by([f"__k{j}" for j in range(len(keys))], use_threads=False)
    result = grouped.aggregate(aggregations)
    if ordered:
        result = result.take(pc.sort_indices(result.column("__i_min")))
    out: dict[str, pa.Array | pa.ChunkedArray] = {}
    for j, k in enumerate(keys):
        out[k] = result.column(f"__k{j}")
    for (name, _, kernel), column_name in zip(specs, outputs, strict=True):
        column = result.column(column_name)
        if column_name in nan_of:
            column = _nan_tops(column, result.column(nan_of[column_name]))
        out[name] = pc.fill_null(column, 0) if kernel == "sum0" else column
    return pa.table(out)


def _hash_input(values: pa.ChunkedArray | pa.Array, kernel: str) -> pa.ChunkedArray | pa.Array:
    """What a hash aggregation's kernel reads: AVG's sum in float64."""
    return _as_float(values) if kernel == "fsum" else values


#: a key whose values span at most this many (or twice the rows) is counted in dense bins
_DENSE_SPAN = 1 << 16
_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


_KeysOf = Callable[[npt.NDArray[np.intp]], pa.Array]


def _dense_keys(col: pa.Array) -> tuple[pa.Array, int, int, _KeysOf] | None:
    """How to number the bins of a key column whose values are few and dense, or None.

    A dictionary column's bins are its indices; a signed integer column's are ``value - min`` when the
    values span at most ``max(_DENSE_SPAN, 2 * rows)``. NULL keys get the last bin. Returns the values
    to number (NULLs filled), the offset to subtract, the number of bins, and how to turn bin numbers back
    into key values.
    """
    t = col.type
    if pa.types.is_dictionary(t):
        dictionary = col.dictionary
        bins = len(dictionary)
        values = dictionary.cast(t.value_type)

        def keys_of(ids: npt.NDArray[np.intp]) -> pa.Array:
            return values.take(pa.array(np.where(ids == bins, -1, ids), mask=ids == bins))

        raw = col.indices
        offset = 0
    elif t in _SIGNED:
        bounds = pc.min_max(col)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo is None:  # every key is NULL: no bins but the NULL one
            lo, hi = 0, -1
        if hi - lo >= max(_DENSE_SPAN, 2 * len(col)):
            return None
        bins = hi - lo + 1
        raw = col
        offset = lo

        def keys_of(ids: npt.NDArray[np.intp]) -> pa.Array:
            return pa.array(ids + offset, t, mask=ids == bins)

    else:
        return None
    filled = pc.fill_null(raw, pa.scalar(offset, raw.type)) if raw.null_count else raw
    return filled, offset, bins + 1, keys_of


#: integer sums go through float64 bins only while every partial sum is exact there
_EXACT = float(1 << 52)


def _apply_dense(
    table: pa.Table, keys: Sequence[str], specs: list[_Spec], *, ordered: bool = True
) -> pa.Table | None:
    """Counts, sums and integer min/max per group of one few-valued key, in bins (NumPy), or None.

    Sums add each group's values in row order, as the hash aggregation does, so both give the same
    bits; integer sums only while their magnitudes stay exact in float64. With ``ordered`` the groups
    come in order of first appearance, else in bin order. Anything else is left to the hash aggregation.
    """
    if len(keys) != 1 or table.num_rows == 0:
        return None
    for _, col, kernel in specs:
        if kernel == "count":
            continue
        if kernel not in ("sum", "sum0", "fsum", "min", "max") or col is None:
            return None
        t = _column(table, col).type
        if t not in _SIGNED and (t != pa.float64() or kernel in ("min", "max")):
            return None
    key = _column(table, keys[0])
    raw = key.chunk(0) if key.num_chunks == 1 else key.combine_chunks()
    memory = _BINNED.key(raw) if key.num_chunks == 1 and len(raw) >= _BINNED_MIN_ROWS else None
    if not ordered and memory is not None and (kept := _BINNED.get(memory)) is not None:
        ids, bins, keys_of, rows = kept
        return _dense_states(table, keys[0], specs, ids, bins, keys_of, ordered=False, rows=rows)
    numbering = _dense_keys(raw)
    if numbering is None:
        return None
    filled, offset, bins, keys_of = numbering
    with _copied("ids", filled, np.intp) as ids:
        if offset:
            np.subtract(ids, offset, out=ids)
        if raw.null_count:
            ids[np.asarray(pc.is_null(raw))] = bins - 1
        if ordered or memory is None or not _BINNED.seen_before(memory):
            return _dense_states(table, keys[0], specs, ids, bins, keys_of, ordered=ordered)
        rows = np.bincount(ids, minlength=bins)
        _BINNED.put(memory, raw, (ids.copy(), bins, keys_of, rows))
        return _dense_states(table, keys[0], specs, ids, bins, keys_of, ordered=False, rows=rows)


#: key columns at least this long keep their bin numbers (``_Binned``)
_BINNED_MIN_ROWS = 1 << 16


class _Binned:
    """The bin numbers and per-bin row counts of the last few key columns grouped by, by their memory.

    A node groups the same prepared partition again and again (its Arrow arrays live as long as the table
    version): numbering its key column and counting its rows per bin is a third of a dense aggregation.
    An entry is found by the address, offset, length and type of the column's data buffer and keeps the
    column alive, so while the entry exists no other column can have that address; Arrow memory is
    immutable, so equal keys mean equal values.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: dict[tuple[Any, ...], tuple[pa.Array, Any]] = {}
        #: the keys of columns grouped once (nothing kept): a column is kept the second time it is grouped,
        #: so the filtered columns of one query (new memory each time) cost no copy
        self.seen: dict[tuple[Any, ...], None] = {}

    @staticmethod
    def key(col: pa.Array) -> tuple[Any, ...] | None:
        """What finds ``col``: its type and, for each array (indices and dictionary of a dictionary
        column), offset, length and buffer addresses; None for a column without data buffer."""
        arrays = [col.indices, col.dictionary] if pa.types.is_dictionary(col.type) else [col]
        key: list[Any] = [str(col.type)]
        for arr in arrays:
            buffers = arr.buffers()
            if not buffers or buffers[-1] is None:
                return None
            key += [arr.offset, len(arr), *(b.address if b is not None else 0 for b in buffers)]
        return tuple(key)

    # Nodes that run in threads of one process share the entries: every step below is one dict operation
    # (atomic), and an eviction that loses a race with another thread's is simply left to the next put.

    def get(self, key: tuple[Any, ...]) -> Any:
        entry = self.entries.get(key)
        return None if entry is None else entry[1]

    def seen_before(self, key: tuple[Any, ...]) -> bool:
        """Whether a column with this key was grouped before (and note that it was now)."""
        if key in self.seen:
            return True
        self.seen[key] = None
        _trim(self.seen, 8 * self.size)
        return False

    def put(self, key: tuple[Any, ...], col: pa.Array, value: Any) -> None:
        self.entries[key] = (col, value)
        _trim(self.entries, self.size)


def _trim(kept: dict[Any, Any], size: int) -> None:
    """Drop the oldest items of ``kept`` beyond ``size`` (another thread's concurrent trim may win)."""
    while len(kept) > size:
        try:
            del kept[next(iter(kept))]
        except (KeyError, RuntimeError, StopIteration):
            return


_BINNED = _Binned(8)


def _dense_states(
    table: pa.Table,
    key: str,
    specs: list[_Spec],
    ids: npt.NDArray[np.intp],
    bins: int,
    keys_of: _KeysOf,
    *,
    ordered: bool,
    rows: npt.NDArray[Any] | None = None,
) -> pa.Table | None:
    if rows is None:
        rows = np.bincount(ids, minlength=bins)
    present = np.flatnonzero(rows)
    if ordered:
        first = np.full(bins, len(ids), dtype=np.intp)
        np.minimum.at(first, ids, _arange_np(len(ids)))
        present = present[np.argsort(first[present], kind="stable")]
    done: dict[tuple[str | None, str], pa.Array] = {}
    results: list[pa.Array] = []
    for _, col, kernel in specs:
        if (col, kernel) not in done:
            result = _dense_aggregate(table, col, kernel, ids, bins, rows, present)
            if result is None:
                return None
            done[(col, kernel)] = result
        results.append(done[(col, kernel)])
    out: dict[str, pa.Array] = {key: keys_of(present)}
    for (name, _, _), result in zip(specs, results, strict=True):
        out[name] = result
    return pa.table(out)


def _dense_aggregate(
    table: pa.Table,
    col: str | None,
    kernel: str,
    ids: npt.NDArray[np.intp],
    bins: int,
    rows: npt.NDArray[Any],
    present: npt.NDArray[Any],
) -> pa.Array | None:
    """One count or sum per bin in ``present`` (None: an integer sum too large to be exact in float64)."""
    if col is None:
        return pa.array(rows[present], pa.int64())
    values = _column(table, col)
    arr = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    valid: npt.NDArray[Any] = rows
    if arr.null_count:
        valid = np.bincount(ids, weights=np.asarray(pc.is_valid(arr)), minlength=bins).astype(np.int64)
    if kernel == "count":
        return pa.array(valid[present], pa.int64())
    if kernel in ("min", "max"):  # signed integers only (float min/max have NaN rules of their own)
        dtype = np.dtype(arr.type.to_pandas_dtype())
        info = np.iinfo(dtype)
        start = info.max if kernel == "min" else info.min
        filled = pc.fill_null(arr, pa.scalar(start, arr.type)) if arr.null_count else arr
        extreme = np.full(bins, start, dtype=dtype)
        (np.minimum if kernel == "min" else np.maximum).at(extreme, ids, filled.to_numpy())
        return pa.array(extreme[present], arr.type, mask=valid[present] == 0)
    floating = arr.type == pa.float64()
    zero = pa.scalar(0.0) if floating else pa.scalar(0, arr.type)
    filled = pc.fill_null(arr, zero) if arr.null_count else arr
    # fsum (AVG's sum) adds the values cast to float64 whatever their size, as the hash aggregation does.
    in_float = floating or kernel == "fsum"
    with _copied("weights", filled, np.float64) as weights:
        if not in_float and max(-float(weights.min()), float(weights.max())) * len(weights) >= _EXACT:
            return None  # a bound on every partial sum's magnitude, without a temporary array
        sums = np.bincount(ids, weights=weights, minlength=bins)[present]
    empty = None if kernel == "sum0" else valid[present] == 0
    if in_float:
        return pa.array(sums, pa.float64(), mask=empty)
    return pa.array(sums.astype(np.int64), pa.int64(), mask=empty)


def _apply_numbered(table: pa.Table, keys: Sequence[str], specs: list[_Spec]) -> pa.Table:
    """Grouping through dense group numbers (``group_ids``), groups in order of first appearance: a second
    path to the same states, which the tests compare the dense and hashed paths with."""
    _check_sums(table, keys, specs)
    g, groups = group_ids(table, keys)
    inputs: dict[str, pa.Array | pa.ChunkedArray] = {"__g": g}
    aggregations: list[tuple[str, str]] = []
    for j, k in enumerate(keys):
        if not pa.types.is_null(table.schema.field(k).type):  # Arrow's "first" has no null-type kernel
            inputs[f"__k{j}"] = table.column(k)
            aggregations.append((f"__k{j}", "first"))
    for i, (_, col, kernel) in enumerate(specs):
        # COUNT(*) counts the group number, which is never null.
        values = g if col is None else _column(table, col)
        inputs[f"__c{i}"] = _hash_input(values, kernel)
        aggregations.append((f"__c{i}", _HASH[kernel]))
        if _nan_on_top(kernel, values):
            inputs[f"__n{i}"] = pc.is_nan(values)
            aggregations.append((f"__n{i}", "any"))
    grouped = pa.table(inputs).group_by(["__g"], use_threads=False).aggregate(aggregations)
    grouped = grouped.sort_by("__g")
    out: dict[str, pa.Array | pa.ChunkedArray] = {}
    for j, k in enumerate(keys):
        out[k] = grouped.column(f"__k{j}_first") if f"__k{j}" in inputs else pa.nulls(groups)
    for i, (name, _, kernel) in enumerate(specs):
        column = grouped.column(f"__c{i}_{_HASH[kernel]}")
        if f"__n{i}" in inputs:
            column = _nan_tops(column, grouped.column(f"__n{i}_any"))
        out[name] = pc.fill_null(column, 0) if kernel == "sum0" else column
    return pa.table(out)
