"""The Spark runtime on local[2]: rendezvous, data hand-off, orderly stop, and prompt, named failures."""

from __future__ import annotations

import ast
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import zmq
from pyspark import BarrierTaskContext, cloudpickle

from sparkbus.bus import security
from sparkbus.topologies.probe import ProbeFactory
from sparkbus.topologies.schema import load, loads, shipped
from sparkbus.topologies.spark import SparkRuntime, SparkRuntimeError, _explain, embedded_session

from . import faults
from .conftest import SESSION_CONF

pytestmark = pytest.mark.spark

DOCS = Path(__file__).parents[2] / "docs" / "TOPOLOGIES.md"

# The test helpers are not importable in Spark's Python workers: ship them by value.
cloudpickle.register_pickle_by_value(faults)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _ThirdsRouter runs in the tasks


def _exchange(_: Any) -> Any:
    """Inside a barrier task: bind REP on an ephemeral port, allGather it, REQ the other task, answer it."""
    ctx = BarrierTaskContext.get()
    me = ctx.partitionId()
    zctx = zmq.Context()
    rep = zctx.socket(zmq.REP)
    req = zctx.socket(zmq.REQ)
    try:
        for sock in (rep, req):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.setsockopt(zmq.SNDTIMEO, 5000)
        port = rep.bind_to_random_port("tcp://127.0.0.1")
        peers = [json.loads(a) for a in ctx.allGather(json.dumps({"task": me, "port": port}))]
        other = next(p for p in peers if p["task"] != me)
        req.connect(f"tcp://127.0.0.1:{other['port']}")
        req.send_string(f"hello from {me}")
        asked = rep.recv_string()
        rep.send_string(f"{me} got: {asked}")
        answer = req.recv_string()
    finally:
        rep.close()
        req.close()
        zctx.term()
    yield (me, port, answer)


def test_barrier_tasks_exchange_messages_through_allgather(spark: Any) -> None:
    rdd = spark.sparkContext.parallelize(range(2), 2)
    out = sorted(rdd.barrier().mapPartitions(_exchange).collect())
    assert [(task, answer) for task, _, answer in out] == [
        (0, "1 got: hello from 0"),
        (1, "0 got: hello from 1"),
    ]
    assert out[0][1] != out[1][1]


def test_runtime_brings_every_node_up_and_stops(spark: Any) -> None:
    topo = load(shipped("local.toml"))
    with SparkRuntime(topo, spark, ProbeFactory(), ready_timeout=30) as rt:
        assert rt.rendezvous_seconds is not None
        print(f"spark_rendezvous_s={rt.rendezvous_seconds:.3f}")
        assert set(rt.endpoints) == {"coordinator", "store-0", "store-1"}
        assert len({ep.control for ep in rt.endpoints.values()}) == 3
        rt.check()
        results = rt.stop()
    by_node = {r.node: r for r in results}
    assert set(by_node) == {"coordinator", "store-0", "store-1"}
    assert by_node["store-0"].partition == 0 and by_node["store-1"].partition == 1
    for r in results:
        assert r.status == "stopped"
        assert r.counters["ready"] is True
        assert r.counters["peers"] == 2
        assert r.counters["peers_welcomed"] == 2  # every peer answered this node's hello ...
        assert r.counters["peers_greeted"] == 2  # ... and said hello to it


