"""``sparkbus load`` of a table the topology declares: rows split by Spark's partition rule, each partition
written through its current leader's gateway (a follower's refusal followed once), flushed, and waited for
until replicated; the errors a user can fix are one ``CommandError`` line. Fake clients, no cluster (the
real one: tests/integration/topologies/test_cli_cluster.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ClientError
from sparkbus.topologies import cli, shipped
from sparkbus.topologies.cli import (
    CommandError,
    current_leaders,
    leader_in_refusal,
    not_replicated,
    routed_load,
    write_partition,
)
from sparkbus.topologies.model import TableSpec
from sparkbus.topologies.partitioning import partition_of

ORDERS = TableSpec(name="orders", partitions=6, replication=2, key=("order_id",))
LAYOUT = {f"orders/{p}": f"store-{p % 3}" for p in range(6)}
FAILING = pa.schema([("node", pa.string()), ("partition", pa.string()), ("failing", pa.string())])


def refusal(node: str, partition: str, leader: str | None) -> ClientError:
    return ClientError(ErrorCode.PROTOCOL, f"{node} is not the leader of {partition}; leader: {leader}")


class Node:
    """A node's gateway as ``Client`` offers it: ``write`` and ``flush`` recorded or refused."""

    def __init__(self, name: str, cluster: Cluster) -> None:
        self.name, self.cluster = name, cluster
        self.closed = False

    def write(self, table: str, data: pa.Table, *, partition: str | None = None) -> Any:
        assert partition is not None
        leader = self.cluster.leaders.get(partition)
        if leader != self.name:
            self.cluster.refused += 1
            raise refusal(self.name, partition, leader)
        self.cluster.writes.append((self.name, partition, data))
        return {"rows": data.num_rows}

    def flush(self, partition: str) -> str | None:
        self.cluster.flushed.append((self.name, partition))
        return "1.1"

    def close(self) -> None:
        self.closed = True


class Cluster:
    """The coordinator's ``sql`` over ``sparkbus_replicas``, and the nodes' gateways."""

    def __init__(self, leaders: dict[str, str], *, advertised: dict[str, str] | None = None) -> None:
        self.leaders = dict(leaders)  # who really leads
        self.advertised = dict(leaders if advertised is None else advertised)  # what sparkbus_replicas says
        self.writes: list[tuple[str, str, pa.Table]] = []
        self.flushed: list[tuple[str, str]] = []
        self.nodes: dict[str, Node] = {}
        self.polls_until_replicated = 2
        self.refused = 0
        self.error = ""
        self.failing: list[dict[str, str]] = []  # sparkbus_replicas rows of replicas that fail
        self.unacked: dict[
            str, str
        ] = {}  # partition -> the replicas that have not acked it: never replicated

    def sql(self, text: str, **_: Any) -> pa.Table:
        if "WHERE failing <> ''" in text:
            return pa.Table.from_pylist(self.failing, schema=FAILING)
        assert "FROM sparkbus_replicas WHERE leader = 1" in text
        if "replicated" in text:
            self.polls_until_replicated -= 1
            done = self.polls_until_replicated <= 0
            rows = [
                {
                    "partition": p,
                    "replicated": int(done and not self.unacked.get(p)),
                    "error": self.error,
                    "unacked": self.unacked.get(p, ""),
                }
                for p in self.advertised
            ]
            return pa.Table.from_pylist(rows)
        return pa.Table.from_pylist(
            [{"node": n, "partition": p} for p, n in self.advertised.items()]
            + [{"node": "store-0", "partition": "other/0"}]
        )

    def connect(self, node: str) -> Node:
        self.nodes.setdefault(node, Node(node, self))
        return self.nodes[node]


def orders(n: int) -> pa.Table:
    return pa.table({"order_id": pa.array(range(n), pa.int64()), "amount": [float(i) for i in range(n)]})


def load(cluster: Cluster, rows: pa.Table, **kw: Any) -> str:
    return routed_load(
        cluster,  # type: ignore[arg-type]
        ORDERS,
        rows,
        cluster.connect,  # type: ignore[arg-type]
        timeout=kw.pop("timeout", 5.0),
        path="orders.csv",
        poll=0.0,
        **kw,
    )


