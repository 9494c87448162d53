"""Who leads each partition of a table the topology declares, and why a partition has no leader: read
from the ``sparkbus_replicas`` catalog table through a client (``sparkbus load``, ``topologies/cli.py``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparkbus.topologies.cli_args import CommandError

if TYPE_CHECKING:
    from sparkbus.topologies.client import Client
    from sparkbus.topologies.model import TableSpec

_NOT_LEADER = re.compile(r"not the leader of \S+; leader: (\S+)")


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
