"""docs/PROTOCOL.md's HELLO example is what the codec sends: a peer in another language is written from it."""

from __future__ import annotations

import re
from pathlib import Path

from sparkbus.bus.messages import INCARNATION, MAGIC, Hello
from sparkbus.codecs import REGISTRY, EnvelopeCodec

DOC = Path(__file__).resolve().parents[3] / "docs" / "PROTOCOL.md"


def _frames_of_the_example() -> list[bytes]:
    """The HELLO example's frames: hex bytes and "quoted" ASCII, a frame per ``frame N:`` line and its
    continuation lines."""
    text = DOC.read_text()
    block = text.split("Example, HELLO from node `n1`", 1)[1].split("```", 2)[1]
    frames: list[bytearray] = []
    for line in block.strip().splitlines():
        body = line
        if line.startswith("frame "):
            frames.append(bytearray())
            body = line.split(":", 1)[1]
        for token in re.findall(r'"[^"]*"|[0-9a-f]{2}', body):
            frames[-1] += token[1:-1].encode() if token.startswith('"') else bytes.fromhex(token)
    return [bytes(f) for f in frames]


def test_the_documented_hello_is_what_the_codec_encodes() -> None:
    hello = Hello(
        magic=MAGIC,
        version=(1, 0, 0),
        features=b"\x07",
        cluster_tag="demo",
        node_id="n1",
        kind="node",
        attempt=1,
        extensions={INCARNATION: "7"},
    )
    assert [bytes(f) for f in EnvelopeCodec(REGISTRY).encode(hello)] == _frames_of_the_example()
