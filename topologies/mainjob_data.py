"""The main job's data phase: the events table, generated or read from ``--data``, cached in Spark.

Data a user brings is checked before either engine sees it, each problem in one line naming the column
and a value: a value that is not of its column's type (Spark 4 casts with ANSI on, so a malformed value
would otherwise fail the first action with a long JVM error), and, when the data has ``event_id``, a key
that is null or that several rows share (the table's key: sparkbus keeps one row per key where Spark SQL
counts them all, so the results could not match).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkbus.topologies.mainjob import KEY, KINDS, REQUIRED, JobError, Options

#: each column of the events table and its Spark type
COLUMN_TYPES = {KEY: "long", "user_id": "long", "kind": "string", "value": "double", "ts": "timestamp"}
_WHAT = {"long": "a whole number", "double": "a number", "timestamp": "a timestamp", "string": "a string"}
#: duplicated keys named in the error
_EXAMPLES = 3


def events(spark: Any, opts: Options) -> tuple[Any, int]:
    """The events table (``--data``, else ``opts.rows`` generated rows), cached and counted (which fills
    the cache), and its number of rows. Raises JobError for data the job cannot use."""
    if opts.data is None:
        frame = generated_events(spark, opts.rows).cache()
        return frame, frame.count()
    frame, keyed = read_events(spark, opts.data)
    try:
        rows = frame.count()
    except Exception as exc:  # a file Spark reads its schema from but not its rows (a corrupt Parquet page)
        raise JobError(f"--data {opts.data}: Spark cannot read its rows: {_first_line(exc)}") from None
    if rows == 0:
        raise JobError(f"--data {opts.data}: no rows")
    if keyed:
        _refuse_duplicate_keys(frame, opts.data)
    return frame, rows


def generated_events(spark: Any, rows: int) -> Any:
    """``rows`` events, the same on every evaluation (hashes of the row number, no randomness)."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    users = max(1, rows // 100)
    kinds = F.array(*[F.lit(k) for k in KINDS])
    return spark.range(rows).select(
        F.col("id").alias(KEY),
        F.pmod(F.hash(F.col("id"), F.lit(7)), F.lit(users)).cast("long").alias("user_id"),
        F.element_at(
            kinds, (F.pmod(F.hash(F.col("id"), F.lit(11)), F.lit(len(KINDS))) + 1).cast("int")
        ).alias("kind"),
        (F.pmod(F.hash(F.col("id"), F.lit(13)), F.lit(100_000)) / F.lit(100.0)).alias("value"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("ts"),
    )


def read_events(spark: Any, path: Path) -> tuple[Any, bool]:
    """A Parquet file or directory, or a CSV file with a header, as the events table (cached, not yet
    filled), and whether it brings its own ``event_id``. Raises JobError for a file Spark cannot read, a
    missing column, or a value that is not of its column's type."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    if not path.exists():
        raise JobError(f"--data {path}: no such file or directory")
    is_csv = path.suffix.lower() == ".csv" or (path.is_dir() and any(path.glob("*.csv")))
    try:
        reader = spark.read.option("header", True).option("inferSchema", True)
        df = reader.csv(str(path)) if is_csv else spark.read.parquet(str(path))
        columns = df.columns
    except Exception as exc:
        raise JobError(
            f"--data {path}: Spark cannot read it as {'CSV' if is_csv else 'Parquet'}: {_first_line(exc)}"
        ) from None
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise JobError(
            f"--data {path}: missing column(s) {', '.join(missing)}; the events table needs "
            f"{', '.join(REQUIRED)} (and optionally {KEY})"
        )
    keyed = KEY in columns
    if not keyed:
        df = df.withColumn(KEY, F.monotonically_increasing_id())
    _refuse_malformed(df, path, keyed=keyed)
    # try_cast: the values were checked, and a cast that fails would fail the first action instead.
    df = df.select(*[F.col(c).try_cast(t).alias(c) for c, t in COLUMN_TYPES.items()])
    # Materialised once, so the generated keys and both engines see the same rows.
    return df.cache(), keyed


def _refuse_malformed(df: Any, path: Path, *, keyed: bool) -> None:
    """JobError naming the first column holding a value that does not cast to its type, or a number with a
    fraction in a whole-number column (with one such value and how many), or, when the data has its own
    keys, rows without one."""
    from pyspark.sql import functions as F  # noqa: PLC0415
    from pyspark.sql.types import DecimalType, DoubleType, FloatType  # noqa: PLC0415

    fractional = (DecimalType, DoubleType, FloatType)
    checks = []
    for c, t in COLUMN_TYPES.items():
        bad = F.col(c).isNotNull() & F.col(c).try_cast(t).isNull()
        if t == "long" and isinstance(df.schema[c].dataType, fractional):
            # try_cast makes 42.9 the whole number 42 (only an overflow is null); compared exactly (a
            # double holds no fraction beyond 2**53, a decimal is compared as a decimal)
            bad = bad | (F.col(c) != F.col(c).try_cast(t))
        checks += [
            F.count_if(bad).alias(f"{c}:n"),
            F.first(F.when(bad, F.col(c).cast("string")), ignorenulls=True).alias(f"{c}:e"),
        ]
    checks.append(F.count_if(F.col(KEY).isNull()).alias("nokey"))
    try:
        found = df.select(*checks).first()
    except Exception as exc:  # a column of a type that casts to nothing of the table's (an array, a map)
        raise JobError(f"--data {path}: {_first_line(exc)}") from None
    for c, t in COLUMN_TYPES.items():
        if n := found[f"{c}:n"]:
            raise JobError(
                f"--data {path}: column {c} holds {n:,} value(s) that are not {_WHAT[t]}, such as "
                f"{found[f'{c}:e']!r}"
            )
    if keyed and found["nokey"]:
        raise JobError(
            f"--data {path}: {found['nokey']:,} row(s) have no {KEY}, the table's key; give every row one, "
            f"or leave the column out and the job numbers the rows"
        )


def _refuse_duplicate_keys(frame: Any, path: Path) -> None:
    """JobError naming keys that several rows share: the store keeps one row per key (an upsert), Spark SQL
    counts every row."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    shared = frame.groupBy(KEY).count().filter(F.col("count") > 1)
    found = shared.agg(F.count("*").alias("keys"), F.sum("count").alias("rows")).first()
    if not found["keys"]:
        return
    examples = shared.orderBy(KEY).limit(_EXAMPLES).collect()
    named = ", ".join(f"{r[KEY]} ({r['count']} rows)" for r in examples)
    raise JobError(
        f"--data {path}: {found['keys']:,} {KEY} value(s) occur in more than one row ({found['rows']:,} rows), "
        f"such as {named}; {KEY} is the table's key and sparkbus keeps one row per key: give each row its "
        f"own {KEY}, or leave the column out and the job numbers the rows"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
