"""``BusNodeHandle.feed``: rows handed to a running node reach the roles that take them, refusals surface."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sparkbus.codecs import decode_batch
from sparkbus.roles.replication import PARTITION_COLUMN
from sparkbus.roles.replication.factory import DATA_DIR_ENV, DataDirInUse
from sparkbus.topologies.busnode import BusNodeHandle
from sparkbus.topologies.runtime import NodeRequest
from sparkbus.topologies.schema import loads

pytestmark = pytest.mark.integration

TOPO = """
[cluster]
name = "feed"
[bus]
host = "127.0.0.1"
[[nodes]]
name = "s"
placement = "host"
host = "127.0.0.1"
roles = ["replication", "query"]
[tables.t]
partitions = 2
replication = 1
key = "id"
"""


@pytest.fixture
def node() -> Iterator[BusNodeHandle]:
    handle = BusNodeHandle(NodeRequest(node_id="s", topology=loads(TOPO), advertise_host="127.0.0.1"))
    handle.bind()
    handle.set_peers({})
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


def rows(ids: list[int], partition: str | None = None) -> list[pa.RecordBatch]:
    names = [partition or f"t/{i % 2}" for i in ids]
    return pa.table({"id": ids, "v": [i * 0.5 for i in ids], PARTITION_COLUMN: names}).to_batches()


def held(node: BusNodeHandle, partition: str) -> list[int]:
    batch = decode_batch(node.call("replication", "read", {"partition": partition}, timeout=10))
    return sorted(batch.column("id").to_pylist())


def test_fed_rows_are_written_to_the_partitions_the_node_leads(node: BusNodeHandle) -> None:
    node.feed(rows([0, 1, 2]), last=False)
    node.feed(rows([3, 4]), last=False)
    node.feed((), last=True)  # returns once the role has taken every row (it writes a chunk per turn)
    deadline = time.monotonic() + 10
    while held(node, "t/1") != [1, 3] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held(node, "t/0") == [0, 2, 4]
    assert held(node, "t/1") == [1, 3]


def test_a_refusal_is_raised_by_the_last_feed_at_the_latest(node: BusNodeHandle) -> None:
    with pytest.raises(RuntimeError, match="nosuch/0, which the layout does not have"):
        # The first call raises only if the role has answered by the time it looks (a race either way);
        # otherwise the last call, which waits for every answer, must.
        node.feed(rows([7], partition="nosuch/0"), last=False)
        node.feed(rows([1]), last=True)


def test_a_node_stopped_and_started_again_in_one_process_opens_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reused Spark worker, or a restarted node: with SPARKBUS_DATA_DIR set, stopping the node releases
    its data directory, and the next node of that id (here in the same process) serves the rows again."""
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    first = BusNodeHandle(NodeRequest(node_id="s", topology=loads(TOPO), advertise_host="127.0.0.1"))
    try:
        with pytest.raises(DataDirInUse, match="in use by another process"):
            BusNodeHandle(NodeRequest(node_id="s", topology=loads(TOPO), advertise_host="127.0.0.1"))
        first.bind()
        first.set_peers({})
        first.start()
        first.feed(rows([0, 1, 2]), last=True)
        deadline = time.monotonic() + 10
        while held(first, "t/1") != [1] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        first.stop()
    again = BusNodeHandle(NodeRequest(node_id="s", topology=loads(TOPO), advertise_host="127.0.0.1"))
    try:
        again.bind()
        again.set_peers({})
        again.start()
        assert held(again, "t/0") == [0, 2]
        assert held(again, "t/1") == [1]
    finally:
        again.stop()
