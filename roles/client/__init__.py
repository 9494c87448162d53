"""Thin client (IEP-90): address list, cluster identity, retries, logical connection restore.

The node side is the ``client.gateway`` role (``Gateway``); the client side is ``ClientCore``, sans-IO,
driven over ZeroMQ by ``sparkbus.topologies.client`` and by the simulator in the tests.
"""

from sparkbus.roles.client.core import ClientConfig, ClientCore, Close, Done, Link, Open, Send
from sparkbus.roles.client.errors import (
    AUTHENTICATION,
    AuthenticationError,
    ClientConnectionError,
    ClientError,
    ClusterMismatchError,
    ConnectionUnknownError,
    ConnectTimeoutError,
    OperationError,
)
from sparkbus.roles.client.gateway import Gateway, encode_response, is_client, make_gateway
from sparkbus.roles.client.messages import (
    READ_OPS,
    Op,
    Request,
    Response,
    Restore,
    Restored,
    RestoreRefused,
)
from sparkbus.roles.client.policy import (
    RETRY_NONE,
    Keepalive,
    RetryLimitPolicy,
    RetryPolicy,
    RetryReadPolicy,
    keepalive_interval,
    literal_resolver,
    node_order,
    parse_address,
    resolve_order,
)

__all__ = [
    "AUTHENTICATION",
    "READ_OPS",
    "RETRY_NONE",
    "AuthenticationError",
    "ClientConfig",
    "ClientConnectionError",
    "ClientCore",
    "ClientError",
    "Close",
    "ClusterMismatchError",
    "ConnectTimeoutError",
    "ConnectionUnknownError",
    "Done",
    "Gateway",
    "Keepalive",
    "Link",
    "Op",
    "Open",
    "OperationError",
    "Request",
    "Response",
    "Restore",
    "RestoreRefused",
    "Restored",
    "RetryLimitPolicy",
    "RetryPolicy",
    "RetryReadPolicy",
    "Send",
    "encode_response",
    "is_client",
    "keepalive_interval",
    "literal_resolver",
    "make_gateway",
    "node_order",
    "parse_address",
    "resolve_order",
]
