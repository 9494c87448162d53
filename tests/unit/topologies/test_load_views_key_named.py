"""``sparkbus load`` of a declared table learns the key of the compute controller's table from the
controller's refusal to create it again (``'orders' already exists: a table keyed by ['order_id']``) and
compares it with the topology's: a table keyed otherwise, or without a key, or a view of that name, is
refused before anything is written, and asking changes nothing in the controller. The controller is the real
``ComputeController``; the write through the partitions' leaders stands in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkbus.roles.client import OperationError
from sparkbus.roles.compute import Aggregate, ViewDef
from sparkbus.topologies import cli

from .test_load_views_key import ORDERS, Gateway, _load, routed

__all__ = ["routed"]  # the fixture the tests take

STOP = "load with --no-views, or start the cluster again (the controller keeps its tables in memory)"


class Views(Gateway):
    """A gateway whose peek also reads a view's columns, as the controller's peek does."""

    def peek(self, view: str, **kw: Any) -> pa.Table:
        id = self.controller.views.get(view)
        if id is None:
            return super().peek(view, **kw)
        return self.controller.collections[id].schema.empty_table()


def _refused(gateway: Gateway, tmp_path: Path) -> str:
    upper = gateway.controller.upper
    with pytest.raises(cli.CommandError) as err:
        _load(gateway, tmp_path)
    assert gateway.controller.upper == upper  # no write, not even one of no rows
    return str(err.value)


def test_a_views_table_keyed_by_another_key_is_refused_naming_it(tmp_path: Path, routed: list[int]) -> None:
    gateway = Views()
    gateway.create_table("orders", ORDERS, key=["amount"])
    assert _refused(gateway, tmp_path) == (
        "the compute controller's table orders was created keyed by amount, while orders upserts by order_id "
        f"(views would not count the rows SQL counts): {STOP}"
    )
    assert routed == [] and gateway.rows("orders") == 0


def test_a_views_table_without_a_key_is_refused_without_a_write(tmp_path: Path, routed: list[int]) -> None:
    gateway = Views()
    gateway.create_table("orders", ORDERS)
    assert _refused(gateway, tmp_path) == (
        "the compute controller's table orders was created without a key, so it would append the rows orders "
        f"upserts by order_id (views would count a key loaded twice as two rows): {STOP}"
    )
    assert routed == []


def test_a_view_named_like_the_table_is_refused(tmp_path: Path, routed: list[int]) -> None:
    gateway = Views()
    gateway.create_table("src", ORDERS)
    view = ViewDef(source="src", aggregates=(Aggregate(func="count", column=None, name="n"),))
    gateway._call("create_view", name="orders", view=view)
    assert _refused(gateway, tmp_path) == (
        "the compute controller's orders is a view, not a table, so views cannot read rows loaded into orders: "
        "load with --no-views, or drop that view first (`sparkbus view drop orders`)"
    )
    assert routed == []


def test_another_refusal_of_create_table_is_raised_as_it_is(tmp_path: Path, routed: list[int]) -> None:
    gateway = Views()
    gateway.create_table("orders", ORDERS, key=["order_id"])

    def refused(name: str, schema: pa.Schema, key: Any = None) -> Any:
        raise OperationError(1, "create_table: the controller is read-only")

    gateway.create_table = refused  # type: ignore[method-assign]
    with pytest.raises(OperationError, match="read-only"):
        _load(gateway, tmp_path)
    assert routed == []
