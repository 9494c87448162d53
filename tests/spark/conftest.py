"""One SparkSession (local[2]) for the whole test session, built the way sparkbus builds it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")

from sparkbus.topologies.schema import load, shipped  # noqa: E402
from sparkbus.topologies.spark import embedded_session  # noqa: E402

#: the session's settings beyond local.toml's
SESSION_CONF = {
    "spark.barrier.sync.timeout": "10s",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    # a killed task's Python worker is reaped this long after the kill
    "spark.python.task.killTimeout": "1s",
}


#: seconds a Spark test may take: the first one to ask for ``spark`` also starts the JVM and the session,
#: which took over 30 s of the suite's 60 on a loaded 2-core machine; a test's own timeout mark stays
SPARK_TEST_TIMEOUT = 180


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if (
            item.path.is_relative_to(here)
            and "spark" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("timeout") is None
        ):
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = embedded_session(load(shipped("local.toml")), **SESSION_CONF)
    session.sparkContext.setLogLevel(
        "ERROR"
    )  # failure tests fail stages on purpose; keep the output readable
    gateway = session.sparkContext._gateway
    try:
        yield session
    finally:
        session.stop()
        # The JVM is a child of this process: shut it down so no process outlives the tests.
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # PySpark keeps the JVM's stdin open to tie its life to ours
            proc.terminate()
            proc.wait(timeout=30)
        pyspark.SparkContext._gateway = None
        pyspark.SparkContext._jvm = None
