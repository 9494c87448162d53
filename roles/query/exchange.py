"""How a query's fragments hand rows to the next stage: the exchange kinds and the BinX exchange source.

A query runs with one exchange, chosen by the ``execute`` argument ``exchange`` (default: the role's
``QueryConfig.exchange``, itself ``push`` by default):

* ``push``: the credit streams of ``docs/QUERY.md`` (``role.py``): the sender pushes Arrow IPC batches as
  the receiver's credit allows.
* ``binx``: pull, after Presto's exchange. A sender *publishes* its output for each receiver as pages
  (the same Arrow IPC batches) into an output buffer of the ``binx.server`` role on its own node, with the
  bus's role-to-role ``Call`` (``publish``); the receiver pulls them through its node's ``binx.client``
  role (``Call`` ``fetch``, again until complete). Both roles must run on every participant. Output to
  oneself never crosses the bus: it is folded at once, under every exchange but push.
* ``http``: pull as ``binx`` (the sender publishes into its ``binx.server`` the same way), but the
  receiver pulls through its node's ``http.client`` role, whose requests the node driver makes over
  Presto's HTTP exchange to the sender node's HTTP server, which serves the ``binx.server`` role's
  buffers (docs/EXCHANGE.md section 5). Every participant must run ``binx.server`` and ``http.client``.
  A cluster whose bus uses CURVE serves no HTTP exchange (it is plain HTTP), so there ``http`` is refused
  when the query is asked for (``QueryConfig.curve``).

The initiator tells participants which exchange a query uses with ``ExchangeChosen``, sent just before
``start`` on the same ordered link (``start`` itself keeps its form; a query without it is ``push``).

Names: a buffer's task id is ``{query id}.{edge}``, its buffer id the receiver's index among the members
of the receiving fragment, so one node's buffers of one query never collide.

Everything here is sans-IO: functions that build ``Call`` actions and an ``ExchangeChosen`` message; the
query role keeps the per-query state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.codecs import encode_batch, message
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError
from sparkbus.roles.query.messages import QueryId

PUSH, BINX, HTTP = "push", "binx", "http"
EXCHANGES = (PUSH, BINX, HTTP)
#: the exchanges whose receivers pull published pages (rather than receive pushed streams)
PULLED = (BINX, HTTP)
BINX_SERVER = "binx.server"
BINX_CLIENT = "binx.client"
HTTP_CLIENT = c.HTTP_CLIENT
#: the node role a receiver pulls through, by exchange
CLIENT_OF = {BINX: BINX_CLIENT, HTTP: HTTP_CLIENT}
#: the tag of clean-up calls, whose answers nobody waits for
CLEANUP_TAG = "exchange/cleanup"
#: buffers remembered per consumer after their query completed here, to abort if the consumer is lost
MAX_HANDED = 4096


#: why a cluster whose bus uses CURVE runs no query with the ``http`` exchange
HTTP_UNDER_CURVE = (
    "exchange 'http' is refused: this cluster's bus uses CURVE, and its nodes serve no HTTP exchange "
    "(Presto's HTTP exchange is plain HTTP, neither encrypted nor authenticated); use 'binx' or 'push', "
    "which move the rows over the encrypted bus"
)


def exchange_kind(value: Any, *, curve: bool = False) -> str:
    """The exchange ``value`` names, checked; ``curve``: the cluster's bus uses CURVE.

    Raises:
        QueryError: ``PARSING`` for an unknown name, or for ``http`` under CURVE.
    """
    if value not in EXCHANGES:
        raise QueryError(ErrorCode.PARSING, f"exchange must be one of {', '.join(EXCHANGES)}, got {value!r}")
    if curve and value == HTTP:
        raise QueryError(ErrorCode.PARSING, HTTP_UNDER_CURVE)
    return str(value)


@message(0x0104)
@dataclass(frozen=True, kw_only=True, slots=True)
class ExchangeChosen:
    """The initiator runs ``query_id`` with ``exchange`` (not ``push``); sent right before ``start``."""

    query_id: QueryId
    exchange: str

    def __post_init__(self) -> None:
        if self.exchange not in PULLED:
            raise ValueError(f"exchange: expected 'binx' or 'http', got {self.exchange!r}")


def task_id(query_id: QueryId, edge: int) -> str:
    """The BinX task id of a query's edge on its sending node."""
    return f"{query_id}.{edge}"


