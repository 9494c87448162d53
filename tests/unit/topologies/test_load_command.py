"""``sparkbus load`` as a whole (``cli._load`` and the clients ``_connect`` opens) with a fake client: which
node each request goes to, and that a file the tables do not take is refused before anything is written.
No cluster (the real one: tests/integration/topologies/test_cli_load.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.client import Op, OperationError
from sparkbus.topologies import cli, shipped
from sparkbus.topologies import client as client_module
from sparkbus.topologies.client import TopologyTarget

TOPOLOGY = str(shipped("processes.toml"))


class Gateway:
    """What ``_load`` asks of a client: the SQL catalog's and the compute controller's table ``ev``."""

    def __init__(self, sql: pa.Schema | None, views: pa.Schema | None) -> None:
        self.sql_schema, self.views_schema = sql, views
        self.sent: list[tuple[str, Any]] = []

    def sql(self, text: str, **_: Any) -> pa.Table:
        assert text == "SELECT * FROM ev LIMIT 0", text
        if self.sql_schema is None:
            raise OperationError(1, "[1003 TABLE_NOT_FOUND] table ev not found")
        return self.sql_schema.empty_table()

    def peek(self, view: str, **args: Any) -> pa.Table:
        assert view == "ev" and args == {"finishing": {"limit": 0}}, (view, args)
        if self.views_schema is None:
            raise OperationError(1, "peek: no table or view named 'ev'")
        return self.views_schema.empty_table()

    def call(self, op: int, args: dict[str, Any], **_: Any) -> int:
        assert op == Op.LOAD
        self.sent.append(("load", args))
        return 1

    def create_table(self, name: str, schema: pa.Schema, key: Any = None) -> dict[str, Any]:
        if self.views_schema is not None:
            raise OperationError(1, f"create_table: {name!r} already exists")
        self.sent.append(("create_table", schema))
        return {"upper": 1}

    def write_table(self, name: str, data: pa.Table) -> int:
        if self.views_schema is not None and not data.schema.equals(self.views_schema):
            raise OperationError(1, f"write: schema {data.schema} is not the table's")
        self.sent.append(("write_table", data))
        return 1


EV = pa.schema([("event_id", pa.int64()), ("kind", pa.string()), ("value", pa.float64())])


def load(gateway: Gateway, tmp_path: Path, csv: str, *options: str) -> str:
    path = tmp_path / "b.csv"
    path.write_text(csv)
    args = cli.build_parser().parse_args(["load", "ev", str(path), "--topology", TOPOLOGY, *options])
    return cli._load(gateway, args)  # type: ignore[arg-type]


def test_replace_checks_the_views_table_before_the_sql_table_is_replaced(tmp_path: Path) -> None:
    other_columns = Gateway(EV, EV)
    with pytest.raises(cli.CommandError, match=r"compute controller's table ev .*not in the table: colour"):
        load(other_columns, tmp_path, "event_id,kind,value,colour\n9,click,7.5,red\n", "--replace")
    assert other_columns.sent == []  # the SQL table was not replaced
    # `value` reads as int64 from this file: cast to the views' double, the SQL table takes the file as it is
    ints = Gateway(EV, EV)
    load(ints, tmp_path, "event_id,kind,value\n9,click,7\n", "--replace")
    assert [what for what, _ in ints.sent] == ["load", "write_table"]
    assert ints.sent[0][1]["replace"] is True
    assert ints.sent[1][1].schema.equals(EV)
    # --no-views: the SQL table alone is replaced, with the file's columns
    alone = Gateway(EV, EV)
    load(alone, tmp_path, "event_id,kind,value,colour\n9,click,7.5,red\n", "--replace", "--no-views")
    assert [what for what, _ in alone.sent] == ["load"]


def test_a_file_the_views_table_does_not_take_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    # the SQL table takes it (it was loaded with --no-views), the compute controller's table does not
    wider = EV.append(pa.field("colour", pa.string()))
    gateway = Gateway(wider, EV)
    with pytest.raises(cli.CommandError, match=r"compute controller's table ev"):
        load(gateway, tmp_path, "event_id,kind,value,colour\n9,click,7.5,red\n")
    assert gateway.sent == []
    fresh = Gateway(None, None)  # neither table exists: created from the file
    load(fresh, tmp_path, "event_id,kind,value\n9,click,7\n")
    assert [what for what, _ in fresh.sent] == ["load", "create_table", "write_table"]


def test_a_declared_table_by_address_and_topology_goes_to_each_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --address is where the command enters; a partition's rows go to its leader's gateway, found by topology
    found = TopologyTarget(
        addresses=["tcp://c"],
        cluster_tag="processes/dev",
        nodes={"tcp://c": "coordinator", "tcp://s1": "store-1"},
        key_dir=None,
        run_dir_keys=False,
        gateways={"coordinator": "tcp://c", "store-1": "tcp://s1"},
    )
    opened: list[tuple[Any, str]] = []

    def client(addresses: list[str], **kw: Any) -> str:
        opened.append((addresses, kw["cluster_tag"]))
        return "leader"

    def connect(target: Any, **kw: Any) -> str:
        opened.append((target, kw["cluster_tag"]))
        return "entry"

    monkeypatch.setattr(client_module, "topology_target", lambda path: found)
    monkeypatch.setattr(client_module, "Client", client)
    monkeypatch.setattr(client_module, "connect", connect)
    where = ["--address", "tcp://c", "--cluster-tag", "processes/dev", "--topology", TOPOLOGY]
    args = cli.build_parser().parse_args(["load", "orders", "x.csv", *where])
    assert cli._topology_table(args) is not None  # orders is declared: routed
    assert cli._connect(args) == "entry"
    assert cli.partial_connect(args)("store-1") == "leader"
    assert opened == [("tcp://c", "processes/dev"), (["tcp://s1"], "processes/dev")]


def test_a_declared_table_by_address_needs_the_topologys_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no cluster recorded as running here
    where = ["--address", "tcp://c", "--cluster-tag", "processes/dev", "--topology", TOPOLOGY]
    args = cli.build_parser().parse_args(["load", "orders", "x.csv", *where])
    with pytest.raises(cli.CommandError, match=r"table orders is declared in .*no running cluster recorded"):
        cli.partial_connect(args)
