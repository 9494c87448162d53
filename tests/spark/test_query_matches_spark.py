"""The query family's results equal Spark SQL's on the same generated data (2 simulated participants, the
initiator holding no rows; for GROUP BY of a select-list alias, which the initiator resolves with its own
partition's columns when it holds one, also 3 with rows on the initiator)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.query import ErrorCode, QueryConfig, QueryError, QueryRole, load, sql

pytestmark = pytest.mark.spark
ROWS = 4000
KINDS = ["click", "view", "buy", "share", "like"]


def generate(rows: int, seed: int = 5) -> pa.Table:
    rng = random.Random(seed)
    ts = list(range(1_000_000, 1_000_000 + rows))
    rng.shuffle(ts)
    return pa.table(
        {
            "user": pa.array([rng.randrange(200) for _ in range(rows)], pa.int64()),
            "kind": pa.array(rng.choices(KINDS, k=rows), pa.string()),
            "value": pa.array(
                [None if rng.random() < 0.05 else round(rng.random() * 100.0, 2) for _ in range(rows)],
                pa.float64(),
            ),
            "ts": pa.array(ts, pa.int64()),
        }
    )


class SimTarget:
    def __init__(self, sim: SimBus, node: str) -> None:
        self.sim, self.node = sim, node

    def call(self, role: str, name: str, args: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        return self.sim.result(self.sim.call(self.node, role, name, args), limit=timeout)


QUERIES = [
    "SELECT COUNT(*) AS n FROM t WHERE user = 17",
    "SELECT kind, COUNT(*) AS n, COUNT(value) AS nv, SUM(value) AS s, AVG(value) AS a, MIN(ts) AS lo, "
    "MAX(ts) AS hi FROM t GROUP BY kind ORDER BY kind",
    "SELECT kind, COUNT(DISTINCT user) AS users FROM t GROUP BY kind ORDER BY users DESC, kind",
    "SELECT user, COUNT(*) AS n FROM t WHERE value > 50 GROUP BY user HAVING COUNT(*) >= 12 ORDER BY n DESC, user",
    "SELECT user, ts FROM t ORDER BY ts DESC LIMIT 10 OFFSET 5",
    "SELECT user, value * 2 + 1 AS v2, ABS(value - 50) AS d FROM t "
    "WHERE kind IN ('buy', 'view') AND value BETWEEN 10 AND 20 ORDER BY ts LIMIT 50",
    "SELECT kind, COUNT(*) AS n FROM t WHERE kind LIKE '%i%' OR value IS NULL GROUP BY kind ORDER BY kind",
    "SELECT kind, SUM(value) / COUNT(*) AS m FROM t GROUP BY kind ORDER BY m DESC",
    "SELECT ts, value FROM t ORDER BY value, ts LIMIT 30",
    "SELECT ts, value FROM t ORDER BY value DESC, ts LIMIT 30",
    "SELECT user, LOWER(kind) AS k, LENGTH(kind) AS l FROM t WHERE user < 3 ORDER BY ts",
    "SELECT COUNT(*) AS n, SUM(user) AS su, MIN(value) AS mn FROM t WHERE value IS NOT NULL AND user <> 4",
]


#: GROUP BY names that the table has no column of: Spark groups by the select list's alias of the name
ALIAS_QUERIES = [
    "SELECT user % 7 AS bucket, COUNT(*) AS n, SUM(value) AS s FROM t GROUP BY bucket ORDER BY bucket",
    "SELECT lower(kind) AS k, user % 2 AS parity, COUNT(DISTINCT user) AS users FROM t GROUP BY K, parity "
    "ORDER BY k, parity",
    "SELECT ts % 10 AS d, AVG(value) AS a FROM t GROUP BY d HAVING d > 4 ORDER BY d",
    "SELECT coalesce(value, -1.0) > 50 AS high, COUNT(*) AS n FROM t GROUP BY high ORDER BY high",
    "SELECT user % 5 AS b, COUNT(*) AS n FROM t GROUP BY b, b * 2 ORDER BY b",
    "SELECT user % 4 AS b, MAX(ts) AS hi FROM t GROUP BY b ORDER BY b DESC LIMIT 3",
    # the table's column user comes before the alias: one group per user, not two (an alias reading the column
    # of its name tells an initiator without rows that the table has it)
    "SELECT user % 2 AS user, COUNT(*) AS n, MIN(ts) AS first FROM t GROUP BY user ORDER BY first",
]
#: a GROUP BY name of a column of the table that the alias does not read: Spark groups by the column user
SHADOWED_QUERY = "SELECT 1 AS user, COUNT(*) AS n FROM t GROUP BY user"
#: GROUP BY names Spark refuses (its error condition), and the reason this family gives
ALIAS_REFUSALS = [
    ("SELECT COUNT(*) AS c FROM t GROUP BY c", "GROUP_BY_AGGREGATE", "GROUP BY cannot hold an aggregate"),
    (
        "SELECT user % 7 AS ts, COUNT(*) AS n FROM t GROUP BY ts",
        "MISSING_AGGREGATION",
        "column 'user' must appear in GROUP BY or inside an aggregate; GROUP BY ts means the column ts",
    ),
    (
        "SELECT user % 7 AS b, COUNT(*) AS n FROM t GROUP BY b + 1",
        "MISSING_AGGREGATION",
        "column 'user' must appear in GROUP BY or inside an aggregate",
    ),
]


#: LIKE patterns with the escape character over table w (column s); in SQL text '\\\\' is one backslash
LIKE_ROWS = ["a\\", "\\", "x", "a\\b", None, "a.b", "a%b", "a_b", "(a)\n\\", "%", ""]
LIKE_QUERIES = [
    "SELECT count(*) AS n FROM w WHERE s LIKE '%\\\\\\\\'",
    "SELECT count(*) AS n FROM w WHERE s LIKE '%\\\\\\\\b'",
    "SELECT count(*) AS n FROM w WHERE s NOT LIKE '%\\\\\\\\'",
    "SELECT count(*) AS n FROM w WHERE s LIKE 'a\\\\%b' OR s LIKE '\\\\%'",
    "SELECT count(*) AS n FROM w WHERE s NOT LIKE 'a\\\\_b'",
    "SELECT count(*) AS n FROM w WHERE s LIKE '(_)_\\\\\\\\'",
    "SELECT s, s LIKE '%\\\\\\\\%' AS m FROM w ORDER BY s",
]
#: LIKE patterns Spark refuses, its error condition, and the reason this family gives
LIKE_REFUSALS = [
    ("SELECT count(*) AS n FROM w WHERE s LIKE 'x\\\\y'", "INVALID_FORMAT.ESC_IN_THE_MIDDLE", "precede 'y'"),
    ("SELECT count(*) AS n FROM w WHERE s NOT LIKE 'a\\\\'", "INVALID_FORMAT.ESC_AT_THE_END", "at its end"),
]


def members(parts: dict[str, pa.Table], table: str = "t") -> SimTarget:
    """Query roles on ``i``, ``p1`` and ``p2``, each node holding its ``parts`` of ``table``; the target
    is ``i``."""
    sim = SimBus(seed=3)
    for name in ("i", "p1", "p2"):
        sim.add_node(name, roles=[QueryRole(name, config=QueryConfig(), incarnation=f"{name}0")])
    sim.start()
    sim.run_until(sim.all_up)
    for node, part in parts.items():
        load(SimTarget(sim, node), table, part)
    return SimTarget(sim, "i")


@pytest.fixture(scope="module")
def both(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[SimTarget, Any]:
    data = generate(ROWS)
    path = Path(tmp_path_factory.mktemp("query-vs-spark")) / "t.parquet"
    pq.write_table(data, path)
    spark.read.parquet(str(path)).createOrReplaceTempView("t")
    half = ROWS // 2
    return members({"p1": data.slice(0, half), "p2": data.slice(half)}), spark


@pytest.fixture(scope="module")
def holding(both: tuple[SimTarget, Any]) -> tuple[SimTarget, Any]:
    """As ``both`` (the same rows and Spark view), with a third of the rows on the initiator."""
    data, third = generate(ROWS), ROWS // 3
    parts = {"i": data.slice(0, third), "p1": data.slice(third, third), "p2": data.slice(2 * third)}
    return members(parts), both[1]


@pytest.fixture(scope="module")
def escapes(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[SimTarget, Any]:
    """Table w (``LIKE_ROWS``) on ``p1`` and ``p2`` and as Spark's view w."""
    data = pa.table({"s": pa.array(LIKE_ROWS, pa.string())})
    path = Path(tmp_path_factory.mktemp("like-vs-spark")) / "w.parquet"
    pq.write_table(data, path)
    spark.read.parquet(str(path)).createOrReplaceTempView("w")
    half = data.num_rows // 2
    return members({"p1": data.slice(0, half), "p2": data.slice(half)}, "w"), spark


