"""Version negotiation beyond one version (IEP-90): what a server offers back, what a client retries with,
a HELLO of a newer version with fields this one does not know, and a WELCOME of a version never offered."""

from __future__ import annotations

import msgpack
import pytest

from sparkbus.bus import BusConfig, PeerUp, SimBus
from sparkbus.bus.messages import MAGIC, Hello, Reject, Welcome, features_to_bits, retry_version
from sparkbus.codecs import REGISTRY, EnvelopeCodec

from .roles import Recorder

codec = EnvelopeCodec(REGISTRY)
V1, V11, V2, V3 = (1, 0, 0), (1, 1, 0), (2, 0, 0), (3, 0, 0)


@pytest.mark.parametrize(
    ("ours", "offered", "answered", "again"),
    [
        ((V11, V1), V11, V1, V1),  # IEP-90: the server's version, which we speak
        ((V3, V1), V3, V2, V1),  # we do not speak 2.0: the newest of ours below both
        ((V2,), V2, V1, None),  # nothing older to offer: give up
        ((V2, V1), V1, V1, None),  # offered already: give up, never loop
        ((V3, V2, V1), V3, (2, 5, 0), V2),
    ],
)
def test_retry_version(
    ours: tuple[tuple[int, int, int], ...],
    offered: tuple[int, int, int],
    answered: tuple[int, int, int],
    again: tuple[int, int, int] | None,
) -> None:
    assert retry_version(ours, offered, answered) == again


def test_nodes_with_only_an_older_version_in_common_agree_on_it() -> None:
    sim = SimBus(seed=3)
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a], BusConfig(cluster_tag="t", versions=(V3, V1)))
    sim.add_node("b", [b], BusConfig(cluster_tag="t", versions=(V2, V1)))
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    assert a.of(PeerUp) and b.of(PeerUp)
    assert sim.node("a").core._inbound["b"].version == V1  # b -> a: b offered 2.0, then 1.0
    assert sim.node("b").core._inbound["a"].version == V1  # a -> b: a offered 3.0, then 1.0


def _hello_body(version: list[int], **extra: object) -> bytes:
    fields: dict[str, object] = {
        "magic": MAGIC,
        "version": version,
        "features": features_to_bits([0, 1, 2]),
        "cluster_tag": "t",
        "node_id": "x",
        "kind": "client",
        "attempt": 77,
        "extensions": {},
    }
    fields.update(extra)
    return msgpack.packb(fields)


def _answer(version: list[int], **extra: object) -> Reject | Welcome:
    sim = SimBus(seed=1)
    sim.add_node("s", [Recorder()], BusConfig(cluster_tag="t", versions=(V2, V1)))
    sim.start()
    core = sim.node("s").core
    header = bytes(
        codec.encode(Hello(magic=MAGIC, version=V1, features=b"", cluster_tag="t", node_id="x"))[0]
    )
    core.on_control(b"x", [header, _hello_body(version, **extra)], sim.now)
    out = [t for t in core.take() if getattr(t, "to", None) == b"x"]
    msg = codec.decode(out[-1].frames).message
    assert isinstance(msg, Reject | Welcome)
    return msg


@pytest.mark.parametrize(
    ("offered", "answer"),
    [([3, 0, 0], V2), ([1, 5, 0], V1), ([0, 9, 0], V2)],
    ids=["newer", "between", "older"],
)
def test_a_server_offers_back_its_newest_version_below_the_offer(
    offered: list[int], answer: tuple[int, int, int]
) -> None:
    msg = _answer(offered)
    assert isinstance(msg, Reject) and msg.code.name == "PROTOCOL_COMPATIBILITY"
    assert msg.version == answer and msg.attempt == 77


def test_a_newer_hello_with_fields_we_do_not_know_is_a_version_question_not_malformed() -> None:
    msg = _answer([3, 0, 0], resume_token="abc")
    assert isinstance(msg, Reject) and msg.code.name == "PROTOCOL_COMPATIBILITY"
    assert msg.version == V2 and msg.attempt == 77  # echoed, so the client takes the answer as its own


def test_a_hello_of_our_version_with_an_unknown_field_is_still_malformed() -> None:
    msg = _answer([2, 0, 0], resume_token="abc")
    assert isinstance(msg, Reject) and msg.code.name == "MALFORMED"


def test_a_welcome_of_a_version_never_offered_ends_the_link_for_good() -> None:
    sim = SimBus(seed=2)
    a = Recorder()
    sim.add_node("a", [a], BusConfig(cluster_tag="t"))
    sim.add_node("b", [Recorder()], BusConfig(cluster_tag="t"))
    sim.start()
    core = sim.node("a").core
    out = core._outbound["b"]
    welcome = Welcome(
        version=(9, 0, 0),
        features=b"\x07",
        session=5,
        connection_id="c",
        idle_timeout_ms=1500,
        node_id="b",
        cluster_tag="t",
        attempt=out.attempt,
    )
    core.on_reply("b", [bytes(f) for f in codec.encode(welcome)], sim.now)
    assert out.state == "refused"
    assert "welcomed version 9.0.0" in core.refused()["b"]