def test_every_row_goes_to_its_partition_through_the_leader_then_waits_for_replication() -> None:
    cluster = Cluster(LAYOUT)
    message = load(cluster, orders(1000))
    got: dict[str, list[int]] = {}
    for node, partition, data in cluster.writes:
        assert LAYOUT[partition] == node
        got.setdefault(partition, []).extend(data.column("order_id").to_pylist())
    assert sorted(i for ids in got.values() for i in ids) == list(range(1000))  # every row exactly once
    for partition, ids in got.items():
        index = partition_of(pa.table({"order_id": pa.array(ids, pa.int64())}), ["order_id"], 6)
        assert {f"orders/{p}" for p in index.tolist()} == {partition}
    assert sorted(cluster.flushed) == sorted((LAYOUT[p], p) for p in got)  # each written partition, once
    assert cluster.polls_until_replicated <= 0
    assert all(node.closed for node in cluster.nodes.values())
    assert message.startswith(
        "loaded 1,000 rows into orders: 6 of 6 partitions written through their leaders"
    )


def test_rows_go_in_slices_of_request_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "REQUEST_BYTES", 16 * 50)  # 16 bytes a row: about 50 rows a request
    cluster = Cluster(LAYOUT)
    load(cluster, orders(1000))
    assert max(data.num_rows for _, _, data in cluster.writes) <= 50
    assert sum(data.num_rows for _, _, data in cluster.writes) == 1000


def test_a_moved_leader_is_followed_once_and_kept_for_later_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "REQUEST_BYTES", 16 * 50)
    moved = {**LAYOUT, "orders/0": "store-1"}  # store-0 was down for a moment: store-1 leads orders/0
    cluster = Cluster(moved, advertised=LAYOUT)
    message = load(cluster, orders(1000))
    zero = [node for node, partition, _ in cluster.writes if partition == "orders/0"]
    assert len(zero) > 1 and set(zero) == {"store-1"}
    assert cluster.refused == 1  # the first slice was refused; the later ones went to store-1 directly
    assert ("store-1", "orders/0") in cluster.flushed
    assert "(store-0, store-1, store-2)" in message
    assert sum(d.num_rows for _, _, d in cluster.writes) == 1000


def test_write_partition_follows_a_refusal_only_once() -> None:
    cluster = Cluster({"orders/1": "store-2"})
    assert write_partition(cluster.connect, "orders", "orders/1", "store-0", orders(3)) == "store-2"  # type: ignore[arg-type]
    assert [(n, p) for n, p, _ in cluster.writes] == [("store-2", "orders/1")]

    class Stale:
        """A follower whose idea of the leader is itself stale: it names another follower."""

        def __init__(self, name: str, names: str) -> None:
            self.name, self.names, self.calls = name, names, 0

        def write(self, table: str, data: pa.Table, *, partition: str | None = None) -> Any:
            self.calls += 1
            raise refusal(self.name, "orders/1", self.names)

    nodes = {"store-0": Stale("store-0", "store-1"), "store-1": Stale("store-1", "store-2")}
    with pytest.raises(ClientError, match="store-1 is not the leader of orders/1; leader: store-2"):
        write_partition(nodes.__getitem__, "orders", "orders/1", "store-0", orders(3))  # type: ignore[arg-type]
    assert nodes["store-0"].calls == 1 and nodes["store-1"].calls == 1


def test_refusals_without_a_leader_are_raised() -> None:
    cluster = Cluster({"orders/1": None})  # type: ignore[dict-item]
    with pytest.raises(ClientError, match="leader: None"):
        write_partition(cluster.connect, "orders", "orders/1", "store-1", orders(3))  # type: ignore[arg-type]
    assert leader_in_refusal(refusal("a", "orders/1", "store-2")) == "store-2"
    assert leader_in_refusal(refusal("a", "orders/1", None)) is None
    assert leader_in_refusal(ClientError(ErrorCode.PROTOCOL, "write: schema mismatch")) is None


def test_no_replication_node_up_is_one_line() -> None:
    with pytest.raises(CommandError, match=r"^table orders: no replication node is up"):
        current_leaders(Cluster({}), ORDERS)  # type: ignore[arg-type]

    class NoCatalog:
        def sql(self, text: str, **_: Any) -> pa.Table:
            raise ClientError(ErrorCode.PROTOCOL, "[1005 PARSING] no table sparkbus_replicas")

    with pytest.raises(CommandError, match="no replication node is up"):
        current_leaders(NoCatalog(), ORDERS)  # type: ignore[arg-type]
    assert current_leaders(Cluster(LAYOUT), ORDERS) == LAYOUT  # type: ignore[arg-type]


