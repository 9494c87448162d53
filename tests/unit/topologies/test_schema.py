"""Topology loading: the shipped files, and one test per kind of problem."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sparkbus.topologies.schema import (
    SHIPPED,
    NodeSpec,
    PortRange,
    TopologyError,
    load,
    loads,
    shipped,
)

BASE = """
[cluster]
name = "t"

[spark]
master = "local[2]"

[[nodes]]
name = "d"
placement = "driver"
services = ["echo"]

[[nodes]]
name = "s"
placement = "executor"
count = 2
roles = ["replication"]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(TopologyError) as err:
        loads(text, "t.toml")
    assert all(line.startswith("t.toml") for line in str(err.value).splitlines())
    return [str(p) for p in err.value.problems]


def only_problem(text: str) -> str:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_files_load(name: str) -> None:
    topo = load(shipped(name))
    assert topo.source.endswith(name)
    assert topo.node_ids()
    pickle.loads(pickle.dumps(topo))  # shipped to Spark tasks


def test_local_toml_is_the_embedded_default() -> None:
    topo = load(shipped())
    assert topo.spark is not None
    assert topo.spark.master == "local[2]"
    assert topo.spark.local_slots == 2
    assert [nid for nid, _ in topo.placed("executor")] == ["store-0", "store-1"]
    assert [nid for nid, _ in topo.placed("driver")] == ["coordinator"]
    assert topo.bus.heartbeat == 0.25
    assert topo.bus.batch_size == 512 * 1024
    assert {t.name: t.replication for t in topo.tables} == {"events": 2, "orders": 2, "customers": 2}


def test_processes_toml_has_no_spark() -> None:
    topo = load(shipped("processes.toml"))
    assert topo.spark is None
    assert len(topo.node_ids()) == 4
    assert all(spec.placement == "host" for spec in topo.nodes)


def test_cluster_example_has_curve_and_a_port_range() -> None:
    topo = load(shipped("cluster.example.toml"))
    assert topo.bus.security.mode == "curve"
    assert topo.bus.ports == PortRange(first=7100, last=7199)
    keys = {t.name: t.key for t in topo.tables}
    assert keys["lineitem"] == ("order_id", "line_number")
    assert keys["events"] == ("event_id",)  # what sparkbus run loads


def test_cluster_example_says_what_barrier_timeout_bounds() -> None:
    # only Spark's barrier calls; the rendezvous goes through the driver, bounded by ready_timeout
    text = shipped("cluster.example.toml").read_text()
    line = next(line for line in text.splitlines() if line.startswith("barrier_timeout"))
    comment = line.partition("#")[2]
    assert "spark.barrier.sync.timeout" in comment and "ready_timeout" in comment, line
    assert load(shipped("cluster.example.toml")).spark is not None


def test_defaults() -> None:
    topo = loads(BASE)
    assert topo.bus.transport == "tcp"
    assert topo.bus.ports is None
    assert topo.bus.compression.enabled is False
    assert topo.spark is not None and topo.spark.app_name == "sparkbus-t"
    assert topo.nodes[1] == NodeSpec(name="s", placement="executor", count=2, roles=("replication",))
    assert topo.hosting("replication") == ["s-0", "s-1"]
    assert topo.spec_of("s-1").name == "s"
    with pytest.raises(KeyError, match="no node 'x'"):
        topo.spec_of("x")


def test_not_toml() -> None:
    assert only_problem("[cluster\nname=1").startswith("not valid TOML: ")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"missing.toml: cannot read the file"):
        load(tmp_path / "missing.toml")


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(BASE.replace('name = "t"', 'name = "t"\ncolour = 1'))
    with pytest.raises(TopologyError) as err:
        load(path)
    assert str(err.value) == f"{path}: cluster.colour: unknown key; allowed keys: name, tag"


def test_unknown_key_suggests_a_near_one() -> None:
    text = BASE + '\n[bus]\nheartbeet = "1s"\n'
    assert only_problem(text) == "bus.heartbeet: unknown key; did you mean 'heartbeat'?"


