"""The Spark runtime's row exchange between barrier tasks: under CURVE only the keys of the stage's nodes
reach a task's rows, a message that is not rows is dropped and logged, and a CURVE topology loads its rows
through the exchange, each on the task of its partition's leader."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import zmq
from pyspark import cloudpickle

from sparkbus.bus import security
from sparkbus.roles.replication import PARTITION_COLUMN
from sparkbus.topologies import keys
from sparkbus.topologies.mainjob import KEY, RoutedFrame
from sparkbus.topologies.model import Topology
from sparkbus.topologies.probe import ProbeNode
from sparkbus.topologies.runtime import NodeHandle, NodeRequest
from sparkbus.topologies.schema import load, shipped
from sparkbus.topologies.spark import SparkRuntime
from sparkbus.topologies.spark_task import _exchange_push, _ExchangeInbox, _ipc

from .zmq_peers import WAIT_MS, Sockets, handshake

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _LeaderCheckingNode runs in the tasks

TASKS = ("store-0", "store-1")
LOG = "sparkbus.topologies.spark_task"


def rows(*ids: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({KEY: pa.array(ids, pa.int64())})


def curve_local(tmp_path: Path, *generate: str, allow: Sequence[str] = ()) -> Topology:
    """``local.toml`` with CURVE, its keys written by ``sparkbus keys generate DIR`` with ``generate``."""
    key_dir = tmp_path / "keys"
    security_section = f'[bus.security]\nmode = "curve"\nkey_dir = "{key_dir}"\nallow = {list(allow)!r}\n\n'
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "curve.toml"
    # Without http.client: under CURVE no node serves the HTTP exchange, and validate refuses the role.
    text = shipped("local.toml").read_text().replace(', "http.client"', "")
    path.write_text(text.replace("[spark]\n", security_section + "[spark]\n", 1))
    parser = argparse.ArgumentParser()
    keys.add_parser(parser.add_subparsers(dest="command"))
    argv = ["keys", "generate", str(key_dir), *[a.replace("{topology}", str(path)) for a in generate]]
    assert keys.main(parser.parse_args(argv)) == 0
    return load(path)


#: rows no task sent, and two "done"s: were they taken, a task could end its exchange before its peer's rows
FORGED = (_ipc(rows(-1, -2)).to_pybytes(), b"", b"")
#: how a plain ZeroMQ client's handshake ends, and one's with a key outside the directory
REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def intrude(peers: Sockets, key_dir: str, node_id: str, endpoint: str) -> tuple[int, int]:
    """Connect a plain ZeroMQ PUSH and a CURVE one with a key outside ``key_dir`` to ``node_id``'s row
    exchange at ``endpoint``, each with ``FORGED`` queued; how their first handshakes ended."""
    plain = peers.socket(zmq.PUSH)
    stranger = peers.socket(zmq.PUSH)
    public, secret = zmq.curve_keypair()
    security.apply_client(stranger, security.KeyPair(public, secret), security.server_key(key_dir, node_id))
    return handshake(plain, endpoint, FORGED), handshake(stranger, endpoint, FORGED)


@pytest.fixture
def inboxes() -> Iterator[list[_ExchangeInbox]]:
    opened: list[_ExchangeInbox] = []
    yield opened  # pytest runs the rest whether the test passed or not
    for inbox in opened:
        inbox.close()


def dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Why the row exchange dropped each message it dropped, as it logged."""
    said = [r.getMessage() for r in caplog.records if r.name == LOG]
    return [m.split(": ", 1)[1].split(" (", 1)[0] for m in said if "dropped a message" in m]


def drain_until(
    inbox: _ExchangeInbox, caplog: pytest.LogCaptureFixture, done: int, drops: int
) -> tuple[list[int], int]:
    """Drain ``inbox`` until ``done`` tasks said they are done and ``drops`` messages were dropped (or
    ``WAIT_MS`` passed); the ids received and the tasks done."""
    got: list[pa.RecordBatch] = []
    seen = 0
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        if seen >= done and len(dropped(caplog)) >= drops:
            break
        if inbox.sock.poll(100):
            seen += inbox.drain(got.append)
    return [i for b in got for i in b.column(KEY).to_pylist()], seen


def test_a_curve_inbox_takes_rows_from_the_other_tasks_keys_only(
    tmp_path: Path, inboxes: list[_ExchangeInbox], caplog: pytest.LogCaptureFixture
) -> None:
    topo = curve_local(tmp_path, "--topology", "{topology}")
    inboxes.append(inbox := _ExchangeInbox(topo, TASKS, "store-0", "127.0.0.1"))
    key_dir = str(tmp_path / "keys")
    with Sockets() as peers:
        assert intrude(peers, key_dir, "store-0", inbox.endpoint) == REFUSED
        # The coordinator's key is in the directory, but the coordinator runs no task: admitted, its rows dropped.
        coordinator = peers.socket(zmq.PUSH)
        security.apply_client(
            coordinator, security.node_keys(key_dir, "coordinator"), security.server_key(key_dir, "store-0")
        )
        assert handshake(coordinator, inbox.endpoint, FORGED) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        # store-1's task: what is not rows is dropped, its rows and its "done" are taken.
        task = peers.add(_exchange_push(peers.ctx, topo, ("store-1", "store-0"), inbox.endpoint, 1.0))
        task.send_multipart([b"two", b"frames"])
        task.send(b"not an Arrow stream")
        task.send(_ipc(rows(-3)).to_pybytes()[:-20])  # cut short
        task.send(_ipc(rows(1, 2, 3)))
        task.send(b"")
        ids, done = drain_until(inbox, caplog, done=1, drops=6)
    assert (sorted(ids), done) == ([1, 2, 3], 1)
    assert sorted(dropped(caplog)) == [
        "2 frames, not 1",
        *["not an Arrow IPC stream"] * 2,
        *["on a connection with the key of 'coordinator', which is no other task's node's"] * 3,
    ]


