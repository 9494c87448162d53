"""The thin-client family's messages (codes 0x0400..0x040f) and its operation codes.

A client session is one bus session (HELLO ``kind="client"``); on it the client sends ``Request``, ``Ack``
and, as the first message of a new session only, ``Restore``; the gateway answers with ``Response`` chunks,
``Restored`` or ``RestoreRefused``. A response is a sequence of chunks the gateway sends at most ``window``
ahead of what the client acknowledged consuming. Byte layout and semantics: docs/CLIENT.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
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
    FLUSH = 22
    PEEK = 30
    SUBSCRIBE = 31
    FETCH = 32
    UNSUBSCRIBE = 33
    CREATE_TABLE = 34
    TABLE_WRITE = 35
    CREATE_VIEW = 36
    DROP_VIEW = 37


#: Operations that change nothing on the cluster: the default retry policy (IEP-82) re-sends only these.
READ_OPS = frozenset({Op.PING, Op.STATUS, Op.SQL, Op.PEEK})
#: Operations whose result is an Arrow IPC stream: their chunks are Arrow IPC streams of their own.
ARROW_OPS = frozenset({Op.SQL, Op.PEEK})

#: Response chunks a client accepts beyond those it acknowledged consuming (``Request.window``): bounds
#: what one result holds in flight and queued on the client to ``window`` chunks of about ``chunk_bytes``.
DEFAULT_WINDOW = 8
#: The most a gateway grants, whatever a request asks.
MAX_WINDOW = 64


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
        window: response chunks the gateway may send beyond those the client acknowledged consuming.
    """

    request_id: int
    op: int
    args: dict[str, Any]
    ack: tuple[int, ...] = ()
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if self.request_id < 0:
            raise ValueError(f"request_id must be >= 0, got {self.request_id}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@message(0x0401)
@dataclass(frozen=True, kw_only=True)
class Response:
    """Gateway -> client: one chunk of the answer to ``request_id``.

    Without ``arrow``, the chunks of a response concatenated in ``chunk`` order are the msgpack encoding of
    the result. With ``arrow``, each chunk is a whole Arrow IPC stream (the result's schema and some of its
    rows; the first chunk at least the schema), so a client can hand its batches out as it arrives.
    An error response is one chunk with ``code`` != 0, the error text and an empty payload.
    """

    request_id: int
    chunk: int
    last: bool
    code: int = 0
    error: str = ""
    arrow: bool = False
    payload: bytes = blob(default=b"")

    def __post_init__(self) -> None:
        if self.request_id < 0 or self.chunk < 0:
            raise ValueError("request_id and chunk must be >= 0")


@message(0x0402)
@dataclass(frozen=True, kw_only=True)
class Restore:
    """Client -> gateway, first message of a new session: rebind the logical connection ``connection_id``.

    ``waiting`` lists the request ids the client still waits for; results the gateway holds for any other
    request were delivered and are dropped. For a response cut by the break, ``consumed`` and ``received``
    say how many chunks the client consumed and has: the gateway frees the first and resumes after the
    second (the client drops any chunk it already has).
    """

    connection_id: str
    waiting: tuple[int, ...] = ()
    consumed: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)


@message(0x0405)
@dataclass(frozen=True, kw_only=True)
class Ack:
    """Client -> gateway: flow control and release of held results.

    Attributes:
        consumed: request id -> chunks the client has consumed (0 .. n-1): the gateway frees them and may
            send up to ``n + window``.
        release: request ids whose results the client no longer needs (received whole, or abandoned).
    """

    consumed: dict[int, int] = field(default_factory=dict)
    release: tuple[int, ...] = ()


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
