"""A DecodeError's text is sent back to the peer whose message it refuses: each part of it is bounded, and
the schema quotes a peer's field names, map keys and values by a bounded repr, never whole."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from sparkbus.codecs import DecodeError, LimitExceeded
from sparkbus.codecs.errors import MAX_TEXT, clip
from sparkbus.codecs.schema import QUOTED, from_plain, quote

BIG = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Tagged:
    kind: str
    table: dict[bytes, int]

    def __post_init__(self) -> None:
        if not self.kind.isalpha():
            raise ValueError(f"kind must be letters, got {self.kind!r}")


def _bounded(exc: DecodeError) -> None:
    for part in (exc.message_type, exc.field, exc.reason):
        assert len(part) <= MAX_TEXT + 32, len(part)
    assert len(str(exc)) <= 3 * (MAX_TEXT + 32) + 2


def test_clip_keeps_a_short_text_and_cuts_a_long_one_naming_its_length_once() -> None:
    assert clip("x" * MAX_TEXT) == "x" * MAX_TEXT
    cut = clip("y" * BIG)
    assert cut == "y" * MAX_TEXT + f"... ({BIG} chars)"
    assert clip(cut) == cut


def test_each_part_of_a_decode_error_is_clipped() -> None:
    exc = LimitExceeded("T" * BIG, "f" * BIG, "r" * BIG)
    _bounded(exc)
    assert exc.field == "f" * MAX_TEXT + f"... ({BIG} chars)"
    assert str(exc).startswith("T" * MAX_TEXT + f"... ({BIG} chars).")
    assert DecodeError("Hello", "kind", "unexpected field").reason == "unexpected field"


def test_quote_is_repr_for_a_short_value_and_bounded_for_a_long_one() -> None:
    assert quote("abc") == "'abc'" and quote(b"\x00") == "b'\\x00'" and quote(7) == "7"
    assert quote(b"a" * BIG) == repr(b"a" * QUOTED)[:QUOTED] + f"... ({BIG} bytes)"
    assert quote("\x01" * BIG) == repr("\x01" * QUOTED)[:QUOTED] + f"... ({BIG} chars)"
    assert quote("\U000e0001" * QUOTED) == repr("\U000e0001" * QUOTED)[:QUOTED] + f"... ({QUOTED} chars)"
    assert len(quote(tuple(range(BIG)))) <= 2 * QUOTED


@pytest.mark.parametrize(
    ("plain", "field"),
    [
        ({"kind": "a", "table": {}, b"\x00" * BIG: 1}, "<bytes>"),  # an unexpected field, not a str
        ({"kind": "a", "table": {}, "k" * BIG: 1}, "<str>"),  # an unexpected field, a str
        ({"kind": "a", "table": {b"\x00" * BIG: "x"}}, "table"),  # a map key quoted in the field's name
        ({"kind": "\x01" * BIG, "table": {}}, "kind"),  # the constructor's message quotes the value
    ],
)
def test_a_refusal_quoting_a_huge_name_or_value_stays_small(plain: dict[object, object], field: str) -> None:
    with pytest.raises(DecodeError) as refused:
        from_plain(Tagged, plain, "Tagged")
    _bounded(refused.value)
    assert re.search(r"\.\.\. \(\d+ (chars|bytes)\)", str(refused.value)), str(refused.value)
    if not field.startswith("<"):
        assert refused.value.field.startswith(field)