def test_unknown_top_level_section() -> None:
    assert only_problem(BASE + "\n[extra]\nx = 1\n").startswith("extra: unknown key")


def test_unknown_role_lists_known_ones() -> None:
    text = BASE.replace('roles = ["replication"]', 'roles = ["replication", "qeury"]')
    assert only_problem(text) == (
        "nodes[1].roles[1]: unknown role 'qeury'; known roles: binx.client, binx.server, "
        "client.gateway, compute.controller, compute.replica, http.client, query, replication"
    )


def test_service_listed_as_role() -> None:
    text = BASE.replace('roles = ["replication"]', 'roles = ["replication", "echo"]')
    assert only_problem(text) == "nodes[1].roles[1]: 'echo' is a service; list it under services"


def test_duplicate_role_on_a_node() -> None:
    text = BASE.replace('roles = ["replication"]', 'roles = ["replication", "replication"]')
    assert only_problem(text) == "nodes[1].roles[1]: 'replication' is listed twice"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('master = "local[2]"', 'master = "locale"', "spark.master: expected local, local[N]"),
        ('master = "local[2]"', "master = 2", "spark.master: expected a string, got an integer (2)"),
        ("count = 2", "count = 0", "nodes[1].count: must be at least 1, got 0"),
        ("count = 2", "count = true", "nodes[1].count: expected an integer, got a boolean"),
        ("count = 2", "count = 201", "nodes[1].count: must be at most 200 (each node opens 4 ZeroMQ sockets"),
        (
            "count = 2",
            "count = 100000",
            "nodes[1].count: must be at most 200 (each node opens 4 ZeroMQ sockets",
        ),
        ('placement = "driver"', 'placement = "gpu"', "nodes[0].placement: must be driver, executor or host"),
        ('name = "t"', 'name = "-t"', "cluster.name: must be 1-63 letters"),
        ('name = "d"', 'name = "d d"', "nodes[0].name: must be 1-63 letters"),
        (
            'services = ["echo"]',
            'services = "echo"',
            "nodes[0].services: expected a list of names, got a string",
        ),
        (
            'services = ["echo"]',
            "services = [1]",
            "nodes[0].services[0]: expected a name (string), got an integer",
        ),
    ],
)
def test_bad_values(old: str, new: str, expected: str) -> None:
    assert only_problem(BASE.replace(old, new)).startswith(expected)


