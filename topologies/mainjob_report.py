"""The main job's pure pieces: comparing results with Spark SQL's, the JSON report, the summary, the chart."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.table import Table

#: relative tolerance when either side is a float (integers compare exactly): sums over a million doubles
#: differ in the last bits between engines
REL_TOL = 1e-6
ABS_TOL = 1e-9


@dataclass(frozen=True, kw_only=True)
class QueryResult:
    """One reference query, run on both engines."""

    name: str
    sql: str
    ordered: bool
    match: bool
    detail: str
    rows: int
    sparkbus_ms: list[float]
    spark_ms: list[float]

    @property
    def sparkbus_p50(self) -> float:
        return statistics.median(self.sparkbus_ms)

    @property
    def spark_p50(self) -> float:
        return statistics.median(self.spark_ms)

    @property
    def speedup(self) -> float:
        return self.spark_p50 / self.sparkbus_p50 if self.sparkbus_p50 > 0 else math.inf


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a result agree: nulls with nulls, integers exactly, NaN with NaN (as in Spark
    SQL), a float and a number within ``REL_TOL``, anything else by ``==``."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a == b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # counts, keys and sums of integers: exact (a tolerance hides a lost row)
    if isinstance(a, int | float) and isinstance(b, int | float):
        x, y = float(a), float(b)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)  # Spark SQL: NaN = NaN
        return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


def _value_key(v: Any) -> tuple[int, Any]:
    # Nulls last, NaN after every number (as Spark SQL orders them); floats rounded so that last-bit
    # differences between engines do not reorder rows.
    if v is None:
        return 2, 0
    if isinstance(v, float):
        return (1, 0) if math.isnan(v) else (0, round(v, 6))
    return 0, v


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_value_key(v) for v in row)


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` as tuples, by column position."""
    columns = [c.to_pylist() for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def compare(ours: pa.Table, theirs: pa.Table, *, ordered: bool) -> tuple[bool, str]:
    """Whether two results agree: same columns by position, same rows (in order when ``ordered``), integers
    exactly, a float and a number within ``REL_TOL``. Returns (match, what differs)."""
    if ours.num_columns != theirs.num_columns:
        return False, f"{ours.num_columns} columns, Spark SQL has {theirs.num_columns}"
    if ours.num_rows != theirs.num_rows:
        return False, f"{ours.num_rows} rows, Spark SQL has {theirs.num_rows}"
    a, b = rows_of(ours), rows_of(theirs)
    if not ordered:
        a, b = sorted(a, key=_sort_key), sorted(b, key=_sort_key)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if len(x) != len(y) or not all(same_value(u, v) for u, v in zip(x, y, strict=True)):
            return False, f"row {i}: sparkbus {x!r}, Spark SQL {y!r}"
    return True, ""


def compare_runs(runs: Sequence[pa.Table], theirs: pa.Table, *, ordered: bool) -> tuple[bool, str]:
    """``compare`` for every run of a query (each distinct result once): (match, what differs in the first
    run that differs, named by its number among ``len(runs)``)."""
    checked: list[pa.Table] = []
    for i, ours in enumerate(runs):
        if any(ours.equals(seen) for seen in checked):
            continue
        checked.append(ours)
        match, detail = compare(ours, theirs, ordered=ordered)
        if not match:
            return False, f"run {i + 1} of {len(runs)}: {detail}"
    return bool(runs), "" if runs else "no run"


def build_report(
    *,
    rows: int,
    topology: str,
    commit: str,
    phases: dict[str, float],
    queries: Sequence[QueryResult],
    load: dict[str, Any],
    view: dict[str, Any],
    exchange: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON report (docs/MAIN_JOB.md lists every field)."""
    speedups = [q.speedup for q in queries]
    return {
        "rows": rows,
        "topology": topology,
        "commit": commit,
        "all_results_match": bool(queries) and all(q.match for q in queries),
        "min_speedup_vs_spark": round(min(speedups), 2) if speedups else None,
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "queries": [
            {
                "name": q.name,
                "sql": q.sql,
                "ordered": q.ordered,
                "match": q.match,
                "mismatch": q.detail,
                "result_rows": q.rows,
                "sparkbus_p50_ms": round(q.sparkbus_p50, 3),
                "spark_p50_ms": round(q.spark_p50, 3),
                "speedup": round(q.speedup, 2),
                "sparkbus_runs": len(q.sparkbus_ms),
                "spark_runs": len(q.spark_ms),
            }
            for q in queries
        ],
        "load": load,
        "view": view,
        "exchange": exchange,
    }


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def summary_table(report: dict[str, Any]) -> Table:
    """The per-query table printed at the end."""
    table = Table(title=f"sparkbus vs Spark SQL on {report['rows']:,} rows (p50 latency)")
    table.add_column("query")
    table.add_column("sparkbus ms", justify="right")
    table.add_column("Spark SQL ms", justify="right")
    table.add_column("speedup", justify="right")
    table.add_column("same result")
    for q in report["queries"]:
        table.add_row(
            q["name"],
            f"{q['sparkbus_p50_ms']:.2f}",
            f"{q['spark_p50_ms']:.1f}",
            f"{q['speedup']:.1f}x",
            "yes" if q["match"] else f"NO: {q['mismatch']}",
        )
    return table


def print_summary(report: dict[str, Any], console: Console) -> None:
    console.print(summary_table(report))
    load, view, ex = report["load"], report["view"], report["exchange"]
    console.print(
        f"load: {load['rows_per_s']:,.0f} rows/s into {load['partitions']} partitions x {load['replication']} "
        f"replicas; Spark toArrow() of the same DataFrame: {load['toarrow_rows_per_s']:,.0f} rows/s "
        f"(ratio {load['load_vs_toarrow']:.2f})"
    )
    console.print(
        f"view {view['name']}: {'fresh' if view['fresh'] else 'NOT fresh'} after {view['written_rows']:,} "
        f"written rows; write to fresh peek p50 {view['write_to_peek_p50_ms']:.1f} ms"
    )
    if ex is not None:
        p50, q50 = ex["p50_ms"], ex["query_p50_ms"]
        q_http = f"{q50['http']:.2f} ms" if "http" in q50 else ex["query_not_run"].get("http", "not run")
        http = f"{p50['http']:.2f} ms" if "http" in p50 else ex["not_run"].get("http", "not run")
        console.print(
            f"exchange ({ex['query']}): the query with push {q50['push']:.2f} ms, BinX {q50['binx']:.2f} ms, "
            f"HTTP {q_http} (same rows: {'yes' if ex['query_results_match'] else 'NO'}); "
            f"its {ex['bytes']:,} bytes in {ex['pages']} pages alone: push {p50['push']:.2f} ms, "
            f"BinX {p50['binx']:.2f} ms, HTTP {http}"
        )
    verdict = (
        "all results match Spark SQL" if report["all_results_match"] else "RESULTS DIFFER from Spark SQL"
    )
    console.print(
        f"{verdict}; min speedup {report['min_speedup_vs_spark']}x; "
        f"wall time {report['phases_s'].get('total', 0):.1f} s"
    )


def write_chart(report: dict[str, Any], path: Path) -> None:
    """A PNG bar chart of p50 latencies per query, both engines, log scale."""
    import matplotlib  # noqa: PLC0415 (only the main job draws)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = [q["name"] for q in report["queries"]]
    ours = [q["sparkbus_p50_ms"] for q in report["queries"]]
    theirs = [q["spark_p50_ms"] for q in report["queries"]]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    width = 0.4
    ax.bar([i - width / 2 for i in x], ours, width, label="sparkbus")
    ax.bar([i + width / 2 for i in x], theirs, width, label="Spark SQL")
    ax.set_yscale("log")
    ax.set_xticks(list(x), names, rotation=20, ha="right")
    ax.set_ylabel("p50 latency, ms (log scale)")
    ax.set_title(f"Reference queries on {report['rows']:,} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
