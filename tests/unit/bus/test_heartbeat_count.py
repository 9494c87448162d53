"""HEARTBEAT's count of data batches travels in the header's stream slot; its body stays the empty map.

So a HEARTBEAT from a peer that predates the count (stream nil) decodes as before, and one with the count
decodes in a decoder that knows nothing of it (the body is unchanged; a heartbeat's stream slot was never
read). Byte layout: docs/PROTOCOL.md section 4.
"""

from __future__ import annotations

import msgpack
import pytest

from sparkbus.bus.messages import Heartbeat
from sparkbus.codecs import REGISTRY, DecodeError, EnvelopeCodec

CODEC = EnvelopeCodec(REGISTRY)


def test_an_old_peers_heartbeat_decodes_byte_for_byte() -> None:
    # Session 42, seq 9, stream nil: as every HEARTBEAT was before the count.
    frames = [bytes.fromhex("9601042a09c000"), bytes.fromhex("80")]
    env = CODEC.decode(frames)
    assert env.message == Heartbeat()
    assert (env.header.session, env.header.seq, env.header.stream) == (42, 9, None)


def test_a_heartbeat_with_a_count_has_the_same_body_and_the_count_in_the_header() -> None:
    frames = CODEC.encode(Heartbeat(), session=42, seq=9, stream="3")
    assert bytes(frames[0]) == bytes.fromhex("9601042a09a13300")  # fixarray(6) 1 4 42 9 "3" 0
    assert bytes(frames[1]) == b"\x80"  # the empty map, as before
    env = CODEC.decode(frames)
    assert env.message == Heartbeat() and env.header.stream == "3"
    assert CODEC.encode(Heartbeat(), session=42, seq=9)[1] == frames[1]


def test_a_heartbeat_body_with_a_field_is_still_refused() -> None:
    """The count is not a body field: the strict decoder refuses one, naming it."""
    frames = [bytes.fromhex("9601042a09c000"), msgpack.packb({"data_sent": 3})]
    with pytest.raises(DecodeError, match="data_sent"):
        CODEC.decode(frames)
