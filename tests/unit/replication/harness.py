"""An in-memory link between replication roles (like h11's ConnectionPair, for N nodes).

Actions of one role become events of another: Send -> MessageReceived (through the real envelope
codec), SendBatch -> BatchReceived, Consumed -> CreditChanged (credit returned at once), SetTimer ->
TimerFired when the clock reaches it. Each (source, destination, channel) is a FIFO queue; control and
data are separate channels, as on the bus, and a seeded random choice picks which queue delivers next.

Peer notifications keep the bus's contract: per (node, peer), PeerUp and PeerLost alternate, starting with
PeerUp, and a node is told a peer is up only while both are up and not cut apart. A node can crash while it
handles its own PeerUp (a flush on losing leadership, say): its peer is then not told it is up.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkbus.bus.contract import (
    AcceptStream,
    Action,
    BatchReceived,
    CancelTimer,
    CloseStream,
    Consumed,
    CreditChanged,
    Event,
    GrantCredit,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    OpenStream,
    PeerLost,
    PeerUp,
    Reply,
    Send,
    SendBatch,
    SetTimer,
    TimerFired,
)
from sparkbus.codecs import EnvelopeCodec, decode_batch, encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.segments import SegmentEntry
from sparkbus.roles.replication.storage import MemoryStorage, SimulatedCrash, Storage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig

CODEC = EnvelopeCodec()


def flushed(
    storage: Storage, partition: str, config: StoreConfig, rows: pa.Table
) -> tuple[PartitionStore, SegmentEntry]:
    """A store of placement 1 on ``storage`` whose ``rows`` were written and flushed into one segment."""
    store = PartitionStore.open(storage, partition, 1, config)
    store.write(rows, 0.0)
    entry = store.flush()
    assert entry is not None
    return store, entry


def _errors(role: ReplicationRole) -> int:
    return sum(role.counters.get(k, 0) for k in ("handler_errors", "procedure_errors", "open_errors"))


@dataclass(frozen=True)
class _Returned:
    """Credit returned by a receiver, applied when it reaches the sender, to the stream generation it
    was meant for (a re-opened stream with the same key must not get a late grant of the old one)."""

    peer: str
    stream: str
    size: int
    generation: int


@dataclass
class Stats:
    messages: dict[str, int] = field(default_factory=dict)
    batch_bytes: int = 0


class Cluster:
    """Nodes running one ``ReplicationRole`` each, over in-memory links."""

    def __init__(
        self,
        nodes: list[str],
        specs: list[PartitionSpec],
        config: ReplicationConfig | None = None,
        seed: int = 0,
    ) -> None:
        self.nodes = list(nodes)
        self.specs = list(specs)
        self.config = config or ReplicationConfig()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.storages: dict[tuple[str, str], MemoryStorage] = {}
        self.roles: dict[str, ReplicationRole] = {}
        self.up: set[str] = set()
        self.cut_pairs: set[frozenset[str]] = set()
        # (node, peer): the last notification node got about peer was PeerUp.
        self.told_up: set[tuple[str, str]] = set()
        self.queues: dict[tuple[str, str, str], deque[Event | _Returned]] = {}
        self.timers: dict[tuple[str, str], float] = {}
        self.credit: dict[tuple[str, str, str], int] = {}
        self.generation: dict[tuple[str, str, str], int] = {}
        self.ordinals: dict[tuple[str, str, str], int] = {}
        self.replies: dict[int, Reply] = {}
        self.stats = Stats()
        self._call_id = 0
        self.strict = True  # a role error fails the test (see _deliver)
        for n in self.nodes:
            self._boot(n)
        for n in self.nodes:
            self._connect_all(n)

    # ------------------------------------------------------------ topology

    def role(self, node: str) -> ReplicationRole:
        return self.roles[node]

    def _boot(self, node: str) -> None:
        layout = Layout.of(copy.deepcopy(self.specs))

        def storage_for(partition: str) -> MemoryStorage:
            return self.storages.setdefault((node, partition), MemoryStorage())

        self.roles[node] = ReplicationRole(node, layout, storage_for, self.config)
        self.up.add(node)
        self._deliver(node, TimerFired(key="boot"))

    def _linked(self, a: str, b: str) -> bool:
        return a in self.up and b in self.up and frozenset((a, b)) not in self.cut_pairs

    def _tell_up(self, node: str, peer: str) -> None:
        # Checked at delivery: the PeerUp delivered just before may have crashed one of the two.
        if self._linked(node, peer) and (node, peer) not in self.told_up:
            self.told_up.add((node, peer))
            self._deliver(node, PeerUp(peer=peer))

    def _tell_lost(self, node: str, peer: str, reason: str) -> None:
        if (node, peer) in self.told_up:
            self.told_up.discard((node, peer))
            self._deliver(node, PeerLost(peer=peer, reason=reason))

    def _connect_all(self, node: str) -> None:
        for other in self.nodes:
            if other != node:
                self._tell_up(node, other)
                self._tell_up(other, node)

    def _drop_link(self, a: str, b: str, reason: str) -> None:
        for key in [k for k in self.queues if {k[0], k[1]} == {a, b}]:
            del self.queues[key]
        for key in [k for k in self.credit if {k[0], k[1]} == {a, b}]:
            del self.credit[key]
        self._tell_lost(a, b, reason)
        self._tell_lost(b, a, reason)

    def cut(self, a: str, b: str) -> None:
        if self._linked(a, b):
            self._drop_link(a, b, "cut")
        self.cut_pairs.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if pair not in self.cut_pairs:
            return
        self.cut_pairs.discard(pair)
        self._tell_up(a, b)
        self._tell_up(b, a)

    def crash(self, node: str) -> None:
        """Kill ``node``: its un-fsynced bytes are lost, its links break."""
        if node not in self.up:
            return
        self.up.discard(node)
        self.told_up = {t for t in self.told_up if t[0] != node}  # the restarted role is told afresh
        del self.roles[node]
        for key in [k for k in self.timers if k[0] == node]:
            del self.timers[key]
        for (n, p), st in list(self.storages.items()):
            if n == node:
                self.storages[n, p] = st.crashed()
        for key in [k for k in self.queues if node in (k[0], k[1])]:
            del self.queues[key]
        for key in [k for k in self.credit if node in (k[0], k[1])]:
            del self.credit[key]
        for o in self.nodes:
            if o != node:
                self._tell_lost(o, node, "crash")

    def restart(self, node: str) -> None:
        if node in self.up:
            return
        self._boot(node)
        self._connect_all(node)

    # ------------------------------------------------------------ delivery

    def _deliver(self, node: str, event: Event) -> None:
        role = self.roles.get(node)
        if role is None:
            return
        before = _errors(role)
        try:
            actions = list(role.handle(event, self.now))
        except SimulatedCrash:
            self.crash(node)
            return
        for action in actions:
            self._apply(node, action)
        if self.strict and _errors(role) != before:
            # The role logs and counts what it raised instead of raising it: a protocol bug all the same.
            raise AssertionError(f"{node} failed on {event!r}: {role.counters}, failing: {role.failing}")

    def _enqueue(self, src: str, dst: str, channel: str, event: Event | _Returned) -> None:
        if not self._linked(src, dst):
            return
        self.queues.setdefault((src, dst, channel), deque()).append(event)

    def _apply(self, node: str, action: Action) -> None:
        if isinstance(action, Send):
            name = type(action.message).__name__
            self.stats.messages[name] = self.stats.messages.get(name, 0) + 1
            decoded = CODEC.decode(CODEC.encode(action.message)).message
            self._enqueue(node, action.peer, "control", MessageReceived(peer=node, message=decoded))
        elif isinstance(action, OpenStream):
            key = (node, action.peer, action.stream)
            self.credit[key] = action.credit
            self.generation[key] = self.generation.get(key, 0) + 1
            self.ordinals[key] = 0
        elif isinstance(action, SendBatch):
            key = (node, action.peer, action.stream)
            left = self.credit.get(key, 0)
            if len(action.data) > left:
                raise LocalProtocolError(f"{action.stream}: {len(action.data)} bytes over credit {left}")
            self.credit[key] = left - len(action.data)
            self.stats.batch_bytes += len(action.data)
            ordinal = self.ordinals.get(key, 0)
            self.ordinals[key] = ordinal + 1
            event = BatchReceived(
                peer=node,
                stream=action.stream,
                ordinal=ordinal,
                last=action.last,
                data=action.data,
                size=len(action.data),
                remaining=self.credit[key],
            )
            self._enqueue(node, action.peer, "data", event)
        elif isinstance(action, Consumed):
            key = (action.peer, node, action.stream)
            returned = _Returned(node, action.stream, action.size, self.generation.get(key, 0))
            self._enqueue(node, action.peer, "control", returned)
        elif isinstance(action, GrantCredit):
            key = (action.peer, node, action.stream)
            self.credit[key] = action.credit
        elif isinstance(action, SetTimer):
            self.timers[node, action.key] = action.at
        elif isinstance(action, CancelTimer):
            self.timers.pop((node, action.key), None)
        elif isinstance(action, Reply):
            self.replies[action.call_id] = action
        elif isinstance(action, CloseStream):
            self.credit.pop((node, action.peer, action.stream), None)
        elif isinstance(action, AcceptStream):
            pass
        else:  # pragma: no cover - the contract has no other actions
            raise AssertionError(f"unknown action {action!r}")

    def step(self) -> bool:
        """Deliver one queued event (seeded choice of queue); False when nothing is queued."""
        ready = sorted(k for k, q in self.queues.items() if q)
        if not ready:
            return False
        key = ready[self.rng.randrange(len(ready))]
        event = self.queues[key].popleft()
        if isinstance(event, _Returned):
            credit_key = (key[1], event.peer, event.stream)
            if credit_key not in self.credit or self.generation.get(credit_key) != event.generation:
                return True  # the stream was closed or re-opened since: the grant is stale
            self.credit[credit_key] += event.size
            event = CreditChanged(peer=event.peer, stream=event.stream, credit=self.credit[credit_key])
        self._deliver(key[1], event)
        return True

    def drain(self, limit: int = 200_000) -> None:
        for _ in range(limit):
            if not self.step():
                return
        raise AssertionError("the cluster did not go quiet")

    def run(self, until: float) -> None:
        """Deliver everything, firing timers in time order, until the clock reaches ``until``."""
        self.drain()
        while self.timers:
            (node, key), at = min(self.timers.items(), key=lambda kv: (kv[1], kv[0]))
            if at > until:
                break
            del self.timers[node, key]
            self.now = max(self.now, at)
            self._deliver(node, TimerFired(key=key))
            self.drain()
        self.now = max(self.now, until)

    def settle(self, seconds: float = 30.0) -> None:
        self.run(self.now + seconds)

    # ------------------------------------------------------------ calls

    def call(self, node: str, name: str, **args: Any) -> Reply:
        self._call_id += 1
        cid = self._call_id
        self._deliver(node, LocalCall(call_id=cid, name=name, args=args))
        # A node that crashed while handling the call never replies: the caller sees no acknowledgement.
        return self.replies.pop(cid, Reply(call_id=cid, error=f"{node} crashed"))

    def write(self, node: str, partition: str, rows: dict[str, list[Any]] | pa.RecordBatch) -> Reply:
        batch = rows if isinstance(rows, pa.RecordBatch) else pa.RecordBatch.from_pydict(rows)
        return self.call(node, "write", partition=partition, rows=bytes(encode_batch(batch)))

    def read(self, node: str, partition: str) -> dict[str, list[Any]]:
        reply = self.call(node, "read", partition=partition)
        assert reply.error is None, reply.error
        return dict(decode_batch(reply.result).to_pydict())

    def status(self, node: str) -> dict[str, Any]:
        reply = self.call(node, "status")
        assert reply.error is None
        result: dict[str, Any] = reply.result
        return result

    def leader(self, node: str, partition: str) -> str | None:
        leader: str | None = self.status(node)["partitions"][partition]["leader"]
        return leader