def next_batch(table: pa.Table, offset: int, target: int) -> tuple[bytes, int]:
    """The next batch of ``table`` from row ``offset``: Arrow IPC bytes of at most ``target`` bytes (unless
    one row is larger), and how many rows it holds."""
    total = table.num_rows
    width = max(1, table.nbytes // max(total, 1))
    rows = min(total - offset, max(1, target // width))
    data = _encode(table, offset, rows)
    while len(data) > target and rows > 1:
        rows //= 2
        data = _encode(table, offset, rows)
    return data, rows


def _encode(table: pa.Table, offset: int, rows: int) -> bytes:
    part = table.slice(offset, rows).combine_chunks()
    batches = part.to_batches()
    batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    return bytes(encode_batch(batch))


def concat_rows(tables: Sequence[pa.Table]) -> pa.Table:
    """The rows of ``tables`` (members' outputs, or states merged so far) in order, in one schema.

    Members type a column by the rows they hold: one whose partition holds only NULLs there (a table
    loaded with None values) has Arrow's null type, and so do the states and results it derives from that
    column (a MIN, a SUM, a group key), where another member has BIGINT. Such a column takes the other
    members' type; numeric types widen as Spark SQL widens them (INT and BIGINT to BIGINT, an integer and
    a DOUBLE to DOUBLE: Arrow's permissive promotion), so ``x + 1``, INT where ``x`` is NULL-typed, meets
    the BIGINT of a member that has ``x``.

    Raises:
        ExecutionError: the tables' columns differ, or a column's types have no common type (STRING and
            BIGINT), naming the column and its types.
    """
    schemas = [t.schema for t in tables]
    if all(s.equals(schemas[0]) for s in schemas[1:]):
        return pa.concat_tables(tables)
    names = schemas[0].names
    for s in schemas[1:]:
        if s.names != names:
            raise ExecutionError(f"members sent rows with different columns: {names} and {s.names}")
    fields = []
    for i, name in enumerate(names):
        kinds = [s.field(i) for s in schemas]
        try:
            fields.append(
                pa.unify_schemas([pa.schema([f]) for f in kinds], promote_options="permissive").field(0)
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            shown = ", ".join(dict.fromkeys(str(f.type) for f in kinds))
            raise ExecutionError(
                f"members sent column {name} with types that have no common type: {shown}"
            ) from None
    schema = pa.schema(fields)
    try:
        return pa.concat_tables([t if t.schema.equals(schema) else t.cast(schema) for t in tables])
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ExecutionError(f"members sent rows that do not fit one schema {schema}: {exc}") from None


def pages(table: pa.Table | None, target: int) -> list[bytes]:
    """A sender's whole output as pages of at most ``target`` bytes; none for "no data here" (``None``).

    A table without rows is one page (it carries the schema), as a zero-row batch does on a stream.
    """
    if table is None:
        return []
    out: list[bytes] = []
    offset = 0
    while True:
        data, rows = next_batch(table, offset, target)
        out.append(data)
        offset += rows
        if offset >= table.num_rows:
            return out


@dataclass(frozen=True, slots=True)
class Fetch:
    """One source a query pulls (``binx`` or ``http``): what the receiver needs to fold its pages, and the
    node role it pulls through (``binx.client`` or ``http.client``)."""

    query_id: QueryId
    edge: int
    peer: str
    buffer_id: int
    client: str = BINX_CLIENT

    def args(self) -> dict[str, Any]:
        return {"peer": self.peer, "task_id": task_id(self.query_id, self.edge), "buffer_id": self.buffer_id}


@dataclass(frozen=True, slots=True)
class Publish:
    """One output buffer a query published on this node."""

    query_id: QueryId
    edge: int
    buffer_id: int

    def args(self) -> dict[str, Any]:
        return {"task_id": task_id(self.query_id, self.edge), "buffer_id": self.buffer_id}


def fetch_call(tag: str, fetch: Fetch) -> c.Call:
    """Ask the node's BinX (or HTTP) client for the pages that arrived since the last call (parks until some
    do)."""
    return c.Call(role=fetch.client, name="fetch", args=fetch.args(), tag=tag)


def publish_call(tag: str, publish: Publish, data: list[bytes]) -> c.Call:
    """Put a sender's whole output for one receiver into the node's BinX server, finished."""
    return c.Call(
        role=BINX_SERVER, name="publish", args={**publish.args(), "pages": data, "last": True}, tag=tag
    )


def create_call(publish: Publish) -> c.Call:
    """Create an empty buffer, which consumers can long-poll before the sender's output is ready."""
    return c.Call(role=BINX_SERVER, name="create", args=publish.args(), tag=CLEANUP_TAG)


def abandon_call(fetch: Fetch) -> c.Call:
    """Stop pulling a source at once (the query ended without it)."""
    return c.Call(role=fetch.client, name="abandon", args=fetch.args(), tag=CLEANUP_TAG)


def abort_call(publish: Publish, reason: str) -> c.Call:
    """Free a published buffer whose consumer will not come (its readers get ABORTED)."""
    return c.Call(role=BINX_SERVER, name="abort", args={**publish.args(), "reason": reason}, tag=CLEANUP_TAG)