def _close(u: Any, v: Any) -> bool:
    if isinstance(u, float) or isinstance(v, float):
        return u is not None and v is not None and math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9)
    return bool(u == v)


@pytest.mark.parametrize("text", QUERIES)
def test_results_equal_spark_sql(both: tuple[SimTarget, Any], text: str) -> None:
    same_rows(*both, text)


@pytest.mark.parametrize("text", ALIAS_QUERIES)
def test_group_by_a_select_alias_equals_spark_sql(holding: tuple[SimTarget, Any], text: str) -> None:
    same_rows(*holding, text)


@pytest.mark.parametrize("text", ALIAS_QUERIES)
def test_group_by_a_select_alias_equals_spark_sql_where_the_initiator_holds_no_rows(
    both: tuple[SimTarget, Any], text: str
) -> None:
    # the initiator plans the alias without the table's columns; the participants' have no such column
    same_rows(*both, text)


def test_group_by_a_column_that_an_initiator_without_rows_read_as_the_alias_is_refused(
    holding: tuple[SimTarget, Any], both: tuple[SimTarget, Any]
) -> None:
    same_rows(holding[0], holding[1], f"{SHADOWED_QUERY} ORDER BY n, user")  # one group per user, as Spark's
    target, spark = both
    assert spark.sql(SHADOWED_QUERY).count() > 2
    with pytest.raises(QueryError) as ours:
        sql(target, SHADOWED_QUERY)
    assert ours.value.code is ErrorCode.PARSING, ours.value.message
    assert "but table t has a column user, which GROUP BY user means before the alias" in ours.value.message


