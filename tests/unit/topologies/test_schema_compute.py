"""A topology whose compute controller has no replica to feed is refused by validation, as its node would be
refused at start (``ComputeController`` needs at least one replica)."""

from __future__ import annotations

import pytest

from sparkbus.topologies.schema import TopologyError, loads

NODES = """
[cluster]
name = "t"

[[nodes]]
name = "c"
placement = "host"
host = "127.0.0.1"
roles = ["query", "compute.controller", "client.gateway"]

[[nodes]]
name = "s"
placement = "host"
host = "127.0.0.1"
count = 2
roles = [{roles}]
"""


def test_a_controller_without_any_replica_is_refused_in_one_line() -> None:
    with pytest.raises(TopologyError) as err:
        loads(NODES.format(roles='"query"'), "t.toml")
    assert [str(p) for p in err.value.problems] == [
        "nodes[0].roles[1]: 'compute.controller' needs at least one node running 'compute.replica', and none does"
    ]


def test_a_replica_on_any_node_satisfies_the_controller() -> None:
    topo = loads(NODES.format(roles='"query", "compute.replica"'))
    assert topo.hosting("compute.replica") == ["s-0", "s-1"]
    alone = NODES.replace('"compute.controller",', '"compute.controller", "compute.replica",')
    assert loads(alone.format(roles='"query"')).hosting("compute.replica") == ["c"]


def test_a_refused_node_brings_no_second_problem_about_the_controller() -> None:
    # the nodes section has a problem of its own: the check across it does not run
    text = NODES.format(roles='"query", "qeury"')
    with pytest.raises(TopologyError) as err:
        loads(text, "t.toml")
    assert [p.path for p in err.value.problems] == ["nodes[1].roles[1]"]
