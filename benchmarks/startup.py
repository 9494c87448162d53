"""Startup figures: ``up_ready_s`` (sparkbus up processes.toml: launch to every link ready) and
``spark_rendezvous_s`` (barrier tasks started to every link ready, on local[2], real bus nodes with echo).

``spark_rendezvous_s`` counts from the first barrier task's start (its ``task_started`` mark in
``SparkRuntime.timeline``) until every node, executor and driver, has all its links up; ``spark_start_s``
is the whole ``SparkRuntime.start()``, which adds Spark scheduling the stage and starting its Python
workers (in a fresh session the first stage also starts Spark's Python daemon). Each run is one start in
the same SparkSession: the first is cold, the later ones reuse the Python workers.

    python benchmarks/startup.py [--quick] --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from sparkbus.topologies import shipped


def up_ready_once() -> float:
    with tempfile.TemporaryDirectory(prefix="sparkbus-bench-") as tmp:
        env = {**os.environ, "XDG_RUNTIME_DIR": tmp}
        cmd = [sys.executable, "-m", "sparkbus.topologies.cli", "up", str(shipped("processes.toml"))]
        started = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "--skip-unavailable", "--timeout", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "ready (" in line:
                    return time.monotonic() - started
            raise RuntimeError(f"sparkbus up exited with {proc.wait(timeout=10)} before ready")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            if proc.stdout is not None:
                proc.stdout.close()


def spark_rendezvous(runs: int) -> tuple[list[float], list[float]]:
    """(rendezvous seconds, start seconds) of each run."""
    from sparkbus.topologies.busnode import BusNodeFactory  # noqa: PLC0415
    from sparkbus.topologies.schema import loads  # noqa: PLC0415
    from sparkbus.topologies.spark import SparkRuntime, embedded_session  # noqa: PLC0415 (needs pyspark)

    topo_text = """
[cluster]
name = "bench"
[bus]
heartbeat = "250ms"
peer_timeout = "2s"
[spark]
master = "local[2]"
barrier_timeout = "20s"
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
    topo = loads(topo_text)
    spark = embedded_session(topo, **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    rendezvous: list[float] = []
    starts: list[float] = []
    try:
        for _ in range(runs):
            with SparkRuntime(topo, spark, BusNodeFactory(), ready_timeout=30) as rt:
                assert rt.rendezvous_seconds is not None
                tasks = [at for mark, at in rt.timeline.items() if mark.endswith(":task_started")]
                rendezvous.append(rt.timeline["driver:driver_nodes_ready"] - min(tasks))
                starts.append(rt.rendezvous_seconds)
                rt.stop()
    finally:
        spark.stop()
    return rendezvous, starts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-spark", action="store_true", help="skip spark_rendezvous_s")
    args = parser.parse_args()
    runs = 1 if args.quick else 5
    up = [up_ready_once() for _ in range(runs)]
    result: dict[str, Any] = {"runs": runs, "up_ready_s": statistics.median(up), "up_ready_all_s": up}
    if not args.no_spark:
        try:
            sr, ss = spark_rendezvous(runs)
            result["spark_rendezvous_s"] = statistics.median(sr)
            result["spark_rendezvous_all_s"] = sr
            result["spark_start_s"] = statistics.median(ss)
            result["spark_start_all_s"] = ss
        except ImportError as exc:
            result["spark_rendezvous_s"] = None
            result["spark_skipped"] = str(exc)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'figure':<22}{'seconds':>10}")
    for key in ("up_ready_s", "spark_rendezvous_s", "spark_start_s"):
        val = result.get(key)
        print(f"{key:<22}{val if val is None else format(val, '.3f'):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
