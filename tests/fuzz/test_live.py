"""A running node's ROUTER and PULL under random and mutated frames while a well-behaved peer keeps working."""

from __future__ import annotations

import gc
import random
import tracemalloc

import zmq

from sparkbus.bus import BusConfig
from sparkbus.bus.messages import MAGIC, Hello, StreamBatch, features_to_bits
from sparkbus.bus.node import Node, context
from sparkbus.topologies.echo import EchoRequest, EchoRole, StreamRequest

from .conftest import count
from .strategies import CODEC

ROUNDS = 30
FRAMES_PER_ROUND = 200
#: Growth of Python allocations across the run that still counts as bounded (the node keeps counters and
#: log records; nothing per refused message).
MEMORY_SLACK = 8 << 20


def _seeds() -> list[list[bytes]]:
    hello = Hello(
        magic=MAGIC, version=(1, 0, 0), features=features_to_bits((0, 1)), cluster_tag="fuzz", node_id="x"
    )
    msgs = [
        hello,
        EchoRequest(request_id=1, payload=b"p" * 100),
        StreamRequest(request_id=1, batches=3, batch_size=10, credit=100),
        StreamBatch(ordinal=0, last=False, remaining=0, data=b"d" * 64),
    ]
    return [[bytes(f) for f in CODEC.encode(m, session=s, seq=q)] for m in msgs for s, q in ((0, 0), (1, 1))]


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(frames)) if frames else 0
        op = rng.choice(["flip", "truncate", "extend", "drop", "dup", "noise"])
        if not frames or op == "noise":
            frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))]
        elif op == "flip" and frames[i]:
            j = rng.randrange(len(frames[i]))
            frames[i] = frames[i][:j] + bytes([frames[i][j] ^ rng.randint(1, 255)]) + frames[i][j + 1 :]
        elif op == "truncate":
            frames[i] = frames[i][: rng.randint(0, len(frames[i]))]
        elif op == "extend":
            frames[i] += rng.randbytes(rng.randint(1, 32))
        elif op == "drop" and len(frames) > 1:
            del frames[i]
        elif op == "dup":
            frames.insert(i, frames[i])
    return frames or [b""]


def test_node_serves_on_under_garbage_with_bounded_memory() -> None:
    cfg = BusConfig(cluster_tag="fuzz")
    target = Node("a", cfg, [EchoRole(node_id="a")])
    friend = Node("b", cfg, [EchoRole(node_id="b")])
    rng = random.Random(11)
    seeds = _seeds()
    raw: list[zmq.Socket[bytes]] = []
    try:
        ep_a, ep_b = target.bind(), friend.bind()
        target.start({"b": ep_b})
        friend.start({"a": ep_a})
        target.wait_ready(10)
        friend.wait_ready(10)
        ctx = context()
        for i in range(4):  # strangers: DEALERs with their own identities, and PUSHes
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, f"stranger-{i}".encode())
            push = ctx.socket(zmq.PUSH)
            for s, ep in ((dealer, ep_a.control), (push, ep_a.data)):
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDTIMEO, 1000)
                s.connect(ep)
                raw.append(s)
        assert friend.call("echo", "ping", {"peer": "a", "payload": b"warm"}, timeout=10)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        sent = 0
        for r in range(ROUNDS):
            for _ in range(FRAMES_PER_ROUND):
                sock = rng.choice(raw)
                frames = (
                    _mutate(rng, rng.choice(seeds))
                    if rng.random() < 0.8
                    else [rng.randbytes(rng.randint(0, 40))]
                )
                sock.send_multipart(frames)
                sent += 1
                count("live_frames")
            # The well-behaved peer keeps working through it: a ping each round, a stream every third.
            assert friend.call("echo", "ping", {"peer": "a", "payload": bytes([r]) * 32}, timeout=10)
            if r % 3 == 0:
                friend.call("echo", "stream", {"peer": "a", "batches": 4, "batch_size": 4096}, timeout=10)
        st = target.status()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert target.error is None and friend.error is None
        assert st["peers"]["b"]["up"]
        assert target.drops.get("handler_bug", 0) == 0, target.drops
        refused = sum(st["refusals"].values())
        assert refused > 0 and st["counters"]["refused"] == refused
        assert after - before < MEMORY_SLACK, f"Python allocations grew by {after - before} bytes"
        count("live_refusals", refused)
    finally:
        for s in raw:
            s.close(linger=0)
        target.stop()
        friend.stop()
