"""An in-memory link between one BinX client role and one BinX server role (after h11's ConnectionPair).

Every ``Send`` is encoded to frames and decoded again, so the tests exercise the wire format too. Timers
live on a fake clock that only moves when ``run`` or ``advance`` moves it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sparkbus.bus.contract import (
    Action,
    CancelTimer,
    Event,
    LocalCall,
    MessageReceived,
    PeerLost,
    PeerUp,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import EnvelopeCodec
from sparkbus.roles.exchange import BinxClient, BinxServer

CLIENT = "cli"
SERVER = "srv"


@dataclass
class Pair:
    """A client node ``cli`` and a server node ``srv`` with one link between them."""

    client: BinxClient
    server: BinxServer
    now: float = 0.0
    up: bool = False
    codec: EnvelopeCodec = field(default_factory=EnvelopeCodec)
    wire: deque[tuple[str, Any]] = field(default_factory=deque)  # (destination node, message)
    timers: dict[tuple[str, str], float] = field(default_factory=dict)
    replies: dict[int, Reply] = field(default_factory=dict)
    sent: list[tuple[str, Any]] = field(default_factory=list)  # every message put on the wire, in order
    _next_call: int = 0

    def role(self, node: str) -> BinxClient | BinxServer:
        return self.client if node == CLIENT else self.server

    def deliver(self, node: str, event: Event) -> None:
        actions = list(self.role(node).handle(event, self.now))
        self.apply(node, actions)

    def apply(self, node: str, actions: list[Action]) -> None:
        other = SERVER if node == CLIENT else CLIENT
        for action in actions:
            if isinstance(action, Send):
                assert action.peer == other, f"{node} sent to unknown peer {action.peer}"
                frames = self.codec.encode(action.message)
                message = self.codec.decode(frames).message
                assert message == action.message
                self.sent.append((other, message))
                if self.up:
                    self.wire.append((other, message))
            elif isinstance(action, SetTimer):
                self.timers[(node, action.key)] = action.at
            elif isinstance(action, CancelTimer):
                self.timers.pop((node, action.key), None)
            elif isinstance(action, Reply):
                assert action.call_id not in self.replies, f"call {action.call_id} answered twice"
                self.replies[action.call_id] = action
            else:
                raise AssertionError(f"unexpected action {action!r}")

    # ---------------------------------------------------------------- driving

    def connect(self) -> None:
        self.up = True
        self.deliver(CLIENT, PeerUp(peer=SERVER))
        self.deliver(SERVER, PeerUp(peer=CLIENT))

    def cut(self, reason: str = "test cut") -> None:
        self.up = False
        self.wire.clear()
        self.deliver(CLIENT, PeerLost(peer=SERVER, reason=reason))
        self.deliver(SERVER, PeerLost(peer=CLIENT, reason=reason))

    def call(self, name: str, **args: Any) -> int:
        self._next_call += 1
        args.setdefault("peer", SERVER)
        self.deliver(CLIENT, LocalCall(call_id=self._next_call, name=name, args=args))
        return self._next_call

    def step(self) -> None:
        """Deliver the oldest message on the wire (and nothing else)."""
        node, message = self.wire.popleft()
        self.deliver(node, MessageReceived(peer=CLIENT if node == SERVER else SERVER, message=message))

    def flush(self, limit: int = 100_000) -> int:
        """Deliver every message on the wire (and what they cause); returns how many."""
        n = 0
        while self.wire:
            node, message = self.wire.popleft()
            src = CLIENT if node == SERVER else SERVER
            self.deliver(node, MessageReceived(peer=src, message=message))
            n += 1
            assert n < limit, "message storm"
        return n

    def advance(self, until: float) -> None:
        """Flush, then fire due timers in time order up to ``until``, flushing after each."""
        self.flush()
        while True:
            due = [(at, key) for key, at in self.timers.items() if at <= until]
            if not due:
                break
            at, (node, key) = min(due)
            del self.timers[(node, key)]
            self.now = max(self.now, at)
            self.deliver(node, TimerFired(key=key))
            self.flush()
        self.now = max(self.now, until)

    def result(self, call_id: int) -> Any:
        reply = self.replies.pop(call_id)
        assert reply.error is None, reply.error
        return reply.result

    def error(self, call_id: int) -> str:
        reply = self.replies.pop(call_id)
        assert reply.error is not None, f"call {call_id} succeeded with {reply.result!r}"
        return reply.error

    def fetch_all(
        self, task_id: str, buffer_id: int, *, step: float = 0.01, limit: float = 600.0
    ) -> list[bytes]:
        """Fetch until complete, advancing time as needed; returns every page."""
        pages: list[bytes] = []
        while True:
            cid = self.call("fetch", task_id=task_id, buffer_id=buffer_id)
            while cid not in self.replies:
                assert self.now < limit, "fetch did not finish"
                self.advance(self.now + step)
            res = self.result(cid)
            pages.extend(res["pages"])
            if res["complete"]:
                return pages
