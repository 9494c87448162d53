"""``sparkbus keys generate DIR``: CURVE key pairs for ``[bus.security]``, and where a topology's keys are.

``DIR/public/<name>.key`` holds each public certificate (every key there may connect to every node) and
``DIR/private/<name>.key_secret`` each secret one (``private/`` is mode 0700). Without ``--names`` one
shared pair called ``cluster`` is written, which every node without a pair of its own uses. With
``--names store-0,store-1`` each node gets its own pair; ``--topology FILE`` names every node of a file,
and the nodes that have a pair keep it. Otherwise an existing pair is replaced only with ``--force``.

``key_dir`` in a topology may start with ``{run_dir}``: sparkbus's run directory on this machine
(``$SPARKBUS_RUN_DIR``, else ``$XDG_RUNTIME_DIR/sparkbus-<uid>``, else in the temporary directory), where
``sparkbus up`` creates keys it does not find; it uses the run directory only when this user owns it and no
one else can write it (``private_dir``). Other relative paths are resolved against the topology
file's folder.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sparkbus.topologies.model import Topology
from sparkbus.topologies.schema import TopologyError, load

if TYPE_CHECKING:
    from sparkbus.bus.config import CurveSettings

# sparkbus.bus.security (ZeroMQ, and asyncio through zmq.auth.thread) is imported by the functions that write
# or read keys, not to build the ``sparkbus keys`` parser: every ``sparkbus`` command builds it.

RUN_DIR = "{run_dir}"
#: ``sparkbus.bus.security.SHARED_NAME``, named in ``sparkbus keys generate --help``
SHARED_NAME = "cluster"


#: the run directory as ``sparkbus up`` resolved it, given to its nodes: their ``TMPDIR`` is the run's own
#: temporary directory, so without ``XDG_RUNTIME_DIR`` they would otherwise look for keys in the wrong place
RUN_DIR_ENV = "SPARKBUS_RUN_DIR"


def run_dir() -> Path:
    """sparkbus's per-user run directory on this machine (state files, generated keys): ``$SPARKBUS_RUN_DIR``
    when set (``sparkbus up`` sets it for its nodes), else ``$XDG_RUNTIME_DIR/sparkbus-<uid>``, else
    ``sparkbus-<uid>`` in the temporary directory."""
    fixed = os.environ.get(RUN_DIR_ENV)
    if fixed:
        return Path(fixed)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"sparkbus-{os.getuid()}"


class UnsafeDirectory(PermissionError):
    """A directory sparkbus would trust (state files, keys) that another user made or can write: the message
    names it and why."""


def private_dir(path: Path) -> Path:
    """``path``, a directory only this user can change: created mode 0700 when missing; refused with
    ``UnsafeDirectory`` when it is a symbolic link, belongs to another user, or is group- or world-writable
    (another local user may have made it first, e.g. in ``/tmp``, with key pairs whose secrets they keep)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"refusing {path}: it is a symbolic link, not a directory of this user's")
    if st.st_uid != os.getuid():
        # The advice names the variable that chose the run directory: with $SPARKBUS_RUN_DIR set,
        # XDG_RUNTIME_DIR is never read.
        elsewhere = (
            f"{RUN_DIR_ENV} to a directory of yours" if os.environ.get(RUN_DIR_ENV) else "XDG_RUNTIME_DIR"
        )
        raise UnsafeDirectory(
            f"refusing {path}: it belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}), who may have "
            f"put keys or state there; remove it or set {elsewhere}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(
            f"refusing {path}: its mode {stat.S_IMODE(st.st_mode):04o} lets other users write in it; "
            f"remove it (or chmod 700 it if it holds nothing it should not)"
        )
    return path


def key_dir(topology: Topology) -> Path | None:
    """Where ``topology``'s CURVE keys are on this machine; None when it does not use CURVE."""
    sec = topology.bus.security
    if sec.mode != "curve" or sec.key_dir is None:
        return None
    raw = sec.key_dir
    if raw.startswith(RUN_DIR):
        return run_dir() / raw[len(RUN_DIR) :].lstrip("/")
    path = Path(os.path.expanduser(raw))
    if not path.is_absolute() and topology.source and not topology.source.startswith("<"):
        path = Path(topology.source).resolve().parent / path
    return path


