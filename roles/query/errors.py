"""Error codes and exceptions of the query family.

Error codes are Hazelcast's mid-2020 ``SqlErrorCode`` set (protocol-facts 1.3), which has an explicit
``MEMBER_LEAVE``; ``GENERIC`` (-1) is the code Hazelcast's check loop uses for a query that is no longer
active on its initiator.
"""

from __future__ import annotations

import enum

from sparkbus.bus.contract import LocalProtocolError


class ErrorCode(enum.IntEnum):
    """Why a query failed; carried by ``QueryCancelled`` and in the error of an ``execute`` reply."""

    GENERIC = -1
    MEMBER_CONNECTION = 1001
    MEMBER_LEAVE = 1002
    CANCELLED_BY_USER = 1003
    TIMEOUT = 1004
    PARSING = 1005
    CLIENT_LEAVE = 1006
    DATA_EXCEPTION = 2000


class QueryError(Exception):
    """A query failed (or cannot run) with an error code.

    Attributes:
        code: the error code.
        message: what went wrong, for the user.
        query_id: the query, when one was assigned.
        origin: the member where the error happened, when known.
    """

    def __init__(
        self, code: ErrorCode, message: str, *, query_id: str | None = None, origin: str | None = None
    ):
        self.code = code
        self.message = message
        self.query_id = query_id
        self.origin = origin
        super().__init__(self.describe())

    def describe(self) -> str:
        """``[code NAME] message (query id, origin)``: the text of an ``execute`` error reply."""
        where = ", ".join(
            p
            for p in (
                f"query {self.query_id}" if self.query_id else "",
                f"on {self.origin}" if self.origin else "",
            )
            if p
        )
        return f"[{int(self.code)} {self.code.name}] {self.message}" + (f" ({where})" if where else "")


class PlanError(QueryError, LocalProtocolError):
    """A plan (or an encoded plan) is malformed; ``path`` names the offending node or field."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(ErrorCode.PARSING, f"bad plan at {path}: {reason}")


class SqlError(QueryError, LocalProtocolError):
    """SQL text that cannot be parsed or is outside the supported subset.

    Attributes:
        sql: the query text.
        start: offset of the offending part in ``sql`` (None when unknown).
        end: offset just past the offending part.
    """

    def __init__(self, reason: str, sql: str, start: int | None = None, end: int | None = None) -> None:
        self.reason = reason
        self.sql = sql
        self.start = start
        self.end = end
        super().__init__(ErrorCode.PARSING, reason + _pointer(sql, start, end))


def _pointer(sql: str, start: int | None, end: int | None) -> str:
    """The line of ``sql`` holding ``start`` with carets under the offending characters."""
    if start is None or not 0 <= start <= len(sql):
        return ""
    end = max(start + 1, end if end is not None else start + 1)
    line_start = sql.rfind("\n", 0, start) + 1
    line_end = sql.find("\n", start)
    line_end = len(sql) if line_end < 0 else line_end
    line_no = sql.count("\n", 0, start) + 1
    col = start - line_start
    width = max(1, min(end, line_end) - start)
    return f" at line {line_no}, column {col + 1}:\n  {sql[line_start:line_end]}\n  {' ' * col}{'^' * width}"


class ExecutionError(QueryError):
    """An operator failed on data (a type error, division by zero, a missing column)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.DATA_EXCEPTION, message)
