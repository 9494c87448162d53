"""RFC-0009: ``bufferComplete`` is "true if the entire buffer has been transferred". A size probe
(``getDataSize``) of a finished buffer whose pages were not fetched yet must not say complete: a consumer
taking the probe's answer as the end would DELETE the buffer and lose its pages."""

from __future__ import annotations

from sparkbus.bus.contract import MessageReceived, Send
from sparkbus.roles.exchange import BinReply, BinRequest, BinxServer, OutputBuffers, RequestType


def test_a_size_probe_of_a_finished_buffer_with_pages_left_is_not_complete() -> None:
    bufs = OutputBuffers()
    bufs.create("t", 0)
    bufs.add_pages("t", 0, [b"one", b"two"])
    bufs.no_more_pages("t", 0)
    probe = bufs.read("t", 0, 0, 1024, size_only=True)
    assert probe.remaining_bytes == (3, 3)
    assert probe.complete is False


def test_the_binx_reply_to_that_probe_is_not_buffer_complete() -> None:
    srv = BinxServer(OutputBuffers())
    srv.create_buffer("t", 0)
    srv.add_pages("t", 0, [b"one", b"two"], 0.0)
    srv.no_more_pages("t", 0, 0.0)
    req = BinRequest(
        sequence=1,
        requestType=int(RequestType.DATA),
        getDataSize=True,
        maxSizeOctets=1024,
        maxWaitMicroSeconds=0,
        taskId="t",
        bufferId=0,
        pageToken=0,
    )
    (send,) = [a for a in srv.handle(MessageReceived(peer="c", message=req), 0.0) if isinstance(a, Send)]
    reply = send.message
    assert isinstance(reply, BinReply)
    assert reply.bufferComplete is False
