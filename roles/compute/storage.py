"""A replica's tables, sparkbus's stand-in for persist: checking an ``AppendUpdates`` and planning what it changes.

Nothing here changes a table: ``ComputeReplica._append`` applies the plan once every check has passed, so a
refused append leaves its table as it was (docs/COMPUTE.md, "Storage", "A compacted replay", "A table of
another history").
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.bus.contract import RemoteProtocolError
from sparkbus.codecs import DecodeError
from sparkbus.roles.compute.arrangement import (
    DIFF,
    TIME,
    Arrangement,
    advance_times,
    canonical_nans,
    conform,
    consolidate,
    data_schema,
    decode_table,
    decoded,
    i64,
    ungroupable,
    update_schema,
)
from sparkbus.roles.compute.messages import AppendUpdates


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What an append changes (``plan_append``): the table replaced by another history, its data columns,
    the updates to add (None: nothing new) and the since to compact to first."""

    replace: bool
    schema: pa.Schema
    fresh: pa.Table | None = None
    compact_to: int | None = None


def append_where(msg: AppendUpdates, controller: str | None) -> str:
    """How errors about ``msg`` name it."""
    return f"AppendUpdates for table {msg.id!r} [{msg.lower}, {msg.upper}) from {controller}"


def checked_updates(msg: AppendUpdates, where: str) -> pa.Table:
    """The updates of ``msg``, checked: a ``RemoteProtocolError`` for any the table cannot take."""
    try:
        updates = decode_table(msg.updates)
    except DecodeError as exc:
        raise RemoteProtocolError(f"{where}: {exc}") from None
    names = updates.schema.names
    # Checked before anything changes: a duplicate name would make the column lookups below raise
    # KeyError, a null time or diff would fail (or silently count) deep inside the arrangements.
    if (
        names[-2:] != [TIME, DIFF]
        or len(set(names)) != len(names)
        or any(updates.schema.field(n).type != pa.int64() or updates[n].null_count for n in (TIME, DIFF))
    ):
        raise RemoteProtocolError(
            f"{where}: the columns must have distinct names, the last ones __time and __diff "
            "(int64, no nulls)"
        )
    if updates.num_rows and (
        pc.min(updates[TIME]).as_py() < max(msg.lower, msg.since)
        or pc.max(updates[TIME]).as_py() >= msg.upper
    ):
        raise RemoteProtocolError(
            f"{where}: an update's time is outside [lower, upper) or below the since {msg.since}"
        )
    # A controller sends plain columns with NaNs made one already; a dictionary column or a NaN of other
    # bits would make other group keys here.
    return canonical_nans(decoded(updates))


def plan_append(
    table: Arrangement | None, msg: AppendUpdates, where: str, *, compared: bool, read: bool
) -> AppendPlan:
    """What appending ``msg`` to ``table`` (None: the replica has none of that name) changes, or a
    ``RemoteProtocolError`` if the table cannot take it. ``compared``: a snapshot reconciliation found to
    be the replica's history; ``read``: dataflows read the table. Changes nothing."""
    updates = checked_updates(msg, where)
    replace = False
    if table is not None and msg.lower == 0 and not compared and not same_history(table, msg, updates):
        # The table anew as another history (a restarted controller's): loaded again, which only a
        # table no dataflow reads can be (``ComputeReplica._initialize`` sees to that).
        if read:
            raise RemoteProtocolError(
                f"{where}: the table starts again as another history, and dataflows read it"
            )
        replace, table = True, None
    if table is None:
        if msg.lower != 0:
            raise RemoteProtocolError(f"{where}: a table's first append must start at time 0")
        schema, current = data_schema(updates.schema), 0
        why = ungroupable(schema)
        if why is not None:  # an empty snapshot would pass, and the first rows fail
            raise RemoteProtocolError(f"{where}: the table's rows cannot be consolidated ({why})")
    elif not data_schema(updates.schema).equals(table.schema):
        raise RemoteProtocolError(f"{where}: schema {updates.schema} differs from the table's {table.schema}")
    else:
        schema, current = table.schema, table.upper[0]
    if msg.lower > current:
        raise RemoteProtocolError(f"{where}: the table's upper is {current}, so updates are missing")
    if msg.upper <= current:
        return AppendPlan(replace, schema)
    fresh = updates.cast(update_schema(schema))
    compact_to = None
    if msg.lower < current and msg.since < current:
        # A replay (after a reconnect) overlaps what this replica already has, and its times below
        # ``current`` are still below it after compaction: keep only the new times.
        fresh = fresh.filter(pc.greater_equal(fresh[TIME], i64(current)))
    elif msg.lower < current:
        # The replay was compacted to a since at or beyond our upper, so our updates are in it,
        # advanced to the since, and cannot be told apart: take the difference between the replay
        # and what we hold, at the since. Reads at times >= since (all the controller allows) see
        # the table's true contents; the dataflows reading it get the difference as updates.
        assert table is not None
        fresh = pa.concat_tables([fresh, negated(advance_times(table.updates, msg.since))])
        compact_to = msg.since
    try:
        fresh = consolidate(fresh)
    except pa.ArrowException as exc:
        raise RemoteProtocolError(f"{where}: the updates cannot be consolidated ({exc})") from None
    return AppendPlan(replace, schema, fresh, compact_to)


def negated(updates: pa.Table) -> pa.Table:
    return updates.set_column(updates.schema.get_field_index(DIFF), DIFF, pc.negate(updates[DIFF]))


def same_history(table: Arrangement, msg: AppendUpdates, updates: pa.Table) -> bool:
    """Whether snapshot ``msg`` (lower 0, its checked ``updates``) continues the history ``table`` holds.

    A reconnecting controller's snapshot does. A restarted controller's table, built anew, is another
    history, which may look like ours by its since and upper: it starts below our since, ends below our
    upper, has other columns, or holds other rows at the times both know exactly (``[its since, our
    upper)``, its earlier updates and ours advanced to its since). A snapshot compacted to our upper or
    beyond shares no such time; ``plan_append`` merges it by difference, which is right for any history.
    """
    current = table.upper[0]
    if msg.since < table.since[0] or msg.upper < current:
        return False
    if not data_schema(updates.schema).equals(table.schema):
        return False
    if msg.since >= current:
        return True
    # Their updates are at or beyond their since already (``checked_updates``); the difference of the two
    # consolidates to nothing exactly when they agree (NaN groups with NaN, as keys do).
    theirs = updates.filter(pc.less(updates[TIME], i64(current)))
    ours = negated(advance_times(table.updates, msg.since))
    rows: int = consolidate(pa.concat_tables([conform(theirs, ours.schema), ours])).num_rows
    return rows == 0
