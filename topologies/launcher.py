"""``sparkbus up FILE`` and ``sparkbus status FILE``: a topology as local processes.

Each node of a processes-style topology (every node ``placement = "host"`` on this machine) runs as a
child process (``sparkbus.topologies.nodeproc``) in its own process group. The launcher collects every
child's endpoints over its stdout, sends each the peer table over its stdin, waits until every node
reports all its links handshaken, prints where each listens, and records the cluster's status endpoints in
a state file so that ``sparkbus status FILE`` finds them. It then watches: SIGINT or SIGTERM stops every
node and exits 0, also before every node is ready; a node that dies stops the others and exits 1 naming it
and its exit status.

No orphans: a child stops when its stdin closes (the launcher died, however it died), and the launcher
kills any child's process group that does not stop in time.

No leftovers: a node killed with SIGKILL cannot remove its ipc sockets (``transport = "ipc"``); the launcher
removes them once it has stopped every node, and when the launcher died with its nodes the next ``sparkbus up``
of the file removes those its state file records for nodes whose process is gone (``remove_stale_ipc``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import zmq
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from sparkbus.topologies.keys import RUN_DIR_ENV, ensure_keys, private_dir, run_dir
from sparkbus.topologies.model import Topology
from sparkbus.topologies.schema import TopologyError, load

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
STOP_GRACE = 5.0


def _console() -> Console:
    """Full-width tables when the output is a file or a pipe (tests, logs), the terminal's width otherwise."""
    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)


class LaunchError(RuntimeError):
    """The topology cannot be started, or a node failed; the message names the node."""