def test_a_curve_topologys_tasks_meet_through_a_curve_channel(spark: Any, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    text = shipped("local.toml").read_text().replace(', "http.client"', "")  # no HTTP exchange under CURVE
    topo = loads(
        text.replace("[spark]\n", f'[bus.security]\nmode = "curve"\nkey_dir = "{keys}"\n\n[spark]\n', 1)
    )
    security.generate(keys, topo.node_ids())
    with SparkRuntime(topo, spark, ProbeFactory(), ready_timeout=30) as rt:
        assert sorted(r.node for r in rt.stop()) == ["coordinator", "store-0", "store-1"]


def test_each_node_gets_its_input_partition(spark: Any) -> None:
    topo = load(shipped("local.toml"))
    data = spark.range(1000)
    with SparkRuntime(topo, spark, ProbeFactory(), data=data, ready_timeout=30) as rt:
        results = rt.stop()
    rows = {r.node: r.counters["rows"] for r in results}
    assert rows["coordinator"] == 0
    assert rows["store-0"] + rows["store-1"] == 1000
    assert rows["store-0"] > 0 and rows["store-1"] > 0


def test_warmed_python_workers_are_the_ones_the_nodes_run_in(spark: Any) -> None:
    topo = load(shipped("local.toml"))
    rt = SparkRuntime(topo, spark, ProbeFactory(), ready_timeout=30)
    warm = rt.warm_workers()
    assert len(warm["pids"]) == 2 and len(warm["import_seconds"]) == 2
    with rt:
        pids = dict(rt.worker_pids)
        rt.stop()
    assert set(pids) == {"store-0", "store-1"}
    assert sorted(pids.values()) == warm["pids"]  # Spark reused the warmed workers for the barrier tasks
    assert rt.timeline["store-0:worker_spawned"] < 0 and rt.timeline["store-1:worker_spawned"] < 0


class _Routed:
    """Data with a row router that names each row's task: the tasks exchange them, no shuffle."""

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        self.router = _ThirdsRouter()

    def repartition(self, n: int) -> Any:
        return self.frame.coalesce(n)


class _ThirdsRouter:
    """Every third id to task 0, the rest to task 1."""

    exchange = True

    def __call__(self, batch: pa.RecordBatch, tasks: int) -> tuple[pa.RecordBatch, Any]:
        ids = batch.column("id").to_numpy()
        return batch, np.where(ids % 3 == 0, 0, 1)


def test_routed_rows_reach_the_task_their_route_names(spark: Any) -> None:
    topo = load(shipped("local.toml"))
    with SparkRuntime(
        topo, spark, ProbeFactory(), data=_Routed(spark.range(0, 3000, 1, 2)), ready_timeout=30
    ) as rt:
        results = rt.stop()
    rows = {r.node: r.counters["rows"] for r in results}
    assert rows == {"coordinator": 0, "store-0": 1000, "store-1": 2000}
    assert {"store-0:data_received", "store-1:links_ready", "driver:all_tasks_ready"} <= set(rt.timeline)


class _BadRouter:
    """A router that breaks its contract: one index short, or a task that does not exist."""

    exchange = True

    def __init__(self, how: str) -> None:
        self.how = how

    def __call__(self, batch: pa.RecordBatch, tasks: int) -> tuple[pa.RecordBatch, Any]:
        dest = np.zeros(batch.num_rows, np.int64)
        if self.how == "short":
            return batch, dest[:-1]
        dest[-1] = tasks if self.how == "beyond" else -1
        return batch, dest


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("short", "ValueError: the row router gave 1500 rows but no task index for each"),
        ("beyond", "ValueError: the row router named task 2 for a row, but the tasks are 0 to 1"),
        ("negative", "ValueError: the row router named task -1 for a row, but the tasks are 0 to 1"),
    ],
)
def test_a_row_router_that_breaks_its_contract_fails_the_stage_without_losing_rows(
    spark: Any, how: str, cause: str
) -> None:
    topo = load(shipped("local.toml"))
    data = _Routed(spark.range(0, 3000, 1, 2))
    data.router = _BadRouter(how)  # type: ignore[assignment]
    with pytest.raises(SparkRuntimeError) as err:
        SparkRuntime(topo, spark, ProbeFactory(), data=data, ready_timeout=30).start()
    assert err.value.node in ("store-0", "store-1")
    assert cause in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        ("raise", "ValueError: disk on fire"),
        ("bind", "OSError: address already in use"),
        ("exit", "Python worker exited unexpectedly"),
        ("sigkill", "Python worker exited unexpectedly"),
    ],
)
def test_a_dying_node_fails_the_stage_with_its_name(spark: Any, mode: str, cause: str) -> None:
    topo = load(shipped("local.toml"))
    rt = SparkRuntime(topo, spark, faults.FailingFactory(victim="store-1", mode=mode), ready_timeout=30)
    began = time.monotonic()
    with pytest.raises(SparkRuntimeError) as err:
        rt.start()
    print(f"{mode}: {time.monotonic() - began:.2f}s to: {err.value}")
    assert err.value.node == "store-1"
    assert err.value.task == 1
    assert str(err.value).startswith("sparkbus node store-1 (barrier task 1) failed: ")
    assert cause in str(err.value)
    # The runtime is usable again afterwards: the failed stage released every slot.
    with SparkRuntime(topo, spark, ProbeFactory(), ready_timeout=30) as rt2:
        assert len(rt2.stop()) == 3


@pytest.mark.timeout(120)
def test_a_driver_node_that_cannot_bind_is_named_and_leaves_no_spark_job_running(spark: Any) -> None:
    # The driver's node fails within milliseconds of the stage's thread starting, before that thread has
    # submitted the job: a job submitted after the cancel would wait ready_timeout for a peer table.
    topo = load(shipped("local.toml"))
    rt = SparkRuntime(
        topo, spark, faults.FailingFactory(victim="coordinator", mode="bind"), ready_timeout=120
    )
    try:
        with pytest.raises(SparkRuntimeError) as err:
            rt.start()
        assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    finally:
        spark.sparkContext.cancelAllJobs()  # a stage left running would hold the slots the next test needs
    # Named, as a task node's failure is: `sparkbus run` reports it in one line.
    assert (err.value.node, err.value.task) == ("coordinator", None)
    assert str(err.value) == "sparkbus node coordinator (driver) failed: OSError: address already in use"


