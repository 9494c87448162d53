from __future__ import annotations

import os

import pytest
import zstandard

from sparkbus.codecs import Compression, DecodeError


def test_small_frames_stay_raw_and_large_ones_shrink() -> None:
    c = Compression(level=1, min_size=100)
    assert c.compress(b"a" * 99) == (b"a" * 99, False)
    packed, compressed = c.compress(b"a" * 10_000)
    assert compressed and len(packed) < 100
    assert c.decompress(packed) == b"a" * 10_000


def test_incompressible_frames_stay_raw() -> None:
    data = bytes(range(256)) * 4
    c = Compression(min_size=0)
    noise = os.urandom(4096)
    assert c.compress(noise) == (noise, False)
    assert c.compress(data)[1] in (True, False)


def test_disabled_never_compresses() -> None:
    assert Compression(enabled=False, min_size=0).compress(b"a" * 10_000) == (b"a" * 10_000, False)


def test_bound_declared_size_lie_and_garbage() -> None:
    c = Compression(max_decompressed=1000)
    big = zstandard.ZstdCompressor().compress(b"x" * 5000)
    with pytest.raises(DecodeError, match="limit is 1000"):
        c.decompress(big)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 10)
    with pytest.raises(DecodeError, match="content size"):
        c.decompress(no_size)
    with pytest.raises(DecodeError, match="zstd"):
        c.decompress(b"not zstd at all")
    truncated = zstandard.ZstdCompressor().compress(bytes(range(200)) * 4)[:-5]
    with pytest.raises(DecodeError):
        c.decompress(truncated)


def test_bytes_after_the_zstd_frame_are_refused() -> None:
    """A compressed frame is one zstd frame: trailing bytes, or a second frame, are not silently dropped."""
    c = Compression(min_size=0)
    frame, compressed = c.compress(b"payload " * 100)
    assert compressed and c.decompress(frame) == b"payload " * 100
    for extra in (b"hidden", frame, zstandard.ZstdCompressor().compress(b"")):
        with pytest.raises(DecodeError, match="corrupt zstd frame"):
            c.decompress(frame + extra)


@pytest.mark.parametrize("kwargs", [{"level": 0}, {"level": 23}, {"min_size": -1}, {"max_decompressed": 0}])
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Compression(**kwargs)
