"""``sparkbus run --data`` with data the job cannot use: one line naming the column and a value, before
either engine sees the rows. Runs the command in this process, on the test session's SparkSession."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.topologies import cli, spark
from sparkbus.topologies.mainjob import Options
from sparkbus.topologies.mainjob_data import events
from sparkbus.topologies.schema import shipped

pytestmark = pytest.mark.spark

HEADER = "event_id,user_id,kind,value,ts\n"


def run(session: Any, data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """``sparkbus run --data data`` on ``session``: it must fail; its stderr."""
    monkeypatch.setattr(spark, "embedded_session", lambda *_, **__: session)
    assert cli.main(["run", "--data", str(data), "--report", str(data.parent / "r.json")]) == 1
    return capsys.readouterr().err


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ("1,1,click,1.5,2024-01-01 00:00:00\n2,x,view,2.0,2024-01-01 00:00:01\n", "column user_id holds 1 "
         "value(s) that are not a whole number, such as 'x'"),
        ("1,1,click,1.5,2024-01-01 00:00:00\n2,2,view,n/a,2024-01-01 00:00:01\n3,3,view,-,2024-01-01 00:00:02\n",
         "column value holds 2 value(s) that are not a number, such as 'n/a'"),
        ("1,1,click,1.5,2024-01-01 00:00:00\n2,2,view,2.0,yesterday\n", "column ts holds 1 value(s) that are not "
         "a timestamp, such as 'yesterday'"),
        # Read as doubles: Spark's try_cast to a whole number truncates them (42.9 to 42) instead of failing.
        ("1,1,click,1.5,2024-01-01 00:00:00\n2,42.9,view,2.0,2024-01-01 00:00:01\n3,-7.5,view,1.0,2024-01-01 "
         "00:00:02\n4,8.0,view,1.0,2024-01-01 00:00:03\n", "column user_id holds 2 value(s) that are not a whole "
         "number, such as '42.9'"),
        ("1,1,click,1.5,2024-01-01 00:00:00\n3.7,2,view,2.0,2024-01-01 00:00:01\n", "column event_id holds 1 "
         "value(s) that are not a whole number, such as '3.7'"),
    ],
    ids=["user_id", "value", "ts", "user_id_fraction", "event_id_fraction"],
)  # fmt: skip
def test_a_value_not_of_its_columns_type_is_named_in_one_line(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rows: str,
    error: str,
) -> None:
    data = tmp_path / "events.csv"
    data.write_text(HEADER + rows)
    assert run(spark, data, monkeypatch, capsys) == f"sparkbus run: --data {data}: {error}\n"


@pytest.mark.timeout(180)
def test_shared_and_missing_event_ids_are_named_in_one_line(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "events.csv"
    ids = [1, 2, 2, 3, 3, 3, 4, 5, 5]
    data.write_text(HEADER + "".join(f"{i},{i},click,1.0,2024-01-01 00:00:00\n" for i in ids))
    assert run(spark, data, monkeypatch, capsys) == (
        f"sparkbus run: --data {data}: 3 event_id value(s) occur in more than one row (7 rows), such as "
        "2 (2 rows), 3 (3 rows), 5 (2 rows); event_id is the table's key and sparkbus keeps one row per key: "
        "give each row its own event_id, or leave the column out and the job numbers the rows\n"
    )
    data.write_text(HEADER + "1,1,click,1.0,2024-01-01 00:00:00\n,2,view,2.0,2024-01-01 00:00:01\n")
    assert run(spark, data, monkeypatch, capsys) == (
        f"sparkbus run: --data {data}: 1 row(s) have no event_id, the table's key; give every row one, or "
        "leave the column out and the job numbers the rows\n"
    )


@pytest.mark.timeout(180)
def test_data_the_job_can_use_loads_with_the_tables_types(spark: Any, tmp_path: Path) -> None:
    # Parquet with epoch-second timestamps and no event_id: the job numbers the rows.
    data = tmp_path / "events.parquet"
    pq.write_table(
        pa.table(
            {
                "user_id": pa.array([1, 2, None], pa.int32()),
                "kind": ["click", None, "view"],
                "value": [1.5, None, float("nan")],
                "ts": pa.array([1_700_000_000, 1_700_000_001, 1_700_000_002], pa.int64()),
            }
        ),
        data,
    )
    frame, rows = events(spark, Options(topology=shipped("local.toml"), data=data))
    try:
        assert rows == 3
        table = frame.toArrow()
        assert table.schema.names == ["event_id", "user_id", "kind", "value", "ts"]
        assert [str(t) for t in table.schema.types[:4]] == ["int64", "int64", "string", "double"]
        assert len(set(table.column("event_id").to_pylist())) == 3
        assert table.column("user_id").to_pylist() == [1, 2, None]
    finally:
        frame.unpersist()
