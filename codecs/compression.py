"""zstd compression of payload frames, with a hard bound on what a frame may inflate to."""

from __future__ import annotations

from dataclasses import dataclass, field

import zstandard

from sparkbus.codecs.errors import DecodeError, LimitExceeded
from sparkbus.codecs.limits import MiB

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, kw_only=True)
class Compression:
    """How payload frames are compressed.

    Attributes:
        level: zstd level (1 is the fast default; 3 is zstd's own default).
        min_size: frames smaller than this are sent as they are.
        max_decompressed: a compressed frame that would inflate past this is refused, never allocated (an
            ``EnvelopeCodec`` holds its frames to this or its limits' ``max_decompressed_bytes``, the smaller).
        enabled: when false, ``compress`` never compresses (``decompress`` still works).
    """

    level: int = 1
    min_size: int = 4096
    max_decompressed: int = 64 * MiB
    enabled: bool = True
    _cctx: zstandard.ZstdCompressor = field(init=False, repr=False, compare=False)
    _dctx: zstandard.ZstdDecompressor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.level <= 22:
            raise ValueError(f"Compression.level must be in 1..22, got {self.level}")
        if self.min_size < 0 or self.max_decompressed <= 0:
            raise ValueError("Compression.min_size must be >= 0 and max_decompressed > 0")
        # Contexts are reused: creating one costs more than compressing a small frame.
        object.__setattr__(self, "_cctx", zstandard.ZstdCompressor(level=self.level, write_content_size=True))
        object.__setattr__(self, "_dctx", zstandard.ZstdDecompressor())

    def compress(self, data: Buffer) -> tuple[bytes | Buffer, bool]:
        """Return ``(frame, compressed)``; small frames, and frames that would not shrink, stay raw."""
        if not self.enabled or len(data) < self.min_size:
            return data, False
        packed = self._cctx.compress(data)
        if len(packed) >= len(data):
            return data, False
        return packed, True

    def decompress(self, frame: Buffer, *, message_type: str = "?", part: str = "payload") -> bytes:
        """Inflate one frame, refusing anything that would exceed ``max_decompressed``."""
        return decompress_bounded(self._dctx, frame, self.max_decompressed, message_type, part)


def decompress_bounded(
    dctx: zstandard.ZstdDecompressor, frame: Buffer, bound: int, message_type: str, part: str
) -> bytes:
    """Decompress exactly one zstd frame whose output must not exceed ``bound`` bytes."""
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise DecodeError(message_type, part, f"not a zstd frame ({exc})") from None
    declared = params.content_size
    # Our encoder always writes the content size; a frame without one is refused rather than
    # inflated blind, so the bound is checked before a single byte is allocated.
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        raise DecodeError(message_type, part, "zstd frame does not declare its content size")
    if declared > bound:
        raise LimitExceeded(message_type, part, f"declares {declared} bytes decompressed, limit is {bound}")
    try:
        # One frame and nothing after it: bytes zstd would otherwise skip could carry anything past every
        # check, and make two different frames decode to the same message.
        out = dctx.decompress(frame, max_output_size=bound, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise DecodeError(message_type, part, f"corrupt zstd frame ({exc})") from None
    if len(out) != declared:
        raise DecodeError(message_type, part, f"decompressed to {len(out)} bytes, header said {declared}")
    return out
