"""Replication roles on SimBus: the production ``NodeCore`` (sessions, streams, credit, peer loss) with
simulated sockets and clock. Each node's stores are ``MemoryStorage``; a crash keeps what was committed
or durably appended (``MemoryStorage.crashed``) and the restarted node gets fresh roles over it.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pyarrow as pa

from sparkbus.bus.sim import SimBus, SimTimeout
from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import MANIFEST, StoreConfig

P = "t/0"
NODES = ("a", "b", "c")
ROLE = "replication"


def spec(*nodes: str, partition: str = P, first_placement: int = 1, **kw: Any) -> PartitionSpec:
    replicas = tuple(Replica(node=n, placement=first_placement + i) for i, n in enumerate(nodes))
    return PartitionSpec(partition=partition, replicas=replicas, **kw)


def config(**store: Any) -> ReplicationConfig:
    """Small thresholds, chunks and credit, so a few rows make segments that travel in many batches."""
    base: dict[str, Any] = {"flush_rows": 4, "compact_minors": 3, "flush_age": 5.0}
    base.update(store)
    return ReplicationConfig(store=StoreConfig(**base), chunk_bytes=300, credit_bytes=900, retry_after=0.5)


class Unreadable:
    """A file object whose reads fail with ``err`` (say EIO), as a failing disk's do; the rest is
    ``file``'s. What a storage's ``open`` returns to fail under Arrow reading a segment's body."""

    def __init__(self, file: Any, err: int) -> None:
        self.file, self.err = file, err

    def read(self, *args: Any) -> bytes:
        raise OSError(self.err, os.strerror(self.err))

    readinto = read1 = read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


class _NodeStorages:
    """A node's stores, as ``NodeData`` gives them: by partition, and which hold a replica's files."""

    def __init__(self, storages: dict[tuple[str, str], MemoryStorage], node: str) -> None:
        self.storages, self.node = storages, node

    def __call__(self, partition: str) -> MemoryStorage:
        return self.storages.setdefault((self.node, partition), MemoryStorage())

    def held(self, partitions: list[str]) -> list[str]:
        return [p for p in partitions if (s := self.storages.get((self.node, p))) and s.exists(MANIFEST)]


