"""``sparkbus load`` of a declared table that fails after the partitions' leaders took rows (the replication
wait timed out, a write failed part-way) still writes those rows into the compute controller's table, so
views count what SQL counts; when that write fails too, the message says views miss the rows and to load the
file again. The replication wait asks its status again after a transient ``MEMBER_LEAVE``. The routing is
the real ``routed_load`` over stand-in nodes; the views' table is a real ``ComputeController``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ClientError, OperationError
from sparkbus.roles.client.errors import OPERATION_TIMEOUT
from sparkbus.roles.compute import DIFF
from sparkbus.roles.query import ErrorCode as QueryCode
from sparkbus.topologies import cli

from .test_load_routing import LAYOUT, Cluster
from .test_load_views_key import ORDERS, TOPOLOGY, Gateway

ROWS = 1000


class Entry(Gateway):
    """The node the command enters by: SQL over ``sparkbus_replicas`` (``Cluster``) and over the stored
    table, and the compute calls of a real controller."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.status_failures: list[int] = []  # query error codes the next status queries fail with

    def sql(self, text: str, **kw: Any) -> pa.Table:
        if text == "SELECT * FROM orders LIMIT 0":
            return super().sql(text)
        if "replicated" in text and self.status_failures:
            code = self.status_failures.pop(0)
            if code == OPERATION_TIMEOUT:
                raise OperationError(code, "[OPERATION_TIMEOUT] no answer within 5 s")
            raise OperationError(code, f"[{code} {QueryCode(code).name}] member store-0 left the cluster")
        return self.cluster.sql(text, **kw)

    def sql_batches(self, text: str, **_: Any) -> Any:
        """``SELECT * FROM orders``: the rows the leaders took."""
        assert text == "SELECT * FROM orders", text
        return iter(pa.concat_tables(d for _, _, d in self.cluster.writes).to_batches())

    def view_keys(self) -> list[int]:
        """The keys the views' table holds, each once per row counted."""
        updates = self.controller._table_data["orders"].updates
        counted = updates.filter(pc.greater(updates[DIFF], 0))
        retracted = updates.filter(pc.less(updates[DIFF], 0))
        keys = counted["order_id"].to_pylist()
        for k in retracted["order_id"].to_pylist():
            keys.remove(k)
        return sorted(keys)


def stored_keys(cluster: Cluster) -> list[int]:
    return sorted(k for _, _, d in cluster.writes for k in d["order_id"].to_pylist())


@pytest.fixture()
def csv(tmp_path: Path) -> Path:
    path = tmp_path / "orders.csv"
    path.write_text("order_id,amount\n" + "".join(f"{i},{i}.5\n" for i in range(ROWS)))
    return path


def _load(entry: Entry, csv: Path, monkeypatch: pytest.MonkeyPatch, *options: str) -> str:
    monkeypatch.setattr(cli, "partial_connect", lambda args: entry.cluster.connect)
    args = cli.build_parser().parse_args(
        ["load", "orders", str(csv), "--topology", TOPOLOGY, "--timeout", "0", *options]
    )
    return cli._load(entry, args)  # type: ignore[arg-type]


def _failed(entry: Entry, csv: Path, monkeypatch: pytest.MonkeyPatch, *options: str) -> str:
    """The one line a load that fails prints."""
    with pytest.raises(cli.CommandError) as err:
        _load(entry, csv, monkeypatch, *options)
    return str(err.value)


def keyed(cluster: Cluster) -> Entry:
    """An entry whose controller holds the views' table, keyed as an earlier load made it."""
    entry = Entry(cluster)
    entry.create_table("orders", ORDERS, key=["order_id"])
    return entry


