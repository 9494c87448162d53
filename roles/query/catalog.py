"""A node's table catalog: the partitions its query role scans, shared with the roles that own the rows.

One ``TableCatalog`` is created per node and handed to every role factory of that node (the
``catalog`` of ``sparkbus.topologies.registry.RoleContext``). The query role scans it as its
``PartitionStore``. A role that owns rows of a table, such as replication, *publishes* the table: it
registers a function returning the rows this node serves, and a scan calls it. Rows therefore never
travel through the bus, or get copied, to become visible to queries on the node that holds them. Tables
loaded with the query role's own ``load`` call still live in the catalog as plain tables.

Everything runs on the node's loop thread (roles are called one event at a time), so a publisher's
function reads its role's state without locks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from sparkbus.roles.query.engine import PartitionStore
from sparkbus.roles.query.errors import ExecutionError
from sparkbus.roles.query.expressions import resolve

#: Returns the rows of a published table this node serves now, or None when it serves none.
Publisher = Callable[[], pa.Table | None]
#: Given a query's participants, says why the nodes may not serve each partition of a published table
#: exactly once in it (a partition whose leader does not take part, or that two of them may serve while its
#: leadership moves), or None.
Coverage = Callable[[Sequence[str]], str | None]


class TableCatalog(PartitionStore):
    """Loaded tables plus tables published by other roles of the node."""

    def __init__(self) -> None:
        super().__init__()
        self.published: dict[str, Publisher] = {}
        self.coverage: dict[str, Coverage] = {}

    def publish(self, name: str, rows: Publisher, coverage: Coverage | None = None) -> None:
        """Serve table ``name`` from ``rows`` (called at every scan), checked by ``coverage`` before each
        scan of it when given (``unserved``).

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

    def load(self, name: str, table: pa.Table, *, replace: bool = False) -> int:
        if name in self.published:
            raise ExecutionError(
                f"table {name!r} is published by another role; write to it through that role"
            )
        return super().load(name, table, replace=replace)

    def names(self) -> list[str]:
        return [*self.published, *self.tables]

    def get(self, name: str) -> pa.Table | None:
        publisher = self.published.get(name)
        if publisher is not None:
            return publisher()
        return super().get(name)

    def unserved(self, tables: Sequence[str], participants: Sequence[str]) -> str | None:
        for table in tables:
            found = resolve(table, self.names(), "table")
            check = self.coverage.get(found) if found is not None else None
            why = check(participants) if check is not None else None
            if why is not None:
                return why
        return None
