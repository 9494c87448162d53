"""Errors a thin client raises. Each carries a code: a bus ``ErrorCode`` (``(3 << 16) | n``) or, for a
failed query, the query family's code."""

from __future__ import annotations

from sparkbus.bus.messages import ErrorCode

#: ``(3 << 16) | 11``: Ignite's OPERATION_TIMEOUT, an operation a thin client waited for longer than its timeout
#: (raised by the client itself, never sent by a node)
OPERATION_TIMEOUT = (3 << 16) | 11

#: ``ErrorCode.AUTHENTICATION``: a node's security layer refused the client (CURVE key not on its allow-list, its
#: address not allowed, a wrong server key, or one side without CURVE).
AUTHENTICATION = int(ErrorCode.AUTHENTICATION)


class ClientError(Exception):
    """An operation or a connection failed; ``code`` says why (an ``ErrorCode`` or a query error code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        if self.code == OPERATION_TIMEOUT:
            return "OPERATION_TIMEOUT"
        try:
            return ErrorCode(self.code).name
        except ValueError:
            return str(self.code)

    def __str__(self) -> str:
        return f"[{self.code_name}] {self.message}"


class ClientConnectionError(ClientError):
    """The logical connection an operation ran on is gone (retryable under the retry policy)."""

    def __init__(self, message: str, code: int = ErrorCode.CONNECTION) -> None:
        super().__init__(code, message)


class ConnectionUnknownError(ClientConnectionError):
    """The server no longer knows the logical connection: its restore timeout passed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.RESOURCE_NOT_FOUND)


class ClusterMismatchError(ClientError):
    """A node belongs to another cluster than the one the client is connected to; never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CLUSTER_ID_MISMATCH, message)


class AuthenticationError(ClientError):
    """A node refused this client during the ZeroMQ security handshake (before any sparkbus message);
    the node is never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(AUTHENTICATION, message)

    @property
    def code_name(self) -> str:
        return "AUTHENTICATION"


class ConnectTimeoutError(ClientError):
    """No node connection could be established within the connect timeout; the message lists every
    address tried and why each failed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CONNECTION, message)


class OperationError(ClientError):
    """The cluster ran the operation and it failed (a role's error, e.g. a query's)."""
