"""Where the Spark runtime's nodes keep their data, and that none of it outlives the runtime: after a clean
stop, after a node fails (Spark kills the other tasks), and whatever ``$SPARKBUS_DATA_DIR`` the Python
workers inherited."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from sparkbus.topologies.model import Topology
from sparkbus.topologies.schema import load, loads, shipped
from sparkbus.topologies.spark import SparkRuntime, SparkRuntimeError

from . import faults

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(faults)


def recorded(record: Path) -> list[Path]:
    """Every replica directory the nodes wrote down (``faults.RecordingBusFactory``)."""
    return [Path(line) for f in sorted(record.glob("*.roots")) for line in f.read_text().splitlines()]


def over_ipc() -> Topology:
    """local.toml over ipc: each node's socket files live in a directory of its own, which only its stop
    removes."""
    text = shipped("local.toml").read_text().replace('transport = "tcp"', 'transport = "ipc"')
    return loads(re.sub(r"(?m)^(host|ports) = .*$", "", text))


def socket_dirs(record: Path) -> list[Path]:
    """The directories of every socket file the nodes wrote down (``faults.RecordingBusFactory``)."""
    return [
        Path(line.removeprefix("ipc://")).parent
        for f in sorted(record.glob("*.endpoints"))
        for line in f.read_text().split()
    ]


@pytest.mark.timeout(120)
def test_a_node_that_fails_leaves_no_node_running_and_no_node_data_behind(spark: Any, tmp_path: Path) -> None:
    # store-1 fails in start(): its node never comes up, so store-0 is still waiting for its link to it when
    # the stage fails, and Spark kills a task without its cleanup.
    topo = over_ipc()
    factory = faults.RecordingBusFactory(record=str(tmp_path), victim="store-1", when="start")
    with pytest.raises(SparkRuntimeError, match="store-1") as err:
        SparkRuntime(topo, spark, factory, ready_timeout=30).start()
    assert "ValueError: disk on fire" in str(err.value)
    assert sorted(p.stem for p in tmp_path.glob("*.stopped")) == ["coordinator", "store-0", "store-1"]
    roots = recorded(tmp_path)
    assert len(roots) == 2  # store-0's and store-1's
    assert [p for p in roots if p.exists()] == []
    dirs = socket_dirs(tmp_path)
    assert len(dirs) == 6 and [p for p in dirs if p.exists()] == []


@pytest.mark.timeout(120)
def test_a_task_node_whose_worker_is_killed_leaves_no_socket_directory_or_data_behind(
    spark: Any, tmp_path: Path
) -> None:
    # store-1's Python worker is SIGKILLed once its links are up: its node never stops, so the directory of
    # its socket files, which only a node's stop removes, falls to the driver.
    factory = faults.RecordingBusFactory(record=str(tmp_path), victim="store-1", when="sigkill")
    with pytest.raises(SparkRuntimeError, match="store-1"):
        SparkRuntime(over_ipc(), spark, factory, ready_timeout=30).start()
    assert not (tmp_path / "store-1.stopped").exists()
    dirs = socket_dirs(tmp_path)
    assert len(dirs) == 6 and [p for p in dirs if p.exists()] == []
    assert [p for p in recorded(tmp_path) if p.exists()] == []


@pytest.mark.timeout(120)
def test_nodes_keep_their_data_in_the_runtimes_directory_not_the_inherited_one(
    spark: Any, tmp_path: Path
) -> None:
    topo = load(shipped("local.toml"))
    record = tmp_path / "record"
    record.mkdir()
    inherited = tmp_path / "inherited"
    # Python workers Spark starts from now on get this variable, as those of a JVM that an earlier job
    # started with its own (since removed) directory.
    environment = spark.sparkContext.environment
    environment["SPARKBUS_DATA_DIR"] = str(inherited)
    try:
        with SparkRuntime(
            topo, spark, faults.RecordingBusFactory(record=str(record)), ready_timeout=30
        ) as rt:
            roots = recorded(record)
            assert len(roots) == 2 and all(p.is_dir() for p in roots)
            assert not any(p.is_relative_to(inherited) for p in roots), roots
            rt.stop()
    finally:
        del environment["SPARKBUS_DATA_DIR"]
    assert [p for p in roots if p.exists()] == []
    assert not inherited.exists()


@pytest.mark.timeout(120)
def test_a_start_the_driver_calls_off_stops_every_task_node_before_the_stage_is_cancelled(
    spark: Any, tmp_path: Path
) -> None:
    # The driver's own node fails once every task node is serving: the tasks are still running, and a
    # cancelled task is killed without its finally (which stops the node and removes its data).
    topo = load(shipped("local.toml"))
    factory = faults.RecordingBusFactory(record=str(tmp_path), victim="coordinator")
    rt = SparkRuntime(topo, spark, factory, ready_timeout=30)
    with pytest.raises(SparkRuntimeError) as err:
        rt.start()
    assert str(err.value) == "sparkbus node coordinator (driver) failed: ValueError: disk on fire"
    # The tasks the driver aborted did not fail (Spark logs a failed task with its traceback): each returned
    # its row, and the stage ended by itself rather than by the cancel.
    assert rt._error is None and rt._rows is not None
    assert sorted((row["node"], row["status"]) for row in rt._rows) == [
        ("store-0", "aborted"),
        ("store-1", "aborted"),
    ]
    assert sorted(p.name for p in tmp_path.glob("*.stopped")) == [
        "coordinator.stopped",
        "store-0.stopped",
        "store-1.stopped",
    ]
    roots = recorded(tmp_path)
    assert len(roots) == 2 and [p for p in roots if p.exists()] == []
