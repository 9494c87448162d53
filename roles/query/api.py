"""The user-facing query API: ``Query`` objects and ``sql()``, returning Arrow tables.

Sans-IO like the rest of the family: the functions here work over any *target* with a
``call(role, name, args, timeout=...)`` method that returns the role's reply or raises an exception whose
text is the role's error (a ``Node``, a thin client, or a test adapter over ``SimBus``). Failures come back
as ``QueryError`` with the code, message, query id and origin the initiator reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from sparkbus.codecs import encode_batch
from sparkbus.roles.query.errors import ErrorCode, QueryError
from sparkbus.roles.query.plan import PlanNode, plan_to_plain

ROLE = "query"
#: seconds a caller waits beyond the query's own timeout, so the initiator's TIMEOUT error wins the race
CALL_MARGIN = 5.0
#: rows per Arrow batch handed to ``load``
LOAD_BATCH_ROWS = 65536


class Target(Protocol):
    """Anything that can make a local call into a node's roles (``Node``, a client, a sim adapter)."""

    def call(self, role: str, name: str, args: dict[str, Any] | None = ..., *, timeout: float = ...) -> Any:
        """The role's reply; raises with the role's error text on failure."""
        ...


_ERROR = re.compile(
    r"\A\[(?P<code>-?\d+) (?P<name>[A-Z_]+)\] (?P<message>.*?)"
    r"(?: \((?:query (?P<qid>[^\s,()]+))?(?:, )?(?:on (?P<origin>[^\s,()]+))?\))?\Z",
    re.DOTALL,
)


def error_from_reply(text: str) -> QueryError:
    """The ``QueryError`` an ``execute`` error reply describes (``[code NAME] message (query q, on m)``).

    Text that does not follow that form (a bus error, an unknown call) becomes a ``GENERIC`` error.
    """
    m = _ERROR.match(text)
    if m is None:
        return QueryError(ErrorCode.GENERIC, text)
    try:
        code = ErrorCode(int(m["code"]))
    except ValueError:
        return QueryError(ErrorCode.GENERIC, text)
    return QueryError(code, m["message"], query_id=m["qid"], origin=m["origin"])


@dataclass(frozen=True, kw_only=True, slots=True)
class Query:
    """One query to run: SQL text or a logical plan, its parameters and how to run it.

    Attributes:
        sql: the SQL text (exactly one of ``sql`` and ``plan``).
        plan: a logical plan.
        parameters: values of the ``?`` parameters, in order.
        participants: the members to run on (default: the initiator and every peer that is up).
        timeout: seconds before the initiator cancels the query with ``TIMEOUT``; 0 for the role's default.
        repartition: give a grouped aggregate a hash-partitioned middle stage.
        exchange: how fragments hand rows on: ``push`` (credit streams), ``binx`` (pulled through the
            nodes' BinX roles), ``http`` (pulled over Presto's HTTP exchange by the nodes' drivers for their
            ``http.client`` roles), or None for the initiator's default (``push`` unless configured)
            (``docs/QUERY.md``, Exchanges).
    """

    sql: str | None = None
    plan: PlanNode | None = None
    parameters: tuple[Any, ...] = ()
    participants: tuple[str, ...] | None = None
    timeout: float = 0.0
    repartition: bool = False
    exchange: str | None = None

    def __post_init__(self) -> None:
        if (self.sql is None) == (self.plan is None):
            raise ValueError("Query takes exactly one of sql and plan")
        if self.timeout < 0:
            raise ValueError(f"Query.timeout must be >= 0, got {self.timeout}")

    def args(self) -> dict[str, Any]:
        """The arguments of the ``execute`` local call."""
        out: dict[str, Any] = {}
        if self.sql is not None:
            out["sql"] = self.sql
        if self.plan is not None:
            out["plan"] = plan_to_plain(self.plan)
        if self.parameters:
            out["parameters"] = list(self.parameters)
        if self.participants is not None:
            out["participants"] = list(self.participants)
        if self.timeout > 0:
            out["timeout"] = float(self.timeout)
        if self.repartition:
            out["repartition"] = True
        if self.exchange is not None:
            out["exchange"] = self.exchange
        return out

    def run(self, target: Target, *, wait: float | None = None) -> pa.Table:
        """Run on ``target`` (the initiator) and return the result.

        Args:
            target: the initiator node (anything with ``call``).
            wait: seconds to wait for the reply; default the query's timeout plus ``CALL_MARGIN``
                (or 60 s when the query has no timeout).

        Raises:
            QueryError: the query failed; ``code`` says why. A reply that does not come within ``wait``
                is a ``TIMEOUT``.
        """
        if wait is None:
            wait = self.timeout + CALL_MARGIN if self.timeout > 0 else 60.0
        try:
            reply = target.call(ROLE, "execute", self.args(), timeout=wait)
        except QueryError:
            raise
        except TimeoutError:
            raise QueryError(ErrorCode.TIMEOUT, f"no reply from the initiator within {wait} s") from None
        except Exception as exc:
            raise error_from_reply(str(exc)) from exc
        return result_table(reply)


def result_table(reply: Any) -> pa.Table:
    """The table an ``execute`` reply (Arrow IPC stream bytes) carries."""
    if not isinstance(reply, bytes | bytearray | memoryview):
        raise QueryError(ErrorCode.GENERIC, f"execute replied with {type(reply).__name__}, not Arrow IPC")
    return pa.ipc.open_stream(pa.py_buffer(reply)).read_all()


def sql(
    target: Target,
    text: str,
    parameters: tuple[Any, ...] | list[Any] = (),
    *,
    timeout: float = 30.0,
    participants: tuple[str, ...] | list[str] | None = None,
    repartition: bool = False,
    exchange: str | None = None,
) -> pa.Table:
    """Run the SQL ``text`` on ``target`` and return the result as an Arrow table.

    ``timeout`` (seconds) is the query's timeout on the initiator; the call waits a little longer for the
    initiator's ``TIMEOUT`` error. Raises ``QueryError`` with the query's error code and message.
    """
    q = Query(
        sql=text,
        parameters=tuple(parameters),
        participants=tuple(participants) if participants is not None else None,
        timeout=timeout,
        repartition=repartition,
        exchange=exchange,
    )
    return q.run(target)


def load_batches(data: pa.Table, batch_rows: int = LOAD_BATCH_ROWS) -> list[bytes]:
    """``data`` as ``load`` sends it: one encoded record batch of at most ``batch_rows`` rows each (the role
    decodes exactly one batch from each, whatever ``data``'s chunks), a table of no rows as one empty batch
    of its columns."""
    if batch_rows <= 0:
        raise ValueError("batch_rows must be positive")
    batches = [bytes(encode_batch(b)) for b in data.to_batches(max_chunksize=batch_rows)]
    return batches or [bytes(encode_batch(pa.RecordBatch.from_pylist([], schema=data.schema)))]


def load(
    target: Target,
    table: str,
    data: pa.Table,
    *,
    replace: bool = False,
    batch_rows: int = LOAD_BATCH_ROWS,
    timeout: float = 60.0,
) -> int:
    """Load ``data`` as this node's partition of ``table``; returns the partition's row count."""
    args = {"table": table, "batches": load_batches(data, batch_rows), "replace": replace}
    try:
        rows = target.call(ROLE, "load", args, timeout=timeout)
    except QueryError:
        raise
    except Exception as exc:
        raise error_from_reply(str(exc)) from exc
    return int(rows)
