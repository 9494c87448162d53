"""The text of a refusal (ERROR, REJECT) never quotes a peer's bytes whole: a field name or value of a
megabyte in the refused message, which its repr would make four, gets an answer of a few hundred bytes, to a
peer on a session and to a stranger's HELLO alike."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from sparkbus.bus.core import NodeCore
from sparkbus.bus.messages import MAGIC, ErrorCode, Reject
from sparkbus.codecs import REGISTRY, EnvelopeCodec
from tests.sim.bus.roles import Note, pair

BIG = 1 << 20
#: What an answer to a refused message may take, whatever the message held.
ANSWER_BOUND = 16 << 10


def _answers(core: NodeCore) -> list[list[bytes]]:
    return [list(map(bytes, o.frames)) for o in core.take() if getattr(o, "channel", None) == "reply"]


def _small(answers: list[list[bytes]]) -> Any:
    assert answers, "the message was not answered"
    sizes = [sum(map(len, frames)) for frames in answers]
    assert max(sizes) <= ANSWER_BOUND, sizes
    return EnvelopeCodec(REGISTRY).decode(answers[-1]).message


@pytest.mark.parametrize("seed", [1, 2])
def test_refusing_an_unexpected_field_does_not_echo_its_name_whole(seed: int) -> None:
    sim, _, _ = pair(seed)
    a = sim.node("a").core
    out = sim.node("b").core._outbound["a"]
    out.seq += 1
    header = msgpack.packb([1, REGISTRY.code_of(Note), out.session, out.seq, None, 0])
    body = msgpack.packb({"text": "x", b"\x00" * BIG: 1}, use_bin_type=True)
    a.take()
    a.on_control(b"b", [header, body], sim.now)
    error = _small(_answers(a))
    assert a.refusals["MALFORMED"] == 1 and error.code == ErrorCode.MALFORMED
    assert f"... ({BIG} bytes)" in error.message and "unexpected field" in error.message


def _hello(**fields: Any) -> dict[str, Any]:
    hello = {
        "magic": MAGIC,
        "version": [1, 0, 0],
        "features": b"",
        "cluster_tag": "t",
        "node_id": "zz",
        "kind": "node",
        "attempt": 5,
        "extensions": {},
    }
    return {**hello, **fields}


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        (_hello(kind="\x01" * BIG), ErrorCode.MALFORMED),  # the constructor's message quotes it
        (_hello(extensions={"\x02" * BIG: 1}), ErrorCode.MALFORMED),  # a map key, in the field's name
        (_hello(magic=b"\x00" * BIG), ErrorCode.HANDSHAKE_HEADER),
        (_hello(cluster_tag="\x03" * BIG), ErrorCode.CLUSTER_ID_MISMATCH),
    ],
)
def test_refusing_a_strangers_hello_does_not_echo_it_whole(hello: dict[str, Any], code: ErrorCode) -> None:
    sim, _, _ = pair(1)
    a = sim.node("a").core
    a.take()
    header = msgpack.packb([1, 1, 0, 0, None, 0])
    a.on_control(b"zz", [header, msgpack.packb(hello, use_bin_type=True)], sim.now)
    reject = _small(_answers(a))
    assert isinstance(reject, Reject) and reject.code == code and reject.attempt == 5, reject
    assert "... (" in reject.message


def test_any_refusal_text_is_cut_to_a_few_kib() -> None:
    sim, _, _ = pair(1)
    a = sim.node("a").core
    a.take()
    a._refuse_rid(b"zz", ErrorCode.PROTOCOL, "x" * BIG, sim.now)
    reject = _small(_answers(a))
    assert reject.message.endswith(f"... ({BIG} chars)")
