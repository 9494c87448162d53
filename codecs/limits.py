"""Size limits applied by every decoder: what a peer's message may take once it has been received.

Over the bus's ZeroMQ sockets only the size of each frame is enforced before a message is buffered (ZeroMQ's
MAXMSGSIZE, checked per frame: ``max_frame_bytes`` on the data and reply sockets, ``max_message_bytes`` on
the ROUTER, whose requests the core answers); the frame count and the total are checked after ZeroMQ
delivers the whole message, so a peer that may connect can still make a node hold a message of many frames
(docs/PROTOCOL.md section 3).
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from dataclasses import dataclass

from sparkbus.codecs.errors import LimitExceeded

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what a decoder accepts.

    Attributes:
        max_frame_bytes: largest single frame, compressed or not. The bus's data and reply sockets also
            give it to ZeroMQ (MAXMSGSIZE), which closes the connection of a peer that sends a longer frame
            before buffering it; the ROUTER takes frames up to ``max_message_bytes`` and the core refuses
            one over this limit with an answer.
        max_message_bytes: largest sum of frame sizes in one message; checked once ZeroMQ has delivered the
            whole message (libzmq 4.3 has no option that bounds a message's frames or total).
        max_frames: most frames in one message; the node keeps no more than this many frames of a message,
            drops the rest as it reads them, and refuses it.
        max_decompressed_bytes: largest frame after decompression.
    """

    max_frame_bytes: int = 64 * MiB
    max_message_bytes: int = 256 * MiB
    max_frames: int = 64
    max_decompressed_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_message_bytes", "max_frames", "max_decompressed_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


def check_frames(frames: Sequence[Sized], limits: Limits, message_type: str = "?") -> None:
    """Refuse a message whose frame count, frame sizes or total size exceed ``limits``.

    Raises:
        LimitExceeded: naming the limit that was exceeded.
    """
    if len(frames) > limits.max_frames:
        raise too_many_frames(len(frames), limits, message_type)
    total = 0
    for i, frame in enumerate(frames):
        n = len(frame)
        if n > limits.max_frame_bytes:
            raise LimitExceeded(message_type, f"<frame {i}>", f"{n} bytes, limit is {limits.max_frame_bytes}")
        total += n
    if total > limits.max_message_bytes:
        raise LimitExceeded(
            message_type, "<frames>", f"{total} bytes in all, limit is {limits.max_message_bytes}"
        )


def too_many_frames(count: int, limits: Limits, message_type: str = "?") -> LimitExceeded:
    """The refusal of a message of ``count`` frames, over ``limits.max_frames`` (a receiver that stopped
    keeping frames past the limit still names them all)."""
    return LimitExceeded(message_type, "<frames>", f"{count} frames, limit is {limits.max_frames}")
