"""UPPER and LOWER map ASCII values with Arrow's kernel and only the other values with Python's full case
mapping (Spark's answers for those are checked in tests/sim/query/test_case_mapping.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.roles.query.expressions import _cased, apply


def test_only_values_beyond_ascii_go_through_python() -> None:
    seen: list[str] = []

    def upper(text: str) -> str:
        seen.append(text)
        return text.upper()

    column = pa.chunked_array([["ab", None, "ßs"], ["cd" * 1000, "İx"]])
    got = _cased(pc.utf8_upper, upper)(column)
    assert seen == ["ßs", "İx"]
    assert got.to_pylist() == ["AB", None, "SSS", "CD" * 1000, "İX"]
    ascii_only = pa.chunked_array([["ab", None], ["cd"]])
    assert _cased(pc.utf8_upper, upper)(ascii_only).equals(pc.utf8_upper(ascii_only))
    assert _cased(pc.utf8_upper, upper)(pa.scalar("ef")).as_py() == "EF" and seen == ["ßs", "İx"]


def test_scalars_nulls_and_large_strings() -> None:
    assert apply("upper", [pa.scalar("straße")]).as_py() == "STRASSE"
    assert apply("lower", [pa.scalar(None, pa.string())]).as_py() is None
    lowered = apply("lower", [pa.array(["ΟΔΟΣ", "A"], pa.large_string())])
    assert lowered.type == pa.large_string() and lowered.to_pylist() == ["οδος", "a"]
