"""The one error every decoder raises."""

from __future__ import annotations

#: Characters of each part of a ``DecodeError`` (type, field, reason) kept from a peer's message: its text
#: goes back to the peer in a refusal, and a field name or value quoted whole could be as large as a frame.
MAX_TEXT = 200

#: Room for ``clip``'s "... (N chars)": a text clipped once is never clipped again.
_SUFFIX_ROOM = 32


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, or its first ``limit`` characters and ``"... (N chars)"`` when it is longer (N: its length).
    A text clipped once comes back as it is."""
    if len(text) <= limit + _SUFFIX_ROOM:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


class DecodeError(ValueError):
    """Bytes that do not decode to a valid message.

    Attributes:
        message_type: the message type being decoded, when known (``"?"`` before the header is read).
        field: the field, frame or part that was wrong.
        reason: what was wrong with it.

    Each is kept to ``MAX_TEXT`` characters (``clip``): they may quote the peer's own bytes, and the text
    is sent back to it.
    """

    def __init__(self, message_type: str, field: str, reason: str) -> None:
        self.message_type = message_type = clip(message_type)
        self.field = field = clip(field)
        self.reason = reason = clip(reason)
        super().__init__(f"{message_type}.{field}: {reason}")


class LimitExceeded(DecodeError):
    """A message over a decoder limit (frames, bytes, header size, decompressed size): refused unread."""


class EncodeError(ValueError):
    """A value that cannot be encoded (a caller's mistake, never a peer's)."""
