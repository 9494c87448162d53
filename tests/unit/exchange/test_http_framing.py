"""Pure parts of the HTTP exchange: page framing and Presto's size and duration strings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.bus.http_wire import frame_pages, parse_data_size, parse_duration, unframe_pages


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_frame_round_trip(pages: list[bytes]) -> None:
    assert unframe_pages(frame_pages(pages)) == pages


def test_frame_layout_is_u32_little_endian_length_then_bytes() -> None:
    assert frame_pages([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


@pytest.mark.parametrize("body", [b"\x01\x00", b"\x05\x00\x00\x00abc", b"\x00\x00\x00\x00\x01"])
def test_truncated_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="truncated"):
        unframe_pages(body)


@pytest.mark.parametrize(
    ("text", "size"), [("1048576B", 1 << 20), ("32MB", 32 << 20), ("1.5kB", 1536), (" 0B ", 0)]
)
def test_data_sizes(text: str, size: int) -> None:
    assert parse_data_size(text) == size


@pytest.mark.parametrize(("text", "secs"), [("2s", 2.0), ("500ms", 0.5), ("1.5m", 90.0), ("100us", 1e-4)])
def test_durations(text: str, secs: float) -> None:
    assert parse_duration(text) == pytest.approx(secs)


@pytest.mark.parametrize("text", ["", "12", "1 XB", "-1B", "abc"])
def test_bad_sizes_and_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        parse_data_size(text)
    with pytest.raises(ValueError, match="not a"):
        parse_duration(text)


def test_a_size_too_large_for_a_number_is_not_a_size() -> None:
    """Before, 400 nines made infinity and int() raised OverflowError, which killed the request's thread."""
    with pytest.raises(ValueError, match="too large"):
        parse_data_size("9" * 400 + "B")
