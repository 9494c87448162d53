"""Roles take control-message blobs as the node hands them over: a large one as a memoryview.

The node keeps a control frame after the envelope's header and body as a memoryview on ZeroMQ's buffer
when it is at least ``BusConfig.zero_copy_threshold`` long, and the core decodes it without a copy
(``bus/node.py`` ``_drain_control``, ``bus/core.py`` ``on_control``). ``node_wire`` does the same to an
encoded message (with a writable view, as ZeroMQ's), so the roles' own harnesses run with it here; the
real sockets are in ``tests/integration/bus/test_control_zero_copy.py``.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from sparkbus.bus.config import BusConfig
from sparkbus.bus.contract import MessageReceived
from sparkbus.codecs import Buffer, EnvelopeCodec
from sparkbus.roles.client.gateway import encode_response
from sparkbus.roles.compute import decode_table
from sparkbus.roles.exchange import (
    BinReply,
    BinxClient,
    BinxServer,
    OutputBuffers,
    ReplyStatus,
    RequestType,
    pack_sizes,
)
from sparkbus.roles.query.engine import Inbox
from sparkbus.roles.query.plan import Receive

from .compute import harness as compute_harness
from .compute.test_controller import ORDERED, batch, cluster
from .exchange.harness import SERVER, Pair

THRESHOLD = BusConfig().zero_copy_threshold
T, B = "q1.0.0.0", 0


def node_frames(frames: list[Buffer], threshold: int) -> list[Buffer]:
    """``frames`` as ``_drain_control`` hands them to the core: blobs at or above ``threshold`` as
    writable memoryviews on a buffer of their own, everything else as bytes."""
    return [
        memoryview(bytearray(f)) if i >= 2 and len(f) >= threshold else bytes(f) for i, f in enumerate(frames)
    ]


class NodeCodec(EnvelopeCodec):
    """Decodes as the core decodes control messages off the node (counting the views it hands out)."""

    def __init__(self, threshold: int = THRESHOLD) -> None:
        super().__init__()
        self.threshold = threshold
        self.views = 0

    def decode(self, frames: Any, *, copy_blobs: bool = True, header: Any = None) -> Any:
        received = node_frames(list(frames), self.threshold)
        self.views += sum(type(f) is memoryview for f in received)
        env = super().decode(received, copy_blobs=False)
        return env


def node_wire(codec: NodeCodec) -> Any:
    def wire(message: Any) -> Any:
        return codec.decode(codec.encode(message)).message

    return wire


# ---------------------------------------------------------------- the codec


def test_a_control_blob_decoded_without_copying_is_the_received_view() -> None:
    codec = EnvelopeCodec()
    page = bytes(range(256)) * 300
    frames = node_frames(list(codec.encode(_reply(1, [page]))), THRESHOLD)
    assert type(frames[2]) is memoryview
    reply = codec.decode(frames, copy_blobs=False).message
    assert reply.data is frames[2] and reply.data == page
    small = node_frames(list(codec.encode(_reply(1, [b"abc"]))), THRESHOLD)
    assert type(small[2]) is bytes and codec.decode(small, copy_blobs=False).message.data == b"abc"


# ---------------------------------------------------------------- binx.client


def _reply(sequence: int, pages: list[bytes], *, token: int = 0, complete: bool = True) -> BinReply:
    return BinReply(
        sequence=sequence,
        replyType=RequestType.DATA,
        status=ReplyStatus.OK,
        bufferComplete=complete,
        pageToken=token,
        pageNextToken=token + len(pages),
        remainingBytes=b"",
        pageSizes=pack_sizes(tuple(map(len, pages))),
        instanceId="i",
        data=b"".join(pages),
    )


def _pair(**client_kw: Any) -> Pair:
    client_kw.setdefault("max_wait", 1.0)
    return Pair(
        client=BinxClient(rng=random.Random(1), **client_kw),
        server=BinxServer(OutputBuffers()),
        codec=NodeCodec(),
    )


def _pull(pair: Pair, pages: list[bytes]) -> list[Any]:
    pair.apply("srv", pair.server.create_buffer(T, B))
    pair.apply("srv", pair.server.add_pages(T, B, pages, pair.now))
    pair.apply("srv", pair.server.no_more_pages(T, B, pair.now))
    pair.connect()
    got: list[Any] = []
    while True:
        call = pair.call("fetch", task_id=T, buffer_id=B)
        pair.flush()
        result = pair.result(call)
        got += result["pages"]
        if result["complete"]:
            return got


def test_binx_client_queues_a_large_page_as_the_view_it_arrived_in() -> None:
    pair = _pair()
    pair.connect()
    fetch = pair.call("fetch", task_id=T, buffer_id=B)
    _, req = pair.wire.popleft()
    page = b"p" * (1 << 20)
    codec = pair.codec
    assert isinstance(codec, NodeCodec)
    reply = codec.decode(codec.encode(_reply(req.sequence, [page]))).message
    assert type(reply.data) is memoryview
    pair.deliver("cli", MessageReceived(peer=SERVER, message=reply))
    [got] = pair.result(fetch)["pages"]
    assert got is reply.data  # not copied again
    assert got == page and bytes(got) == page


@pytest.mark.parametrize("max_request_bytes", [1, 1 << 20])
def test_binx_transfer_of_large_and_small_pages_through_a_node_like_wire(max_request_bytes: int) -> None:
    # One page per reply, or several (large replies: views split into views).
    pages = [bytes([i]) * size for i, size in enumerate([1 << 20, 10, THRESHOLD, THRESHOLD - 1, 40_000, 3])]
    pair = _pair(max_request_bytes=max_request_bytes)
    got = _pull(pair, pages)
    assert got == pages
    assert [bytes(p) for p in got] == pages
    assert isinstance(pair.codec, NodeCodec) and pair.codec.views > 0
    if max_request_bytes == 1:
        # A reply's frame is its one page: views exactly for the large ones, bytes for the others.
        assert [type(p) for p in got] == [memoryview, bytes, memoryview, bytes, bytes, bytes]
    assert pair.client.source(SERVER, T, B) is None  # deleted after the end, as with bytes


def test_binx_small_pages_of_a_multi_page_reply_stay_bytes() -> None:
    pages = [b"a" * 100, b"b" * 200, b"c"]
    got = _pull(_pair(max_request_bytes=1 << 20), pages)
    assert got == pages and all(type(p) is bytes for p in got)


# ---------------------------------------------------------------- compute (AppendUpdates, peeks, subscribes)


def test_compute_roles_take_every_blob_as_a_view(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = NodeCodec(threshold=1)  # every non-empty blob as a view, as a large one arrives
    monkeypatch.setattr(compute_harness, "wire", node_wire(codec))
    c = cluster()
    cid = c.call("peek", view="v", finishing=ORDERED)
    c.run()
    result = c.result(cid)
    assert type(result) is memoryview  # the replica's PeekResponse.rows, handed to the caller as it came
    assert decode_table(result).to_pylist() == [{"k": "a", "n": 2, "s": 4}, {"k": "b", "n": 1, "s": 2}]
    sub = c.do("subscribe", view="v")
    c.do("write", table="t", batch=batch(("b", 5)))  # AppendUpdates to the replicas, as views
    got = c.do("fetch", id=sub["id"])
    updates = pa.concat_tables([decode_table(d) for _, _, d, _ in got["batches"] if d is not None])
    assert sorted((r["k"], r["n"], r["__diff"]) for r in updates.to_pylist()) == [
        ("a", 2, 1),
        ("b", 1, -1),
        ("b", 1, 1),
        ("b", 2, 1),
    ]
    assert codec.views > 0


# ---------------------------------------------------------------- client.gateway, query


def test_gateway_sends_a_viewed_result_as_it_sends_bytes() -> None:
    rows = batch(*((f"k{i}", i) for i in range(5000)))
    view = memoryview(bytearray(rows))
    for arrow in (True, False):
        assert encode_response(7, view, None, 4096, arrow=arrow) == encode_response(
            7, rows, None, 4096, arrow=arrow
        )
    [plain] = encode_response(8, {"rows": view}, None)
    assert msgpack.unpackb(plain.payload) == {"rows": rows}


def test_query_inbox_folds_a_page_that_is_a_view() -> None:
    page = batch(("a", 1), ("b", 2))
    inbox = Inbox(Receive(edge=0))
    assert inbox.add(memoryview(bytearray(page))) == 2
    assert inbox.table is not None and inbox.table.to_pylist() == decode_table(page).to_pylist()
