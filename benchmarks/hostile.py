"""Hostile conditions, measured: CURVE's cost, the fuzz tier's cases, and a peer killed or frozen mid-stream.

* ``curve_vs_plain_1mib``: throughput of an echo credit stream of 1 MiB batches (8 MiB of credit)
  between two nodes with CURVE, over the same stream without it. Both nodes run in this process (their
  loop threads share the GIL; encryption runs in libzmq's I/O threads), median of the repeats.
* ``fuzz``: ``pytest tests/fuzz`` run as the fuzz tox environment runs it; cases per kind and failures.
* ``scenarios``: a peer process streaming 1 MiB batches to us is SIGKILLed, or SIGSTOPped, mid-stream.
  What the caller sees (the stream call's error), how long after the signal, and whether the link comes
  back once the peer is replaced (SIGKILL) or continued (SIGSTOP). Echo streams are not stored, so no
  acknowledged row can be lost here: ``rows_lost`` is 0 by construction and says so.
* ``faults``: the fault tier (``pytest tests/faults``, as ``tox -e faults`` runs it): each scenario prints
  what it measured (seconds from the signal or the cut to the error, from SIGCONT, a restart or the heal
  to the next success, and for replication the acknowledged rows missing afterwards), collected here with
  what the user sees. ``load``: 1,000 concurrent queries with 100 concurrent exchanges, wall time and
  queries per second, and the participants' memory and descriptors before and after.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, table, write

from sparkbus.bus import BusConfig, security
from sparkbus.bus.config import CurveSettings
from sparkbus.bus.node import Endpoints, Node
from sparkbus.codecs import MiB
from sparkbus.topologies.echo import EchoRole

ROOT = Path(__file__).resolve().parent.parent


def _pair(curve: CurveSettings | None) -> tuple[Node, Node]:
    cfg = BusConfig(cluster_tag="hostile", curve=curve, initial_credit=8 * MiB, batch_size=MiB)
    a, b = Node("a", cfg, [EchoRole(node_id="a")]), Node("b", cfg, [EchoRole(node_id="b")])
    ea, eb = a.bind(), b.bind()
    a.start({"b": eb})
    b.start({"a": ea})
    a.wait_ready(10)
    b.wait_ready(10)
    return a, b


def stream_gbps(curve: CurveSettings | None, batches: int, repeats: int) -> float:
    a, b = _pair(curve)
    try:
        args = {"peer": "b", "batches": batches, "batch_size": MiB, "credit": 8 * MiB, "timeout": 60}
        a.call("echo", "stream", args, timeout=60)  # warm-up
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a.call("echo", "stream", args, timeout=60)
            rates.append(batches * MiB / (time.perf_counter() - t0) / 1e9)
        return statistics.median(rates)
    finally:
        a.stop()
        b.stop()


def fuzz(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hostile-fuzz-") as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {**os.environ, "SPARKBUS_FUZZ_REPORT": str(report)}
        paths = ["tests/fuzz/test_decoders.py", "tests/fuzz/test_live.py"] if quick else ["tests/fuzz"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        took = time.perf_counter() - t0
        if not report.exists():
            raise RuntimeError(f"the fuzz run wrote no report:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        doc = json.loads(report.read_text())
    cases = doc["cases"]
    return {
        "paths": paths,
        "cases": cases,
        "cases_total": sum(v for k, v in cases.items() if k not in {"role_refusals", "live_refusals"}),
        "crashes": doc["failed"],
        "seconds": round(took, 1),
    }


PEER = textwrap.dedent(
    """
    import json, sys
    from sparkbus.bus import BusConfig
    from sparkbus.bus.node import Endpoints, Node
    from sparkbus.topologies.echo import EchoRole
    cfg = BusConfig(cluster_tag="hostile", heartbeat_interval=0.3, peer_timeout=1.5)
    node = Node("p", cfg, [EchoRole(node_id="p")])
    print(json.dumps(node.bind().to_json()), flush=True)
    node.start({"us": Endpoints.from_json(json.loads(sys.stdin.readline()))})
    sys.stdin.readline()  # until the benchmark closes our stdin
    node.stop()
    """
)


def _peer() -> tuple[subprocess.Popen[str], Endpoints]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, Endpoints.from_json(json.loads(proc.stdout.readline()))


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


def scenario(sig: signal.Signals) -> dict[str, Any]:
    """Stream from a peer process; signal it once the stream runs; time the caller's error."""
    cfg = BusConfig(cluster_tag="hostile", heartbeat_interval=0.3, peer_timeout=1.5)
    us = Node("us", cfg, [EchoRole(node_id="us")])
    ours = us.bind()
    proc, theirs = _peer()
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(ours.to_json()) + "\n")
        proc.stdin.flush()
        us.start({"p": theirs})
        us.wait_ready(10)
        # Slow enough (credit of one batch) that the signal lands mid-stream.
        fut = us.call_async(
            "echo",
            "stream",
            {"peer": "p", "batches": 100_000, "batch_size": MiB, "credit": MiB, "timeout": 30},
        )
        deadline = time.monotonic() + 10
        while us.call("echo", "counters", timeout=5)["batches_received"] < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        try:
            fut.result(timeout=20)
            outcome, error = "success", ""
        except Exception as exc:  # the stream call's error is what a user sees
            outcome, error = "error", str(exc)
        detect = time.monotonic() - t0
        recovered: float | None = None
        if sig == signal.SIGSTOP:
            os.kill(proc.pid, signal.SIGCONT)
            t1 = time.monotonic()
            try:
                us.wait_ready(10)
                us.call("echo", "ping", {"peer": "p", "payload": b"back"}, timeout=10)
                recovered = time.monotonic() - t1
            except Exception:
                recovered = None
        status = us.status()
        return {
            "scenario": f"{sig.name} of a peer mid-stream (1 MiB batches)",
            "outcome": outcome,
            "user_sees": error[:160],
            "detect_s": round(detect, 3),
            "recovery_s": None if recovered is None else round(recovered, 3),
            "streams_left": sum(p["streams_in"] + p["streams_out"] for p in status["peers"].values()),
            "rows_lost": 0,
        }
    finally:
        us.stop()
        _reap(proc)


