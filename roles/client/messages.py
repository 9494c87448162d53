"""The thin-client family's messages (codes 0x0400..0x040f) and its operation codes.

A client session is one bus session (HELLO ``kind="client"``); on it the client sends ``Request`` and, as
the first message of a new session only, ``Restore``; the gateway answers with ``Response`` chunks,
``Restored`` or ``RestoreRefused``. Byte layout and semantics: docs/CLIENT.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sparkbus.bus.messages import ErrorCode
from sparkbus.codecs import blob, message


class Op(enum.IntEnum):
    """What a ``Request`` asks for (after Ignite's ``ClientOp``; ``PING`` is its ``HEARTBEAT``)."""

    PING = 1
    STATUS = 2
    SQL = 10
    QUERY_CANCEL = 11
    WRITE = 20
    LOAD = 21
    PEEK = 30
    SUBSCRIBE = 31
    FETCH = 32
    UNSUBSCRIBE = 33


#: Operations that change nothing on the cluster: the default retry policy (IEP-82) re-sends only these.
READ_OPS = frozenset({Op.PING, Op.STATUS, Op.SQL, Op.PEEK})


@message(0x0400)
@dataclass(frozen=True, kw_only=True)
class Request:
    """Client -> gateway: run ``op`` with ``args``.

    Attributes:
        request_id: unique per logical connection, chosen by the client (increasing).
        op: an ``Op`` value.
        args: the operation's arguments (a msgpack map).
        ack: request ids whose complete response the client received since its previous message; the
            gateway stops holding those results.
    """

    request_id: int
    op: int
    args: dict[str, Any]
    ack: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.request_id < 0:
            raise ValueError(f"request_id must be >= 0, got {self.request_id}")


@message(0x0401)
@dataclass(frozen=True, kw_only=True)
class Response:
    """Gateway -> client: one chunk of the answer to ``request_id``.

    The chunks of a response, concatenated in ``chunk`` order, are the msgpack encoding of the result.
    An error response is one chunk with ``code`` != 0, the error text and an empty payload.
    """

    request_id: int
    chunk: int
    last: bool
    code: int = 0
    error: str = ""
    payload: bytes = blob(default=b"")

    def __post_init__(self) -> None:
        if self.request_id < 0 or self.chunk < 0:
            raise ValueError("request_id and chunk must be >= 0")


@message(0x0402)
@dataclass(frozen=True, kw_only=True)
class Restore:
    """Client -> gateway, first message of a new session: rebind the logical connection ``connection_id``.

    ``waiting`` lists the request ids the client still waits for; results the gateway holds for any other
    request were delivered and are dropped.
    """

    connection_id: str
    waiting: tuple[int, ...] = ()


@message(0x0403)
@dataclass(frozen=True, kw_only=True)
class Restored:
    """Gateway -> client: the logical connection is bound to this session again.

    ``known`` lists every request id the gateway knows for it (running, or with a result held); the client
    fails (or retries) the ones it waits for that are missing: they never arrived. The held results follow.
    """

    connection_id: str
    known: tuple[int, ...] = ()


@message(0x0404)
@dataclass(frozen=True, kw_only=True)
class RestoreRefused:
    """Gateway -> client: the logical connection cannot be restored (``RESOURCE_NOT_FOUND``: connection
    unknown, its restore timeout passed; ``OUT_OF_STATE``: RESTORE was not the session's first message)."""

    code: ErrorCode
    message: str
