"""An in-memory link between one compute controller and its replicas (like h11's ConnectionPair).

Every message goes through the real envelope codec on its way, so the tests also exercise the wire format.
Each direction is a FIFO queue; ``run(rng)`` delivers from randomly chosen non-empty queues (a seeded
interleaving), ``run()`` in a fixed round-robin order.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from sparkbus.bus.contract import Action, Event, LocalCall, MessageReceived, PeerLost, PeerUp, Reply, Send
from sparkbus.codecs import EnvelopeCodec
from sparkbus.roles.compute import ComputeController, ComputeReplica, decode_table, encode_table

CTL = "ctl"
CODEC = EnvelopeCodec()


def wire(message: Any) -> Any:
    """``message`` after a trip through the envelope codec."""
    return CODEC.decode(CODEC.encode(message)).message


def ipc(table: pa.Table) -> bytes:
    return encode_table(table)


class Cluster:
    """A controller named ``ctl`` and replicas, with per-direction FIFO queues between them."""

    def __init__(self, replicas: Iterable[str] = ("r1",), **controller_args: Any) -> None:
        names = list(replicas)
        self.controller = ComputeController(replicas=names, **controller_args)
        self.replicas = {r: ComputeReplica() for r in names}
        self.queues: dict[tuple[str, str], deque[Any]] = {}
        self.replies: dict[int, Reply] = {}
        self.sent: list[tuple[str, str, Any]] = []
        self._next_call = 0
        self.now = 0.0

    def role(self, name: str) -> ComputeController | ComputeReplica:
        return self.controller if name == CTL else self.replicas[name]

    def deliver(self, to: str, event: Event) -> None:
        self.now += 0.001
        self._carry(to, self.role(to).handle(event, self.now))

    def _carry(self, src: str, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                key = (src, action.peer)
                if key in self.queues:
                    self.queues[key].append(wire(action.message))
                    self.sent.append((src, action.peer, action.message))
            elif isinstance(action, Reply):
                assert action.call_id not in self.replies, f"call {action.call_id} answered twice"
                self.replies[action.call_id] = action
            else:
                raise AssertionError(f"unexpected action {action!r}")

    # ---------------------------------------------------------------- links

    def up(self, replica: str) -> None:
        self.queues[(CTL, replica)] = deque()
        self.queues[(replica, CTL)] = deque()
        self.deliver(replica, PeerUp(peer=CTL))
        self.deliver(CTL, PeerUp(peer=replica))

    def cut(self, replica: str) -> None:
        """Break the link: queued messages are lost, both sides see PeerLost."""
        self.queues.pop((CTL, replica), None)
        self.queues.pop((replica, CTL), None)
        self.deliver(replica, PeerLost(peer=CTL, reason="cut"))
        self.deliver(CTL, PeerLost(peer=replica, reason="cut"))

    def step(self, src: str, dst: str) -> Any:
        message = self.queues[(src, dst)].popleft()
        self.deliver(dst, MessageReceived(peer=src, message=message))
        return message

    def run(self, rng: random.Random | None = None, limit: int = 100_000) -> None:
        for _ in range(limit):
            ready = [k for k, q in self.queues.items() if q]
            if not ready:
                return
            src, dst = rng.choice(ready) if rng is not None else ready[0]
            self.step(src, dst)
        raise AssertionError("the cluster did not go idle")

    def pending(self, src: str, dst: str) -> list[Any]:
        return list(self.queues.get((src, dst), ()))

    # ---------------------------------------------------------------- calls

    def call(self, call: str, /, **args: Any) -> int:
        self._next_call += 1
        self.deliver(CTL, LocalCall(call_id=self._next_call, name=call, args=args))
        return self._next_call

    def result(self, call_id: int) -> Any:
        reply = self.replies[call_id]
        assert reply.error is None, reply.error
        return reply.result

    def do(self, call: str, /, rng: random.Random | None = None, **args: Any) -> Any:
        cid = self.call(call, **args)
        self.run(rng)
        return self.result(cid)

    def rows(self, call_id: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = decode_table(self.result(call_id)).to_pylist()
        return rows
