"""A grouped COUNT(DISTINCT v) whose v has Arrow's null type (NULL, a ``?`` bound to None, a column loaded all
NULL) counts 0 per group, as Spark SQL does. Arrow's grouped distinct crashes the process (SIGSEGV) on that
type, so the queries run in a child process: a crash fails the test instead of ending pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = r"""
import json, sys
import pyarrow as pa
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.sql import parse_sql
from tests.unit.query.helpers import run_fragments, stores

part = pa.table({"k": pa.array(["a", "b", "c", None] * 5), "n": pa.nulls(20)})  # n: Arrow type null
out = []
for sql, params in json.loads(sys.argv[1]):
    for repartition in (False, True):
        fragments = plan_fragments(
            parse_sql(sql), initiator="i", participants=["p1", "p2"], repartition=repartition
        )
        got = run_fragments(fragments, stores([part, part]), tuple(params))
        out.append(sorted(got.to_pylist(), key=repr))
print(json.dumps(out))
"""

QUERIES = [
    ("SELECT k, count(DISTINCT ?) AS d FROM t GROUP BY k", [None]),
    ("SELECT k, count(DISTINCT NULL) AS d FROM t GROUP BY k", []),
    ("SELECT k, count(DISTINCT n) AS d, count(*) AS c FROM t GROUP BY k", []),
]


def test_grouped_count_distinct_of_the_null_type_is_zero_per_group() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(QUERIES)],
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"the engine's process ended with {done.returncode}: {done.stderr[-800:]}"
    results = json.loads(done.stdout)
    keys = [None, "a", "b", "c"]
    zero = sorted(({"k": k, "d": 0} for k in keys), key=repr)
    counted = sorted(({"k": k, "d": 0, "c": 10} for k in keys), key=repr)
    assert results == [zero, zero, zero, zero, counted, counted]