def test_a_plain_inbox_drops_what_is_not_rows_and_takes_the_rest(
    inboxes: list[_ExchangeInbox], caplog: pytest.LogCaptureFixture
) -> None:
    inboxes.append(inbox := _ExchangeInbox(load(shipped("local.toml")), TASKS, "store-1", "127.0.0.1"))
    with Sockets() as peers:
        task = peers.add(_exchange_push(peers.ctx, load(shipped("local.toml")), TASKS, inbox.endpoint, 1.0))
        task.send(b"\xff" * 64)
        task.send(_ipc(rows(7, 8)))
        task.send(b"")
        ids, done = drain_until(inbox, caplog, done=1, drops=1)
    assert (ids, done, dropped(caplog)) == ([7, 8], 1, ["not an Arrow IPC stream"])


def test_a_curve_inbox_takes_the_shared_pair_and_refuses_an_address_outside_allow(
    tmp_path: Path, inboxes: list[_ExchangeInbox], caplog: pytest.LogCaptureFixture
) -> None:
    # One shared "cluster" pair (`sparkbus keys generate DIR`): every task uses it.
    topo = curve_local(tmp_path)
    inboxes.append(inbox := _ExchangeInbox(topo, TASKS, "store-0", "127.0.0.1"))
    with Sockets() as peers:
        task = peers.add(_exchange_push(peers.ctx, topo, ("store-1", "store-0"), inbox.endpoint, 1.0))
        task.send(_ipc(rows(4)))
        task.send(b"")
        assert drain_until(inbox, caplog, done=1, drops=0) == ([4], 1)
    outside = curve_local(tmp_path / "outside", allow=["10.0.0.11"])  # not this machine's loopback
    inboxes.append(guarded := _ExchangeInbox(outside, TASKS, "store-0", "127.0.0.1"))
    with Sockets() as peers:
        push = peers.socket(zmq.PUSH)
        key_dir = str(tmp_path / "outside" / "keys")
        security.apply_client(
            push, security.node_keys(key_dir, "store-1"), security.server_key(key_dir, "store-0")
        )
        assert (
            handshake(push, guarded.endpoint, [_ipc(rows(5)).to_pybytes(), b""])
            == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
    assert guarded.drain(lambda _: pytest.fail("rows from an address outside allow")) == 0


class _LeaderCheckingNode(ProbeNode):
    """A probe that also counts the rows it was fed of a partition another task's node leads (or of none)."""

    def __init__(self, request: NodeRequest, tasks: tuple[str, ...]) -> None:
        super().__init__(request)
        self.tasks = len(tasks)
        self.me = tasks.index(request.node_id) if request.node_id in tasks else -1
        self.misplaced = 0

    def feed(self, batches: Sequence[Any], *, last: bool) -> None:
        for batch in batches:
            if PARTITION_COLUMN not in batch.schema.names:
                self.misplaced += batch.num_rows
                continue
            partition = batch.column(PARTITION_COLUMN).indices.to_numpy()  # names are <table>/<p>, p in order
            self.misplaced += int(np.count_nonzero(partition % self.tasks != self.me))
        super().feed(batches, last=last)

    def counters(self) -> dict[str, Any]:
        return {**super().counters(), "misplaced": self.misplaced}


@dataclass(frozen=True)
class _LeaderCheckingFactory:
    tasks: tuple[str, ...]

    def __call__(self, request: NodeRequest) -> NodeHandle:
        return _LeaderCheckingNode(request, self.tasks)


class _IntrudedRuntime(SparkRuntime):
    """Before the driver answers the tasks' ``rows`` round, each task's row exchange gets ``intrude``d."""

    peers: Sockets
    key_dir: str
    refused: dict[str, tuple[int, int]]

    def _on_task_event(self, node_id: str, event: str, body: dict[str, Any]) -> None:
        if event == "rows":
            self.refused[node_id] = intrude(self.peers, self.key_dir, node_id, body["endpoint"])
        super()._on_task_event(node_id, event, body)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_curve_topology_loads_its_rows_through_the_exchange_each_on_its_leader(
    spark: Any, tmp_path: Path
) -> None:
    topo = curve_local(tmp_path, "--topology", "{topology}")
    partitions = next(t.partitions for t in topo.tables if t.name == "events")
    frame = spark.range(0, 3000, 1, 2).withColumnRenamed("id", KEY)
    # Every row's leader by Spark's own hash: partition p is led by node p % 2 (layout_for).
    leaders = (
        frame.selectExpr(f"pmod(hash({KEY}), {partitions}) % 2 AS task").groupBy("task").count().collect()
    )
    expected = {TASKS[r["task"]]: r["count"] for r in leaders}
    rt = _IntrudedRuntime(
        topo, spark, _LeaderCheckingFactory(TASKS), data=RoutedFrame(frame, partitions), ready_timeout=60
    )
    with Sockets() as peers:
        rt.peers, rt.key_dir, rt.refused = peers, str(tmp_path / "keys"), {}
        with rt:
            results = {r.node: r.counters for r in rt.stop()}
    assert rt.refused == dict.fromkeys(TASKS, REFUSED)
    assert {n: c["rows"] for n, c in results.items()} == {"coordinator": 0, **expected}
    assert {n: c["misplaced"] for n, c in results.items() if n in TASKS} == dict.fromkeys(TASKS, 0)
    assert "store-0:data_received" in rt.timeline
