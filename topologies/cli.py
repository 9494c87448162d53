"""The ``sparkbus`` command."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkbus.topologies import keys
from sparkbus.topologies.cli_args import DEFAULT_TOPOLOGY, CommandError, _view_def, add_cluster_parsers
from sparkbus.topologies.leaders import (
    current_leaders,
    failing,
    leader_in_refusal,
    not_replicated,
    unanswered,
)

# Each command imports what it needs (the launcher, the client, pyarrow, Rich, Spark) when it runs, so
# ``sparkbus --help`` and ``sparkbus status`` do not pay for the others (docs/OPERATIONS.md, "Start-up time").
if TYPE_CHECKING:
    import pyarrow as pa
    from rich.progress import Progress

    from sparkbus.topologies.client import Client
    from sparkbus.topologies.model import TableSpec


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 (only for --version)

    try:
        return version("sparkbus")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


class _VersionAction(argparse._VersionAction):
    """``--version``: the version is looked up when it is asked for, not each time the parser is built."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.version = f"sparkbus {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def validate_command(path: str) -> int:
    """``sparkbus validate FILE``: 0 and a summary when valid, 1 and every problem when not."""
    from rich.console import Console  # noqa: PLC0415

    from sparkbus.topologies.runtime import check_filled_in  # noqa: PLC0415
    from sparkbus.topologies.schema import TopologyError, load  # noqa: PLC0415
    from sparkbus.topologies.summary import print_summary  # noqa: PLC0415

    try:
        topo = load(path)
        check_filled_in(topo)
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 1
    print_summary(topo, Console(soft_wrap=True))
    return 0


def run_command(topology: str | None, *, rows: int, data: str | None, report: str) -> int:
    """``sparkbus run``: the main job (``sparkbus.topologies.mainjob``)."""
    from sparkbus.topologies.mainjob import Options, main_job  # noqa: PLC0415 (pulls in pyarrow and Spark)
    from sparkbus.topologies.runtime import check_filled_in  # noqa: PLC0415
    from sparkbus.topologies.schema import TopologyError, load, shipped  # noqa: PLC0415

    if rows <= 0 and data is None:
        print(f"sparkbus run: --rows must be a positive number of rows, got {rows}", file=sys.stderr)
        return 1
    path = Path(topology) if topology is not None else shipped("local.toml")
    try:
        check_filled_in(load(path))
    except TopologyError as exc:
        print(
            f"sparkbus run: {str(exc).splitlines()[0]} (sparkbus validate {path} lists every problem)",
            file=sys.stderr,
        )
        return 1
    report_path = Path(report)
    if not report_path.name:  # ".", "" and "/" name no file for the report nor its chart
        print(f"sparkbus run: --report {report}: the report {report_path} is a directory", file=sys.stderr)
        return 1
    return main_job(
        Options(
            topology=path,
            rows=rows,
            data=Path(data) if data is not None else None,
            report=report_path,
            chart=report_path.with_suffix(".png"),
        )
    )


# ---------------------------------------------------------------- commands for a running cluster

#: rows of Arrow IPC per LOAD / TABLE_WRITE request, kept well below the 64 MiB message limit
REQUEST_BYTES = 16 * 1024 * 1024
#: rows per write into the compute controller's table: the controller and each compute replica apply a write in
#: one turn of their node's loop, and 600,000 rows in one turn held the replicas' loops past a second, near the
#: peers' heartbeat timeout (docs/TOPOLOGIES.md, "Loading a table")
VIEW_ROWS = 50_000


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """The message on one line (schemas and nested errors span several), cut at ``limit`` characters."""
    # A ClientError whose role named the code already ("[1005 PARSING] ...") needs no second "[1005]".
    message = getattr(exc, "message", None)
    text = " ".join((message if isinstance(message, str) and message.startswith("[") else str(exc)).split())
    if not text:
        return type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What ``_topology_path`` says is missing and how to give it, as (missing, give any, give one of those running):
#: the client commands take --topology and --address, ``sparkbus status`` a file or an address argument.
CLIENT_HINT = ("--topology", "give --topology FILE or --address tcp://...", "give --topology, one of")
STATUS_HINT = ("FILE", "give FILE or tcp://HOST:PORT", "give one of")


def _topology_path(args: argparse.Namespace, hint: tuple[str, str, str] = CLIENT_HINT) -> str:
    """``--topology``; else ``topologies/processes.toml`` if it is here; else the one cluster ``sparkbus up``
    runs on this machine.

    Raises:
        CommandError: none of these, or several clusters running; worded by ``hint`` for the command.
    """
    from sparkbus.topologies.launcher import running_clusters  # noqa: PLC0415

    if args.topology:
        return str(args.topology)
    if Path(DEFAULT_TOPOLOGY).exists():
        return DEFAULT_TOPOLOGY
    try:
        running = running_clusters()
    except OSError as exc:  # an unsafe run directory (keys.UnsafeDirectory) or one that cannot be read
        raise CommandError(str(exc)) from None
    if len(running) == 1:
        return running[0]
    missing, give_any, give_one = hint
    if not running:
        raise CommandError(
            f"no {missing}, no {DEFAULT_TOPOLOGY} here, and no cluster started by `sparkbus up` is running "
            f"({give_any})"
        )
    raise CommandError(
        f"no {missing}, and {len(running)} clusters are running: {give_one} {', '.join(running)}"
    )


def _connect(args: argparse.Namespace, node: str | None = None) -> Client:
    """The thin client, by ``--address`` (with ``--cluster-tag``) or by ``args.topology`` (which
    ``cluster_command`` has resolved, ``_topology_path``); with ``node``, to that node's gateway only, found by
    topology even with ``--address`` (a declared table's rows go to each partition's leader, ``_load``).

    ``--topology`` always names a topology file, whatever its name, so it is read here (``topology_target``)
    rather than handed to ``connect``, which would take a file name that is not a file for an address.
    ``--address NODE=tcp://HOST:PORT`` names the address's node (``connect({NODE: ADDRESS})``), so a key
    directory with a pair per node serves it.
    """
    from sparkbus.roles.client import ConnectTimeoutError  # noqa: PLC0415
    from sparkbus.topologies.client import (  # noqa: PLC0415 (pulls in pyarrow and the client)
        CLIENT_KEY_NAME,
        GATEWAY,
        Client,
        ClientCurve,
        connect,
        topology_target,
    )

    options: dict[str, Any] = {"connect_timeout": args.connect_timeout, "op_timeout": args.timeout + 5.0}
    if args.address and node is None:
        if not args.cluster_tag:
            raise CommandError("--address needs --cluster-tag (the nodes' bus tag, NAME/TAG of the topology)")
        node_id, named, address = str(args.address).partition("=")
        if named and not (node_id and address):
            raise CommandError(f"--address {args.address}: expected [NODE=]tcp://HOST:PORT")
        target: str | dict[str, str] = {node_id: address} if named else node_id
        return connect(target, cluster_tag=args.cluster_tag, key_dir=args.key_dir, **options)
    topology = args.topology
    if not Path(topology).exists():
        raise CommandError(f"{topology}: no such topology file (give --topology FILE or --address tcp://...)")
    found = topology_target(topology)
    if node is None:
        addresses = found.addresses
    elif node in found.gateways:
        addresses = [found.gateways[node]]
    else:
        running = ", ".join(sorted(found.gateways))
        raise ConnectTimeoutError(f"{topology}: node {node} runs no {GATEWAY} (running gateways: {running})")
    keys = args.key_dir if args.key_dir is not None else found.key_dir
    curve = None
    if keys is not None:
        # a key directory `sparkbus up` made lends an entry gateway's pair when it holds no client pair
        lend = (
            [found.nodes[a] for a in found.addresses] if args.key_dir is None and found.run_dir_keys else []
        )
        curve = ClientCurve.from_key_dir(keys, name=CLIENT_KEY_NAME, nodes=found.nodes, fallback_names=lend)
    return Client(addresses, cluster_tag=args.cluster_tag or found.cluster_tag, curve=curve, **options)


def _read_rows(path: Path) -> pa.Table:
    """A Parquet file or directory, or a CSV file with a header, as an Arrow table of at least one row.

    Raises:
        CommandError: no such file, it cannot be read, or it holds no rows. A file of no rows adds nothing,
            and a CSV one has no column types either (every column reads as Arrow's null type): a table
            created from it would refuse every later file.
    """
    import pyarrow.csv as pcsv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    if not path.exists():
        raise CommandError(f"{path}: no such file or directory")
    is_csv = path.suffix.lower() == ".csv"
    try:
        rows = pcsv.read_csv(path) if is_csv else pq.read_table(path)
    except Exception as exc:
        raise CommandError(
            f"{path}: cannot read it as {'CSV' if is_csv else 'Parquet'}: {_one_line(exc)}"
        ) from None
    if not rows.num_rows:
        raise CommandError(f"{path} holds no rows; nothing to load")
    return rows


def _slices(table: pa.Table, rows: int | None = None) -> list[pa.Table]:
    """``table`` in requests of at most ``REQUEST_BYTES``, and of at most ``rows`` rows when given."""
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    step = max(1, REQUEST_BYTES // per_row if rows is None else min(REQUEST_BYTES // per_row, rows))
    return [table.slice(i, step) for i in range(0, table.num_rows, step)] or [table]


def _progress(counted: str = "{task.completed:,.0f}/{task.total:,.0f}") -> Progress:
    """A load's progress on stderr, gone when it ends; ``counted`` shows each task's count."""
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn(counted),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _load(client: Client, args: argparse.Namespace) -> str:
    """``sparkbus load``: into the replicated store for a table of the topology, else into the gateway
    node's query catalog; then, unless ``--no-views``, into the compute controller's table. Whether both
    tables take the rows is checked before anything is written."""
    from sparkbus.roles.client import ClientError, Op  # noqa: PLC0415
    from sparkbus.roles.query import table_to_ipc  # noqa: PLC0415

    rows = _read_rows(Path(args.path))
    spec = _topology_table(args)
    if spec is not None and args.replace:
        raise CommandError(
            f"--replace: {spec.name} is a replicated table of the topology; its rows are upserted by "
            f"key {', '.join(spec.key)}, never replaced"
        )
    if not args.replace:  # --replace: the SQL table takes the file as it is
        rows = _as_existing(rows, _sql_schema(client, args.table), f"table {args.table}")
    views, views_schema = rows, None
    if not args.no_views:
        where = f"the compute controller's table {args.table}"
        views_schema = _views_schema(client, args.table)
        if spec is not None and views_schema is not None:
            _check_views_key(client, spec, views_schema)
        views = _as_existing(rows, views_schema, where)
    if spec is not None:
        taken: list[pa.Table] = []
        try:
            done = routed_load(
                client, spec, rows, partial_connect(args), timeout=args.timeout, path=args.path, taken=taken
            )
        except (CommandError, ClientError) as exc:
            if args.no_views or not taken:
                raise
            # The partitions keep what their leaders took; the views' table must take it too, or views miss
            # those rows for good (it upserts by key: rows written again later change nothing).
            raise CommandError(_views_after_failure(client, spec, args, exc, taken, views_schema)) from None
    else:
        held = 0
        for i, part in enumerate(_slices(rows)):
            request = {
                "table": args.table,
                # one record batch a stream, as the query role's load takes it (a CSV reads in many chunks)
                "batches": [table_to_ipc(part.combine_chunks())],
                "replace": args.replace and i == 0,
            }
            held = int(client.call(Op.LOAD, request, timeout=args.timeout))
        done = f"loaded {rows.num_rows:,} rows into {args.table} for SQL ({held:,} rows on the gateway node)"
    if args.no_views:
        return done
    how = "appended" if spec is None else f"upserted by {', '.join(spec.key)}"
    if spec is not None and views_schema is None:
        _create_from_stored(client, spec, args.timeout)
        # The stored rows include the file's: the new compute table now holds the whole table.
        return (
            f"{done} and into the compute controller's table {args.table}, new, with every stored row ({how})"
        )
    _write_views(client, args.table, views, None if spec is None else spec.key)
    return f"{done} and into the compute controller's table {args.table} for views ({how})"


def _views_after_failure(
    client: Client,
    spec: TableSpec,
    args: argparse.Namespace,
    error: Exception,
    taken: list[pa.Table],
    views_schema: pa.Schema | None,
) -> str:
    """What to say of a load into declared table ``spec`` that failed with ``error`` after the partitions'
    leaders took the rows ``taken``, once those rows are written into the compute controller's table too
    (or the whole table is created from the stored rows, when the controller has none yet)."""
    import pyarrow as pa  # noqa: PLC0415

    from sparkbus.roles.client import ClientError  # noqa: PLC0415

    n = sum(t.num_rows for t in taken)
    where = f"the compute controller's table {spec.name}"
    if unanswered(error):  # each write would wait its timeout out too
        return (
            f"{_one_line(error)}; {where} was not written (the cluster did not answer): views miss the "
            f"{n:,} rows written; load the file again once it answers (rows are upserted by key)"
        )
    try:
        if views_schema is None:
            _create_from_stored(client, spec, args.timeout)
            wrote = f"{where} was created with every stored row, for views"
        else:
            rows = _as_existing(pa.concat_tables(taken), views_schema, where)
            _write_views(client, spec.name, rows, spec.key)
            wrote = f"the {n:,} rows written went into {where} too, for views"
    except (CommandError, ClientError) as exc:
        wrote = (
            f"{where} was not written ({_one_line(exc)}): views miss the {n:,} rows written; load the file "
            "again (rows are upserted by key)"
        )
    return f"{_one_line(error)}; {wrote}"


def _write_views(client: Client, table: str, rows: pa.Table, key: Sequence[str] | None) -> None:
    """Into the compute controller's table: created as an upsert table by ``key`` for a replicated table,
    so its views count a row loaded twice once, as SQL does; otherwise appended. A table that exists
    already takes the rows as it was created (``_check_views_key``)."""
    from sparkbus.roles.client import OperationError  # noqa: PLC0415

    try:
        client.create_table(table, rows.schema, key=key)
    except OperationError as exc:
        if "already exists" not in str(exc):
            raise
    with _progress() as progress:
        written = progress.add_task(f"rows written into the compute table {table}", total=rows.num_rows)
        for part in _slices(rows, VIEW_ROWS):
            client.write_table(table, part)
            progress.advance(written, part.num_rows)


#: the compute controller's refusal to create a table whose name is taken: what has it, and a table's key
_EXISTS = re.compile(r"already exists: (a view|a table without a key|a table keyed by (\[.*\]))$")


def _check_views_key(client: Client, spec: TableSpec, schema: pa.Schema) -> None:
    """Check that the compute controller's table for declared table ``spec``, which exists with ``schema``,
    upserts by ``spec``'s key, as the partitions do: a table takes rows as it was created, and one without a
    key (a client's ``create_table``) appends them. The controller names the key when it refuses to create
    the table again (``'orders' already exists: a table keyed by ['order_id']``).

    Raises:
        CommandError: it has no key or another, or the name is a view's there.
    """
    import ast  # noqa: PLC0415

    from sparkbus.roles.client import OperationError  # noqa: PLC0415

    where = f"the compute controller's table {spec.name}"
    try:
        client.create_table(spec.name, schema, key=spec.key)
    except OperationError as exc:
        found = _EXISTS.search(exc.message)
        if found is None:
            raise
        what, named = found.groups()
    else:  # nothing had the name any more (a view of that name dropped since): it is now, keyed as it should be
        return
    if what == "a view":
        raise CommandError(
            f"the compute controller's {spec.name} is a view, not a table, so views cannot read rows loaded "
            f"into {spec.name}: load with --no-views, or drop that view first (`sparkbus view drop {spec.name}`)"
        )
    key = () if named is None else tuple(ast.literal_eval(named))
    if key == tuple(spec.key):
        return
    upserts = f"upserts by {', '.join(spec.key)}"
    if not key:
        why = f"was created without a key, so it would append the rows {spec.name} {upserts} (views would count "
        why += "a key loaded twice as two rows)"
    else:
        why = f"was created keyed by {', '.join(key)}, while {spec.name} {upserts} (views would not count "
        why += "the rows SQL counts)"
    raise CommandError(
        f"{where} {why}: load with --no-views, or start the cluster again (the controller keeps its tables in "
        "memory)"
    )


def _create_from_stored(client: Client, spec: TableSpec, timeout: float) -> None:
    """The compute controller's table for the replicated table ``spec``, which it has none of, created and
    filled with every row the partitions hold.

    The controller keeps its tables and views in memory, while the partitions keep their rows on disk
    (``SPARKBUS_DATA_DIR``): after the cluster starts again the stored table has rows the views' table
    has not. Filled with the file's rows alone, it would make every view count only rows loaded since.
    """
    from sparkbus.roles.client import OperationError  # noqa: PLC0415
    from sparkbus.roles.query import ErrorCode as QueryCode  # noqa: PLC0415

    batches = client.sql_batches(f"SELECT * FROM {spec.name}", timeout=timeout)
    try:
        first = next(batches, None)
    except OperationError as exc:
        if exc.code != QueryCode.PARSING:  # a declared table's SELECT * fails to plan only without rows
            raise
        raise CommandError(
            f"table {spec.name} holds no rows on any node yet, and its columns come from its rows: "
            f"load some first (`sparkbus load {spec.name} FILE`)"
        ) from None
    schema = first.schema if first is not None else _sql_schema(client, spec.name)
    if schema is None:
        raise CommandError(f"table {spec.name}: the cluster has no such table")
    import pyarrow as pa  # noqa: PLC0415

    client.create_table(spec.name, schema, key=spec.key)
    with _progress("{task.completed:,.0f}") as progress:
        written = progress.add_task(f"stored rows written into the compute table {spec.name}", total=None)
        for batch in itertools.chain([] if first is None else [first], batches):
            for part in _slices(pa.Table.from_batches([batch]), VIEW_ROWS):
                client.write_table(spec.name, part)
                progress.advance(written, part.num_rows)


# ---------------------------------------------------------------- load routed to partition leaders


def _topology_table(args: argparse.Namespace, name: str | None = None) -> TableSpec | None:
    """The ``[tables.X]`` entry for ``name`` (default ``args.table``) of the topology the command connects
    by, or None (``--address`` without ``--topology``, or a table the topology does not declare: loaded
    into the gateway node's catalog)."""
    from sparkbus.topologies.schema import load  # noqa: PLC0415

    if args.address and args.topology is None:
        return None
    topo = load(args.topology)
    wanted = args.table if name is None else name
    return next((t for t in topo.tables if t.name == wanted), None)


def partial_connect(args: argparse.Namespace) -> Callable[[str], Client]:
    """A function connecting to one node's gateway, by the same topology and options as ``_connect``.

    Raises:
        CommandError: with ``--address``, the topology's cluster is not recorded as running on this machine
            (its state file names the gateways); checked now, before anything is written.
    """
    if args.address:
        from sparkbus.roles.client import ConnectTimeoutError  # noqa: PLC0415
        from sparkbus.topologies.client import topology_target  # noqa: PLC0415

        try:
            topology_target(args.topology)
        except ConnectTimeoutError as exc:
            raise CommandError(
                f"table {args.table} is declared in {args.topology}, so its rows go to each partition's "
                f"leader, whose gateway that cluster's state file names: {_one_line(exc)} (load it on the "
                "machine that started the cluster: no node loads a declared table into its own catalog)"
            ) from None

    def to_node(node: str) -> Client:
        return _connect(args, node)

    return to_node


class _Writers:
    """One client per leader node, connected on first use, all closed at the end."""

    def __init__(self, connect_node: Callable[[str], Client]) -> None:
        self.connect_node = connect_node
        self.clients: dict[str, Client] = {}

    def __call__(self, node: str) -> Client:
        if node not in self.clients:
            self.clients[node] = self.connect_node(node)
        return self.clients[node]

    def close(self) -> None:
        for c in self.clients.values():
            with contextlib.suppress(Exception):
                c.close()


def write_partition(
    writers: Callable[[str], Client], table: str, partition: str, leader: str, rows: pa.Table
) -> str:
    """Write ``rows`` to ``partition`` through ``leader``'s gateway; a follower's refusal naming another
    leader is followed once. Returns the node that took the rows."""
    from sparkbus.roles.client import ClientError  # noqa: PLC0415

    try:
        writers(leader).write(table, rows, partition=partition)
    except ClientError as exc:
        other = leader_in_refusal(exc)
        if other is None or other == leader:
            raise
        writers(other).write(table, rows, partition=partition)
        return other
    return leader


def routed_load(
    client: Client,
    spec: TableSpec,
    rows: pa.Table,
    connect_node: Callable[[str], Client],
    *,
    timeout: float,
    path: str,
    poll: float = 0.05,
    taken: list[pa.Table] | None = None,
) -> str:
    """Write ``rows`` into the replicated partitions of ``spec``, each row to partition
    ``pmod(hash(key), partitions)`` (``sparkbus.topologies.partitioning``) through its current leader,
    flush each partition written and wait until ``sparkbus_replicas`` says every one is replicated.

    Each slice of rows a leader took is appended to ``taken`` as it is acknowledged: when the load fails
    after that (a write, a flush, the wait), those rows are in the partitions all the same."""
    from sparkbus.topologies.partitioning import PartitionError, split  # noqa: PLC0415

    if not rows.num_rows:
        raise CommandError(f"{path} holds no rows; nothing to load")
    try:
        parts = split(rows, spec.key, spec.partitions)
    except PartitionError as exc:
        raise CommandError(f"{path}: {exc}") from None
    leaders = current_leaders(client, spec)
    names = {p: f"{spec.name}/{p}" for p in parts}
    missing = sorted(n for n in names.values() if n not in leaders)
    if missing:
        raise CommandError(
            f"table {spec.name}: no leader is up for {', '.join(missing)}{failing(client, missing)}"
        )
    writers = _Writers(connect_node)
    progress = _progress()
    try:
        with progress:
            written = progress.add_task("rows written through the partition leaders", total=rows.num_rows)
            replicated = progress.add_task("partitions replicated", total=len(parts))
            for p, part in sorted(parts.items()):
                name = names[p]
                for piece in _slices(part):
                    leaders[name] = write_partition(writers, spec.name, name, leaders[name], piece)
                    if taken is not None:
                        taken.append(piece)
                    progress.advance(written, piece.num_rows)
                writers(leaders[name]).flush(name)  # replication starts now, not at the flush thresholds
            for done in _until_replicated(client, set(names.values()), timeout, poll):
                progress.update(replicated, completed=done)
    finally:
        writers.close()
    nodes = ", ".join(sorted(set(leaders[n] for n in names.values())))
    return (
        f"loaded {rows.num_rows:,} rows into {spec.name}: {len(parts)} of {spec.partitions} partitions written "
        f"through their leaders ({nodes}), upserted by {', '.join(spec.key)}, replicated {spec.replication}x"
    )


def _until_replicated(client: Client, partitions: set[str], timeout: float, poll: float) -> Iterator[int]:
    """Yields how many of ``partitions`` are replicated, until all are. A status query that fails because a
    member left or lost its connection for a moment (``MEMBER_LEAVE``, ``MEMBER_CONNECTION``: a store paused,
    a leadership moving) is asked again until the deadline.

    Raises:
        CommandError: a replica reports an error, or ``timeout`` seconds pass (naming, per partition, the
            replicas its leader still waits on: ``not_replicated``).
    """
    from sparkbus.roles.client import ClientError  # noqa: PLC0415
    from sparkbus.roles.query import ErrorCode as QueryCode  # noqa: PLC0415
    from sparkbus.roles.replication import REPLICAS_TABLE  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    done: set[str] = set()
    unacked: dict[str, str] = {}  # partition -> the replicas its leader waits on, from the last answer
    while True:
        failed = ""
        try:
            status = client.sql(
                f"SELECT partition, replicated, error, unacked FROM {REPLICAS_TABLE} WHERE leader = 1",
                timeout=max(0.1, deadline - time.monotonic()),  # the client's 30 s kept a load 66 s past 20
            ).to_pylist()
        except ClientError as exc:
            if exc.code not in (QueryCode.MEMBER_LEAVE, QueryCode.MEMBER_CONNECTION):
                raise
            failed = f" (the last status query failed: {_one_line(exc)})"
        else:
            errors = sorted({r["error"] for r in status if r["error"]})
            if errors:
                raise CommandError(errors[0])
            done = {r["partition"] for r in status if r["replicated"]} & partitions
            unacked = {r["partition"]: r.get("unacked") or "" for r in status}
            yield len(done)
            if done == partitions:
                return
        if time.monotonic() >= deadline:
            raise CommandError(not_replicated(timeout, partitions - done, unacked, failed))
        time.sleep(poll)


def _sql_schema(client: Client, table: str) -> pa.Schema | None:
    """The schema of SQL table ``table``, or None when there is none yet."""
    from sparkbus.roles.client import ClientError  # noqa: PLC0415

    try:
        return client.sql(f"SELECT * FROM {table} LIMIT 0").schema
    except ClientError:
        return None


def _views_schema(client: Client, table: str) -> pa.Schema | None:
    """The schema of the compute controller's table ``table`` (what views read), or None when there is none
    yet."""
    from sparkbus.roles.client import ClientError  # noqa: PLC0415

    try:
        return client.peek(table, finishing={"limit": 0}).schema
    except ClientError as exc:
        if "no table or view named" in str(exc):
            return None
        raise


def _as_existing(rows: pa.Table, schema: pa.Schema | None, table: str) -> pa.Table:
    """``rows`` in the column order of the table they are added to and cast to its ``schema`` (a file may
    order its columns otherwise, and CSV type inference may differ from the first load: ``1`` is an
    integer, ``1.5`` a double); as they are when there is no such table yet (``schema`` None). ``table``
    names it in errors.

    Raises:
        CommandError: the file's columns are not the table's, or do not cast to its types. Checked before
            anything is written: a partition without rows yet would take the file's schema, and every
            query of the table would then fail on the mix; the compute controller's table refuses rows of
            another schema.
    """
    if schema is None:
        return rows
    ours, theirs = schema.names, rows.schema.names
    if sorted(ours) != sorted(theirs):
        missing = [n for n in ours if n not in theirs]
        extra = [n for n in theirs if n not in ours]
        differences = [f"missing {', '.join(missing)}"] if missing else []
        differences += [f"not in the table: {', '.join(extra)}"] if extra else []
        raise CommandError(
            f"the file's columns ({', '.join(theirs)}) are not those of {table} ({', '.join(ours)}): "
            f"{'; '.join(differences) or 'a column is repeated'}"
        )
    rows = rows.select(ours)
    if schema.equals(rows.schema):
        return rows
    try:
        return rows.cast(schema)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"rows do not fit {table}: {_one_line(exc)}") from None


def _print_table(table: pa.Table, args: argparse.Namespace, title: str) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    if args.json:
        for row in table.to_pylist():
            print(json.dumps(row, default=str))
        return
    # Text, not str: Rich would read a value such as "[info] started" or "[/x]" as markup
    out = Table(title=escape(title), title_justify="left")
    for name in table.column_names:
        out.add_column(Text(name), overflow="fold")
    shown = table.slice(0, args.max_rows)
    for row in shown.to_pylist():
        out.add_row(*(Text("NULL" if v is None else str(v)) for v in row.values()))
    console = Console()
    console.print(out)
    more = f", {shown.num_rows} shown (--max-rows)" if shown.num_rows < table.num_rows else ""
    console.print(f"({table.num_rows:,} rows{more})", highlight=False)


def cluster_command(args: argparse.Namespace) -> int:
    """``sparkbus load | sql | view``: one operation through the thin client; 0, or 1 and one line."""
    name = args.command if args.command != "view" else f"view {args.view_command}"
    try:
        if args.command == "view" and args.view_command == "create":
            view = _view_def(args)  # a bad definition needs no connection
        if not args.address:
            args.topology = _topology_path(args)  # once: the calls below all use this file
        with _connect(args) as client:
            if args.command == "load":
                print(_load(client, args))
            elif args.command == "sql":
                _print_table(client.sql(args.query, timeout=args.timeout), args, "")
            elif args.view_command == "create":
                source = _topology_table(args, view.source)
                if source is not None and _views_schema(client, source.name) is None:
                    _create_from_stored(client, source, args.timeout)
                    print(
                        f"table {view.source}: the compute controller's table created with every stored row"
                    )
                created = client.create_view(args.name, view)
                print(f"view {args.name} created (as of time {created.get('as_of')})")
            elif args.view_command == "drop":
                client.drop_view(args.name)
                print(f"view {args.name} dropped")
            else:
                _print_table(client.peek(args.name), args, f"view {args.name}")
    except CommandError as exc:
        print(f"sparkbus {name}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a client, role or file error: one line, never a traceback
        from sparkbus.roles.client import ClientError  # noqa: PLC0415
        from sparkbus.topologies.schema import TopologyError  # noqa: PLC0415

        if not isinstance(exc, ClientError | OSError | ValueError | TopologyError):
            raise
        print(f"sparkbus {name}: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkbus",
        description=(
            "Data-engine protocols over a ZeroMQ bus, next to Spark: a partitioned, replicated in-memory "
            "table store that Spark loads, that answers queries in milliseconds and keeps views fresh."
        ),
    )
    parser.add_argument("--version", action=_VersionAction)
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
        "tcp://HOST:PORT) for its peers, sessions, streams and counters. The nodes are asked at once; a node "
        "whose process is gone (the pid and start time the state file records) is shown down without asking.",
    )
    status.add_argument(
        "target",
        nargs="?",
        help="the topology file given to `sparkbus up`, or a tcp:// status address (default: as for "
        "`sparkbus sql`, topologies/processes.toml here or the one cluster running)",
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="seconds to wait for the nodes' answers, all asked at once (default 3)",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_cluster_parsers(sub)
    keys.add_parser(sub)
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
        from sparkbus.topologies.launcher import up_command  # noqa: PLC0415

        return up_command(args.topology, ready_timeout=args.timeout, skip_unavailable=args.skip_unavailable)
    if args.command == "status":
        from sparkbus.topologies.launcher import status_command  # noqa: PLC0415

        target = args.target
        if target is None:
            try:
                target = _topology_path(argparse.Namespace(topology=None), STATUS_HINT)
            except CommandError as exc:
                print(f"sparkbus status: {exc}", file=sys.stderr)
                return 1
        return status_command(target, timeout=args.timeout, as_json=args.json)
    if args.command in ("load", "sql", "view"):
        return cluster_command(args)
    if args.command == "keys":
        return keys.main(args)
    if args.command == "run":
        return run_command(args.topology, rows=args.rows, data=args.data, report=args.report)
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
