"""``sparkbus load`` of a declared table into the compute controller's table that views read: rows the
replicated store upserts by key go to an upsert table, and a table that exists without a key (a client's
``create_table``) is refused before anything is written, as it would append them. The controller is the
real ``ComputeController``; the SQL table and the write through the partitions' leaders stand in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkbus.bus.contract import LocalCall, Reply
from sparkbus.codecs import encode_batch
from sparkbus.roles.client import OperationError
from sparkbus.roles.compute import DIFF, ComputeController
from sparkbus.topologies import cli, shipped

TOPOLOGY = str(shipped("processes.toml"))  # declares `orders`, key order_id
ORDERS = pa.schema([("order_id", pa.int64()), ("amount", pa.float64())])


class Gateway:
    """A client whose compute calls a real controller answers (as the gateway passes them on)."""

    def __init__(self) -> None:
        self.controller = ComputeController(replicas=["r"])
        self.calls = 0

    def _call(self, call: str, **args: Any) -> Any:
        self.calls += 1
        actions = self.controller.handle(LocalCall(call_id=self.calls, name=call, args=args), 0.0)
        [reply] = [a for a in actions if isinstance(a, Reply)]
        if reply.error is not None:
            raise OperationError(1, reply.error)
        return reply.result

    def sql(self, text: str, **_: Any) -> pa.Table:
        assert text == "SELECT * FROM orders LIMIT 0", text
        return ORDERS.empty_table()  # the replicated table holds rows already

    def peek(self, view: str, **_: Any) -> pa.Table:
        if view not in self.controller.tables:
            raise OperationError(1, f"peek: no table or view named {view!r}")
        return self.controller.tables[view].empty_table()

    def create_table(self, name: str, schema: pa.Schema, key: Any = None) -> Any:
        return self._call("create_table", name=name, schema=schema, key=None if key is None else list(key))

    def write_table(self, name: str, data: pa.Table) -> Any:
        batch = (
            data.combine_chunks().to_batches()[0]
            if data.num_rows
            else pa.RecordBatch.from_pylist([], data.schema)
        )
        return self._call("write", table=name, batch=bytes(encode_batch(batch)))

    def rows(self, table: str) -> int:
        """The rows the controller's table holds (its updates' multiplicities)."""
        return int(pc.sum(self.controller._table_data[table].updates[DIFF]).as_py() or 0)


@pytest.fixture()
def routed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows each load wrote through the partitions' leaders."""
    written: list[int] = []

    def routed_load(client: Any, spec: Any, rows: pa.Table, *_: Any, **__: Any) -> str:
        written.append(rows.num_rows)
        return f"loaded {rows.num_rows} rows into {spec.name}"

    monkeypatch.setattr(cli, "routed_load", routed_load)
    return written


def _load(gateway: Gateway, tmp_path: Path, *options: str) -> str:
    path = tmp_path / "orders.csv"
    path.write_text("order_id,amount\n1,1.5\n2,2.5\n3,3.5\n")
    args = cli.build_parser().parse_args(["load", "orders", str(path), "--topology", TOPOLOGY, *options])
    return cli._load(gateway, args)  # type: ignore[arg-type]


def test_a_views_table_created_without_a_key_is_refused_before_anything_is_written(
    tmp_path: Path, routed: list[int]
) -> None:
    gateway = Gateway()
    gateway.create_table("orders", ORDERS)  # no key: it appends
    with pytest.raises(cli.CommandError) as err:
        _load(gateway, tmp_path)
    assert str(err.value) == (
        "the compute controller's table orders was created without a key, so it would append the rows orders "
        "upserts by order_id (views would count a key loaded twice as two rows): load with --no-views, or "
        "start the cluster again (the controller keeps its tables in memory)"
    )
    assert routed == [] and gateway.rows("orders") == 0
    # without the views' table the store takes the file
    assert _load(gateway, tmp_path, "--no-views") == "loaded 3 rows into orders"
    assert routed == [3] and gateway.rows("orders") == 0


def test_a_views_table_keyed_as_the_table_counts_a_file_loaded_twice_once(
    tmp_path: Path, routed: list[int]
) -> None:
    gateway = Gateway()
    gateway.create_table("orders", ORDERS, key=["order_id"])  # as a first load or `view create` makes it
    for _ in range(2):
        done = _load(gateway, tmp_path)
        assert done.endswith("into the compute controller's table orders for views (upserted by order_id)"), (
            done
        )
    assert routed == [3, 3] and gateway.rows("orders") == 3