def test_explain_names_the_node_from_spark_messages() -> None:
    ids = ("store-0", "store-1")
    crash = RuntimeError(
        "Job aborted due to stage failure: ... barrier task ResultTask(9, 1) finished unsuccessfully.\n"
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider ..."
    )
    err = _explain(crash, ids)
    assert (err.node, err.task) == ("store-1", 1)
    assert err.cause.startswith("Python worker exited unexpectedly (crashed)")
    tagged = RuntimeError(
        "    raise RuntimeError(_tagged(self.node_id, self.task, _describe(exc))) from exc\n"
        "RuntimeError: sparkbus node store-1 (barrier task 1) failed: ValueError: disk on fire\n"
    )
    err = _explain(tagged, ids)
    assert str(err) == "sparkbus node store-1 (barrier task 1) failed: ValueError: disk on fire"
    unknown = _explain(RuntimeError("something else\nentirely"), ids)
    assert (unknown.node, str(unknown)) == (None, "the sparkbus barrier stage failed: something else")


def test_embedded_session_returns_the_running_session_only_if_it_has_the_topologys_settings(
    spark: Any,
) -> None:
    local = shipped("local.toml").read_text()
    assert embedded_session(load(shipped("local.toml")), **SESSION_CONF) is spark
    # One store node on local[1]: Spark would keep the running session's master and barrier timeout, so
    # this topology's SparkRuntime would get neither.
    one = local.replace('"local[2]"', '"local[1]"').replace("count = 2", "count = 1")
    other = loads(one.replace("replication = 2", "replication = 1"))
    with pytest.raises(SparkRuntimeError) as err:
        embedded_session(
            other, **{**SESSION_CONF, "spark.barrier.sync.timeout": "7s", "spark.sql.shuffle.partitions": "9"}
        )
    assert str(err.value) == (
        "a SparkSession already runs in this process with master local[2] (the topology asks local[1]); "
        "spark.barrier.sync.timeout 10s (asked: 7s): stop it first, or build the SparkRuntime on it with a "
        "topology it matches"
    )
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"  # refused before Spark applied anything


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        conf = _Conf(values)
        self.sparkContext = type("SC", (), {"getConf": lambda _self: conf})()


def test_a_session_without_a_barrier_timeout_is_refused() -> None:
    topo = load(shipped("local.toml"))
    with pytest.raises(SparkRuntimeError, match=r"365 days.*set spark\.barrier\.sync\.timeout"):
        SparkRuntime(topo, _Session({}), ProbeFactory())
    for enabled in ("true", " TRUE"):  # as Spark reads a boolean: trimmed, in any case
        with pytest.raises(SparkRuntimeError, match="refuse dynamic allocation"):
            SparkRuntime(
                topo,
                _Session({"spark.barrier.sync.timeout": "5s", "spark.dynamicAllocation.enabled": enabled}),
                ProbeFactory(),
            )
    with pytest.raises(SparkRuntimeError, match="no \\[spark\\] section"):
        SparkRuntime(load(shipped("processes.toml")), _Session({}), ProbeFactory())


def documented_example(heading: str) -> str:
    """The Python block of ``docs/TOPOLOGIES.md`` under ``## heading``."""
    section = DOCS.read_text().split(f"\n## {heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.timeout(240)
def test_the_documented_example_runs(
    spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sparkbus.topologies.spark as runtime

    # The example's session is this one: embedded_session returns it given the tests' settings as well.
    monkeypatch.setattr(
        runtime, "embedded_session", lambda topo, **conf: embedded_session(topo, **SESSION_CONF)
    )
    exec(compile(documented_example("Running on Spark"), str(DOCS), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    probes = ast.literal_eval(lines[1])
    assert probes["coordinator"] == ("stopped", 0)
    assert {n: status for n, (status, _) in probes.items()} == dict.fromkeys(probes, "stopped")
    assert probes["store-0"][1] + probes["store-1"][1] == 1_000_000
    [loaded] = ast.literal_eval(lines[2])
    assert set(loaded) == {"written", "pending"} and loaded["written"] + loaded["pending"] == 100_000
    assert ast.literal_eval(lines[3]) == {
        "store-0": "stopped",
        "store-1": "stopped",
        "coordinator": "stopped",
    }
