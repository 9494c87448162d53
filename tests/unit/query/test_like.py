"""LIKE and NOT LIKE select complementary rows, NULL in neither, as in Spark SQL; a backslash makes the _, %
or backslash after it literal, and a pattern with a backslash before anything else or at its end is refused,
as Spark refuses it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.roles.query import ErrorCode, QueryError
from sparkbus.roles.query.errors import SqlError
from sparkbus.roles.query.expressions import apply
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql

from .helpers import distributed, run_fragments, split, stores

K = ["apple", "banana", None, "avocado", "cherry", "a"]
TABLE = pa.table({"k": pa.array(K), "x": pa.array(range(len(K)), pa.int64())})


def xs(where: str) -> list[int]:
    got = distributed(parse_sql(f"SELECT x FROM t WHERE {where} ORDER BY x"), split(TABLE, [3]))
    assert got is not None
    return got.column("x").to_pylist()


@pytest.mark.parametrize(
    ("pattern", "like"), [("a%", [0, 3, 5]), ("%an%", [1]), ("_", [5]), ("cherry", [4]), ("z%", [])]
)
def test_not_like_keeps_the_rows_like_drops(pattern: str, like: list[int]) -> None:
    unlike = [i for i, k in enumerate(K) if k is not None and i not in like]
    assert xs(f"k LIKE '{pattern}'") == like
    assert xs(f"k NOT LIKE '{pattern}'") == unlike
    assert xs(f"NOT k LIKE '{pattern}'") == unlike


def _reference(pattern: str, text: str) -> bool | None:
    """LIKE by its definition (None: a pattern Spark refuses), matched by dynamic programming, no regex."""
    tokens: list[tuple[str, str]] = []  # ("any", ""), ("one", ""), ("char", c)
    chars = iter(pattern)
    for c in chars:
        if c == "\\":
            escaped = next(chars, "")
            if escaped not in ("_", "%", "\\"):
                return None
            tokens.append(("char", escaped))
        else:
            tokens.append(("any", "") if c == "%" else ("one", "") if c == "_" else ("char", c))
    ok = [True] + [False] * len(text)  # ok[j]: the tokens so far match text[:j]
    for kind, c in tokens:
        if kind == "any":
            ok = [any(ok[: j + 1]) for j in range(len(text) + 1)]
        else:
            ok = [False] + [ok[j] and (kind == "one" or text[j] == c) for j in range(len(text))]
    return ok[-1]


ALPHABET = ["a", "b", "\\", "%", "_", ".", "*", "(", "[", "$", "^", "+", "?", "{", "|", "\n", "é", "😀"]


@settings(max_examples=400, deadline=None)
@given(
    st.text(st.sampled_from(ALPHABET), max_size=6),
    st.lists(st.text(st.sampled_from(ALPHABET), max_size=6), min_size=1, max_size=6),
)
def test_like_matches_its_definition_with_escapes_and_regex_characters(
    pattern: str, texts: list[str]
) -> None:
    want = [_reference(pattern, t) for t in texts]
    if None in want:
        with pytest.raises(QueryError) as refused:
            apply("like", [pa.array(texts), pa.scalar(pattern)])
        assert refused.value.code is ErrorCode.PARSING
        return
    assert apply("like", [pa.array(texts), pa.scalar(pattern)]).to_pylist() == want
    assert apply("like", [pa.array([None], pa.string()), pa.scalar(pattern)]).to_pylist() == [None]


ROWS = pa.table({"k": pa.array(["a\\", "\\", "x", "a\\b", "%a%", "a_", None]), "x": pa.array(range(7))})


@pytest.mark.parametrize(
    ("pattern", "like"),
    [("%\\\\", [0, 1]), ("%\\\\b", [3]), ("a\\\\%", [0, 3]), ("\\%%", [4]), ("_\\_", [5]), ("%\\%", [4])],
)
def test_an_escaped_character_is_literal_in_a_parameter_pattern(pattern: str, like: list[int]) -> None:
    for where, want in (("k LIKE ?", like), ("k NOT LIKE ?", [i for i in range(6) if i not in like])):
        plan = parse_sql(f"SELECT x FROM t WHERE {where} ORDER BY x")
        fragments = plan_fragments(plan, initiator="i", participants=["p0", "p1"])
        got = run_fragments(fragments, stores(split(ROWS, [3])), (pattern,))
        assert got is not None and got.column("x").to_pylist() == want, (where, pattern)


@pytest.mark.parametrize(
    ("pattern", "reason"), [("x\\y", "precede 'y'"), ("a\\", "at its end"), ("\\", "at its end")]
)
def test_an_escape_spark_refuses_is_refused_in_the_text(pattern: str, reason: str) -> None:
    text = "SELECT x FROM t WHERE k LIKE '" + pattern.replace("\\", "\\\\") + "'"
    with pytest.raises(SqlError) as refused:
        parse_sql(text)
    assert refused.value.code is ErrorCode.PARSING and reason in refused.value.message
