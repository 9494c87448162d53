"""``sparkbus load`` writes the compute controller's table in writes of at most ``VIEW_ROWS`` rows, whether it
adds a file's rows to the table or creates the table from every stored row: the controller and each compute
replica apply a write in one turn of their node's loop, and one write of a large file held those loops past
the peers' heartbeat timeout. The views' table is a real ``ComputeController``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.topologies import cli

from .test_load_routing import LAYOUT, Cluster
from .test_load_views_after_failure import Entry, keyed
from .test_load_views_key import TOPOLOGY

ROWS = 120_000  # 16 bytes a row: one 16 MiB request would carry them all


def _load(entry: Entry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each write into the controller's table while loading ``ROWS`` rows."""
    path = tmp_path / "orders.parquet"
    pq.write_table(
        pa.table(
            {"order_id": pa.array(range(ROWS), pa.int64()), "amount": pa.array(range(ROWS), pa.float64())}
        ),
        path,
    )
    sizes: list[int] = []
    write = entry.write_table

    def recorded(name: str, data: pa.Table) -> Any:
        sizes.append(data.num_rows)
        return write(name, data)

    monkeypatch.setattr(entry, "write_table", recorded)
    monkeypatch.setattr(cli, "partial_connect", lambda args: entry.cluster.connect)
    args = cli.build_parser().parse_args(["load", "orders", str(path), "--topology", TOPOLOGY])
    done = cli._load(entry, args)  # type: ignore[arg-type]
    assert done.startswith("loaded 120,000 rows into orders"), done
    assert entry.view_keys() == list(range(ROWS))
    return sizes


def test_a_file_goes_into_the_views_table_in_bounded_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _load(keyed(Cluster(LAYOUT)), tmp_path, monkeypatch)
    assert sizes == [cli.VIEW_ROWS, cli.VIEW_ROWS, ROWS - 2 * cli.VIEW_ROWS]


def test_a_views_table_made_from_the_stored_rows_takes_them_in_bounded_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = Entry(Cluster(LAYOUT))  # the controller has no table orders: made from every stored row
    sizes = _load(entry, tmp_path, monkeypatch)
    assert max(sizes) <= cli.VIEW_ROWS and sum(sizes) == ROWS
    assert entry.controller.table_keys["orders"] == ["order_id"]


def test_slices_keep_to_both_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = pa.table({"a": pa.array(range(1000), pa.int64())})  # 8 bytes a row
    assert [t.num_rows for t in cli._slices(rows, 300)] == [300, 300, 300, 100]
    monkeypatch.setattr(cli, "REQUEST_BYTES", 8 * 200)
    assert [t.num_rows for t in cli._slices(rows, 300)] == [200] * 5
    assert [t.num_rows for t in cli._slices(rows)] == [200] * 5
    assert [t.num_rows for t in cli._slices(rows.slice(0, 0), 300)] == [0]
