"""The ``sparkbus`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from rich.console import Console

from sparkbus.topologies.launcher import status_command, up_command
from sparkbus.topologies.schema import TopologyError, load
from sparkbus.topologies.summary import print_summary


def package_version() -> str:
    try:
        return version("sparkbus")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def validate_command(path: str) -> int:
    """``sparkbus validate FILE``: 0 and a summary when valid, 1 and every problem when not."""
    try:
        topo = load(path)
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 1
    print_summary(topo, Console(soft_wrap=True))
    return 0


def run_command(topology: str | None, *, rows: int, data: str | None, report: str) -> int:
    """``sparkbus run``: the main job (``sparkbus.topologies.mainjob``)."""
    from sparkbus.topologies.mainjob import Options, main_job  # noqa: PLC0415 (pulls in pyarrow and Spark)
    from sparkbus.topologies.schema import shipped  # noqa: PLC0415

    if rows <= 0 and data is None:
        print(f"sparkbus run: --rows must be a positive number of rows, got {rows}", file=sys.stderr)
        return 1
    path = Path(topology) if topology is not None else shipped("local.toml")
    try:
        load(path)
    except TopologyError as exc:
        print(
            f"sparkbus run: {str(exc).splitlines()[0]} (sparkbus validate {path} lists every problem)",
            file=sys.stderr,
        )
        return 1
    report_path = Path(report)
    return main_job(
        Options(
            topology=path,
            rows=rows,
            data=Path(data) if data is not None else None,
            report=report_path,
            chart=report_path.with_suffix(".png"),
        )
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkbus",
        description=(
            "Data-engine protocols over a ZeroMQ bus, next to Spark: a partitioned, replicated in-memory "
            "table store that Spark loads, that answers queries in milliseconds and keeps views fresh."
        ),
    )
    parser.add_argument("--version", action="version", version=f"sparkbus {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="the main job: load a table with Spark, replicate it, query it, keep a view fresh",
        description="The main job: Spark builds (or reads) an events table, the executor nodes load it into "
        "replicated partitions, reference queries run on sparkbus and on Spark SQL side by side (results "
        "compared, p50 latencies), a view is kept fresh while rows are written, and one query's output is "
        "moved by the three exchanges. Writes a JSON report and a PNG chart.",
    )
    run.add_argument(
        "topology", nargs="?", default=None, help="topology file (default: the shipped local.toml)"
    )
    run.add_argument("--rows", type=int, default=1_000_000, help="rows to generate (default 1,000,000)")
    run.add_argument(
        "--data",
        default=None,
        help="a Parquet file or directory, or a CSV file, to load instead of generating",
    )
    run.add_argument(
        "--report",
        default="sparkbus-report.json",
        help="the JSON report (default ./sparkbus-report.json; the chart goes next to it as .png)",
    )
    validate = sub.add_parser(
        "validate",
        help="check a topology file and summarise it",
        description="Load and validate a topology file. Prints its nodes, roles and tables, or every problem "
        "found (file, key path, reason) and exits with status 1.",
    )
    validate.add_argument("topology", help="the topology file (shipped ones: see docs/TOPOLOGIES.md)")
    up = sub.add_parser(
        "up",
        help="start every node of a topology as a local process",
        description="Start each node of a processes-style topology (host placements on 127.0.0.1) as a child "
        "process, wait until every link has completed its handshake, print where each node listens, and run "
        "until Ctrl-C or SIGTERM. When a node dies the others are stopped and the exit status is 1.",
    )
    up.add_argument("topology", help="the topology file, e.g. topologies/processes.toml")
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for every link (default 30)")
    up.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="run only the roles and services that can be loaded (the others are listed, not run)",
    )
    status = sub.add_parser(
        "status",
        help="peers, sessions, streams and counters of each running node",
        description="Ask each node of a cluster started by `sparkbus up FILE` (or one status endpoint "
        "tcp://HOST:PORT) for its peers, sessions, streams and counters.",
    )
    status.add_argument("target", help="the topology file given to `sparkbus up`, or a tcp:// status address")
    status.add_argument("--timeout", type=float, default=3.0, help="seconds to wait per node (default 3)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "validate":
        return validate_command(args.topology)
    if args.command == "up":
        return up_command(args.topology, ready_timeout=args.timeout, skip_unavailable=args.skip_unavailable)
    if args.command == "status":
        return status_command(args.target, timeout=args.timeout, as_json=args.json)
    if args.command == "run":
        return run_command(args.topology, rows=args.rows, data=args.data, report=args.report)
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