@pytest.mark.parametrize(
    ("bus", "expected"),
    [
        ('transport = "udp"', "bus.transport: must be 'tcp' or 'ipc', got 'udp'"),
        ('host = "::1"', "bus.host: '::1' is an IPv6 address; the bus binds IPv4 only"),
        ('host = " "', "bus.host: must not be empty"),
        ('heartbeat = "5"', "bus.heartbeat: '5' has no unit"),
        ('heartbeat = "0s"', "bus.heartbeat: must be greater than zero"),
        (
            'heartbeat = "1s"\npeer_timeout = "1500ms"',
            "bus.peer_timeout: must be at least twice bus.heartbeat (1s)",
        ),
        ('batch_size = "512kb"', "bus.batch_size: unknown size unit 'kb'"),
        ('batch_size = "65MiB"', "bus.batch_size: must be between 1B and 64MiB"),
        (
            'batch_size = "1MiB"\ninitial_credit = "512KiB"',
            "bus.initial_credit: must be at least bus.batch_size",
        ),
        ('ports = "7100"', "bus.ports: expected 'ephemeral' or a range"),
        ('ports = "7200-7100"', "bus.ports: '7200-7100' is not a range within 1-65535"),
        ('transport = "ipc"\nports = "7100-7199"', "bus.ports: has no meaning with transport = 'ipc'"),
        ('ipc_dir = "/tmp/x"', "bus.ipc_dir: only meaningful with transport = 'ipc'"),
        ('tune_allocator = "no"', "bus.tune_allocator: expected a boolean, got a string"),
        ('idle_spin = "200"', "bus.idle_spin: '200' has no unit"),
        ('idle_spin = "-1us"', "bus.idle_spin: expected a duration"),
        ('heartbeat = "1s"\nidle_spin = "1s"', "bus.idle_spin: must be shorter than bus.heartbeat (1s)"),
        ("[bus.compression]\nlevel = 30", "bus.compression.level: zstd levels are 1-22"),
        ('[bus.security]\nmode = "curve"', "bus.security.key_dir: missing: mode = 'curve' needs"),
        ('[bus.security]\nmode = "tls"', "bus.security.mode: must be 'none' or 'curve'"),
        (
            '[bus.security]\nmode = "curve"\nkey_dir = "/k"\nallow = ["db1.example.com"]',
            "bus.security.allow[0]: 'db1.example.com' is not an IP",
        ),
        ('[bus.security]\nkey_dir = "/k"', "bus.security.key_dir: only meaningful with mode = 'curve'"),
        # without CURVE no ZAP handler runs, so an allow-list would limit nothing
        ('[bus.security]\nallow = ["10.0.0.1"]', "bus.security.allow: only meaningful with mode = 'curve'"),
        (
            '[bus.security]\nmode = "none"\nallow = ["10.0.0.1", "10.0.0.2"]',
            "bus.security.allow: only meaningful with mode = 'curve'",
        ),
        # the refused value alone: not also a comparison with the default it is read back as
        ('heartbeat = "0.2"\npeer_timeout = "1s"', "bus.heartbeat: '0.2' has no unit"),
        ('heartbeat = "0s"\npeer_timeout = "1500ms"', "bus.heartbeat: must be greater than zero"),
        ('heartbeat = "x"\nidle_spin = "1s"', "bus.heartbeat: expected a duration"),
        ('heartbeat = "3s"\npeer_timeout = "5"', "bus.peer_timeout: '5' has no unit"),
        ('heartbeat = "100us"\nidle_spin = "1"', "bus.idle_spin: '1' has no unit"),
        ('batch_size = "100kb"\ninitial_credit = "256KiB"', "bus.batch_size: unknown size unit 'kb'"),
        ('batch_size = "8MiB"\ninitial_credit = "4mib"', "bus.initial_credit: unknown size unit 'mib'"),
        ('transport = "IPC"\nipc_dir = "/tmp/x"', "bus.transport: must be 'tcp' or 'ipc', got 'IPC'"),
        ('[bus.security]\nmode = "Curve"\nkey_dir = "/k"', "bus.security.mode: must be 'none' or 'curve'"),
    ],
)
def test_bad_bus_settings(bus: str, expected: str) -> None:
    assert only_problem(BASE + "\n[bus]\n" + bus + "\n").startswith(expected)


def test_an_empty_allow_list_needs_no_curve() -> None:
    # empty means any address: it promises nothing, so a plain topology may keep it
    topo = loads(BASE + '\n[bus.security]\nmode = "none"\nallow = []\n', "t.toml")
    assert topo.bus.security.allow == ()


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ('"sql.shuffle.partitions" = 4', 'spark.conf."sql.shuffle.partitions": Spark settings start with'),
        (
            '"spark.barrier.sync.timeout" = "1s"',
            'spark.conf."spark.barrier.sync.timeout": set by sparkbus; write spark.barrier_timeout',
        ),
        ('"spark.dynamicAllocation.enabled" = true', "barrier stages refuse dynamic allocation"),
        ('"spark.dynamicAllocation.enabled" = " TRUE"', "barrier stages refuse dynamic allocation"),
        ('"spark.x" = [1]', 'spark.conf."spark.x": expected a string, number or boolean, got an array'),
    ],
)
def test_bad_spark_conf(conf: str, expected: str) -> None:
    text = BASE.replace('master = "local[2]"', f'master = "local[2]"\n[spark.conf]\n{conf}')
    assert expected in only_problem(text)


