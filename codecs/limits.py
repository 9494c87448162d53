"""Size limits applied by every decoder, so that no peer can make a node allocate without bound."""

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
        max_frame_bytes: largest single frame, compressed or not.
        max_message_bytes: largest sum of frame sizes in one message.
        max_frames: most frames in one message.
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
        raise LimitExceeded(message_type, "<frames>", f"{len(frames)} frames, limit is {limits.max_frames}")
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