@pytest.mark.parametrize(("text", "condition", "reason"), ALIAS_REFUSALS)
def test_group_by_a_select_alias_is_refused_where_spark_sql_refuses_it(
    holding: tuple[SimTarget, Any], text: str, condition: str, reason: str
) -> None:
    same_refusal(*holding, text, condition, ErrorCode.PARSING, reason)


def same_refusal(
    target: SimTarget, spark: Any, text: str, condition: str, code: ErrorCode, reason: str
) -> None:
    """Spark refuses ``text`` with its error ``condition``; this family with ``code``, saying ``reason``."""
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as theirs:
        spark.sql(text).collect()
    assert theirs.value.getCondition() == condition
    with pytest.raises(QueryError) as ours:
        sql(target, text)
    assert ours.value.code is code and reason in ours.value.message, ours.value.message


def same_rows(target: SimTarget, spark: Any, text: str) -> None:
    ours = sql(target, text)
    theirs = spark.sql(text).toArrow()
    assert ours.column_names == theirs.column_names
    assert ours.num_rows == theirs.num_rows
    assert ours.num_rows > 0
    for name in theirs.column_names:
        got, want = ours[name].to_pylist(), theirs[name].to_pylist()
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _close(g, w)]
        assert not bad, f"{name}: first differences {bad[:5]}"


@pytest.mark.parametrize("text", LIKE_QUERIES)
def test_like_with_escapes_equals_spark_sql(escapes: tuple[SimTarget, Any], text: str) -> None:
    same_rows(*escapes, text)


@pytest.mark.parametrize("pattern", ["%\\\\", "a\\%b", "%\\_%"])
def test_like_with_an_escaped_parameter_pattern_equals_spark_sql(
    escapes: tuple[SimTarget, Any], pattern: str
) -> None:
    target, spark = escapes
    text = "SELECT count(*) AS n FROM w WHERE s LIKE ?"
    assert sql(target, text, [pattern]).to_pylist() == [
        r.asDict() for r in spark.sql(text, args=[pattern]).collect()
    ]


@pytest.mark.parametrize(("text", "condition", "reason"), LIKE_REFUSALS)
def test_like_is_refused_where_spark_sql_refuses_the_pattern(
    escapes: tuple[SimTarget, Any], text: str, condition: str, reason: str
) -> None:
    same_refusal(*escapes, text, condition, ErrorCode.PARSING, reason)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT sum(value > 50) AS s FROM t",
        "SELECT kind, avg(user < 100) AS a FROM t GROUP BY kind",
    ],
)
def test_sum_or_avg_of_a_non_numeric_input_is_refused_as_spark_sql_refuses_it(
    both: tuple[SimTarget, Any], text: str
) -> None:
    same_refusal(
        *both, text, "DATATYPE_MISMATCH.UNEXPECTED_INPUT_TYPE", ErrorCode.DATA_EXCEPTION, "takes numbers"
    )


def test_sum_and_avg_of_a_null_have_sparks_types(both: tuple[SimTarget, Any]) -> None:
    target, spark = both
    text = "SELECT sum(NULL) AS s, avg(NULL) AS a, count(NULL) AS c, sum(NULL) + 1 AS s1 FROM t"
    ours, theirs = sql(target, text), spark.sql(text).toArrow()
    assert ours.to_pylist() == theirs.to_pylist() == [{"s": None, "a": None, "c": 0, "s1": None}]
    assert ours.schema.types == theirs.schema.types == [pa.float64(), pa.float64(), pa.int64(), pa.float64()]