def test_spark_conf_values_become_spark_strings() -> None:
    text = BASE.replace(
        'master = "local[2]"', 'master = "local[2]"\n[spark.conf]\n"spark.a" = true\n"spark.b" = 2'
    )
    topo = loads(text)
    assert topo.spark is not None and topo.spark.conf == (("spark.a", "true"), ("spark.b", "2"))


def test_two_nodes_with_the_same_id() -> None:
    text = BASE + '\n[[nodes]]\nname = "s-1"\nplacement = "driver"\nservices = ["echo"]\n'
    assert only_problem(text) == "nodes[2].name: node id 's-1' is also made by nodes[1]; names must be unique"


def test_more_executor_nodes_than_local_slots() -> None:
    found = only_problem(BASE.replace("count = 2", "count = 3"))
    assert found.startswith(
        "spark.master: local[2] runs 2 task(s) at once, but the barrier stage needs all 3"
    )


def test_executor_placement_needs_spark() -> None:
    text = BASE.replace('[spark]\nmaster = "local[2]"\n', "")
    assert problems(text) == [
        "nodes[0].placement: 'driver' needs a [spark] section; without Spark every node is a process: "
        "use placement = 'host'",
        "nodes[1].placement: 'executor' needs a [spark] section; without Spark every node is a process: "
        "use placement = 'host'",
    ]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (
            'name = "h"\nplacement = "host"\nroles = ["query"]',
            "nodes[2].host: missing: placement = 'host' needs",
        ),
        (
            'name = "h"\nplacement = "driver"\ncount = 2\nroles = ["query"]',
            "nodes[2].count: a driver-placed node is one node",
        ),
        (
            'name = "h"\nplacement = "executor"\nhost = "x"\nroles = ["query"]',
            "nodes[2].host: Spark chooses where",
        ),
        ('name = "h"\nplacement = "host"\nhost = "x"', "nodes[2]: runs nothing"),
        ('name = "h"\nplacement = "host"\nhost = "x"\nroles = []', "nodes[2]: runs nothing"),
        ('name = "h"\nplacement = "host"\nhost = "x"\nroles = []\nservices = []', "nodes[2]: runs nothing"),
        # a list refused for its type or its items is the one problem
        ('name = "h"\nplacement = "host"\nhost = "x"\nroles = "query"', "nodes[2].roles: expected a list"),
        ('name = "h"\nplacement = "host"\nhost = "x"\nroles = [1]', "nodes[2].roles[0]: expected a name"),
        (
            'name = "h"\nplacement = "host"\nhost = "::1"\nroles = ["query"]',
            "nodes[2].host: '::1' is an IPv6 address; peers reach nodes over IPv4 only",
        ),
        ('placement = "host"\nhost = "x"\nroles = ["query"]', "nodes[2].name: missing (required)"),
    ],
)
def test_bad_nodes(node: str, expected: str) -> None:
    text = BASE.replace('master = "local[2]"', 'master = "local[3]"') + "\n[[nodes]]\n" + node + "\n"
    assert only_problem(text).startswith(expected)


def hosts(*counts: int) -> str:
    """A topology of plain processes: one [[nodes]] entry per count."""
    entry = (
        '[[nodes]]\nname = "n{}"\nplacement = "host"\nhost = "127.0.0.1"\ncount = {}\nservices = ["echo"]\n'
    )
    return '[cluster]\nname = "h"\n' + "".join(entry.format(i, n) for i, n in enumerate(counts))


def test_the_nodes_of_a_topology_are_bounded_in_all() -> None:
    assert len(loads(hosts(150, 50)).node_ids()) == 200
    assert only_problem(hosts(150, 51)) == (
        "nodes: 201 nodes in all, but a topology holds at most 200: every node links to every other, "
        "each node opens 4 ZeroMQ sockets per peer, and a process holds at most 1023"
    )
    # a count refused on its own is the one problem, not also the total it would make
    assert only_problem(hosts(150, 10**5)).startswith("nodes[1].count: must be at most 200")


