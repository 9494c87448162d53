"""Thin clients inside a ``SimBus``: each ``ClientCore`` gets simulated DEALER sockets.

A client socket is an endpoint named ``"<client>.<n>"`` (its routing id); the nodes answer it on their
reply channel exactly as they answer a real DEALER. ``block(client, node)`` breaks every connection between
them (the client sees a disconnect at once; the node, as with a real ROUTER, only silence) until ``unblock``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkbus.bus import SimBus
from sparkbus.bus.sim import _Delivery
from sparkbus.codecs import Buffer
from sparkbus.roles.client import Chunk, ClientConfig, ClientCore, ClientError, Close, Done, Open, Send


@dataclass
class _Socket:
    client: str
    key: str
    node: str
    closed: bool = False


@dataclass
class SimClient:
    name: str
    core: ClientCore
    sockets: dict[str, str] = field(default_factory=dict)  # key -> current endpoint
    done: dict[int, Done] = field(default_factory=dict)
    chunks: dict[int, list[Chunk]] = field(default_factory=dict)  # streamed operations' chunks, as output
    opened: list[str] = field(default_factory=list)  # transports, in order

    def submit(self, sim: ClientSim, op: int, args: dict[str, Any] | None = None) -> int:
        handle = self.core.submit(op, args or {}, sim.now)
        sim.flush_client(self)
        return handle

    def stream(self, sim: ClientSim, op: int, args: dict[str, Any] | None = None) -> int:
        handle = self.core.submit(op, args or {}, sim.now, stream=True)
        self.chunks[handle] = []
        sim.flush_client(self)
        return handle

    def cancel(self, sim: ClientSim, handle: int) -> None:
        """The caller stopped waiting for ``handle`` (timed out, interrupted)."""
        self.core.cancel(handle, sim.now)
        sim.flush_client(self)

    def consume(self, sim: ClientSim, handle: int, count: int) -> None:
        """The caller has consumed the first ``count`` chunks of ``handle``."""
        self.core.consumed(handle, count, sim.now)
        sim.flush_client(self)


def sim_resolver(host: str, port: int) -> list[str]:
    """``node:port`` resolves to ``tcp://node:port``; ``multi-a+b:port`` to both a and b."""
    hosts = host[len("multi-") :].split("+") if host.startswith("multi-") else [host]
    return [f"tcp://{h}:{port}" for h in hosts]


class ClientSim(SimBus):
    def __init__(self, seed: int = 0, **kw: Any) -> None:
        super().__init__(seed, **kw)
        self.clients: dict[str, SimClient] = {}
        self.endpoints: dict[str, _Socket] = {}
        self.blocked: set[tuple[str, str]] = set()
        self._n = 0

    def add_client(
        self, name: str, addresses: Sequence[str], config: ClientConfig, *, start: bool = True
    ) -> SimClient:
        core = ClientCore(
            addresses, config, rng=random.Random(f"{self.seed}/{name}"), resolver=sim_resolver, name=name
        )
        client = SimClient(name, core)
        self.clients[name] = client
        if start:
            core.start(self.now)
            self.flush_client(client)
        return client

    def wait(self, client: SimClient, handle: int, *, limit: float = 60.0) -> Done:
        self.run_until(lambda: handle in client.done, limit=limit)
        return client.done[handle]

    def result(self, cid: Any, *, limit: float = 60.0) -> Any:  # SimBus.result, for node calls
        return super().result(cid, limit=limit)

    def outcome(self, client: SimClient, handle: int, *, limit: float = 60.0) -> Any:
        done = self.wait(client, handle, limit=limit)
        if done.error is not None:
            raise done.error
        return done.result

    def block(self, client: str, node: str) -> None:
        self.blocked.add((client, node))
        c = self.clients[client]
        for key, ep in list(c.sockets.items()):
            sock = self.endpoints[ep]
            if sock.node == node and not sock.closed:
                self._queue = [d for d in self._queue if ep not in (d.src, d.dst)]
                heapq.heapify(self._queue)
                c.core.on_disconnected(key, self.now, "link cut")
        self.flush_client(c)

    def unblock(self, client: str, node: str) -> None:
        self.blocked.discard((client, node))

    # ------------------------------------------------------------------ plumbing

    def flush_client(self, client: SimClient) -> None:
        for out in client.core.take():
            if isinstance(out, Open):
                old = client.sockets.get(out.key)
                if old is not None:
                    self.endpoints[old].closed = True
                self._n += 1
                ep = f"{client.name}.{self._n}"
                node = out.transport.split("://", 1)[1].rsplit(":", 1)[0]
                self.endpoints[ep] = _Socket(client.name, out.key, node)
                client.sockets[out.key] = ep
                client.opened.append(out.transport)
                if self._reachable(self.endpoints[ep]):
                    client.core.on_connected(out.key, self.now)
            elif isinstance(out, Close):
                ep = client.sockets.get(out.key)
                if ep is not None:
                    self.endpoints[ep].closed = True
            elif isinstance(out, Send):
                ep = client.sockets[out.key]
                self.send_raw(ep, self.endpoints[ep].node, "ctl", out.frames)
            elif isinstance(out, Chunk):
                got = client.chunks.setdefault(out.handle, [])
                assert out.index == len(got), f"chunk {out.index} of {out.handle} after {len(got)}"
                got.append(out)
            elif isinstance(out, Done):
                assert out.handle not in client.done, f"operation {out.handle} completed twice"
                client.done[out.handle] = out

    def _reachable(self, sock: _Socket) -> bool:
        node = self._nodes.get(sock.node)
        return (
            not sock.closed
            and node is not None
            and node.alive
            and (sock.client, sock.node) not in self.blocked
        )

    def send_raw(self, src: str, dst: str, channel: str, frames: list[Buffer]) -> None:
        ep = self.endpoints.get(src) or self.endpoints.get(dst)
        if ep is None:
            super().send_raw(src, dst, channel, frames)
            return
        if not self._reachable(ep):
            self.dropped += 1
            return
        lo, hi = self.latency
        pipe = (src, dst, channel)
        at = max(self.now + self.rng.uniform(lo, hi), self._pipe_clock.get(pipe, 0.0))
        self._pipe_clock[pipe] = at
        self._seq += 1
        inc = (0, self._incarnation[dst]) if dst in self._nodes else (self._incarnation[src], 0)
        heapq.heappush(
            self._queue, _Delivery(at, self._seq, src, dst, channel, [bytes(f) for f in frames], inc)
        )

    def _deliver(self, d: _Delivery) -> None:
        sock = self.endpoints.get(d.dst)
        if sock is None:
            super()._deliver(d)
            return
        client = self.clients[sock.client]
        if not self._reachable(sock) or self._incarnation[d.src] != d.incarnation[0]:
            self.dropped += 1
            return
        self.delivered += 1
        client.core.on_frames(sock.key, d.frames, self.now)
        self.flush_client(client)

    def _next_at(self) -> float | None:
        at = super()._next_at()
        for c in self.clients.values():
            d = c.core.next_deadline()
            if d is not None:
                d = max(d, self.now)
                at = d if at is None else min(at, d)
        return at

    def _step(self, at: float) -> None:
        super()._step(at)
        for c in self.clients.values():
            d = c.core.next_deadline()
            if d is not None and d <= self.now:
                c.core.tick(self.now)
                self.flush_client(c)


def error_of(done: Done) -> ClientError:
    assert done.error is not None, f"expected an error, got {done.result!r}"
    return done.error