@dataclass
class Child:
    node_id: str
    proc: subprocess.Popen[str]
    endpoints: dict[str, str] | None = None
    status: str | None = None
    ready: bool = False
    skipped: list[str] = field(default_factory=list)
    error: str | None = None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def state_dir() -> Path:
    """The run directory, where ``sparkbus up`` records its clusters. Read as well as written only when it
    is this user's alone (``keys.private_dir``): a state file another user planted there would send
    ``status``, ``sql`` and ``load`` to their endpoints. Not created here: ``claim`` does that."""
    path = run_dir()
    if path.exists() or path.is_symlink():
        private_dir(path)
    return path


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` from the third (the state) on, or None (no such process, no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces or ")"


def start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat`` field 22): with its pid, it
    names one process, where a pid alone may name another one started since. None without ``/proc``."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def process_gone(pid: int, started: str | None) -> str | None:
    """Why the process recorded as ``pid`` (started at ``started``, when recorded) no longer runs, or None
    when it runs."""
    if pid <= 0:  # os.kill would signal a process group
        return f"no process recorded (pid {pid})"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process (pid {pid}) is gone"
    except PermissionError:
        pass  # it runs, as another user: not ours, if a start time says so
    fields = _stat(pid)
    if fields is None:
        return None  # no /proc: the pid runs, which is all there is to know
    if fields[0] in ("Z", "X"):  # ended, not reaped yet
        return f"its process (pid {pid}) is gone"
    if started is not None and fields[19] != started:
        return f"pid {pid} is another process now"
    return None


#: the prefix of the nodes' temporary directory ``up`` makes (``Launcher.tmp``)
UP_TMP_PREFIX = "sparkbus-up-"

#: the prefix of the ipc directory a node makes for itself, ``sparkbus.bus.node.OWN_IPC_DIR_PREFIX`` (the
#: launcher does not import the node loop)
OWN_IPC_DIR = "sparkbus-ipc-"


def _ipc_sockets(endpoints: Mapping[str, Any]) -> list[Path]:
    return [
        Path(v.removeprefix("ipc://"))
        for k in ("control", "data")
        if isinstance(v := endpoints.get(k), str) and v.startswith("ipc://")
    ]


def _listening(path: Path) -> bool:
    """Something accepts connections on the unix socket ``path`` (a node of another process bound it)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # cannot tell (no permission, a timeout): keep it
    finally:
        probe.close()
    return True


def remove_ipc(endpoints: Mapping[str, Any]) -> bool:
    """Remove the ipc socket files of a node whose process is gone, at ``endpoints`` (its control and data
    addresses): its own directory, or its two files in a ``bus.ipc_dir`` others share. A socket
    something still listens on is kept, with its directory. True when anything was removed."""
    paths = _ipc_sockets(endpoints)
    if not paths or any(_listening(p) for p in paths):
        return False
    removed = False
    for directory in {p.parent for p in paths}:
        ours = {p.name for p in paths if p.parent == directory}
        try:
            inside = {p.name for p in directory.iterdir()}
        except OSError:
            continue  # gone already (the node stopped and removed it), or not ours to read
        if directory.name.startswith(OWN_IPC_DIR) and inside <= ours:
            shutil.rmtree(directory, ignore_errors=True)
            removed = True
            continue
        for name in ours & inside:
            with contextlib.suppress(OSError):
                (directory / name).unlink()
                removed = True
    return removed


def remove_stale_ipc(path: Path) -> list[str]:
    """The nodes recorded in the state file ``path`` whose process is gone and whose ipc sockets were left
    behind (a node killed with SIGKILL, with its launcher), after removing those sockets. Nodes whose
    process runs are left alone."""
    try:
        nodes = dict(json.loads(path.read_text())["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []  # none, or not one of ours
    removed = []
    for node, info in nodes.items():
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if process_gone(int(info["pid"]), info.get("started")) and remove_ipc(info):
                removed.append(node)
    return removed


def remove_stale_tmp(path: Path) -> str | None:
    """The nodes' temporary directory (their TMPDIR, with their replicas when $SPARKBUS_DATA_DIR is unset)
    that the state file ``path`` records, removed when every node it records is gone: a launcher killed
    with SIGKILL could not remove it, and its name is random. Only a directory of ours named as ``up``
    names them is removed. Returns the directory removed, or None."""
    try:
        body = json.loads(path.read_text())
        tmp, nodes = Path(str(body["tmp"])), dict(body["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none recorded, or not one of ours
    try:
        info = tmp.lstat()
    except OSError:
        return None  # gone already
    if (
        not tmp.name.startswith(UP_TMP_PREFIX)
        or not tmp.is_dir()
        or tmp.is_symlink()
        or info.st_uid != os.getuid()
    ):
        return None
    for node in nodes.values():
        try:
            if process_gone(int(node["pid"]), node.get("started")) is None:
                return None  # a node still runs in it
        except (KeyError, TypeError, ValueError):
            return None
    shutil.rmtree(tmp, ignore_errors=True)
    return str(tmp)


def state_file(topology_path: str | os.PathLike[str]) -> Path:
    """Where ``sparkbus up`` records the running cluster started from ``topology_path``."""
    resolved = str(Path(topology_path).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return state_dir() / f"up-{Path(resolved).stem}-{digest}.json"


def claim(topology_path: str | os.PathLike[str]) -> IO[bytes] | None:
    """The lock that makes one ``sparkbus up`` per topology file: held while the returned file is open, and
    released when the process ends, however it ends. None when another launcher holds it (its cluster
    runs, or is starting: its state file is written only once every node is ready)."""
    path = state_file(topology_path).with_suffix(".lock")
    private_dir(path.parent)  # the run directory: this user's alone, or refused
    lock = open(path, "ab")  # noqa: SIM115 (held until close)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def check_local(topo: Topology, *, skip_unavailable: bool) -> list[str]:
    """Problems that keep ``sparkbus up`` from starting ``topo`` (empty: it can start)."""
    problems: list[str] = []
    if topo.spark is not None:
        problems.append(
            "the topology has a [spark] section: run it with the Spark runtime, not `sparkbus up`"
        )
    for spec in topo.nodes:
        if spec.placement != "host":
            problems.append(
                f"node {spec.name}: placement {spec.placement!r}; `sparkbus up` runs host nodes only"
            )
        elif spec.host not in LOCAL_HOSTS:
            problems.append(f"node {spec.name}: host {spec.host!r} is not this machine (127.0.0.1)")
    if not problems:
        from sparkbus.topologies.busnode import unavailable  # noqa: PLC0415 (the bus's node loop)

        for node_id in topo.node_ids():
            missing = unavailable(topo, node_id)
            if missing and (not skip_unavailable or set(missing) >= set(topo.spec_of(node_id).runs)):
                problems.append(
                    f"node {node_id}: {', '.join(sorted(missing))} cannot be loaded (protocol family not "
                    "installed yet); --skip-unavailable runs the rest"
                )
    return problems


class Launcher:
    """Start, watch and stop the nodes of one topology. ``run()`` is ``sparkbus up``."""

    def __init__(
        self,
        path: str,
        topo: Topology,
        *,
        console: Console,
        ready_timeout: float = 30.0,
        skip_unavailable: bool = False,
        state_path: Path | None = None,
    ) -> None:
        self.path = path
        self.topo = topo
        self.console = console
        self.ready_timeout = ready_timeout
        self.skip_unavailable = skip_unavailable
        self.state_path = state_path or state_file(path)
        self.children: dict[str, Child] = {}
        # A Queue, not a SimpleQueue: on CPython 3.11 a SimpleQueue.get whose wait a signal cut short
        # waits again with the time left worked out after the handler ran, and, once negative, for ever:
        # the stop flag the handler set was never looked at again and up ignored every later signal.
        self.events: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
        #: the nodes' temporary directory (their TMPDIR): removed once every node is gone, so that what a
        #: node killed with SIGKILL kept there (its replicas, without $SPARKBUS_DATA_DIR) goes with it
        self.tmp: str | None = None

    # -- starting

    def spawn(self) -> None:
        cmd = [sys.executable, "-m", "sparkbus.topologies.nodeproc", self.path]
        extra = ["--ready-timeout", str(self.ready_timeout)]
        if self.skip_unavailable:
            extra.append("--skip-unavailable")
        self.tmp = tempfile.mkdtemp(prefix=UP_TMP_PREFIX)
        # The run directory is resolved here, before TMPDIR changes: without XDG_RUNTIME_DIR it is in the
        # temporary directory, and the nodes must find the keys `up` made there.
        env = {**os.environ, "TMPDIR": self.tmp, RUN_DIR_ENV: str(run_dir())}
        for node_id in self.topo.node_ids():
            proc = subprocess.Popen(
                [*cmd, node_id, *extra],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                process_group=0,
                env=env,
            )
            self.children[node_id] = Child(node_id=node_id, proc=proc)
            assert proc.stdout is not None
            threading.Thread(
                target=self._read, args=(node_id, proc.stdout), name=f"read-{node_id}", daemon=True
            ).start()

    def _read(self, node_id: str, stream: IO[str]) -> None:
        for line in stream:
            with contextlib.suppress(ValueError):
                self.events.put((node_id, json.loads(line)))
        self.events.put((node_id, None))

    def _send(self, child: Child, msg: dict[str, Any]) -> None:
        if child.proc.stdin is not None and not child.proc.stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                child.proc.stdin.write(json.dumps(msg) + "\n")
                child.proc.stdin.flush()

    def _dead(self, node_id: str) -> LaunchError:
        child = self.children[node_id]
        try:
            code = child.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            code = None
        why = f": {child.error}" if child.error else ""
        return LaunchError(f"node {node_id} (pid {child.proc.pid}) {describe_exit(code)}{why}")

    def _next(self, deadline: float) -> tuple[str, dict[str, Any] | None] | None:
        try:
            return self.events.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
        except queue.Empty:
            return None

    def _handle(self, node_id: str, msg: dict[str, Any] | None) -> None:
        child = self.children[node_id]
        if msg is None:
            raise self._dead(node_id)
        event = msg.get("event")
        if event == "error":
            child.error = str(msg.get("error"))
        elif event == "bound":
            child.endpoints = msg["endpoints"]
            child.status = msg["status"]
            child.skipped = list(msg.get("skipped", []))
        elif event == "ready":
            child.ready = True

    def start(self, stop_flag: threading.Event) -> bool:
        """Spawn, exchange endpoints and wait until every link is up; raises LaunchError naming a node.

        Returns:
            True once every node is ready; False when ``stop_flag`` was set first (SIGINT or SIGTERM: the
            user stopping the cluster, not a failure).
        """
        deadline = time.monotonic() + self.ready_timeout
        try:
            generated = ensure_keys(self.topo)
        except OSError as exc:
            raise LaunchError(f"cannot create the CURVE keys: {exc}") from None
        if generated:
            self.console.print(
                f"generated CURVE keys for {len(generated) // 2} nodes in {generated[0].parent.parent}",
                markup=False,
            )
        self.spawn()
        n = len(self.children)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            bound = progress.add_task("binding", total=n)
            ready = progress.add_task("handshakes", total=n)
            while not all(c.ready for c in self.children.values()):
                if stop_flag.is_set():
                    return False
                if time.monotonic() >= deadline:
                    waiting = sorted(c.node_id for c in self.children.values() if not c.ready)
                    raise LaunchError(
                        f"not every link was up within {self.ready_timeout:g}s; waiting for {', '.join(waiting)}"
                    )
                item = self._next(deadline)
                if item is None:
                    continue
                node_id, msg = item
                had_endpoints = all(c.endpoints for c in self.children.values())
                self._handle(node_id, msg)
                progress.update(bound, completed=sum(1 for c in self.children.values() if c.endpoints))
                progress.update(ready, completed=sum(1 for c in self.children.values() if c.ready))
                if not had_endpoints and all(c.endpoints for c in self.children.values()):
                    peers = {c.node_id: c.endpoints for c in self.children.values()}
                    for child in self.children.values():
                        self._send(child, {"cmd": "peers", "peers": peers})
        return True

    def write_state(self) -> None:
        self.state_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        body = {
            "topology": str(Path(self.path).resolve()),
            "cluster": self.topo.cluster.name,
            "launcher_pid": os.getpid(),
            "launcher_started": start_time(os.getpid()),
            "tmp": self.tmp,
            "nodes": {
                c.node_id: {
                    "pid": c.proc.pid,
                    "started": start_time(c.proc.pid),
                    "status": c.status,
                    **(c.endpoints or {}),
                }
                for c in self.children.values()
            },
        }
        tmp = self.state_path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(body, indent=2))
            tmp.replace(self.state_path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a state file that cannot be written leaves no temp file behind
            raise

    def print_endpoints(self) -> None:
        table = Table(title=f"sparkbus up: {self.topo.cluster.name} ready ({len(self.children)} nodes)")
        for col in ("node", "pid", "control", "data", "status", "skipped"):
            table.add_column(col)
        for c in self.children.values():
            ep = c.endpoints or {}
            cells = (c.node_id, str(c.proc.pid), ep.get("control", ""), ep.get("data", ""), c.status or "")
            table.add_row(*map(Text, (*cells, ", ".join(c.skipped))))  # an ipc path may hold brackets
        self.console.print(table)
        self.console.print(f"state: {self.state_path}  (sparkbus status {self.path})", markup=False)

    # -- watching and stopping

    def watch(self, stop_flag: threading.Event) -> None:
        """Until ``stop_flag`` is set; raises LaunchError when a node dies."""
        while not stop_flag.is_set():
            item = self._next(time.monotonic() + 0.2)
            if item is not None:
                self._handle(*item)
            for c in self.children.values():
                if c.proc.poll() is not None:
                    raise self._dead(c.node_id)

    def stop(self) -> None:
        """Stop every child: ask, then SIGTERM, then SIGKILL its process group; reap each."""
        for c in self.children.values():
            self._send(c, {"cmd": "stop"})
            if c.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    c.proc.stdin.close()
        deadline = time.monotonic() + STOP_GRACE
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            for c in self.children.values():
                if c.proc.poll() is None and sig is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(c.proc.pid, sig)
            for c in self.children.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if all(c.proc.poll() is not None for c in self.children.values()):
                break
            deadline = time.monotonic() + 2.0
        for c in self.children.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)  # anything the node itself started
            if c.proc.stdout is not None:
                c.proc.stdout.close()
            if c.endpoints is not None and c.proc.poll() is not None:
                remove_ipc(c.endpoints)  # a node that stopped removed its own; one killed did not
        if self.tmp is not None and all(c.proc.poll() is not None for c in self.children.values()):
            shutil.rmtree(
                self.tmp, ignore_errors=True
            )  # a node that stopped emptied its part; one killed did not
            self.tmp = None
        with contextlib.suppress(OSError):  # none written, or the run directory is not usable: said already
            self.state_path.unlink()

    def run(self) -> int:
        stop_flag = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            received.append(signum)
            stop_flag.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ready = self.start(stop_flag)
            if ready:
                try:
                    self.write_state()
                except OSError as exc:
                    raise LaunchError(f"cannot write the state file: {exc}") from None
                self.print_endpoints()
                self.watch(stop_flag)
            names = ", ".join(signal.Signals(s).name for s in received)
            before = "" if ready else " (before every node was ready)"
            self.console.print(f"sparkbus up: {names}: stopping {len(self.children)} nodes{before}")
            return 0
        except LaunchError as exc:
            stopping = "; stopping the other nodes" if self.children else ""
            self.console.print(f"[red]sparkbus up: {escape(str(exc))}{stopping}[/red]")
            return 1
        finally:
            self.stop()
            for s, handler in old.items():
                signal.signal(s, handler)


def up_command(path: str, *, ready_timeout: float, skip_unavailable: bool) -> int:
    """``sparkbus up FILE``."""
    try:
        topo = load(path)
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 1
    problems = check_local(topo, skip_unavailable=skip_unavailable)
    if problems:
        for p in problems:
            print(f"{path}: cannot start: {p}", file=sys.stderr)
        return 1
    try:
        lock = claim(path)
    except OSError as exc:
        print(f"{path}: cannot start: the run directory {run_dir()} is not usable: {exc}", file=sys.stderr)
        return 1
    if lock is None:
        # A second cluster of the same file would take over the first's state file, and stopping either
        # would delete the other's.
        print(
            f"{path}: cannot start: another `sparkbus up` of this file is running (state {state_file(path)})",
            file=sys.stderr,
        )
        return 1
    console = _console()
    with lock:
        # The lock is ours, so the launcher that wrote any state file here is gone: its nodes may have died
        # with it and left their ipc sockets behind.
        left = remove_stale_ipc(state_file(path))
        if left:
            console.print(
                f"sparkbus up: removed the ipc sockets left by {', '.join(left)} (their processes are gone)",
                markup=False,
            )
        tmp = remove_stale_tmp(state_file(path))
        if tmp is not None:
            console.print(
                f"sparkbus up: removed the temporary directory {tmp} left by a run whose launcher was killed",
                markup=False,
            )
        return Launcher(
            path,
            topo,
            console=console,
            ready_timeout=ready_timeout,
            skip_unavailable=skip_unavailable,
        ).run()


# -- status


def ask_statuses(addresses: dict[str, str], timeout: float = 3.0) -> dict[str, dict[str, Any] | str]:
    """Each node's status from its status endpoint, asked all at once and waited for until one deadline
    ``timeout`` from now: a dict (the node's answer, ``ok`` true) or why there is none, per node."""
    answers: dict[str, dict[str, Any] | str] = {}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks: list[zmq.Socket[bytes]] = []
    try:
        poller = zmq.Poller()
        pending: dict[zmq.Socket[bytes], str] = {}
        for name, address in addresses.items():
            sock = ctx.socket(zmq.REQ)
            socks.append(sock)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(address)
                sock.send(b"status")
            except zmq.ZMQError as exc:
                answers[name] = f"unreachable: {exc}"
                continue
            pending[sock] = name
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(max(1, int(left * 1000))):
                name = pending.pop(sock)
                poller.unregister(sock)
                try:
                    body = json.loads(sock.recv())
                except ValueError as exc:
                    answers[name] = f"unreachable: not a status answer: {exc}"
                    continue
                ok = isinstance(body, dict) and body.get("ok")
                answers[name] = (
                    body if ok else f"error: {body.get('error') if isinstance(body, dict) else body}"
                )
        for name in pending.values():
            answers[name] = f"unreachable: no answer from {addresses[name]} within {timeout:g}s"
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
    return answers


def running_clusters() -> list[str]:
    """The topology files of the clusters ``sparkbus up`` is running on this machine for this user (state
    files whose launcher is alive; a killed launcher's stale file is skipped), sorted."""
    found = []
    for path in state_dir().glob("up-*.json"):
        try:
            state = json.loads(path.read_text())
            if process_gone(int(state["launcher_pid"]), state.get("launcher_started")) is None:
                found.append(str(state["topology"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone, unreadable, or half-written
    return sorted(found)


#: How ``status_targets`` marks a node whose process is gone, in place of its endpoint (an address never
#: starts so), and how ``sparkbus status`` shows it.
DOWN = "down: "


def status_targets(target: str) -> dict[str, str]:
    """Node name (or address) -> status endpoint, for a topology file or a ``tcp://`` address; for a node
    whose recorded process is gone (a stale state file, a node killed), ``DOWN`` and why, at once."""
    if "://" in target:
        return {target: target}
    path = state_file(target)
    if not path.exists():
        raise LaunchError(
            f"no running cluster recorded for {target} (looked for {path}); is `sparkbus up` running?"
        )
    state = json.loads(path.read_text())
    targets = {}
    for node, info in state["nodes"].items():
        gone = process_gone(int(info["pid"]), info.get("started")) if "pid" in info else None
        targets[node] = info["status"] if gone is None else f"{DOWN}{gone}"
    return targets


def status_table(answers: dict[str, dict[str, Any] | str]) -> Table:
    table = Table(title="sparkbus status")
    for col in (
        "node",
        "peers up",
        "sessions out/in",
        "clients",
        "streams out/in",
        "msgs out/in",
        "bytes out/in",
        "refused",
        "drops",
    ):
        table.add_column(col)
    for name, ans in answers.items():
        if isinstance(ans, str):
            table.add_row(Text(name), Text(ans, style="red"), "", "", "", "", "", "", "")
            continue
        st = ans["status"]
        every = st["peers"]
        cnt = st["counters"]
        node = ans.get("node", name)
        # The bus's peers are the nodes it dials; the rest are thin clients' sessions, and the node itself
        # once it streamed to itself (a query's initiator to its own fragment).
        peers = {p: v for p, v in every.items() if v["outbound"] is not None}
        clients = [
            p for p, v in every.items() if v["outbound"] is None and p != node and v["inbound_session"]
        ]
        up = [p for p, v in peers.items() if v["up"]]
        table.add_row(
            Text(node),
            f"{len(up)}/{len(peers)}",
            f"{sum(1 for v in peers.values() if v['outbound'] == 'established')}/"
            f"{sum(1 for v in peers.values() if v['inbound_session'])}",
            str(len(clients)),
            f"{sum(v['streams_out'] for v in every.values())}/{sum(v['streams_in'] for v in every.values())}",
            f"{cnt.get('messages_out', 0)}/{cnt.get('messages_in', 0)}",
            f"{cnt.get('bytes_out', 0)}/{cnt.get('bytes_in', 0)}",
            ", ".join(f"{k}: {v}" for k, v in st.get("refused", {}).items()) or "-",
            ", ".join(f"{k}: {v}" for k, v in st.get("drops", {}).items()) or "-",
        )
    return table


def status_command(target: str, *, timeout: float = 3.0, as_json: bool = False) -> int:
    """``sparkbus status FILE|ADDRESS``: 0 when every node answered, 1 otherwise."""
    try:
        targets = status_targets(target)
    except (LaunchError, OSError, ValueError, KeyError) as exc:
        print(f"sparkbus status: {exc}", file=sys.stderr)
        return 1
    # nodes known to be down are not asked; the others all at once, within one timeout
    asked = ask_statuses({n: a for n, a in targets.items() if not a.startswith(DOWN)}, timeout)
    answers = {name: asked.get(name, address) for name, address in targets.items()}
    if as_json:
        print(json.dumps(answers, indent=2, default=str))
    else:
        _console().print(status_table(answers))
    return 0 if all(not isinstance(a, str) for a in answers.values()) else 1
