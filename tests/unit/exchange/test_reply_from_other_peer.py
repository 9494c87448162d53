"""RFC-0009: a client dispatcher maps a request's sequence number to its outstanding promise per
connection; a reply arriving from another peer answers nothing of ours (a stale reply), even when its
sequence number matches a request outstanding at a different peer."""

from __future__ import annotations

import random

from sparkbus.bus.contract import LocalCall, MessageReceived, PeerUp, Reply, Send
from sparkbus.roles.exchange import BinReply, BinRequest, BinxClient, ReplyStatus, RequestType, pack_sizes


def _reply(seq: int, data: bytes, *, complete: bool) -> BinReply:
    return BinReply(
        sequence=seq,
        replyType=int(RequestType.DATA),
        status=int(ReplyStatus.OK),
        bufferComplete=complete,
        pageToken=0,
        pageNextToken=1,
        remainingBytes=b"",
        pageSizes=pack_sizes([len(data)]),
        instanceId="i1",
        errorCode=0,
        errorMessage="",
        data=data,
    )


def test_a_reply_from_another_peer_is_stale_even_with_a_matching_sequence() -> None:
    client = BinxClient(rng=random.Random(1))
    for p in ("p1", "p2"):
        list(client.handle(PeerUp(peer=p), 0.0))
    out = list(
        client.handle(
            LocalCall(call_id=7, name="fetch", args={"peer": "p1", "task_id": "t", "buffer_id": 0}), 0.0
        )
    )
    (req,) = [a.message for a in out if isinstance(a, Send) and isinstance(a.message, BinRequest)]
    # p2 answers the sequence of the request that went to p1.
    forged = list(
        client.handle(MessageReceived(peer="p2", message=_reply(req.sequence, b"forged", complete=True)), 0.1)
    )
    assert not [a for a in forged if isinstance(a, Reply)], forged
    assert client.counters["stale_replies"] == 1
    # p1's own reply is still taken.
    real = list(
        client.handle(MessageReceived(peer="p1", message=_reply(req.sequence, b"real", complete=True)), 0.2)
    )
    (reply,) = [a for a in real if isinstance(a, Reply)]
    assert reply.result is not None and [bytes(p) for p in reply.result["pages"]] == [b"real"]
