"""The arguments of the ``sparkbus`` commands for a running cluster: ``load``, ``sql`` and ``view create |
peek | drop`` (``sparkbus.topologies.cli.cluster_command`` runs them), and the view ``view create``'s
arguments define (``_view_def``). Only argparse: building the parser imports no command."""

from __future__ import annotations

import argparse
from typing import Any

#: the topology file the cluster commands connect by when neither --topology nor --address is given
DEFAULT_TOPOLOGY = "topologies/processes.toml"
_AGGREGATES = ("count", "sum", "avg", "min", "max")
_OPS = {"=": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


class CommandError(Exception):
    """A mistake the user can fix: printed as one line, exit status 1."""


def client_options(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("which cluster")
    where.add_argument(
        "--topology",
        default=None,
        metavar="FILE",
        help=f"the topology file `sparkbus up` runs (default: {DEFAULT_TOPOLOGY} if it is in this "
        "directory, else the one cluster `sparkbus up` is running); its gateway nodes and keys are found "
        "through the state file `up` writes",
    )
    where.add_argument(
        "--address",
        default=None,
        metavar="[NODE=]tcp://HOST:PORT",
        help="a gateway node's control endpoint; NODE= names its node, whose own public key in --key-dir "
        "is then used (without it, the key directory's shared cluster key)",
    )
    where.add_argument(
        "--cluster-tag", default=None, help="the nodes' bus tag NAME/TAG (needed with --address)"
    )
    where.add_argument(
        "--key-dir", default=None, help="CURVE keys: a directory with a client (or shared cluster) pair"
    )
    where.add_argument(
        "--connect-timeout", type=float, default=10.0, help="seconds to reach a node (default 10)"
    )
    where.add_argument("--timeout", type=float, default=60.0, help="seconds per operation (default 60)")


def output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of a table")
    p.add_argument("--max-rows", type=int, default=100, help="rows to print in the table (default 100)")


def add_cluster_parsers(sub: Any) -> None:
    load_p = sub.add_parser(
        "load",
        help="load a Parquet or CSV file into a table of a running cluster",
        description="Read a Parquet file or directory, or a CSV file with a header, and load its rows through "
        "the thin client. A table the topology declares ([tables.TABLE]): each row goes to partition "
        "pmod(hash(key), partitions) (Spark SQL's hash, as `sparkbus run` routes rows), written through the "
        "partition's current leader and upserted by key; each partition written is flushed and the command "
        "waits until it is replicated. Any other table: into the gateway node's query catalog as table TABLE. "
        "Either way `sparkbus sql` reads it; the rows also go into the compute controller's table TABLE "
        "(what views read; created with the file's schema, and keyed like the replicated table, so a row "
        "loaded twice counts once there too; another table's rows are appended).",
    )
    load_p.add_argument("table", help="the table name")
    load_p.add_argument("path", help="a .parquet file or directory, or a .csv file")
    load_p.add_argument(
        "--replace",
        action="store_true",
        help="replace the SQL table's rows instead of adding (not for a replicated table of the topology)",
    )
    load_p.add_argument("--no-views", action="store_true", help="only the SQL table, not the compute table")
    client_options(load_p)
    sql_p = sub.add_parser(
        "sql",
        help="run a SQL query on a running cluster and print the result",
        description="Run one SELECT through the thin client (the gateway node's query role initiates it, every "
        "node up participates) and print the rows as a table. Errors are one line, exit status 1.",
    )
    sql_p.add_argument("query", help='the query, e.g. "SELECT kind, COUNT(*) AS n FROM events GROUP BY kind"')
    output_options(sql_p)
    client_options(sql_p)
    view = sub.add_parser(
        "view",
        help="create, peek or drop a view kept fresh by the compute replicas",
        description="Views of the compute controller over its tables (`sparkbus load` fills them).",
    )
    view_sub = view.add_subparsers(dest="view_command", metavar="create|peek|drop", required=True)
    create = view_sub.add_parser(
        "create",
        help="create a view",
        description="Create view NAME over table SOURCE: optional filters, a projection, a group-by and "
        "aggregates, e.g. `sparkbus view create by_kind --source events --group-by kind --agg 'n=count(*)' "
        "--agg 'total=sum(value)'`.",
    )
    create.add_argument("name", help="the view's name")
    create.add_argument("--source", required=True, help="the table (or view) it reads")
    create.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="'COLUMN OP VALUE'",
        help="a filter, OP one of = != < <= > >= (repeatable; all must hold)",
    )
    create.add_argument("--project", default=None, metavar="A,B", help="keep only these columns")
    create.add_argument("--group-by", default=None, metavar="A,B", help="group by these columns")
    create.add_argument(
        "--agg",
        action="append",
        default=[],
        metavar="NAME=FUNC(COLUMN)",
        help="an aggregate: count(*), count, sum, avg, min, max (repeatable)",
    )
    client_options(create)
    peek = view_sub.add_parser("peek", help="print a view's rows", description="Print the rows of view NAME.")
    peek.add_argument("name", help="the view (or table) to read")
    output_options(peek)
    client_options(peek)
    drop = view_sub.add_parser(
        "drop",
        help="drop a view",
        description="Drop view NAME, so that a view of that name can be created again (how a view that failed "
        "on its data is made anew); refused while another view reads it.",
    )
    drop.add_argument("name", help="the view to drop")
    client_options(drop)


# ---------------------------------------------------------------- a view's definition from its arguments


def _aggregate(text: str) -> Any:
    """``NAME=FUNC(COLUMN)`` or ``NAME=count(*)``."""
    from sparkbus.roles.compute import Aggregate  # noqa: PLC0415

    name, _, call = text.partition("=")
    func, _, rest = call.partition("(")
    column = rest.removesuffix(")").strip()
    if not name or not func or not rest.endswith(")"):
        raise CommandError(f"--agg {text!r}: expected NAME=FUNC(COLUMN), e.g. total=sum(value) or n=count(*)")
    kind: Any = func.strip().lower()
    if kind not in _AGGREGATES:
        raise CommandError(f"--agg {text!r}: {kind} is not one of {', '.join(_AGGREGATES)}")
    try:
        return Aggregate(func=kind, column=None if column in ("", "*") else column, name=name.strip())
    except ValueError as exc:
        raise CommandError(f"--agg {text!r}: {exc}") from None


def _predicate(text: str) -> Any:
    """``COLUMN OP VALUE`` with OP one of = != < <= > >=; VALUE a number or a string."""
    from sparkbus.roles.compute import Predicate  # noqa: PLC0415

    parts = text.split(None, 2)
    if len(parts) != 3 or parts[1] not in _OPS:
        raise CommandError(f"--where {text!r}: expected COLUMN OP VALUE with OP one of {' '.join(_OPS)}")
    column, op, raw = parts
    value: Any
    try:
        value = int(raw)
    except ValueError:
        try:
            value = float(raw)
        except ValueError:
            value = raw.strip("'\"")
    return Predicate(column=column, op=_OPS[op], value=value)  # type: ignore[arg-type]


def _view_def(args: argparse.Namespace) -> Any:
    from sparkbus.roles.compute import ViewDef  # noqa: PLC0415

    try:
        return ViewDef(
            source=args.source,
            filters=tuple(_predicate(w) for w in args.where),
            project=tuple(c.strip() for c in args.project.split(",")) if args.project else None,
            group_by=tuple(c.strip() for c in args.group_by.split(",")) if args.group_by else (),
            aggregates=tuple(_aggregate(a) for a in args.agg),
        )
    except ValueError as exc:
        raise CommandError(f"view {args.name}: {exc}") from None
