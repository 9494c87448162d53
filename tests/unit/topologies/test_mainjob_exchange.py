"""The main job's query-per-exchange comparison: each exchange is run, rows are compared in any order."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkbus.topologies.mainjob_exchange import query_per_exchange


class Fake:
    def __init__(self, rows: dict[str, pa.Table]) -> None:
        self.rows = rows
        self.calls: list[str] = []

    def sql(self, text: str, *, timeout: float = 60.0, exchange: str | None = None, **_: Any) -> pa.Table:
        assert exchange is not None
        self.calls.append(exchange)
        return self.rows[exchange]


def test_every_exchange_runs_in_rotating_order_and_row_order_does_not_matter() -> None:
    t = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    fake = Fake({"push": t, "binx": t.take([2, 0, 1]), "http": t.take([1, 2, 0])})
    out = query_per_exchange(fake, "SELECT a, b FROM t", reps=3)
    assert fake.calls == ["push", "binx", "http", "binx", "http", "push", "http", "push", "binx"]
    assert out["query_results_match"] is True and out["query_mismatch"] == ""
    assert set(out["query_p50_ms"]) == {"push", "binx", "http"} and out["query_reps"] == 3


def test_an_exchange_that_returns_other_rows_is_named() -> None:
    t = pa.table({"a": [1, 2, 3]})
    fake = Fake({"push": t, "binx": t, "http": t.slice(0, 2)})
    out = query_per_exchange(fake, "SELECT a FROM t", reps=2)
    assert out["query_results_match"] is False
    assert out["query_mismatch"] == "http: 2 rows differ from the first run's 3"