def test_missing_sections() -> None:
    assert problems("") == [
        "cluster: missing (a table is required here)",
        "cluster.name: missing (required)",
        "nodes: missing: a topology needs at least one [[nodes]] entry",
    ]


def test_port_range_must_fit_the_nodes_sharing_a_machine() -> None:
    text = BASE + '\n[bus]\nports = "7100-7107"\n'
    assert only_problem(text) == (
        "bus.ports: 7100-7107 holds 8 ports, but up to 3 nodes may share one machine and each binds 2 "
        "(control and data), plus 1 for the driver's runtime channel and 2 for the tasks' row exchange "
        "(one per executor node); widen it to at least 9 ports or use 'ephemeral'"
    )
    assert loads(BASE + '\n[bus]\nports = "7100-7108"\n').bus.ports == PortRange(first=7100, last=7108)


def test_port_range_counts_the_http_exchange_port_of_a_node_serving_it() -> None:
    serving = BASE.replace('roles = ["replication"]', 'roles = ["replication", "binx.server"]')
    assert only_problem(serving + '\n[bus]\nports = "7100-7109"\n') == (
        "bus.ports: 7100-7109 holds 10 ports, but up to 3 nodes may share one machine and each binds 2 "
        "(control and data) and one more for each that serves the HTTP exchange (binx.server), plus 1 for "
        "the driver's runtime channel and 2 for the tasks' row exchange (one per executor node); widen it "
        "to at least 11 ports or use 'ephemeral'"
    )
    assert loads(serving + '\n[bus]\nports = "7100-7110"\n').bus.ports == PortRange(first=7100, last=7110)


def test_port_range_counts_the_spark_runtimes_channel_and_row_exchange() -> None:
    # local.toml's 3 nodes bind 9 ports (all serve the HTTP exchange); in local mode the driver's runtime
    # channel and both tasks' row exchange PULLs bind on the same machine, in the same range: 12 in all.
    local = shipped("local.toml").read_text().replace('ports = "ephemeral"', 'ports = "7100-7108"')
    assert 'ports = "7100-7108"' in local
    assert only_problem(local) == (
        "bus.ports: 7100-7108 holds 9 ports, but up to 3 nodes may share one machine and each binds 2 "
        "(control and data) and one more for each that serves the HTTP exchange (binx.server), plus 1 for "
        "the driver's runtime channel and 2 for the tasks' row exchange (one per executor node); widen it "
        "to at least 12 ports or use 'ephemeral'"
    )
    assert loads(local.replace("7100-7108", "7100-7111")).bus.ports == PortRange(first=7100, last=7111)
    # without Spark nothing else binds: processes.toml's 4 nodes need their 8 ports only (it uses CURVE,
    # so its binx.server nodes serve no HTTP exchange)
    processes = shipped("processes.toml").read_text().replace('ports = "ephemeral"', 'ports = "7100-7107"')
    assert loads(processes).bus.ports == PortRange(first=7100, last=7107)
    assert only_problem(processes.replace("7100-7107", "7100-7106")) == (
        "bus.ports: 7100-7106 holds 7 ports, but up to 4 nodes may share one machine and each binds 2 "
        "(control and data); widen it to at least 8 ports or use 'ephemeral'"
    )


_CURVE = '\n[bus.security]\nmode = "curve"\nkey_dir = "keys"\n'


def test_under_curve_a_node_serving_binx_binds_no_http_exchange_port() -> None:
    serving = BASE.replace('roles = ["replication"]', 'roles = ["replication", "binx.server"]')
    # as many ports as without binx.server: 3 nodes x 2, the runtime channel, 2 row exchange PULLs
    text = serving.replace("[spark]", '[bus]\nports = "7100-7108"\n' + _CURVE + "\n[spark]", 1)
    assert loads(text).bus.ports == PortRange(first=7100, last=7108)
    assert "widen it to at least 9 ports" in only_problem(text.replace("7100-7108", "7100-7107"))


