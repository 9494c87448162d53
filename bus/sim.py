"""SimBus: the role contract driven by a deterministic, seeded scheduler.

Every node is a real ``NodeCore`` (the same sessions, sequence checks, liveness and credit code as
production); only the sockets and the clock are simulated. Each ZeroMQ pipe (source, destination, channel)
stays FIFO, as ZeroMQ keeps it; across pipes, the seed decides the order through random latencies. Links can
be cut (with or without a disconnect notice), nodes crashed and restarted. Same seed, same run.

The simulator is also the driver of the HTTP exchange (docs/EXCHANGE.md section 5), as ``bus/node.py`` is:
it keeps a "jobs" call open on every node's ``http.client`` role and carries out each ``HttpFetch``
against the peer's ``binx.server`` role in memory, through the same ``LocalCall`` ``read`` / ``delete``
the node's HTTP server makes, each way after a seeded latency. Each request has the deadline the node's
``HttpExchangeClient`` gives it: its long-poll wait (none for a DELETE) plus ``HTTP_TIMEOUT`` from its
start; with no answer by then it fails as ``HttpRequestTimeout`` does, naming the URL and the limit. A
request to a node that is down or cut off with a notice fails at once as a refused connection would, and
one in flight when its node crashes or its link is cut with a notice as a reset would. Without a notice
(a stopped process, a link that drops everything) nothing answers: requests in flight and new ones to
that peer end at their deadline, as on real sockets.
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.bus.core import NodeCore
from sparkbus.bus.http_fetch import answer_of
from sparkbus.bus.http_wire import BufferRead
from sparkbus.bus.messages import Heartbeat
from sparkbus.bus.state import Completed, Transmit
from sparkbus.codecs import REGISTRY, Buffer, DecodeError

_HEARTBEAT = REGISTRY.code_of(Heartbeat)
#: Each HTTP request's limit beyond its long-poll wait, seconds: the ``timeout`` of the node's ``HttpFetcher``
#: (its default: ``Node`` sets none). A request unanswered that long past its start fails.
HTTP_TIMEOUT = 20.0


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
    action: Callable[[], None] | None = field(default=None, compare=False)  # an HTTP exchange step


@dataclass
class _HttpJob:
    """An ``HttpFetch`` in flight: from ``requester`` (incarnation ``inc``) to ``target``."""

    requester: str
    inc: int
    target: str
    target_inc: int
    fetch: c.HttpFetch
    expiry: _Delivery | None = None  # the queued step that fails the request at its deadline
    never_connected: bool = False  # its connect got no answer (a silent link cut)


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
        # The HTTP exchange: each node's open "jobs" call, the requests in flight, the server-side read
        # calls answering them, and the driver's own calls whose answers nobody waits for.
        self._jobs_calls: dict[str, int] = {}
        self._http_jobs: dict[int, _HttpJob] = {}
        self._http_reads: dict[tuple[str, int], int] = {}
        self._driver_calls: set[tuple[str, int]] = set()
        self._http_seq = 0
        self.http_requests = 0
        # Nodes crashed and links cut without a notice: their HTTP requests get no answer at all.
        self._http_silent_nodes: set[str] = set()
        self._http_silent_links: set[frozenset[str]] = set()
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
        self._jobs_calls.pop(name, None)
        if c.HTTP_CLIENT in core.roles:
            self._jobs_calls[name] = core.call(c.HTTP_CLIENT, "jobs", {}, self.now)
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
        if not notify:
            self._http_silent_links.add(frozenset((a, b)))
        self._queue = [d for d in self._queue if frozenset((d.src, d.dst)) != frozenset((a, b))]
        heapq.heapify(self._queue)
        self._http_broken(
            lambda j: frozenset((j.requester, j.target)) == frozenset((a, b)), "link cut", notify
        )
        if notify:
            for x, y in ((a, b), (b, a)):
                if self._nodes[x].alive:
                    self._nodes[x].core.on_transport_down(y, self.now, "link cut")
            self._flush_all()

    def heal(self, a: str, b: str) -> None:
        self._cut.discard(frozenset((a, b)))
        self._http_silent_links.discard(frozenset((a, b)))

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
        if not notify:
            self._http_silent_nodes.add(name)
        self._queue = [d for d in self._queue if name not in (d.src, d.dst)]
        heapq.heapify(self._queue)
        for jid in [j for j, job in self._http_jobs.items() if job.requester == name]:
            del self._http_jobs[jid]  # nobody is left to answer; the server's parked read times out
        self._http_broken(lambda j: j.target == name, "peer process died", notify)
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
        self._http_silent_nodes.discard(name)
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
        if self._http_jobs:
            return False
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
        if d.action is not None:  # an HTTP exchange step: it checks who is still there itself
            self.delivered += 1
            d.action()
            return
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
            large = self._configs[d.dst].zero_copy_threshold
            node.core.on_control(d.src.encode(), _as_received(d.frames, large), self.now)
        elif d.channel == "reply":
            node.core.on_reply(d.src, d.frames, self.now)
        else:
            node.core.on_data(_as_received(d.frames, 0), self.now)
        self._flush(d.dst)

    def _flush_all(self) -> None:
        for name in list(self._nodes):
            self._flush(name)

    def _flush(self, name: str) -> None:
        node = self._nodes[name]
        again = False
        for out in node.core.take():
            if isinstance(out, Completed):
                key = (name, out.call_id)
                if out.call_id == self._jobs_calls.get(name):
                    self._http_start(name, out.result)
                    again = True
                elif key in self._http_reads:
                    self._http_answered(self._http_reads.pop(key), out)
                elif key in self._driver_calls:
                    self._driver_calls.discard(key)
                else:
                    self._replies[key] = out
                continue
            assert isinstance(out, Transmit)
            dst = out.to.decode() if isinstance(out.to, bytes) else out.to
            self.send_raw(name, dst, out.channel, out.frames)
        if again:
            self._flush(name)

    # ------------------------------------------------------------------ the HTTP exchange (as a driver)

    def _http_start(self, name: str, jobs: Any) -> None:
        """Node ``name``'s http.client role handed out ``jobs``: send each; keep a "jobs" call open."""
        node = self._nodes[name]
        for fetch in jobs or ():
            self._http_seq += 1
            jid = self._http_seq
            target = self._nodes.get(fetch.peer)
            self._http_jobs[jid] = _HttpJob(
                requester=name,
                inc=self._incarnation[name],
                target=fetch.peer,
                target_inc=self._incarnation.get(fetch.peer, 0),
                fetch=fetch,
            )
            self.http_requests += 1
            if target is None or c.HTTP_BUFFERS not in target.core.roles:
                self._http_fail(jid, "the peer advertises no HTTP exchange (it runs no binx.server)", 0.0)
            else:
                self._http_jobs[jid].expiry = self._http_schedule(
                    name, name, functools.partial(self._http_expire, jid), _http_limit(fetch)
                )
                self._http_schedule(name, fetch.peer, functools.partial(self._http_arrive, jid))
        self._jobs_calls[name] = node.core.call(c.HTTP_CLIENT, "jobs", {}, self.now)

    def _http_schedule(
        self, src: str, dst: str, action: Callable[[], None], delay: float | None = None
    ) -> _Delivery:
        lo, hi = self.latency
        at = self.now + (self.rng.uniform(lo, hi) if delay is None else delay)
        self._seq += 1
        inc = (self._incarnation.get(src, 0), self._incarnation.get(dst, 0))
        step = _Delivery(at, self._seq, src, dst, "http", [], inc, action)
        heapq.heappush(self._queue, step)
        return step

    def _http_arrive(self, jid: int) -> None:
        """The request reaches its server: a read (or delete) call on its binx.server role."""
        job = self._http_jobs.get(jid)
        if job is None:
            return
        target = self._nodes[job.target]
        link = frozenset((job.requester, job.target))
        if link in self._http_silent_links:
            job.never_connected = True  # the connect hears nothing; the request ends at its deadline
            return
        if not target.alive and job.target in self._http_silent_nodes:
            return  # a stopped process's kernel still accepts the connection; nothing answers
        if not target.alive or self._incarnation[job.target] != job.target_inc:
            self._http_fail(jid, "connection refused (the peer is down)", 0.0)
            return
        if link in self._cut:
            self._http_fail(jid, "no route to the peer (link cut)", 0.0)
            return
        f = job.fetch
        args: dict[str, Any] = {"task_id": f.task_id, "buffer_id": f.buffer_id}
        if not f.delete:
            args.update(token=f.token, max_bytes=f.max_bytes, wait=f.max_wait)
        cid = target.core.call(c.HTTP_BUFFERS, "delete" if f.delete else "read", args, self.now)
        self._http_reads[(job.target, cid)] = jid
        self._flush(job.target)

    def _http_answered(self, jid: int, done: Completed) -> None:
        """The server's role answered: the HTTP answer travels back to the requester."""
        job = self._http_jobs.get(jid)
        if job is None:
            return
        f = job.fetch
        if done.error is not None:
            answer = c.HttpFetched(job=f.job, error=f"http://sim:{job.target}: HTTP 500: {done.error}")
        elif f.delete:
            answer = c.HttpFetched(job=f.job, complete=True)
        else:
            result: BufferRead = done.result
            answer = answer_of(f, result, f"sim:{job.target}")
        self._http_schedule(job.target, job.requester, functools.partial(self._http_done, jid, answer))

    def _http_done(self, jid: int, answer: c.HttpFetched) -> None:
        job = self._http_jobs.pop(jid, None)
        if job is None:
            return
        if job.expiry is not None:  # answered in time: its deadline is no event any more
            self._queue = [d for d in self._queue if d is not job.expiry]
            heapq.heapify(self._queue)
        node = self._nodes[job.requester]
        if not node.alive or self._incarnation[job.requester] != job.inc:
            return
        cid = node.core.call(c.HTTP_CLIENT, "fetched", {"result": answer}, self.now)
        self._driver_calls.add((job.requester, cid))
        self._flush(job.requester)

    def _http_fail(self, jid: int, why: str, delay: float | None) -> None:
        """Fail a request as its client would see it (from the requester itself: no link is crossed)."""
        job = self._http_jobs[jid]
        f = job.fetch
        text = f"http://sim:{job.target}: cannot reach the HTTP exchange: {why}"
        answer = c.HttpFetched(job=f.job, error=text)
        self._http_schedule(
            job.requester, job.requester, functools.partial(self._http_done, jid, answer), delay
        )

    def _http_expire(self, jid: int) -> None:
        """A request's deadline passed with no answer: it fails as ``HttpRequestTimeout`` does (the client
        closes its connection, so an answer still on its way is lost)."""
        job = self._http_jobs.get(jid)
        if job is None:
            return
        job.expiry = None
        self._queue = [d for d in self._queue if not _is_step_of(d, jid)]
        heapq.heapify(self._queue)
        f = job.fetch
        wait = 0.0 if f.delete else f.max_wait
        here = f"http://sim:{job.target}"
        path = f"/v1/task/{quote(f.task_id, safe='')}/results/{f.buffer_id}"
        method = "DELETE" if f.delete else "GET"
        if not f.delete:
            path += f"/{f.token}"
        limit = _http_limit(f)
        cause = (
            f"connecting to sim:{job.target}: no answer in {limit:g} s"
            if job.never_connected
            else "timed out"
        )
        text = (
            f"{here}: {method} {here}{path}: no complete answer within {limit:g} s "
            f"(long-poll {wait:g} s + request timeout {HTTP_TIMEOUT:g} s), connection closed: {cause}"
        )
        self._http_done(jid, c.HttpFetched(job=f.job, error=text))

    def _http_broken(self, hit: Callable[[_HttpJob], bool], why: str, notify: bool) -> None:
        """Requests in flight that ``hit`` selects lose their connection: with a notice they fail at once;
        without, nothing more reaches them and each ends at its deadline."""
        for key, jid in list(self._http_reads.items()):
            job = self._http_jobs.get(jid)
            if job is not None and hit(job):
                del self._http_reads[key]
        for jid, job in list(self._http_jobs.items()):
            if hit(job) and self._nodes[job.requester].alive:
                # Requests and answers still on their way were dropped with the link's deliveries.
                self._queue = [d for d in self._queue if d is job.expiry or not _is_step_of(d, jid)]
                heapq.heapify(self._queue)
                if notify:
                    self._http_fail(jid, f"connection reset ({why})", None)

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


def _as_received(frames: list[Buffer], large: int) -> list[Buffer]:
    """The frames as a node's sockets hand them over: after the envelope's header and body, a frame of at
    least ``large`` bytes is a (writable) memoryview, as ZeroMQ's frame buffers are (``Node._drain_control``;
    the PULL keeps every one), so roles meet in the simulator the views they get on real sockets."""
    return frames[:2] + [memoryview(bytearray(f)) if len(f) >= large else f for f in frames[2:]]


def _http_limit(fetch: c.HttpFetch) -> float:
    """How long after its start a request fails unanswered: its long-poll wait plus the request timeout
    (``HttpExchangeClient``; a DELETE has no long-poll)."""
    return HTTP_TIMEOUT + (0.0 if fetch.delete else fetch.max_wait)


def _is_step_of(d: _Delivery, jid: int) -> bool:
    action = d.action
    return isinstance(action, functools.partial) and action.args[:1] == (jid,)
