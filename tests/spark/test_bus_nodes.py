"""Real bus nodes with the echo service inside Spark barrier tasks on local[2]."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark import cloudpickle

from sparkbus.topologies.schema import loads
from sparkbus.topologies.spark import SparkRuntime, SparkRuntimeError

from . import echo_factory

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(echo_factory)

TOPOLOGY = """
[cluster]
name = "echo-spark"
[bus]
heartbeat = "250ms"
peer_timeout = "2s"
[spark]
master = "local[2]"
barrier_timeout = "10s"
[[nodes]]
name = "coordinator"
placement = "driver"
services = ["echo"]
[[nodes]]
name = "store"
placement = "executor"
count = 2
services = ["echo"]
"""


def test_every_node_pings_and_streams_to_every_other(spark: Any) -> None:
    topo = loads(TOPOLOGY)
    with SparkRuntime(topo, spark, echo_factory.ExercisingFactory(), ready_timeout=30) as rt:
        rt.check()
        results = rt.stop()
    by_node = {r.node: r for r in results}
    assert set(by_node) == {"coordinator", "store-0", "store-1"}
    for r in results:
        assert r.status == "stopped", r
        others = sorted(set(by_node) - {r.node})
        assert sorted(r.counters["exchanged"]) == others
        for peer in others:
            assert r.counters["exchanged"][peer] == {"ping": True, "stream_bytes": 8 * 4096}


def test_sigkill_of_a_task_node_fails_the_job_naming_it(spark: Any) -> None:
    topo = loads(TOPOLOGY)
    started = time.monotonic()
    with (
        pytest.raises(SparkRuntimeError, match="store-1"),
        SparkRuntime(topo, spark, echo_factory.ExercisingFactory(kill="store-1"), ready_timeout=30) as rt,
    ):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rt.check()
            time.sleep(0.05)
    print(f"sigkill_to_error_s={time.monotonic() - started:.2f}")
