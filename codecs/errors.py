"""The one error every decoder raises."""

from __future__ import annotations


class DecodeError(ValueError):
    """Bytes that do not decode to a valid message.

    Attributes:
        message_type: the message type being decoded, when known (``"?"`` before the header is read).
        field: the field, frame or part that was wrong.
        reason: what was wrong with it.
    """

    def __init__(self, message_type: str, field: str, reason: str) -> None:
        self.message_type = message_type
        self.field = field
        self.reason = reason
        super().__init__(f"{message_type}.{field}: {reason}")


class LimitExceeded(DecodeError):
    """A message over a decoder limit (frames, bytes, header size, decompressed size): refused unread."""


class EncodeError(ValueError):
    """A value that cannot be encoded (a caller's mistake, never a peer's)."""
