"""A node's table catalog: the partitions its query role scans, shared with the roles that own the rows.

One ``TableCatalog`` is created per node and handed to every role factory of that node (the
``catalog`` of ``sparkbus.topologies.registry.RoleContext``). The query role scans it as its
``PartitionStore``. A role that owns rows of a table, such as replication, *publishes* the table: it
registers a function returning the rows this node serves, and a scan calls it. Rows therefore never
travel through the bus, or get copied, to become visible to queries on the node that holds them. Tables
loaded with the query role's own ``load`` call still live in the catalog as plain tables.

Everything runs on the node's loop thread (roles are called one event at a time), so a publisher's
function reads its role's state without locks. A publisher that reads its rows in steps across loop turns
(replication, after its store is opened or its leadership moves) raises ``SourcePending`` while they are
not read: a scan raises it on, and planning sees the table's columns (``get``). When the rows are read,
the publisher calls the query role (``Call(role=SCANNER, name=SOURCES_READY)``) so waiting scans run again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from sparkbus.roles.query.engine import PartitionStore
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError
from sparkbus.roles.query.expressions import resolve

#: The role that scans the catalog, and the local call a publisher makes on it when rows that were
#: pending (``SourcePending``) are read, or will not be: scans that waited for them run again.
SCANNER = "query"
SOURCES_READY = "sources_ready"


class SourcePending(QueryError):
    """The rows of published table ``table`` are still being read by the role that publishes them.

    The role reads them in bounded steps so that the node's loop (its peers' heartbeats) keeps running;
    a scan may wait for them and run again at ``SOURCES_READY``. A query role that does not wait fails the
    query with this error (``MEMBER_LEAVE``: a transient state, as a leadership move is).

    Attributes:
        table: the published table.
        schema: its columns, known before its rows are.
    """

    def __init__(self, table: str, why: str, schema: pa.Schema) -> None:
        super().__init__(ErrorCode.MEMBER_LEAVE, why)
        self.table = table
        self.schema = schema


#: Returns the rows of a published table this node serves now, or None when it serves none; raises
#: ``SourcePending`` while they are being read.
Publisher = Callable[[], pa.Table | None]
#: Given a query's participants, says why the nodes may not serve each partition of a published table
#: exactly once in it (a partition whose leader does not take part, or that two of them may serve while its
#: leadership moves), or None.
Coverage = Callable[[Sequence[str]], str | None]

#: Returns the parts of a published table this node serves now (a replicated table's led partitions).
Served = Callable[[], frozenset[str]]


class TableCatalog(PartitionStore):
    """Loaded tables plus tables published by other roles of the node."""

    def __init__(self) -> None:
        super().__init__()
        self.published: dict[str, Publisher] = {}
        self.coverage: dict[str, Coverage] = {}
        self.parts: dict[str, Served] = {}

    def publish(
        self, name: str, rows: Publisher, coverage: Coverage | None = None, served: Served | None = None
    ) -> None:
        """Serve table ``name`` from ``rows`` (called at every scan), checked by ``coverage`` before each
        scan of it when given (``unserved``); ``served`` names the parts of it this node serves now
        (``served``).

        Raises:
            ExecutionError: the name is already loaded or published.
        """
        if not name:
            raise ExecutionError("a table needs a non-empty name")
        if name in self.published or name in self.tables:
            raise ExecutionError(f"table {name!r} is already in this node's catalog")
        self.published[name] = rows
        if coverage is not None:
            self.coverage[name] = coverage
        if served is not None:
            self.parts[name] = served

    def load(self, name: str, table: pa.Table, *, replace: bool = False) -> int:
        if name in self.published:
            raise ExecutionError(
                f"table {name!r} is published by another role; write to it through that role"
            )
        return super().load(name, table, replace=replace)

    def names(self) -> list[str]:
        return [*self.published, *self.tables]

    def get(self, name: str) -> pa.Table | None:
        """The rows of ``name``; for a published table whose rows are still being read, none of its rows
        but its columns (what planning asks for: ``read`` is what a scan reads)."""
        try:
            return self.read(name)
        except SourcePending as pending:
            return pending.schema.empty_table()

    def read(self, name: str) -> pa.Table | None:
        """The rows a scan of ``name`` reads.

        Raises:
            SourcePending: a published table's rows are still being read.
        """
        publisher = self.published.get(name)
        if publisher is not None:
            return publisher()
        return super().get(name)

    def served(self, tables: Sequence[str]) -> tuple[frozenset[str], ...]:
        """The parts of each of ``tables`` this node serves now (empty for a loaded table). A scan that
        waited for a published table's rows (``SourcePending``) and runs again compares them with what it
        served when it first ran: the other members scanned then, and a partition whose leadership moved
        meanwhile would be counted by none of them, or twice."""
        found = (resolve(t, self.names(), "table") for t in tables)
        return tuple(part() if (part := self.parts.get(f or "")) is not None else frozenset() for f in found)

    def unserved(self, tables: Sequence[str], participants: Sequence[str]) -> str | None:
        for table in tables:
            found = resolve(table, self.names(), "table")
            check = self.coverage.get(found) if found is not None else None
            why = check(participants) if check is not None else None
            if why is not None:
                return why
        return None
