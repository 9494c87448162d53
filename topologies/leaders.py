"""Who leads each partition of a table the topology declares, and why a partition has no leader: read
from the ``sparkbus_replicas`` catalog table through a client (``sparkbus load``, ``topologies/cli.py``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from sparkbus.topologies.cli_args import CommandError

if TYPE_CHECKING:
    from sparkbus.topologies.client import Client
    from sparkbus.topologies.model import TableSpec

_NOT_LEADER = re.compile(r"not the leader of \S+; leader: (\S+)")
#: partitions named per group of the message of a load not replicated in time, and groups named: a table of
#: many partitions with a node down keeps the message one readable line
SHOWN_PARTITIONS = 8
SHOWN_GROUPS = 4


def leader_in_refusal(error: BaseException) -> str | None:
    """The leader a ``write`` refused by a follower names (``...; leader: store-1``), or None."""
    found = _NOT_LEADER.search(str(error))
    return found.group(1) if found is not None and found.group(1) != "None" else None


def current_leaders(client: Client, spec: TableSpec) -> dict[str, str]:
    """Partition -> the node currently leading it, from the ``sparkbus_replicas`` catalog table.

    Raises:
        CommandError: no replication node is up (no partition of the table has a leader).
    """
    from sparkbus.roles.client import ClientError  # noqa: PLC0415
    from sparkbus.roles.replication import REPLICAS_TABLE  # noqa: PLC0415

    try:
        led = client.sql(f"SELECT node, partition FROM {REPLICAS_TABLE} WHERE leader = 1").to_pylist()
    except ClientError as exc:
        if REPLICAS_TABLE not in str(exc):
            raise
        led = []
    leaders = {r["partition"]: r["node"] for r in led if str(r["partition"]).startswith(f"{spec.name}/")}
    if not leaders:
        raise CommandError(
            f"table {spec.name}: no replication node is up (no partition has a leader in {REPLICAS_TABLE})"
        )
    return leaders


def failing(client: Client, partitions: Sequence[str]) -> str:
    """Why replicas of ``partitions`` fail, from ``sparkbus_replicas`` (``failing``: a store that cannot be
    opened, a step that keeps failing), as text to end a message with; empty when none says."""
    from sparkbus.roles.replication import REPLICAS_TABLE  # noqa: PLC0415

    with contextlib.suppress(Exception):  # only a hint: the message stands without it
        rows = client.sql(f"SELECT node, partition, failing FROM {REPLICAS_TABLE} WHERE failing <> ''")
        why = [
            f"{r['node']}: {r['partition']}: {r['failing']}"
            for r in rows.to_pylist()
            if r["partition"] in partitions
        ]
        return f" ({'; '.join(sorted(why))})" if why else ""
    return ""


def unanswered(error: BaseException) -> bool:
    """Whether ``error`` says the cluster did not answer (no connection, or an operation's timeout passed),
    rather than refused: a load that failed so does not try the views' table too."""
    from sparkbus.roles.client import ClientConnectionError, ConnectTimeoutError  # noqa: PLC0415
    from sparkbus.roles.client.errors import OPERATION_TIMEOUT  # noqa: PLC0415

    if isinstance(error, (ClientConnectionError, ConnectTimeoutError)):
        return True
    return getattr(error, "code", None) == OPERATION_TIMEOUT


def not_replicated(
    timeout: float, waiting: Iterable[str], unacked: Mapping[str, str], failed: str = ""
) -> str:
    """The message of a load whose partitions ``waiting`` were not replicated within ``timeout`` s: they are
    grouped by the replicas (nodes) their leader's ``unacked`` column in ``sparkbus_replicas`` names, so a
    node down reads once however many partitions wait on it (partitions whose leader named none, or did not
    answer, come last, unnamed), and the message ends saying what to do. The rows are on the leaders
    already: the user must learn not to load again but to start the node, or wait. ``failed`` (why the last status query failed, or empty) follows the partitions."""
    groups: dict[str, list[str]] = {}
    for partition in sorted(waiting, key=_partition_order):
        groups.setdefault(unacked.get(partition, ""), []).append(partition)
    if "" in groups:  # last, so that it does not read as part of the group after it
        groups[""] = groups.pop("")
    shown = [_group(partitions, nodes) for nodes, partitions in list(groups.items())[:SHOWN_GROUPS]]
    hidden = sum(len(partitions) for partitions in list(groups.values())[SHOWN_GROUPS:])
    more = f", and {hidden} more partition{'s' if hidden != 1 else ''}" if hidden else ""
    named = sorted({n for nodes in groups for n in nodes.split(", ") if n})
    start = f"start {', '.join(named)} if down" if named else "start any replica that is down"
    return (
        f"rows written, but not replicated within {timeout:g} s: {', '.join(shown)}{more}{failed}. The rows "
        f"are stored durably on the leaders and counted: {start} (sparkbus status), or wait, and the "
        "replicas catch up"
    )


def _group(partitions: Sequence[str], nodes: str) -> str:
    """``orders/0, orders/3 (waiting on store-2)``, at most ``SHOWN_PARTITIONS`` partitions named."""
    named = ", ".join(partitions[:SHOWN_PARTITIONS])
    if len(partitions) > SHOWN_PARTITIONS:
        named += f" and {len(partitions) - SHOWN_PARTITIONS} more"
    return f"{named} (waiting on {nodes})" if nodes else named


def _partition_order(partition: str) -> tuple[str, int, str]:
    """``orders/2`` before ``orders/10``: partitions in their table's order."""
    table, _, index = partition.rpartition("/")
    return (table, int(index), "") if index.isdigit() else (table, -1, index)
