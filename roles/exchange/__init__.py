"""Page exchange (Presto BinX): output buffers, BinX messages, the BinX server and client roles, and the
HTTP exchange client role (whose requests the node driver makes)."""

from sparkbus.roles.exchange.backoff import BackoffPolicy, RetryState
from sparkbus.roles.exchange.buffers import (
    BufferEvent,
    BufferFullError,
    BufferState,
    OutputBuffer,
    OutputBuffers,
    PageResult,
    Waiter,
)
from sparkbus.roles.exchange.client import CLIENT_ROLE, BinxClient, Source, SourceEvent, SourceState
from sparkbus.roles.exchange.factories import make_client, make_http_client, make_server
from sparkbus.roles.exchange.http_client import HTTP_CLIENT_ROLE, HttpClient, HttpSource
from sparkbus.roles.exchange.messages import (
    BinReply,
    BinRequest,
    ErrorCode,
    ReplyStatus,
    RequestType,
    check_buffer_key,
    pack_sizes,
    page_sizes_of,
    unpack_sizes,
)
from sparkbus.roles.exchange.server import SERVER_ROLE, BinxServer, reply_for

__all__ = [
    "CLIENT_ROLE",
    "HTTP_CLIENT_ROLE",
    "SERVER_ROLE",
    "BackoffPolicy",
    "BinReply",
    "BinRequest",
    "BinxClient",
    "BinxServer",
    "BufferEvent",
    "BufferFullError",
    "BufferState",
    "ErrorCode",
    "HttpClient",
    "HttpSource",
    "OutputBuffer",
    "OutputBuffers",
    "PageResult",
    "ReplyStatus",
    "RequestType",
    "RetryState",
    "Source",
    "SourceEvent",
    "SourceState",
    "Waiter",
    "check_buffer_key",
    "make_client",
    "make_http_client",
    "make_server",
    "pack_sizes",
    "page_sizes_of",
    "reply_for",
    "unpack_sizes",
]