def test_bad_rows_are_refused_before_anything_is_written() -> None:
    cluster = Cluster(LAYOUT)
    with pytest.raises(CommandError, match=r"^orders.csv: the rows have no key column order_id"):
        load(cluster, pa.table({"id": [1, 2]}))
    with pytest.raises(CommandError, match=r"^orders.csv: key column order_id has 1 null value"):
        load(cluster, pa.table({"order_id": pa.array([1, None], pa.int64())}))
    missing = Cluster({p: n for p, n in LAYOUT.items() if p != "orders/4"})
    with pytest.raises(CommandError, match=r"no leader is up for orders/4$"):
        load(missing, orders(100))
    assert cluster.writes == [] and missing.writes == []


def test_a_partition_without_a_leader_names_its_failing_replicas() -> None:
    """The only replica of orders/4 cannot be opened: the message says so, not only "no leader is up"."""
    missing = Cluster({p: n for p, n in LAYOUT.items() if p != "orders/4"})
    missing.failing = [
        {"node": "store-1", "partition": "orders/4", "failing": "cannot open: OSError: [Errno 5] I/O error"},
        {"node": "store-2", "partition": "other/0", "failing": "cannot open: not this table"},
    ]
    with pytest.raises(CommandError) as err:
        load(missing, orders(100))
    assert str(err.value) == (
        "table orders: no leader is up for orders/4 "
        "(store-1: orders/4: cannot open: OSError: [Errno 5] I/O error)"
    )
    assert missing.writes == []


def test_replica_errors_and_timeouts_end_the_wait() -> None:
    failing = Cluster(LAYOUT)
    failing.error = "store-1: writing to orders/4 failed: disk full"
    with pytest.raises(CommandError, match="disk full"):
        load(failing, orders(100))
    slow = Cluster(LAYOUT)
    slow.polls_until_replicated = 10**9
    with pytest.raises(CommandError, match=r"not replicated within 0 s: orders/0, orders/1"):
        load(slow, orders(100), timeout=0.0)


def test_a_timed_out_wait_names_the_replicas_each_partition_waits_on() -> None:
    """store-1, the follower of orders/0 and orders/3, is down: the message names it (from the leaders'
    ``unacked`` column), once for both, and says the rows are kept and what to do."""
    down = Cluster(LAYOUT)
    down.polls_until_replicated = 0
    down.unacked = {"orders/0": "store-1", "orders/3": "store-1"}
    with pytest.raises(CommandError) as err:
        load(down, orders(100), timeout=0.0)
    assert str(err.value) == (
        "rows written, but not replicated within 0 s: orders/0, orders/3 (waiting on store-1). The rows are "
        "stored durably on the leaders and counted: start store-1 if down (sparkbus status), or wait, and "
        "the replicas catch up"
    )


def test_the_not_replicated_message_stays_short_for_many_partitions() -> None:
    unacked = {f"t/{p}": "s-3" for p in range(100)} | {f"u/{p}": f"s-{p}, s-9" for p in range(6)}
    message = not_replicated(20, unacked, unacked | {"t/0": ""}, " (the last status query failed: x)")
    assert message == (
        "rows written, but not replicated within 20 s: t/1, t/2, t/3, t/4, t/5, t/6, t/7, t/8 and 91 more "
        "(waiting on s-3), u/0 (waiting on s-0, s-9), u/1 (waiting on s-1, s-9), u/2 (waiting on s-2, s-9), "
        "and 4 more partitions (the last status query failed: x). The rows are "
        "stored durably on the leaders and counted: start s-0, s-1, s-2, s-3, s-4, s-5, s-9 if down "
        "(sparkbus status), or wait, and the replicas catch up"
    )


def test_which_tables_are_routed() -> None:
    parser = cli.build_parser()
    topology = str(shipped("processes.toml"))
    routed = cli._topology_table(parser.parse_args(["load", "orders", "x.csv", "--topology", topology]))
    assert routed == ORDERS
    assert cli._topology_table(parser.parse_args(["load", "events", "x.csv", "--topology", topology])) is None
    by_address = [
        "load",
        "orders",
        "x.csv",
        "--address",
        "tcp://127.0.0.1:1",
        "--cluster-tag",
        "processes/dev",
    ]
    assert cli._topology_table(parser.parse_args(by_address)) is None  # no topology: the gateway's catalog
    assert cli._topology_table(parser.parse_args([*by_address, "--topology", topology])) == ORDERS
