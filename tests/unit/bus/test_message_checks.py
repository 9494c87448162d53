"""A message's own checks quote a peer's values bounded: their text goes back to the peer in a refusal (and
is clipped there), but a value repr'd whole first would cost up to four times its size on every refusal."""

from __future__ import annotations

import pytest

from sparkbus.bus.messages import MAGIC, Hello
from sparkbus.codecs.schema import QUOTED
from sparkbus.roles.compute.messages import _check_id
from sparkbus.roles.exchange.messages import pack_sizes
from sparkbus.roles.query.messages import QueryId
from sparkbus.roles.replication.messages import _check_partition

BIG = 1 << 20
#: A bounded quote, the check's own words and a length: far below the value's size.
LIMIT = 4 * QUOTED + 200


def test_a_hello_with_a_long_unknown_kind_is_refused_in_a_short_text_naming_its_length() -> None:
    with pytest.raises(ValueError) as caught:
        Hello(magic=MAGIC, version=(1, 0, 0), features=b"", cluster_tag="c", node_id="n", kind="\x01" * BIG)
    text = str(caught.value)
    assert len(text) <= LIMIT, len(text)
    assert f"({BIG} chars)" in text


def test_a_compute_id_of_the_wrong_type_is_quoted_bounded() -> None:
    with pytest.raises(ValueError) as caught:
        _check_id(b"\xff" * BIG, "Peek.uuid")  # type: ignore[arg-type]
    text = str(caught.value)
    assert len(text) <= LIMIT, len(text)
    assert f"({BIG} bytes)" in text


def test_page_sizes_out_of_range_are_quoted_bounded() -> None:
    with pytest.raises(ValueError) as caught:
        pack_sizes([1 << 70] * BIG)
    assert len(str(caught.value)) <= LIMIT


def test_a_replication_partition_name_too_long_is_quoted_bounded() -> None:
    with pytest.raises(ValueError) as caught:
        _check_partition("p" * BIG)
    text = str(caught.value)
    assert len(text) <= LIMIT, len(text)
    assert f"({BIG} chars)" in text


def test_a_query_id_with_a_long_member_is_quoted_bounded() -> None:
    with pytest.raises(ValueError) as caught:
        QueryId.parse("m" * BIG)
    text = str(caught.value)
    assert len(text) <= LIMIT, len(text)
    assert f"({BIG} chars)" in text
