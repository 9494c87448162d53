"""Topology files: TOML in, validated frozen dataclasses out.

A topology names the cluster, the bus settings, the Spark settings (absent: plain processes), the nodes
with their placement and the roles and services each runs, and the tables. ``load`` checks everything
at once and raises one ``TopologyError`` listing every problem, each with the file, the key path (e.g.
``nodes[2].roles[0]``) and the reason. ``docs/TOPOLOGIES.md`` describes every key.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sparkbus.bus.contract import HTTP_BUFFERS, HTTP_CLIENT
from sparkbus.topologies.model import (
    LOCAL_MASTER,
    MAX_BATCH_SIZE,
    MAX_NODES,
    MAX_NODES_WHY,
    PORTS_PER_NODE,
    BusSettings,
    Cluster,
    CompressionSettings,
    NodeSpec,
    PortRange,
    Problem,
    SecuritySettings,
    SparkSettings,
    TableSpec,
    Topology,
    TopologyError,
)
from sparkbus.topologies.registry import ROLES, Kind, Registry
from sparkbus.topologies.units import parse_duration, parse_size

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_CLUSTER_MASTERS = ("spark://", "yarn", "k8s://", "mesos://")
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
#: The compute roles' names (``sparkbus.roles.compute``, not imported: it may not be installed).
COMPUTE_CONTROLLER, COMPUTE_REPLICA = "compute.controller", "compute.replica"
#: Spark settings that sparkbus owns: setting them under [spark.conf] would be silently overridden.
_OWNED_CONF = {
    "spark.master": "spark.master",
    "spark.app.name": "spark.app_name",
    "spark.barrier.sync.timeout": "spark.barrier_timeout",
}

__all__ = [
    "SHIPPED",
    "BusSettings",
    "Cluster",
    "CompressionSettings",
    "NodeSpec",
    "PortRange",
    "Problem",
    "SecuritySettings",
    "SparkSettings",
    "TableSpec",
    "Topology",
    "TopologyError",
    "load",
    "loads",
    "shipped",
]

# ---------------------------------------------------------------- the checker

T = TypeVar("T")
_MISSING: Any = object()


class _Checker:
    """Reads raw TOML values, records problems with key paths, returns defaults where a value is bad."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.problems: list[Problem] = []

    def bad(self, path: str, reason: str) -> None:
        self.problems.append(Problem(path, reason))

    def accepted(self, *paths: str) -> bool:
        """No value at ``paths`` was refused: a check comparing them reads the file's values, not defaults
        standing in for refused ones (which would bring a second, misleading problem)."""
        return not any(p.path in paths for p in self.problems)

    def keys(self, table: Mapping[str, Any], path: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for key in table:
            if key not in allowed:
                near = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else f"; allowed keys: {', '.join(allowed)}"
                self.bad(_join(path, key), f"unknown key{hint}")

    def table(self, raw: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> dict[str, Any]:
        value = raw.get(key, _MISSING)
        full = _join(path, key)
        if value is _MISSING:
            if required:
                self.bad(full, "missing (a table is required here)")
            return {}
        if not isinstance(value, dict):
            self.bad(full, f"expected a table, got {_kind(value)}")
            return {}
        return value

    def get(
        self,
        raw: Mapping[str, Any],
        key: str,
        path: str,
        types: type | tuple[type, ...],
        default: T,
        *,
        required: bool = False,
        check: Callable[[Any], str | None] | None = None,
        convert: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The value of ``key`` converted, or ``default`` after recording why it is not usable."""
        full = _join(path, key)
        value = raw.get(key, _MISSING)
        if value is _MISSING:
            if required:
                self.bad(full, "missing (required)")
            return default
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            self.bad(full, f"expected {_type_names(types)}, got a boolean")
            return default
        if not isinstance(value, types):
            self.bad(full, f"expected {_type_names(types)}, got {_kind(value)}")
            return default
        if convert is not None:
            try:
                value = convert(value)
            except ValueError as exc:
                self.bad(full, str(exc))
                return default
        if check is not None:
            reason = check(value)
            if reason is not None:
                self.bad(full, reason)
                return default
        return value

    def names(self, raw: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = raw.get(key, _MISSING)
        full = _join(path, key)
        if value is _MISSING:
            return ()
        if not isinstance(value, list):
            self.bad(full, f"expected a list of names, got {_kind(value)}")
            return ()
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.bad(f"{full}[{i}]", f"expected a name (string), got {_kind(item)}")
            elif item in out:
                self.bad(f"{full}[{i}]", f"{item!r} is listed twice")
            else:
                out.append(item)
        return tuple(out)


def _join(path: str, key: str) -> str:
    shown = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'
    return f"{path}.{shown}" if path else shown


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
    for cls, name in names.items():
        if type(value) is cls:
            return f"{name} ({value!r})" if cls is not list else name
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in seq)


def _name_check(value: str) -> str | None:
    if _NAME.match(value):
        return None
    return "must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit"


def _host_check(ipv6: str) -> Callable[[str], str | None]:
    """A check of a host value, refusing IPv6 addresses with ``ipv6`` as the reason."""

    def check(value: str) -> str | None:
        if not value.strip():
            return "must not be empty"
        return f"{value!r} is an IPv6 address; {ipv6}" if ":" in value else None

    return check


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be greater than zero, got {value}"


# ---------------------------------------------------------------- sections


def _cluster(c: _Checker, raw: Mapping[str, Any]) -> Cluster:
    t = c.table(raw, "cluster", "", required=True)
    c.keys(t, "cluster", ["name", "tag"])
    name = c.get(t, "name", "cluster", str, "invalid", required=True, check=_name_check)
    tag = c.get(
        t, "tag", "cluster", str, "", check=lambda v: None if len(v) <= 128 else "at most 128 characters"
    )
    return Cluster(name=name, tag=tag)


def _port_range(value: str) -> PortRange | None:
    if value == "ephemeral":
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", value)
    if match is None:
        raise ValueError(f"expected 'ephemeral' or a range such as '7100-7199', got {value!r}")
    first, last = int(match[1]), int(match[2])
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"{value!r} is not a range within 1-65535 with the first port <= the last")
    return PortRange(first=first, last=last)


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IP address (ZeroMQ's allow-list matches addresses, not names)"
        ) from None


def _bus(c: _Checker, raw: Mapping[str, Any]) -> BusSettings:
    t = c.table(raw, "bus", "")
    d = BusSettings()
    c.keys(
        t,
        "bus",
        [
            "transport",
            "host",
            "ports",
            "ipc_dir",
            "heartbeat",
            "peer_timeout",
            "batch_size",
            "initial_credit",
            "tune_allocator",
            "idle_spin",
            "compression",
            "security",
        ],
    )
    transport = c.get(
        t,
        "transport",
        "bus",
        str,
        d.transport,
        check=lambda v: None if v in ("tcp", "ipc") else f"must be 'tcp' or 'ipc', got {v!r}",
    )
    # libzmq takes "tcp://::1:PORT" for an interface name and fails with "No such device".
    host = c.get(
        t,
        "host",
        "bus",
        str,
        d.host,
        check=_host_check("the bus binds IPv4 only: use an IPv4 address, '0.0.0.0' or '*'"),
    )
    ports = c.get(t, "ports", "bus", str, None, convert=_port_range)
    ipc_dir = c.get(t, "ipc_dir", "bus", str, None)
    if not c.accepted("bus.transport"):
        pass  # which of host, ports and ipc_dir have a meaning depends on the transport refused
    elif transport == "ipc":
        for key in ("host", "ports"):
            if key in t:
                c.bad(
                    f"bus.{key}", "has no meaning with transport = 'ipc' (sockets are files in bus.ipc_dir)"
                )
    elif "ipc_dir" in t:
        c.bad("bus.ipc_dir", "only meaningful with transport = 'ipc'")
    heartbeat = c.get(t, "heartbeat", "bus", str, d.heartbeat, convert=parse_duration, check=_positive)
    peer_timeout = c.get(
        t, "peer_timeout", "bus", str, d.peer_timeout, convert=parse_duration, check=_positive
    )
    if c.accepted("bus.heartbeat", "bus.peer_timeout") and peer_timeout < 2 * heartbeat:
        c.bad(
            "bus.peer_timeout",
            f"must be at least twice bus.heartbeat ({heartbeat:g}s), or one late heartbeat drops a healthy peer",
        )
    batch_size = c.get(
        t,
        "batch_size",
        "bus",
        (str, int),
        d.batch_size,
        convert=parse_size,
        check=lambda v: (
            None if 0 < v <= MAX_BATCH_SIZE else f"must be between 1B and 64MiB (one frame), got {v}B"
        ),
    )
    credit = c.get(
        t, "initial_credit", "bus", (str, int), d.initial_credit, convert=parse_size, check=_positive
    )
    if c.accepted("bus.batch_size", "bus.initial_credit") and credit < batch_size:
        c.bad(
            "bus.initial_credit", f"must be at least bus.batch_size ({batch_size}B), or no batch can be sent"
        )
    tune_allocator = c.get(t, "tune_allocator", "bus", bool, d.tune_allocator)
    idle_spin = c.get(t, "idle_spin", "bus", str, d.idle_spin, convert=parse_duration)
    if c.accepted("bus.heartbeat", "bus.idle_spin") and idle_spin >= heartbeat:
        c.bad("bus.idle_spin", f"must be shorter than bus.heartbeat ({heartbeat:g}s)")
    return BusSettings(
        transport=transport,
        host=host,
        ports=ports,
        ipc_dir=ipc_dir,
        heartbeat=heartbeat,
        peer_timeout=peer_timeout,
        batch_size=batch_size,
        initial_credit=credit,
        tune_allocator=tune_allocator,
        idle_spin=idle_spin,
        compression=_compression(c, t),
        security=_security(c, t),
    )


def _compression(c: _Checker, bus: Mapping[str, Any]) -> CompressionSettings:
    t = c.table(bus, "compression", "bus")
    p = "bus.compression"
    c.keys(t, p, ["enabled", "level", "min_size"])
    d = CompressionSettings()
    return CompressionSettings(
        enabled=c.get(t, "enabled", p, bool, d.enabled),
        level=c.get(
            t, "level", p, int, d.level, check=lambda v: None if 1 <= v <= 22 else "zstd levels are 1-22"
        ),
        min_size=c.get(t, "min_size", p, (str, int), d.min_size, convert=parse_size),
    )


def _security(c: _Checker, bus: Mapping[str, Any]) -> SecuritySettings:
    t = c.table(bus, "security", "bus")
    p = "bus.security"
    c.keys(t, p, ["mode", "key_dir", "allow"])
    mode = c.get(
        t,
        "mode",
        p,
        str,
        "none",
        check=lambda v: None if v in ("none", "curve") else f"must be 'none' or 'curve', got {v!r}",
    )
    key_dir = c.get(t, "key_dir", p, str, None)
    if not c.accepted(f"{p}.mode"):
        pass  # whether key_dir is needed depends on the mode refused
    elif mode == "curve" and "key_dir" not in t:
        c.bad(
            f"{p}.key_dir", "missing: mode = 'curve' needs the directory holding the cluster's certificates"
        )
    elif mode == "none" and key_dir is not None:
        c.bad(f"{p}.key_dir", "only meaningful with mode = 'curve'")
    allow: list[str] = []
    listed = c.names(t, "allow", p)
    for i, item in enumerate(listed):
        try:
            allow.append(_address(item))
        except ValueError as exc:
            c.bad(f"{p}.allow[{i}]", str(exc))
    if listed and c.accepted(f"{p}.mode") and mode == "none":
        # the addresses are checked by CURVE's ZAP handler; without CURVE no connection would be limited
        c.bad(f"{p}.allow", "only meaningful with mode = 'curve' (CURVE's ZAP handler checks the addresses)")
    return SecuritySettings(mode=mode, key_dir=key_dir, allow=tuple(allow))


def _master_check(value: str) -> str | None:
    if LOCAL_MASTER.match(value) or value.startswith(_CLUSTER_MASTERS):
        return None
    return f"expected local, local[N], local[*], spark://HOST:PORT, yarn or k8s://URL, got {value!r}"


def _spark(c: _Checker, raw: Mapping[str, Any], cluster: Cluster) -> SparkSettings | None:
    if "spark" not in raw:
        return None
    t = c.table(raw, "spark", "")
    c.keys(t, "spark", ["master", "app_name", "barrier_timeout", "conf"])
    d = SparkSettings()
    master = c.get(t, "master", "spark", str, d.master, check=_master_check)
    app_name = c.get(t, "app_name", "spark", str, f"sparkbus-{cluster.name}")
    timeout = c.get(
        t, "barrier_timeout", "spark", str, d.barrier_timeout, convert=parse_duration, check=_positive
    )
    conf: list[tuple[str, str]] = []
    for key, value in c.table(t, "conf", "spark").items():
        path = _join("spark.conf", key)
        if not key.startswith("spark."):
            c.bad(path, "Spark settings start with 'spark.' (quote dotted keys: \"spark.x.y\" = ...)")
        elif key in _OWNED_CONF:
            c.bad(path, f"set by sparkbus; write {_OWNED_CONF[key]} instead")
        elif isinstance(value, bool):
            conf.append((key, "true" if value else "false"))
        elif isinstance(value, str | int | float):
            conf.append((key, str(value)))
        else:
            c.bad(path, f"expected a string, number or boolean, got {_kind(value)}")
    if any(k == "spark.dynamicAllocation.enabled" and v.strip().lower() == "true" for k, v in conf):
        c.bad(
            'spark.conf."spark.dynamicAllocation.enabled"',
            "barrier stages refuse dynamic allocation (SPARK-24954)",
        )
    return SparkSettings(master=master, app_name=app_name, barrier_timeout=timeout, conf=tuple(conf))


def _count_check(value: int) -> str | None:
    if value < 1:
        return f"must be at least 1, got {value}"
    return None if value <= MAX_NODES else f"must be at most {MAX_NODES} ({MAX_NODES_WHY}), got {value}"


def _node(c: _Checker, t: Mapping[str, Any], path: str, spark: bool) -> NodeSpec | None:
    c.keys(t, path, ["name", "placement", "count", "host", "roles", "services"])
    name = c.get(t, "name", path, str, None, required=True, check=_name_check)
    placement = c.get(
        t,
        "placement",
        path,
        str,
        None,
        required=True,
        check=lambda v: (
            None if v in ("driver", "executor", "host") else f"must be driver, executor or host, got {v!r}"
        ),
    )
    count = c.get(t, "count", path, int, None, check=_count_check)
    host = c.get(
        t,
        "host",
        path,
        str,
        None,
        check=_host_check("peers reach nodes over IPv4 only: use the machine's IPv4 address or name"),
    )
    if placement == "driver" and "count" in t:
        c.bad(f"{path}.count", "a driver-placed node is one node in the driver process; remove count")
    if placement == "host" and "host" not in t:
        c.bad(f"{path}.host", "missing: placement = 'host' needs the machine's name or address")
    if placement in ("driver", "executor") and "host" in t:
        c.bad(
            f"{path}.host",
            f"Spark chooses where {placement}-placed nodes run; use placement = 'host' to fix it",
        )
    if placement in ("driver", "executor") and not spark:
        c.bad(
            f"{path}.placement",
            f"{placement!r} needs a [spark] section; without Spark every node is a process: use placement = 'host'",
        )
    roles = c.names(t, "roles", path)
    services = c.names(t, "services", path)
    listed: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
        ("roles", "role", roles),
        ("services", "service", services),
    )
    for key, kind, names in listed:
        for i, item in enumerate(names):
            if item not in c.registry:
                known = ", ".join(c.registry.names(kind))
                c.bad(f"{path}.{key}[{i}]", f"unknown {kind} {item!r}; known {kind}s: {known}")
            elif (entry := c.registry.entry(item)).kind != kind:
                c.bad(f"{path}.{key}[{i}]", f"{item!r} is a {entry.kind}; list it under {entry.kind}s")
    # Absent or empty lists alike (a list refused for its type or items is one problem already, not two).
    if all(t[key] == [] for key in ("roles", "services") if key in t):
        c.bad(path, "runs nothing: give it roles, services, or both")
    if name is None or placement is None:
        return None
    return NodeSpec(name=name, placement=placement, count=count, host=host, roles=roles, services=services)


def _nodes(c: _Checker, raw: Mapping[str, Any], spark: SparkSettings | None) -> tuple[NodeSpec, ...]:
    value = raw.get("nodes", _MISSING)
    if value is _MISSING:
        c.bad("nodes", "missing: a topology needs at least one [[nodes]] entry")
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        c.bad("nodes", "expected an array of tables ([[nodes]] entries)")
        return ()
    if not value:
        c.bad("nodes", "empty: a topology needs at least one node")
    specs: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(value):
        spec = _node(c, t, f"nodes[{i}]", spark is not None)
        if spec is None:
            continue
        for nid in spec.node_ids:
            if nid in seen:
                c.bad(
                    f"nodes[{i}].name",
                    f"node id {nid!r} is also made by nodes[{seen[nid]}]; names must be unique",
                )
            seen.setdefault(nid, i)
        specs.append(spec)
    total = sum(len(spec.node_ids) for spec in specs)
    if total > MAX_NODES:
        c.bad(
            "nodes",
            f"{total} nodes in all, but a topology holds at most {MAX_NODES}: every node links to every "
            f"other, {MAX_NODES_WHY}",
        )
    return tuple(specs)


def _tables(c: _Checker, raw: Mapping[str, Any]) -> tuple[TableSpec, ...]:
    out: list[TableSpec] = []
    for name, t in c.table(raw, "tables", "").items():
        path = _join("tables", name)
        if not isinstance(t, dict):
            c.bad(path, f"expected a table, got {_kind(t)}")
            continue
        if (reason := _name_check(name)) is not None:
            c.bad(path, f"table name {reason}")
        c.keys(t, path, ["partitions", "replication", "key"])
        partitions = c.get(t, "partitions", path, int, 1, required=True, check=_positive)
        replication = c.get(t, "replication", path, int, 1, check=_positive)
        key = t.get("key", _MISSING)
        keys: tuple[str, ...] = ()
        if key is _MISSING:
            c.bad(f"{path}.key", "missing: the column (or list of columns) rows are partitioned by")
        elif isinstance(key, str):
            keys = (key,)
        else:
            keys = c.names(t, "key", path)
            if isinstance(key, list) and not key:
                c.bad(f"{path}.key", "must name at least one column")
        for i, column in enumerate(keys):
            if not column.strip():
                c.bad(
                    f"{path}.key" if isinstance(key, str) else f"{path}.key[{i}]",
                    "must name a column, got a blank string",
                )
        out.append(TableSpec(name=name, partitions=partitions, replication=replication, key=keys))
    return tuple(out)


# ---------------------------------------------------------------- cross-section checks


def _check_slots(c: _Checker, topo: Topology) -> None:
    spark, executors = topo.spark, len(topo.placed("executor"))
    if spark is None or spark.local_slots is None or executors <= spark.local_slots:
        return
    c.bad(
        "spark.master",
        f"{spark.master} runs {spark.local_slots} task(s) at once, but the barrier stage needs all "
        f"{executors} executor nodes running together; use local[{executors}] or fewer nodes",
    )


def _check_ipc(c: _Checker, topo: Topology) -> None:
    if topo.bus.transport != "ipc":
        return
    if topo.spark is not None and not topo.spark.is_local:
        c.bad("bus.transport", "'ipc' needs every node on one machine, but spark.master is a cluster")
    for i, spec in enumerate(topo.nodes):
        if spec.placement == "host" and spec.host not in _LOCAL_HOSTS:
            c.bad(f"nodes[{i}].host", f"transport 'ipc' needs every node on this machine, not {spec.host!r}")


def _check_ports(c: _Checker, topo: Topology) -> None:
    ports = topo.bus.ports
    if ports is None:
        return

    plain_http = topo.bus.security.mode != "curve"  # under CURVE no node serves the HTTP exchange

    def binds(spec: NodeSpec) -> int:  # control and data, and the HTTP exchange's port if it serves one
        return PORTS_PER_NODE + (1 if plain_http and HTTP_BUFFERS in spec.runs else 0)

    floating = [spec for _, spec in topo.placed("driver") + topo.placed("executor")]
    per_host: dict[str | None, list[NodeSpec]] = {}
    for spec in topo.nodes:
        if spec.placement == "host":
            per_host.setdefault(spec.host, []).extend([spec] * len(spec.node_ids))
    crowded = max(per_host.values(), key=lambda specs: sum(map(binds, specs)), default=[])
    sharing = crowded + floating
    # The Spark runtime binds in the range too: the driver's runtime channel on every start, and each
    # executor node's task a PULL for the row exchange (when the rows are routed with it: counted always).
    channel = 1 if topo.spark is not None else 0
    exchange = len(topo.placed("executor"))
    need = sum(map(binds, sharing)) + channel + exchange
    if need > ports.size:
        http = (
            " and one more for each that serves the HTTP exchange (binx.server)"
            if plain_http and any(HTTP_BUFFERS in spec.runs for spec in sharing)
            else ""
        )
        runtime = [f"{channel} for the driver's runtime channel"] if channel else []
        runtime += [f"{exchange} for the tasks' row exchange (one per executor node)"] if exchange else []
        plus = f", plus {' and '.join(runtime)}" if runtime else ""
        c.bad(
            "bus.ports",
            f"{ports} holds {ports.size} ports, but up to {len(sharing)} nodes may share one machine "
            f"and each binds {PORTS_PER_NODE} (control and data){http}{plus}; widen it to at least "
            f"{need} ports or use 'ephemeral'",
        )


def _check_http_exchange(c: _Checker, topo: Topology) -> None:
    """Under CURVE no node serves the HTTP exchange (plain HTTP, neither encrypted nor authenticated), so a
    node running its fetching side, ``http.client``, asks for what the cluster refuses."""
    if topo.bus.security.mode != "curve":
        return
    for i, spec in enumerate(topo.nodes):
        if HTTP_CLIENT in spec.roles:
            c.bad(
                f"nodes[{i}].roles[{spec.roles.index(HTTP_CLIENT)}]",
                f"{HTTP_CLIENT!r} pulls over the HTTP exchange, which is plain HTTP, so under "
                "bus.security mode = 'curve' no node serves it; remove it (queries use 'binx' or 'push')",
            )


def _check_tables(c: _Checker, topo: Topology) -> None:
    storing = topo.hosting("replication")
    for table in topo.tables:
        path = _join("tables", table.name)
        if not storing:
            c.bad(path, "no node runs the 'replication' role, so the table has nowhere to live")
        elif table.replication > len(storing):
            c.bad(
                f"{path}.replication",
                f"{table.replication} copies need {table.replication} nodes running 'replication', "
                f"but only {len(storing)} do ({', '.join(storing)})",
            )


def _check_compute(c: _Checker, topo: Topology) -> None:
    """A compute controller feeds the nodes running ``compute.replica`` and refuses to start without one."""
    if topo.hosting(COMPUTE_REPLICA):
        return
    for i, spec in enumerate(topo.nodes):
        if COMPUTE_CONTROLLER in spec.roles:
            c.bad(
                f"nodes[{i}].roles[{spec.roles.index(COMPUTE_CONTROLLER)}]",
                f"{COMPUTE_CONTROLLER!r} needs at least one node running {COMPUTE_REPLICA!r}, and none does",
            )


#: The checks across sections, each with the sections it reads. A check runs when those have no problem of
#: their own, so that every problem is reported at once but a bad value, read back as its default, does not
#: bring a second, misleading one (a node refused for its name runs no role).
_ACROSS: tuple[tuple[frozenset[str], Callable[[_Checker, Topology], None]], ...] = (
    (frozenset({"spark", "nodes"}), _check_slots),
    (frozenset({"bus", "spark", "nodes"}), _check_ipc),
    (frozenset({"bus", "nodes"}), _check_ports),
    (frozenset({"bus", "nodes"}), _check_http_exchange),
    (frozenset({"nodes", "tables"}), _check_tables),
    (frozenset({"nodes"}), _check_compute),
)


def _section(problem: Problem) -> str:
    """The top-level section a problem is in (``nodes[2].host``: ``nodes``)."""
    return re.split(r"[.\[]", problem.path, maxsplit=1)[0]


# ---------------------------------------------------------------- entry points

_TOP = ["cluster", "bus", "spark", "nodes", "tables"]


def loads(text: str, source: str = "<string>", *, registry: Registry = ROLES) -> Topology:
    """Parse and validate topology ``text``; ``source`` names it in errors.

    Raises:
        TopologyError: the text is not TOML, or lists every problem found.
    """
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(source, [Problem("", f"not valid TOML: {exc}")]) from None
    c = _Checker(registry)
    c.keys(raw, "", _TOP)
    cluster = _cluster(c, raw)
    bus = _bus(c, raw)
    spark = _spark(c, raw, cluster)
    nodes = _nodes(c, raw, spark)
    tables = _tables(c, raw)
    topo = Topology(source=source, cluster=cluster, bus=bus, spark=spark, nodes=nodes, tables=tables)
    doubtful = {_section(p) for p in c.problems}
    for sections, check in _ACROSS:
        if doubtful.isdisjoint(sections):
            check(c, topo)
    if c.problems:
        raise TopologyError(source, c.problems)
    return topo


def load(path: str | Path, *, registry: Registry = ROLES) -> Topology:
    """Read and validate the topology file at ``path``.

    Raises:
        TopologyError: the file cannot be read, is not TOML, or is invalid.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(str(path), [Problem("", f"cannot read the file: {exc}")]) from None
    return loads(text, str(path), registry=registry)


SHIPPED = ("local.toml", "processes.toml", "cluster.example.toml")


def shipped(name: str = "local.toml") -> Path:
    """The path of a topology file shipped inside ``sparkbus.topologies`` (``local.toml`` by default)."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped topology {name!r}; shipped: {', '.join(SHIPPED)}")
    return Path(str(resources.files("sparkbus.topologies").joinpath(name)))