#: scenario name printed by a test -> (what is done, what the user sees)
FAULTS = {
    "query-sigkill": (
        "SIGKILL of a query participant mid-query",
        "QueryError 1002 MEMBER_LEAVE; after a restart the query succeeds",
    ),
    "query-sigstop": (
        "SIGSTOP of a query participant mid-query",
        "QueryError 1002 MEMBER_LEAVE after the peer timeout; after SIGCONT the query succeeds",
    ),
    "binx-sigkill": (
        "SIGKILL of a BinX server mid-transfer",
        "fetch fails: ExchangeGaveUp (max error duration 3 s); a restarted server serves a new buffer",
    ),
    "binx-sigstop": (
        "SIGSTOP of a BinX server mid-transfer",
        "the transfer pauses, then completes after SIGCONT: every page once, in order",
    ),
    "compute-sigkill": (
        "SIGKILL of a compute replica under a targeted peek",
        "peek fails: TARGET_FAILED; the other replica answers; the restarted one is hydrated and answers",
    ),
    "compute-sigstop": (
        "SIGSTOP of a compute replica under a targeted peek",
        "peek fails: TARGET_FAILED after the peer timeout; after SIGCONT it answers",
    ),
    "replication-sigstop": (
        "SIGSTOP of a follower, then of the leader, mid-transit",
        "writes keep being acknowledged (by b after fail-over); every acknowledged row on every replica",
    ),
    "netem-partition": (
        "partition between two network namespaces during a query",
        "QueryError 1002 MEMBER_LEAVE; after healing the next query succeeds",
    ),
    "tbf-2mbit": ("2 Mbit/s link between two namespaces (tbf), full scan", "correct result, later"),
    "netem-delay-loss": ("netem 20 ms +- 10 ms delay, 2 % loss", "correct results, later"),
}


def faults(quick: bool) -> dict[str, Any]:
    """Run the fault tier and collect what its scenarios printed."""
    select = ["-k", "query_faults or replication"] if quick else []
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/faults",
            *select,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    took = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    load: dict[str, Any] | None = None
    for raw in proc.stdout.splitlines():
        # pytest -q writes its progress dots on the line a test prints to
        at = min((raw.find(m) for m in ("FAULT ", "LOAD ") if m in raw), default=-1)
        line = raw[at:] if at >= 0 else raw
        if line.startswith("FAULT "):
            name, *pairs = shlex.split(line)[1:]
            values = dict(p.split("=", 1) for p in pairs)
            what, sees = FAULTS[name]
            lost = int(values.get("lost", 0))
            rows.append({"scenario": what, "name": name, "user_sees": sees, **values, "rows_lost": lost})
        elif line.startswith("LOAD "):
            head, _, rest = line.partition(" before=")
            load = dict(p.split("=", 1) for p in head.split()[1:])
            before, _, after = rest.partition(" after=")
            load["before"], load["after"] = (
                json.loads(before.replace("'", '"')),
                json.loads(after.replace("'", '"')),
            )
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    return {
        "scenarios": rows,
        "load": load,
        "skipped": skipped,
        "summary": summary,
        "seconds": round(took, 1),
    }


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    batches, repeats = (16, 3) if args.quick else (256, 5)
    with tempfile.TemporaryDirectory(prefix="hostile-keys-") as keys:
        security.generate(keys, [security.SHARED_NAME])
        plain = stream_gbps(None, batches, repeats)
        curve = stream_gbps(CurveSettings(key_dir=keys), batches, repeats)
    scenarios = [scenario(signal.SIGKILL), scenario(signal.SIGSTOP)]
    fz = fuzz(args.quick)
    ft = faults(args.quick)
    figures = {
        "stream_1mib_plain_gbps": round(plain, 3),
        "stream_1mib_curve_gbps": round(curve, 3),
        "curve_vs_plain_1mib": round(curve / plain, 3),
        "fuzz": fz,
        "scenarios": scenarios,
        "faults": ft,
    }
    write(args.out, "hostile", figures, args.quick)
    print(
        table(
            [
                ("1 MiB stream, plain", f"{plain:.2f} GB/s"),
                ("1 MiB stream, CURVE", f"{curve:.2f} GB/s"),
                ("curve_vs_plain_1mib", f"{curve / plain:.2f}"),
                ("fuzz cases / crashes", f"{fz['cases_total']} / {fz['crashes']}"),
            ],
            ("figure", "value"),
        )
    )
    print()
    print(
        table(
            [
                (s["scenario"], s["outcome"], str(s["detect_s"]), str(s["recovery_s"]), str(s["rows_lost"]))
                for s in scenarios
            ],
            ("scenario", "outcome", "detect s", "recovery s", "rows lost"),
        )
    )
    print()
    print(
        table(
            [
                (
                    s["scenario"],
                    s["user_sees"],
                    s.get("detected", "-"),
                    s.get("recovered", s.get("leader_recovery", "-")),
                    str(s["rows_lost"]),
                )
                for s in ft["scenarios"]
            ],
            ("fault scenario", "user sees", "detect s", "recovery s", "rows lost"),
        )
    )
    print(f"faults: {ft['summary']} ({ft['seconds']} s)")
    if ft["load"] is not None:
        print(f"load: {ft['load']}")


if __name__ == "__main__":
    main()