def test_rows_written_but_not_replicated_in_time_reach_the_views_table(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keyed(Cluster(LAYOUT))
    entry.cluster.polls_until_replicated = 0
    entry.cluster.unacked = {"orders/0": "store-1", "orders/3": "store-1"}  # their follower is down
    message = _failed(entry, csv, monkeypatch)
    assert message == (
        "rows written, but not replicated within 0 s: orders/0, orders/3 (waiting on store-1). The rows are "
        "stored durably on the leaders and counted: start store-1 if down (sparkbus status), or wait, and "
        "the replicas catch up; the 1,000 rows written went into the compute controller's table orders "
        "too, for views"
    )
    assert stored_keys(entry.cluster) == entry.view_keys() == list(range(ROWS))
    # loading the file again, as the message allows, counts each row once
    entry.cluster.unacked = {}
    _load(entry, csv, monkeypatch)
    assert entry.view_keys() == list(range(ROWS))


def test_a_write_failing_part_way_leaves_the_rows_taken_before_it_in_the_views_table(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "REQUEST_BYTES", 16 * 50)  # about 50 rows a write
    cluster = Cluster(LAYOUT)
    entry = keyed(cluster)
    node = cluster.connect("store-2")
    write = node.write

    def killed_after_two(table: str, data: pa.Table, *, partition: str | None = None) -> Any:
        if sum(1 for n, _, _ in cluster.writes if n == "store-2") == 2:
            raise ClientError(ErrorCode.CONNECTION, "no connection to store-2")
        return write(table, data, partition=partition)

    monkeypatch.setattr(node, "write", killed_after_two)
    message = _failed(entry, csv, monkeypatch)
    taken = stored_keys(cluster)
    assert 0 < len(taken) < ROWS
    assert message == (
        f"[CONNECTION] no connection to store-2; the {len(taken):,} rows written went into the compute "
        "controller's table orders too, for views"
    )
    assert entry.view_keys() == taken


def test_when_the_views_table_cannot_be_written_either_the_message_says_to_load_again(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keyed(Cluster(LAYOUT))
    entry.cluster.polls_until_replicated = 10**9

    def lost(name: str, data: pa.Table) -> Any:
        raise ClientError(ErrorCode.CONNECTION, "no connection to coordinator")

    monkeypatch.setattr(entry, "write_table", lost)
    message = _failed(entry, csv, monkeypatch)
    assert message.endswith(
        "; the compute controller's table orders was not written ([CONNECTION] no connection to "
        "coordinator): views miss the 1,000 rows written; load the file again (rows are upserted by key)"
    ), message
    assert message.startswith("rows written, but not replicated within 0 s: orders/0")


def test_a_views_table_the_controller_lacks_is_made_from_the_stored_rows(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = Entry(Cluster(LAYOUT))
    entry.cluster.polls_until_replicated = 10**9
    message = _failed(entry, csv, monkeypatch)
    assert message.endswith(
        "; the compute controller's table orders was created with every stored row, for views"
    ), message
    assert entry.controller.table_keys["orders"] == ["order_id"]
    assert entry.view_keys() == list(range(ROWS))


def test_nothing_written_leaves_the_views_table_alone_and_no_views_means_none(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keyed(Cluster({p: n for p, n in LAYOUT.items() if p != "orders/4"}))
    with pytest.raises(cli.CommandError, match=r"^table orders: no leader is up for orders/4$"):
        _load(entry, csv, monkeypatch)
    assert entry.view_keys() == []
    timed_out = keyed(Cluster(LAYOUT))
    timed_out.cluster.polls_until_replicated = 10**9
    with pytest.raises(cli.CommandError, match=r"^rows written, but not replicated within 0 s: [^;]*$"):
        _load(timed_out, csv, monkeypatch, "--no-views")
    assert timed_out.view_keys() == []


def test_the_replication_wait_asks_again_after_a_member_left_for_a_moment(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = keyed(Cluster(LAYOUT))
    entry.status_failures = [QueryCode.MEMBER_LEAVE, QueryCode.MEMBER_CONNECTION]
    monkeypatch.setattr(cli, "partial_connect", lambda args: entry.cluster.connect)
    args = cli.build_parser().parse_args(["load", "orders", str(csv), "--topology", TOPOLOGY])
    done = cli._load(entry, args)  # type: ignore[arg-type]
    assert done.startswith("loaded 1,000 rows into orders: 6 of 6 partitions written"), done
    assert entry.status_failures == [] and entry.view_keys() == list(range(ROWS))


def test_the_replication_wait_gives_up_at_its_deadline_or_on_another_error(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left = keyed(Cluster(LAYOUT))
    left.status_failures = [QueryCode.MEMBER_LEAVE] * 10**6
    message = _failed(left, csv, monkeypatch)
    assert message.startswith(
        "rows written, but not replicated within 0 s: orders/0, orders/1, orders/2, orders/3, orders/4, "
        "orders/5 (the last status query failed: [1002 MEMBER_LEAVE] member store-0 left the cluster). The "
        "rows are stored durably on the leaders and counted: start any replica that is down (sparkbus "
        "status), or wait, and the replicas catch up; the 1,000 rows"
    ), message
    assert left.view_keys() == list(range(ROWS))
    other = keyed(Cluster(LAYOUT))
    other.status_failures = [QueryCode.PARSING]
    with pytest.raises(
        cli.CommandError, match=r"^\[1005 PARSING\] member store-0 left the cluster; the 1,000 rows"
    ):
        _load(other, csv, monkeypatch)
    assert other.status_failures == []


def test_a_cluster_that_stops_answering_during_the_wait_ends_the_load_without_the_views_write(
    csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status query timed out (the coordinator went away): each views write would wait its own timeout
    out too (a load with --timeout 20 took 66 s in all), so the load ends at once saying views miss the
    rows."""
    entry = keyed(Cluster(LAYOUT))
    entry.status_failures = [OPERATION_TIMEOUT]
    before = entry.view_keys()
    message = _failed(entry, csv, monkeypatch)
    assert message.endswith(
        "; the compute controller's table orders was not written (the cluster did not answer): views miss "
        "the 1,000 rows written; load the file again once it answers (rows are upserted by key)"
    )
    assert entry.view_keys() == before == []


class _Status:
    """Answers the wait's status query: orders/0 never replicated (a follower down)."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def sql(self, text: str, parameters: Any = (), *, timeout: float = 30.0, **_: Any) -> pa.Table:
        self.timeouts.append(timeout)
        return pa.table({"partition": ["orders/0"], "replicated": [0], "error": [""]})


def test_each_status_query_of_the_wait_is_given_only_what_is_left_of_the_timeout() -> None:
    client = _Status()
    with pytest.raises(cli.CommandError, match=r"not replicated within 0.2 s: orders/0\. The rows are"):
        for _ in cli._until_replicated(client, {"orders/0"}, 0.2, 0.05):  # type: ignore[arg-type]
            pass
    assert client.timeouts and max(client.timeouts) <= 0.2, client.timeouts
