"""``sparkbus load`` of a file that holds no rows (a CSV of its header alone, an empty Parquet file) is
refused in plain words before anything is asked of the cluster, whichever table it names. No cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.topologies import cli, load, shipped

TOPOLOGY = str(shipped("processes.toml"))  # declares `orders` (key order_id), not `ev`


class Untouched:
    """A client that must not be asked anything."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the client was asked {name}")


def _empty_files(tmp_path: Path) -> list[Path]:
    csv = tmp_path / "header.csv"
    csv.write_text("order_id,amount\n")
    parquet = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({"order_id": pa.array([], pa.int64()), "amount": pa.array([], pa.float64())}), parquet
    )
    return [csv, parquet]


@pytest.mark.parametrize("table", ["ev", "orders"])
def test_a_file_of_no_rows_is_refused_before_anything_is_sent(tmp_path: Path, table: str) -> None:
    for path in _empty_files(tmp_path):
        args = cli.build_parser().parse_args(["load", table, str(path), "--topology", TOPOLOGY])
        with pytest.raises(cli.CommandError) as err:
            cli._load(Untouched(), args)  # type: ignore[arg-type]
        assert str(err.value) == f"{path} holds no rows; nothing to load"


def test_routing_no_rows_to_the_leaders_says_nothing_was_loaded(tmp_path: Path) -> None:
    spec = next(t for t in load(TOPOLOGY).tables if t.name == "orders")
    [csv, _] = _empty_files(tmp_path)
    rows = pa.table({"order_id": pa.array([], pa.int64()), "amount": pa.array([], pa.float64())})
    with pytest.raises(cli.CommandError, match=r"header\.csv holds no rows; nothing to load"):
        cli.routed_load(Untouched(), spec, rows, Untouched(), timeout=1.0, path=str(csv))  # type: ignore[arg-type]
