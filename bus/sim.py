"""SimBus: the role contract driven by a deterministic, seeded scheduler.

Every node is a real ``NodeCore`` (the same sessions, sequence checks, liveness and credit code as
production); only the sockets and the clock are simulated. Each ZeroMQ pipe (source, destination, channel)
stays FIFO, as ZeroMQ keeps it; across pipes, the seed decides the order through random latencies. Links can
be cut (with or without a disconnect notice), nodes crashed and restarted. Same seed, same run.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.core import NodeCore
from sparkbus.bus.messages import Heartbeat
from sparkbus.bus.state import Completed, Transmit
from sparkbus.codecs import REGISTRY, Buffer, DecodeError

_HEARTBEAT = REGISTRY.code_of(Heartbeat)


class SimTimeout(AssertionError):
    """A simulated run did not reach its condition within its time limit."""


@dataclass
class SimNode:
    name: str
    core: NodeCore
    alive: bool = True

    @property
    def roles(self) -> dict[str, c.Role]:
        return self.core.roles


@dataclass(order=True)
class _Delivery:
    at: float
    seq: int
    src: str = field(compare=False)
    dst: str = field(compare=False)
    channel: str = field(compare=False)
    frames: list[Buffer] = field(compare=False)
    incarnation: tuple[int, int] = field(compare=False)


class SimBus:
    """A simulated cluster.

    Args:
        seed: decides every latency, and so every interleaving across pipes.
        config: bus settings for every node.
        latency: (min, max) one-way delay of a message, seconds.
        start_time: the simulated clock's start.
    """

    def __init__(
        self,
        seed: int = 0,
        config: BusConfig | None = None,
        *,
        latency: tuple[float, float] = (0.0001, 0.002),
        start_time: float = 1000.0,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config or BusConfig(cluster_tag="sim")
        self.latency = latency
        self.now = start_time
        self._nodes: dict[str, SimNode] = {}
        self._configs: dict[str, BusConfig] = {}
        self._incarnation: dict[str, int] = {}
        self._queue: list[_Delivery] = []
        self._seq = 0
        self._pipe_clock: dict[tuple[str, str, str], float] = {}
        self._cut: set[frozenset[str]] = set()
        self._replies: dict[tuple[str, int], Completed] = {}
        self._started = False
        self.delivered = 0
        self.dropped = 0

    # ------------------------------------------------------------------ topology

    def add_node(self, name: str, roles: Sequence[c.Role], config: BusConfig | None = None) -> SimNode:
        if name in self._nodes:
            raise ValueError(f"node {name} exists")
        cfg = config or self.config
        self._configs[name] = cfg
        self._incarnation[name] = 0
        node = self._make(name, roles, cfg)
        if self._started:
            for other in self._nodes:
                if other != name:
                    self._nodes[other].core.add_peer(name, self.now)
                    node.core.add_peer(other, self.now)
            self._flush_all()
        return node

    def _make(self, name: str, roles: Sequence[c.Role], cfg: BusConfig) -> SimNode:
        node_rng = random.Random(f"{self.seed}/{name}/{self._incarnation[name]}")
        core = NodeCore(name, cfg, roles, node_rng.getrandbits)
        # Call ids stay unique across restarts, so a crashed incarnation's reply is never mistaken for a
        # new call's.
        core._next_call = self._incarnation[name] * 1_000_000 + 1
        node = SimNode(name, core)
        self._nodes[name] = node
        return node

    def node(self, name: str) -> SimNode:
        return self._nodes[name]

    @property
    def nodes(self) -> dict[str, SimNode]:
        return dict(self._nodes)

    def start(self) -> None:
        """Link every pair of nodes (each starts its handshakes)."""
        self._started = True
        names = list(self._nodes)
        for a in names:
            for b in names:
                if a != b:
                    self._nodes[a].core.add_peer(b, self.now)
        self._flush_all()

    # ------------------------------------------------------------------ faults

    def cut(self, a: str, b: str, *, notify: bool = True) -> None:
        """Break the link between ``a`` and ``b``: in-flight messages are lost. With ``notify``, both sides
        see a socket disconnect at once; without, they must find out from heartbeat silence."""
        self._cut.add(frozenset((a, b)))
        self._queue = [d for d in self._queue if frozenset((d.src, d.dst)) != frozenset((a, b))]
        heapq.heapify(self._queue)
        if notify:
            for x, y in ((a, b), (b, a)):
                if self._nodes[x].alive:
                    self._nodes[x].core.on_transport_down(y, self.now, "link cut")
            self._flush_all()

    def heal(self, a: str, b: str) -> None:
        self._cut.discard(frozenset((a, b)))

    def stall(
        self, src: str, dst: str, seconds: float, channels: tuple[str, ...] = ("ctl", "reply", "data")
    ) -> None:
        """Hold what ``src`` sends to ``dst`` on ``channels`` for ``seconds``: it arrives late, in order,
        after whatever ``dst`` did meanwhile. A loaded sender whose loop queued frames, or a loaded
        receiver that read them late; ``dst`` sees only silence, ``src`` sees nothing wrong."""
        until = self.now + seconds
        for channel in channels:
            pipe = (src, dst, channel)
            self._pipe_clock[pipe] = max(self._pipe_clock.get(pipe, 0.0), until)
        for d in self._queue:
            if d.src == src and d.dst == dst and d.channel in channels:
                d.at = max(d.at, until)
        heapq.heapify(self._queue)

    def crash(self, name: str, *, notify: bool = True) -> None:
        """Kill a node: its state is gone, messages to it are lost. With ``notify``, its peers see the
        disconnect at once (as after SIGKILL); without, only silence (as after SIGSTOP)."""
        node = self._nodes[name]
        node.alive = False
        self._queue = [d for d in self._queue if name not in (d.src, d.dst)]
        heapq.heapify(self._queue)
        if notify:
            for other in self._nodes.values():
                if other.alive:
                    other.core.on_transport_down(name, self.now, "peer process died")
            self._flush_all()

    def restart(self, name: str, roles: Sequence[c.Role]) -> SimNode:
        """Start a crashed node again, with fresh roles (a new process)."""
        if self._nodes[name].alive:
            raise ValueError(f"node {name} is running; crash it first")
        self._incarnation[name] += 1
        node = self._make(name, roles, self._configs[name])
        for other in self._nodes:
            if other != name:
                node.core.add_peer(other, self.now)
        self._flush_all()
        return node

    # ------------------------------------------------------------------ calls

    def call(self, node: str, role: str, name: str, args: dict[str, Any] | None = None) -> tuple[str, int]:
        """A local call on ``node``'s role; its answer is ``reply(cid)`` once it completes."""
        cid = self._nodes[node].core.call(role, name, args or {}, self.now)
        self._flush(node)
        return (node, cid)

    def reply(self, cid: tuple[str, int]) -> Completed | None:
        return self._replies.get(cid)

    def result(self, cid: tuple[str, int], *, limit: float = 60.0) -> Any:
        """Run until the call completes and return its result (raises ``RuntimeError`` with its error)."""
        self.run_until(lambda: cid in self._replies, limit=limit)
        done = self._replies[cid]
        if done.error is not None:
            raise RuntimeError(done.error)
        return done.result

    # ------------------------------------------------------------------ running

    def run(self, until: float) -> None:
        """Advance the simulated clock to ``until``, delivering and ticking in order."""
        while True:
            at = self._next_at()
            if at is None or at > until:
                break
            self._step(at)
        self.now = max(self.now, until)

    def run_for(self, seconds: float) -> None:
        self.run(self.now + seconds)

    def run_until(self, predicate: Callable[[], bool], *, limit: float = 60.0) -> None:
        """Run until ``predicate()`` holds; raise ``SimTimeout`` after ``limit`` simulated seconds."""
        deadline = self.now + limit
        while not predicate():
            at = self._next_at()
            if at is None or at > deadline:
                raise SimTimeout(f"seed {self.seed}: condition not reached within {limit} simulated seconds")
            self._step(at)

    def run_until_idle(self, *, limit: float = 60.0) -> None:
        """Run until no message other than heartbeats is in flight and no role timer is pending."""
        self.run_until(self.idle, limit=limit)

    def idle(self) -> bool:
        for d in self._queue:
            try:
                if self._nodes[d.dst].core.codec.decode_header(d.frames).type != _HEARTBEAT:
                    return False
            except DecodeError:
                return False
        return not any(n.alive and n.core._timers for n in self._nodes.values())

    def all_up(self) -> bool:
        alive = [n for n in self._nodes.values() if n.alive]
        return all(set(n.core.peers_up()) >= {m.name for m in alive if m is not n} for n in alive)

    def _next_at(self) -> float | None:
        cands = [self._queue[0].at] if self._queue else []
        for n in self._nodes.values():
            if n.alive:
                d = n.core.next_deadline()
                if d is not None:
                    cands.append(max(d, self.now))
        return min(cands) if cands else None

    def _step(self, at: float) -> None:
        self.now = max(self.now, at)
        if self._queue and self._queue[0].at <= at:
            d = heapq.heappop(self._queue)
            self._deliver(d)
            return
        for n in self._nodes.values():
            if n.alive:
                deadline = n.core.next_deadline()
                if deadline is not None and deadline <= self.now:
                    n.core.tick(self.now)
                    self._flush(n.name)

    def _deliver(self, d: _Delivery) -> None:
        node = self._nodes.get(d.dst)
        if (
            node is None
            or not node.alive
            or (self._incarnation.get(d.src, 0), self._incarnation[d.dst]) != d.incarnation
        ):
            self.dropped += 1
            return
        self.delivered += 1
        if d.channel == "ctl":
            node.core.on_control(d.src.encode(), d.frames, self.now)
        elif d.channel == "reply":
            node.core.on_reply(d.src, d.frames, self.now)
        else:
            node.core.on_data(d.frames, self.now)
        self._flush(d.dst)

    def _flush_all(self) -> None:
        for name in list(self._nodes):
            self._flush(name)

    def _flush(self, name: str) -> None:
        node = self._nodes[name]
        for out in node.core.take():
            if isinstance(out, Completed):
                self._replies[(name, out.call_id)] = out
                continue
            assert isinstance(out, Transmit)
            dst = out.to.decode() if isinstance(out.to, bytes) else out.to
            self.send_raw(name, dst, out.channel, out.frames)

    def send_raw(self, src: str, dst: str, channel: str, frames: list[Buffer]) -> None:
        """Put frames on a pipe (also how a test plays a hostile peer)."""
        if dst not in self._nodes or frozenset((src, dst)) in self._cut or not self._nodes[dst].alive:
            self.dropped += 1
            return
        lo, hi = self.latency
        pipe = (src, dst, channel)
        at = max(self.now + self.rng.uniform(lo, hi), self._pipe_clock.get(pipe, 0.0))
        self._pipe_clock[pipe] = at
        self._seq += 1
        inc = (self._incarnation.get(src, 0), self._incarnation[dst])
        heapq.heappush(
            self._queue, _Delivery(at, self._seq, src, dst, channel, [bytes(f) for f in frames], inc)
        )
