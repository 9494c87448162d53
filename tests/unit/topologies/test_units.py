from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.topologies.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512KiB", 512 * 1024),
        ("4MiB", 4 << 20),
        ("1GiB", 1 << 30),
        ("100B", 100),
        ("100", 100),
        ("1.5KiB", 1536),
        ("2KB", 2000),
        ("3 MB", 3_000_000),
        (4096, 4096),
        ("0B", 0),
    ],
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("512kib", "unknown size unit 'kib'"),
        ("-1KiB", "expected a size"),
        ("KiB", "expected a size"),
        ("1.1B", "not a whole number of bytes"),
        (-5, "cannot be negative"),
        (True, "expected a size"),
        (1.5, "expected a size"),
    ],
)
def test_bad_sizes(text: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_size(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("1s", 1.0), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), ("500us", 0.0005)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("5", "has no unit; write e.g. '5s'"),
        ("5 sec", "unknown duration unit 'sec'"),
        ("fast", "expected a duration"),
        (5, "expected a duration with a unit"),
    ],
)
def test_bad_durations(text: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(text)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=1 << 50))
def test_size_round_trip(size: int) -> None:
    assert parse_size(format_size(size)) == size


@given(st.integers(min_value=1, max_value=10**7))
def test_duration_round_trip_in_microseconds(micros: int) -> None:
    seconds = micros / 1e6
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