class Cluster:
    """Nodes running one ``ReplicationRole`` each on a ``SimBus``."""

    def __init__(
        self,
        specs: list[PartitionSpec],
        cfg: ReplicationConfig | None = None,
        seed: int = 0,
        nodes: tuple[str, ...] = NODES,
        configs: dict[str, ReplicationConfig] | None = None,
    ) -> None:
        self.specs = list(specs)
        self.config = cfg or config()
        self.configs = configs or {}
        self.sim = SimBus(seed=seed)
        self.storages: dict[tuple[str, str], MemoryStorage] = {}
        self.nodes = nodes
        for n in nodes:
            self.sim.add_node(n, [self._role(n)])
        self.sim.start()
        self.sim.run_until(self.sim.all_up, limit=5)

    def _role(self, node: str) -> ReplicationRole:
        cfg = self.configs.get(node, self.config)
        return ReplicationRole(
            node, Layout.of(copy.deepcopy(self.specs)), _NodeStorages(self.storages, node), cfg
        )

    # ------------------------------------------------------------ faults

    def alive(self, node: str) -> bool:
        return self.sim.node(node).alive

    def crash(self, node: str, *, notify: bool = True) -> None:
        """SIGKILL (peers see the disconnect; without ``notify`` only silence): what was not committed or
        synced is lost. A peer whose armed storage crash struck while it handled the disconnect dies too."""
        if not self.alive(node):
            return
        self.sim.crash(node, notify=notify)
        for (owner, part), storage in list(self.storages.items()):
            if owner == node:
                self.storages[owner, part] = storage.crashed()
        self.reap_struck()

    def lose_disk(self, node: str) -> None:
        """SIGKILL, then a restart on empty storage: the disk was lost, or the node moved to a machine
        without its data directory. The layout (from the topology) still gives it its old placements."""
        self.crash(node)
        for owner, part in list(self.storages):
            if owner == node:
                self.storages[owner, part] = MemoryStorage()
        self.restart(node)

    def restart(self, node: str) -> None:
        if self.alive(node):
            return
        self.sim.restart(node, [self._role(node)])
        self.reap_struck()

    def cut(self, a: str, b: str, *, notify: bool = True) -> None:
        """With ``notify`` both sides handle the disconnect at once: a node struck meanwhile dies."""
        self.sim.cut(a, b, notify=notify)
        self.reap_struck()

    def heal(self, a: str, b: str) -> None:
        self.sim.heal(a, b)

    # ------------------------------------------------------------ running

    def settle(self, seconds: float) -> None:
        """Run the simulated clock on (ticks, heartbeats, handshakes, transfers)."""
        self.sim.run_for(seconds)

    def reap_struck(self) -> list[str]:
        """Crash every live node whose storage an armed crash struck (``MemoryStorage.arm_crash``): the
        node core survives a failing role, a process does not. Returns the nodes crashed.

        Every operation that lets a node handle events calls it: ``run`` after each step, ``write`` and
        ``leader`` after their call, ``crash`` and ``cut``, whose disconnect notices the peers handle at
        once (inside ``SimBus.crash``/``cut``), and ``restart``. A struck node left alive would go on
        handling events with a dead storage, which no real process does."""
        struck = sorted({n for (n, _), st in self.storages.items() if st.struck and self.alive(n)})
        for n in struck:
            self.crash(n)
        return struck

    def run(self, seconds: float) -> None:
        """Like ``settle``, but a node dies at the step its storage is struck."""
        until = self.sim.now + seconds

        def done() -> bool:
            self.reap_struck()
            return self.sim.now >= until

        try:
            self.sim.run_until(done, limit=seconds + 5)
        except SimTimeout:
            self.sim.run(until)  # nothing is scheduled: every node is down

    def quiet(self) -> bool:
        """No transfer in progress on any live node."""
        return all(not r.outgoing and not r.incoming for r in self.live_roles().values())

    def live_roles(self) -> dict[str, ReplicationRole]:
        return {n: self.role(n) for n in self.nodes if self.alive(n)}

    def role(self, node: str) -> ReplicationRole:
        role = self.sim.node(node).roles[ROLE]
        assert isinstance(role, ReplicationRole)
        return role

    def role_errors(self) -> dict[str, int]:
        """Per live node: errors the node core saw raised by the role, and those the role caught itself
        (``handle``, each replica's procedures and each replica's opening log and count what they raise
        instead)."""
        errors = {}
        for n in self.nodes:
            if self.alive(n):
                caught = self.role(n).counters
                raised = self.sim.node(n).core.counters["role_errors"]
                errors[n] = raised + sum(
                    caught.get(k, 0) for k in ("handler_errors", "procedure_errors", "open_errors")
                )
        return errors

    def assert_clean(self) -> None:
        """Nothing in transit and no role raised (a role error would mean a protocol bug)."""
        assert self.quiet(), {n: (r.outgoing, r.incoming) for n, r in self.live_roles().items()}
        assert set(self.role_errors().values()) == {0}, self.role_errors()

    # ------------------------------------------------------------ calls

    def call(self, node: str, name: str, **args: Any) -> Any:
        """A local call, answered within the same simulated step; raises RuntimeError with its error."""
        return self.sim.result(self.sim.call(node, ROLE, name, args), limit=1)

    def try_call(self, node: str, name: str, **args: Any) -> tuple[Any, str | None]:
        cid = self.sim.call(node, ROLE, name, args)
        done = self.sim.reply(cid)
        if done is None:  # the role raised while handling it: no answer
            return None, f"{node}: no answer"
        return done.result, done.error

    def write(self, node: str, partition: str, rows: dict[str, list[Any]]) -> tuple[Any, str | None]:
        batch = pa.RecordBatch.from_pydict(rows)
        return self.try_call(node, "write", partition=partition, rows=bytes(encode_batch(batch)))

    def write_keys(self, node: str, keys: range, tag: str = "v", partition: str = P) -> list[int]:
        acked = []
        for k in keys:
            _, error = self.write(node, partition, {"key": [k], "v": [f"{tag}{k}"]})
            if error is None:
                acked.append(k)
        return acked

    def read(self, node: str, partition: str = P) -> dict[str, list[Any]]:
        return dict(decode_batch(self.call(node, "read", partition=partition)).to_pydict())

    def status(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call(node, "status")
        return result

    def counters(self, node: str) -> dict[str, int]:
        counters: dict[str, int] = self.status(node)["counters"]
        return counters

    def leader(self, node: str, partition: str = P) -> str | None:
        """Whom ``node`` names leader (None if an armed crash struck it while answering)."""
        status, error = self.try_call(node, "status")
        if error is not None:
            assert self.reap_struck() == [node], error
            return None
        leader: str | None = status["partitions"][partition]["leader"]
        return leader

    def assert_identical(
        self, nodes: tuple[str, ...] | list[str], keys: list[int], partition: str = P
    ) -> None:
        first = self.read(nodes[0], partition)
        assert sorted(first.get("key", [])) == sorted(keys), (nodes[0], sorted(first.get("key", [])))
        for n in nodes[1:]:
            assert self.read(n, partition) == first, n