def test_under_curve_a_node_running_http_client_is_refused_in_one_line() -> None:
    text = BASE.replace('roles = ["replication"]', 'roles = ["replication", "binx.client", "http.client"]')
    assert only_problem(text + _CURVE) == (
        "nodes[1].roles[2]: 'http.client' pulls over the HTTP exchange, which is plain HTTP, so under "
        "bus.security mode = 'curve' no node serves it; remove it (queries use 'binx' or 'push')"
    )
    assert loads(text).nodes[1].roles[2] == "http.client"  # without CURVE nothing changes


def test_ipc_needs_one_machine() -> None:
    text = (
        '[cluster]\nname = "p"\n[bus]\ntransport = "ipc"\n'
        '[[nodes]]\nname = "a"\nplacement = "host"\nhost = "10.1.1.1"\nservices = ["echo"]\n'
    )
    assert (
        only_problem(text)
        == "nodes[0].host: transport 'ipc' needs every node on this machine, not '10.1.1.1'"
    )
    cluster = BASE.replace("local[2]", "spark://m:7077") + '\n[bus]\ntransport = "ipc"\n'
    assert (
        only_problem(cluster)
        == "bus.transport: 'ipc' needs every node on one machine, but spark.master is a cluster"
    )


TABLE = '\n[tables.orders]\npartitions = 4\nreplication = {r}\nkey = "id"\n'


def test_replication_above_the_nodes_hosting_replication() -> None:
    assert loads(BASE + TABLE.format(r=2)).tables[0].replication == 2
    assert only_problem(BASE + TABLE.format(r=3)) == (
        "tables.orders.replication: 3 copies need 3 nodes running 'replication', but only 2 do (s-0, s-1)"
    )


def test_table_without_any_replication_node() -> None:
    text = BASE.replace('roles = ["replication"]', 'roles = ["query"]') + TABLE.format(r=1)
    assert (
        only_problem(text)
        == "tables.orders: no node runs the 'replication' role, so the table has nowhere to live"
    )


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("partitions = 0\nkey = 'id'", "tables.orders.partitions: must be greater than zero"),
        ("key = 'id'", "tables.orders.partitions: missing (required)"),
        ("partitions = 2", "tables.orders.key: missing"),
        ("partitions = 2\nkey = []", "tables.orders.key: must name at least one column"),
        ("partitions = 2\nkey = ''", "tables.orders.key: must name a column, got a blank string"),
        ("partitions = 2\nkey = ['id', ' ']", "tables.orders.key[1]: must name a column, got a blank"),
        ("partitions = 2\nkey = 'id'\nsorted = true", "tables.orders.sorted: unknown key"),
    ],
)
def test_bad_tables(table: str, expected: str) -> None:
    assert only_problem(BASE + "\n[tables.orders]\n" + table + "\n").startswith(expected)


def test_every_problem_is_reported_at_once() -> None:
    text = (
        BASE.replace("count = 2", "count = 0").replace('name = "t"', 'name = ""')
        + '\n[bus]\nheartbeat = "x"\n'
    )
    err = problems(text)
    assert [p.split(":")[0] for p in err] == ["cluster.name", "bus.heartbeat", "nodes[1].count"]


def test_checks_across_sections_run_beside_problems_in_sections_they_do_not_read() -> None:
    text = BASE + '\n[bus]\nheartbeet = "1s"\n' + TABLE.format(r=3)
    assert problems(text) == [
        "bus.heartbeet: unknown key; did you mean 'heartbeat'?",
        "tables.orders.replication: 3 copies need 3 nodes running 'replication', but only 2 do (s-0, s-1)",
    ]
    # A node refused for its name runs no role: the table check, which reads the nodes, says nothing.
    text = BASE.replace('name = "s"', 'name = "s s"') + TABLE.format(r=1)
    assert [p.split(":")[0] for p in problems(text)] == ["nodes[1].name"]


def test_shipped_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"no shipped topology 'x\.toml'"):
        shipped("x.toml")
