"""A minimal in-memory bus for echo tests: FIFO delivery, real envelope encoding, simple credit.

Each ``Send`` goes through the envelope codec (so messages must encode), each ``SendBatch`` is checked
against the sender's credit, and each ``Consumed`` is granted straight back to the sender.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkbus.bus import contract as c
from sparkbus.codecs import EnvelopeCodec

CODEC = EnvelopeCodec()


@dataclass(frozen=True)
class _Grant:
    peer: str
    stream: str
    size: int


@dataclass
class MemoryBus:
    roles: dict[str, c.Role]
    now: float = 0.0
    replies: dict[tuple[str, int], c.Reply] = field(default_factory=dict)
    credit: dict[tuple[str, str, str], int] = field(default_factory=dict)
    timers: dict[tuple[str, str], float] = field(default_factory=dict)
    ordinals: dict[tuple[str, str, str], int] = field(default_factory=dict)
    queue: deque[tuple[str, c.Event | _Grant]] = field(default_factory=deque)
    streams_open: set[tuple[str, str, str]] = field(default_factory=set)
    cut: set[frozenset[str]] = field(default_factory=set)
    _calls: int = 0

    def connect_all(self) -> None:
        for a in self.roles:
            for b in self.roles:
                if a != b:
                    self.queue.append((a, c.PeerUp(peer=b)))
        self.run()

    def call(self, node: str, name: str, **args: Any) -> tuple[str, int]:
        self._calls += 1
        self.queue.append((node, c.LocalCall(call_id=self._calls, name=name, args=args)))
        return (node, self._calls)

    def lose(self, a: str, b: str, reason: str = "test cut") -> None:
        self.cut.add(frozenset((a, b)))
        self.queue.append((a, c.PeerLost(peer=b, reason=reason)))
        self.queue.append((b, c.PeerLost(peer=a, reason=reason)))

    def run(self) -> None:
        while self.queue:
            self.step()

    def step(self) -> None:
        """Deliver one queued event."""
        if self.queue:
            node, event = self.queue.popleft()
            if isinstance(event, _Grant):
                key = (node, event.peer, event.stream)
                if key not in self.credit:
                    return
                self.credit[key] += event.size
                event = c.CreditChanged(peer=event.peer, stream=event.stream, credit=self.credit[key])
            self._act(node, self.roles[node].handle(event, self.now))

    def advance(self, seconds: float) -> None:
        """Move the clock and fire due timers in time order."""
        self.now += seconds
        for (node, key), at in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if at <= self.now:
                del self.timers[(node, key)]
                self.queue.append((node, c.TimerFired(key=key)))
        self.run()

    def _deliver(self, src: str, dst: str, event: c.Event) -> None:
        if frozenset((src, dst)) not in self.cut:
            self.queue.append((dst, event))

    def _act(self, src: str, actions: Iterable[c.Action]) -> None:
        for a in actions:
            match a:
                case c.Send(peer=peer, message=msg):
                    decoded = CODEC.decode(CODEC.encode(msg)).message
                    assert decoded == msg
                    self._deliver(src, peer, c.MessageReceived(peer=src, message=decoded))
                case c.OpenStream(peer=peer, stream=stream, credit=credit):
                    self.credit[(src, peer, stream)] = credit
                    self.ordinals[(src, peer, stream)] = 0
                    self.streams_open.add((src, peer, stream))
                case c.AcceptStream():
                    pass
                case c.SendBatch(peer=peer, stream=stream, data=data, last=last):
                    key = (src, peer, stream)
                    if len(data) > self.credit[key]:
                        raise c.LocalProtocolError(
                            f"{src} sent {len(data)}B on {stream} with {self.credit[key]}B credit"
                        )
                    if not data and not last:
                        raise c.LocalProtocolError("empty batch without last")
                    self.credit[key] -= len(data)
                    ordinal = self.ordinals[key]
                    self.ordinals[key] += 1
                    ev = c.BatchReceived(
                        peer=src,
                        stream=stream,
                        ordinal=ordinal,
                        last=last,
                        data=data,
                        size=len(data),
                        remaining=self.credit[key],
                    )
                    self._deliver(src, peer, ev)
                case c.Consumed(peer=sender, stream=stream, size=size):
                    # The grant travels as a message; the sender's bus applies it on arrival and tells its
                    # role the credit it then holds (what bus/streams.py does).
                    if frozenset((src, sender)) not in self.cut:
                        self.queue.append((sender, _Grant(peer=src, stream=stream, size=size)))
                case c.GrantCredit(peer=sender, stream=stream, credit=credit):
                    self.credit[(sender, src, stream)] = credit
                case c.CloseStream(peer=peer, stream=stream):
                    self.streams_open.discard((src, peer, stream))
                case c.SetTimer(key=key, at=at):
                    self.timers[(src, key)] = at
                case c.CancelTimer(key=key):
                    self.timers.pop((src, key), None)
                case c.Reply(call_id=cid):
                    self.replies[(src, cid)] = a
                case _:
                    raise AssertionError(f"unexpected action {a!r}")
