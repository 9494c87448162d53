"""Sizes ("512KiB") and durations ("250ms") as written in topology files."""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")

#: Binary units are what memory and credit are counted in; decimal ones are accepted because users
#: copy numbers from data sheets. Units are case-sensitive: "mb" could mean megabits.
SIZE_UNITS: dict[str, int] = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}

DURATION_UNITS: dict[str, float] = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"512KiB"``, ``"4MiB"``, ``"1.5GB"`` or a plain integer of bytes.

    Raises:
        ValueError: the text is not a non-negative size with a known unit, or is not a whole number of
            bytes.
    """
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"expected a size such as '512KiB' or an integer of bytes, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative, got {text}")
        return text
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"expected a size such as '512KiB', got {text!r}")
    unit = match["unit"] or "B"
    if unit not in SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; use one of {', '.join(SIZE_UNITS)}")
    value = float(match["num"]) * SIZE_UNITS[unit]
    if value != math.floor(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``"250ms"``, ``"1.5s"``, ``"2m"``.

    A bare number is refused: whether ``5`` means seconds or milliseconds is exactly the kind of guess a
    configuration file should not make.

    Raises:
        ValueError: the text is not a non-negative duration with a known unit.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a duration with a unit such as '250ms' or '5s', got {text!r}")
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"expected a duration such as '250ms' or '5s', got {text!r}")
    unit = match["unit"]
    if not unit:
        raise ValueError(f"{text!r} has no unit; write e.g. '{text.strip()}s' or '{text.strip()}ms'")
    if unit not in DURATION_UNITS:
        raise ValueError(
            f"unknown duration unit {unit!r} in {text!r}; use one of {', '.join(DURATION_UNITS)}"
        )
    return float(match["num"]) * DURATION_UNITS[unit]


def format_size(size: int) -> str:
    """The shortest exact binary spelling of ``size`` ("512KiB", "3B")."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        factor = SIZE_UNITS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


def format_duration(seconds: float) -> str:
    """A short spelling of ``seconds`` ("250ms", "5s", "2m")."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1:
        return f"{seconds:.12g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.12g}ms"
    return f"{seconds * 1e6:.12g}us"
