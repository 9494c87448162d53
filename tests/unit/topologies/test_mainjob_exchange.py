"""The main job's exchange comparisons: each exchange is run, rows are compared in any order; the transport
comparison's own two nodes run under a CURVE topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from sparkbus.bus.security import generate
from sparkbus.topologies.busnode import bus_config
from sparkbus.topologies.mainjob_exchange import HTTP_NOT_RUN, compare_exchanges, query_per_exchange
from sparkbus.topologies.schema import loads, shipped


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


def test_rows_holding_a_nan_match_themselves_in_any_order() -> None:
    # Spark SQL takes NaN for `value >= 950` (NaN is above every double) and says NaN = NaN.
    t = pa.table({"event_id": [1, 2], "value": [float("nan"), 960.5]})
    fake = Fake({"push": t, "binx": t.take([1, 0]), "http": t})
    out = query_per_exchange(fake, "SELECT event_id, value FROM events WHERE value >= 950", reps=2)
    assert out["query_results_match"] is True, out["query_mismatch"]


def test_a_nan_where_the_first_run_has_a_number_is_named() -> None:
    t = pa.table({"value": [float("nan"), 960.5]})
    fake = Fake({"push": t, "binx": pa.table({"value": [951.0, 960.5]}), "http": t})
    out = query_per_exchange(fake, "SELECT value FROM events", reps=1)
    assert out["query_mismatch"] == "binx: 2 rows differ from the first run's 2"


def test_the_transport_comparison_runs_under_curve_with_a_pair_per_node(tmp_path: Path) -> None:
    # What `sparkbus keys generate DIR --topology FILE` writes: no pair for the comparison's two nodes, and
    # an address list of the cluster's machines that loopback is not on.
    security = '[bus.security]\nmode = "curve"\nkey_dir = "{}"\nallow = ["10.0.0.11"]\n\n[spark]\n'
    local = shipped("local.toml").read_text().replace('"http.client", ', "")  # refused under CURVE
    topo = loads(local.replace("[spark]\n", security.format(tmp_path), 1))
    generate(tmp_path, topo.node_ids())
    config = bus_config(topo)
    assert config.curve is not None
    out = compare_exchanges(pa.table({"a": list(range(1000))}), config, reps=1)
    # HTTP is plain, and no node of a CURVE cluster serves it: reported as not run, with the reason
    assert out["bytes"] > 0 and set(out["p50_ms"]) == set(out["mb_per_s"]) == {"push", "binx"}
    assert out["not_run"] == {"http": HTTP_NOT_RUN}
    assert sorted(p.name for p in (tmp_path / "public").iterdir()) == [f"{n}.key" for n in topo.node_ids()]


def test_under_curve_the_query_runs_with_push_and_binx_and_http_is_reported_not_run() -> None:
    t = pa.table({"a": [1, 2, 3]})
    fake = Fake({"push": t, "binx": t.take([2, 0, 1])})  # an http run would raise KeyError
    out = query_per_exchange(fake, "SELECT a FROM t", curve=True, reps=3)
    assert fake.calls == ["push", "binx", "binx", "push", "push", "binx"]
    assert set(out["query_p50_ms"]) == {"push", "binx"} and out["query_results_match"] is True
    assert out["query_not_run"] == {"http": HTTP_NOT_RUN}
    assert "CURVE" in HTTP_NOT_RUN and "plain HTTP" in HTTP_NOT_RUN


def test_without_curve_nothing_is_left_out() -> None:
    t = pa.table({"a": [1]})
    out = query_per_exchange(Fake({"push": t, "binx": t, "http": t}), "SELECT a FROM t", reps=1)
    assert set(out["query_p50_ms"]) == {"push", "binx", "http"} and out["query_not_run"] == {}
    assert (
        compare_exchanges(
            pa.table({"a": [1, 2]}), bus_config(loads(shipped("local.toml").read_text())), reps=1
        )["not_run"]
        == {}
    )