def curve_settings(topology: Topology) -> CurveSettings | None:
    """The bus's CURVE settings for ``topology`` (None: plain)."""
    from sparkbus.bus.config import CurveSettings  # noqa: PLC0415

    where = key_dir(topology)
    if where is None:
        return None
    return CurveSettings(key_dir=str(where), allow_addresses=topology.bus.security.allow)


def ensure_keys(topology: Topology) -> list[Path]:
    """Give every node of ``topology`` a key pair under its ``{run_dir}`` key directory if it has none.

    Only keys under the run directory are created: a key directory elsewhere is the operator's, and a
    missing one is an error the nodes report by name. The run directory and the key directory are created
    mode 0700, and refused (``UnsafeDirectory``, an ``OSError``) when another user owns them or can write them.

    Returns:
        The files written (none when the keys exist or the topology is plain).
    """
    from sparkbus.bus import security  # noqa: PLC0415

    where = key_dir(topology)
    sec = topology.bus.security
    if where is None or sec.key_dir is None or not sec.key_dir.startswith(RUN_DIR):
        return []
    # Keys found here are trusted as they are: the run directory and each one down to the key directory must
    # be this user's alone.
    checked = private_dir(run_dir())
    for part in where.relative_to(checked).parts:
        checked = private_dir(checked / part)
    if (where / security.PUBLIC).is_dir():
        return []
    return security.generate(where, topology.node_ids())


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keys generate`` to the ``sparkbus`` command."""
    keys = subparsers.add_parser("keys", help="CURVE key pairs for [bus.security]")
    sub = keys.add_subparsers(dest="keys_command", required=True)
    gen = sub.add_parser(
        "generate",
        help="write key pairs into DIR/public and DIR/private",
        description="Write CURVE key pairs: public certificates into DIR/public (every key there may connect), "
        "secret ones into DIR/private (mode 0700). Default: one shared pair named 'cluster'.",
    )
    gen.add_argument("dir", metavar="DIR", help="the key directory (created if absent)")
    names = gen.add_mutually_exclusive_group()
    names.add_argument(
        "--names",
        help=f"comma-separated key names, usually node ids (default: one shared pair, {SHARED_NAME!r})",
    )
    names.add_argument(
        "--topology",
        metavar="FILE",
        help="one pair per node of this topology file; nodes that have a pair keep it",
    )
    gen.add_argument(
        "--force",
        action="store_true",
        help="replace existing pairs of the same names (without it, --names refuses a name that has one)",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``sparkbus keys generate``; 0 on success, 1 with a message on stderr otherwise."""
    from sparkbus.bus import security  # noqa: PLC0415

    if args.topology:
        try:
            names = load(args.topology).node_ids()
        except TopologyError as exc:
            print(exc, file=sys.stderr)
            return 1
    elif args.names is not None:
        names = [n.strip() for n in args.names.split(",") if n.strip()]
        if not names:
            print(
                f"sparkbus keys: --names {args.names!r} names no key; e.g. --names store-0,store-1",
                file=sys.stderr,
            )
            return 1
    else:
        names = [security.SHARED_NAME]
    # A topology's nodes: those with a whole pair keep it (a running node holding its public key would refuse a
    # new one), the others get theirs; a name given by --names or a half pair is refused unless --force.
    kept = [] if args.force or not args.topology else [n for n in names if _has_pair(Path(args.dir), n)]
    names = [n for n in names if n not in kept]
    try:
        written = security.generate(args.dir, names, overwrite=args.force)
    except (OSError, ValueError) as exc:
        print(f"sparkbus keys: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    also = f"; kept {len(kept)} existing pair{'s' * (len(kept) != 1)} ({', '.join(kept)})" if kept else ""
    print(f"{len(names)} key pair{'s' * (len(names) != 1)} in {args.dir}{also}", file=sys.stderr)
    return 0


def _has_pair(root: Path, name: str) -> bool:
    from sparkbus.bus import security  # noqa: PLC0415

    return (root / security.PUBLIC / f"{name}.key").is_file() and (
        root / security.PRIVATE / f"{name}.key_secret"
    ).is_file()
