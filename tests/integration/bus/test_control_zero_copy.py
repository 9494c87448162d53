"""Control-message blobs through a real node pair: a large one reaches the role as a view on the ZeroMQ
frame it arrived in (no copy), a small one as bytes, both intact; BinX pages likewise."""

from __future__ import annotations

import queue
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from sparkbus.bus import BusConfig, MessageReceived, Send
from sparkbus.bus import contract as c
from sparkbus.bus.node import Node
from sparkbus.codecs import blob, message
from sparkbus.roles.exchange import BinxClient, BinxServer, OutputBuffers

pytestmark = pytest.mark.integration
THRESHOLD = BusConfig().zero_copy_threshold
MiB = 1 << 20


@message(0x7211)
@dataclass(frozen=True, kw_only=True)
class Blobs:
    """Two blob frames (frames 2 and 3) after a body that may itself be large (``text``)."""

    n: int
    text: str = ""
    first: bytes = blob(default=b"")
    second: bytes = blob(default=b"")


@dataclass
class Collect:
    """Sends what a local call asks it to; puts every ``Blobs`` it receives on a queue."""

    name: str = "collect"
    messages: ClassVar[tuple[type, ...]] = (Blobs,)
    got: queue.Queue[Blobs] = field(default_factory=queue.Queue)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, MessageReceived):
            self.got.put(event.message)
        elif isinstance(event, c.LocalCall):
            return [
                Send(peer=event.args["peer"], message=event.args["message"]),
                c.Reply(call_id=event.call_id),
            ]
        return []


def _pair(roles_a: list[Any], roles_b: list[Any]) -> tuple[Node, Node]:
    config = BusConfig(cluster_tag="zero-copy", heartbeat_interval=0.2, peer_timeout=5.0)
    a, b = Node("a", config, roles_a), Node("b", config, roles_b)
    ep = {"a": a.bind(), "b": b.bind()}
    a.start({"b": ep["b"]})
    b.start({"a": ep["a"]})
    a.wait_ready(20)
    b.wait_ready(20)
    return a, b


@pytest.fixture
def collectors() -> Iterator[tuple[Node, Collect]]:
    receiver = Collect()
    a, b = _pair([Collect()], [receiver])
    try:
        yield a, receiver
    finally:
        a.stop()
        b.stop()


def _pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize(
    "first_size, second_size",
    [(0, 10), (THRESHOLD - 1, THRESHOLD), (MiB, 1), (3 * MiB, 5 * MiB)],
)
def test_a_blob_reaches_the_role_intact_as_a_view_when_large(
    collectors: tuple[Node, Collect], first_size: int, second_size: int
) -> None:
    a, receiver = collectors
    sent = Blobs(n=1, first=_pattern(first_size, 1), second=_pattern(second_size, 2))
    a.call("collect", "send", {"peer": "b", "message": sent}, timeout=10)
    got = receiver.got.get(timeout=10)
    assert got == sent
    for value, size in ((got.first, first_size), (got.second, second_size)):
        assert len(value) == size
        assert type(value) is (memoryview if size >= THRESHOLD else bytes)


def test_a_large_body_is_still_decoded_from_bytes_and_many_blobs_arrive_in_order(
    collectors: tuple[Node, Collect],
) -> None:
    a, receiver = collectors
    text = "x" * (2 * THRESHOLD)  # a large body frame (the node copies it out: only blobs stay views)
    sent = [Blobs(n=i, text=text if i == 0 else "", first=_pattern(THRESHOLD + i, i)) for i in range(20)]
    for msg in sent:
        a.call("collect", "send", {"peer": "b", "message": msg}, timeout=10)
    got = [receiver.got.get(timeout=10) for _ in sent]
    assert got == sent
    assert all(type(m.first) is memoryview for m in got)


def test_binx_pages_large_and_small_come_through_the_node_intact() -> None:
    a, b = _pair([BinxServer(OutputBuffers(instance_id="a"))], [BinxClient(rng=random.Random(0))])
    try:
        key = {"task_id": "t", "buffer_id": 0}
        # One 2 MiB page (a reply of its own), then small pages and pages that together exceed the
        # threshold (one reply of several pages, split from one view).
        pages = [_pattern(2 * MiB, 0), b"s", _pattern(100, 1), *(_pattern(30_000, i) for i in range(2, 6))]
        a.call("binx.server", "create", key, timeout=10)
        a.call("binx.server", "add_pages", {**key, "pages": pages}, timeout=10)
        a.call("binx.server", "no_more_pages", key, timeout=10)
        got: list[Any] = []
        while True:
            result = b.call("binx.client", "fetch", {"peer": "a", **key}, timeout=10)
            got += result["pages"]
            if result["complete"]:
                break
        assert got == pages
        assert [bytes(p) for p in got] == pages
        assert type(got[0]) is memoryview  # a reply of its own, above the threshold
        # The rest fit one reply (at most 1 MiB), whose frame is above the threshold: views into it.
        assert all(type(p) is memoryview for p in got[1:])
        b.call("binx.client", "close", {"peer": "a", **key}, timeout=10)
    finally:
        a.stop()
        b.stop()
