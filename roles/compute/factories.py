"""Factories the topology registry calls for ``compute.controller`` and ``compute.replica``.

A controller's epochs are ``generation << 32 | n`` (``ComputeController``), and a replica refuses an epoch at
or below one it has seen, so every controller a node starts must have a higher generation than the last:
``next_generation`` gives it one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from sparkbus.roles.compute.controller import MAX_GENERATION, ComputeController
from sparkbus.roles.compute.replica import ComputeReplica
from sparkbus.roles.replication.storage import DiskStorage

log = logging.getLogger(__name__)

#: The node data directory's variable when the role context gives none (as for the replicated store).
DATA_DIR_ENV = "SPARKBUS_DATA_DIR"
#: The file, in the node's data directory, holding the last controller generation started there.
GENERATION_FILE = "compute.controller.generation"


def next_generation(directory: Path | None, now: float) -> int:
    """A generation above every one started before with this ``directory``, and at least ``now``'s second.

    With a directory, the last generation is kept in ``GENERATION_FILE``, replaced atomically (written to
    a temporary file, fsynced, renamed over it, the directory fsynced), so a crash leaves the old value or the
    new one. The clock's seconds are a floor: a node whose directory was lost (a Spark task's, removed with
    it) or cannot be written still starts above its predecessors, provided the clock has not gone back and
    the predecessor started in an earlier second. The seconds fit the 32 bits a generation has until 2106.

    Raises:
        ValueError: the file does not hold a generation (edited by hand), or the result exceeds 32 bits.
    """
    generation = int(now)
    if directory is not None:
        path = directory / GENERATION_FILE
        try:
            # The files of the replicated store's own kind: commits write a temporary, fsync, rename and
            # fsync the directory.
            storage = DiskStorage(directory)
            last = storage.read(GENERATION_FILE).decode("ascii", "replace").strip() if path.exists() else "0"
            if not last.isdigit():
                raise ValueError(f"{path} holds {last[:40]!r}, not a controller generation")
            generation = max(generation, int(last) + 1)
            writer = storage.create(GENERATION_FILE)
            writer.append(f"{generation}\n".encode("ascii"))
            writer.commit()
        except OSError as exc:
            log.warning(
                "compute.controller: cannot keep its generation in %s (%s); using the clock's", path, exc
            )
    if generation > MAX_GENERATION:
        raise ValueError(f"controller generation {generation} exceeds {MAX_GENERATION}")
    return generation


def _node_dir(ctx: Any) -> Path | None:
    """``<data dir>/<cluster>/<node>``, the directory the node's replicated store uses too; None without a
    data directory (a temporary one would not outlive the process)."""
    base = getattr(ctx, "data_dir", None) or os.environ.get(DATA_DIR_ENV)
    if not base:
        return None
    return Path(base) / str(ctx.topology.cluster.name) / str(ctx.node_id)


def make_controller(ctx: Any) -> ComputeController:
    """A controller feeding every node of the topology that runs ``compute.replica``, with a generation
    above its predecessors' on this node (``next_generation``)."""
    return ComputeController(
        replicas=ctx.topology.hosting("compute.replica"),
        generation=next_generation(_node_dir(ctx), ctx.started_at),
    )


def make_replica(ctx: Any) -> ComputeReplica:
    return ComputeReplica()
