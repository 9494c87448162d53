"""docs/CLIENT.md says what the code does: how SQL through the gateway finds its participants (the query role
leaves thin-client sessions out of its default participants, and the gateway adds no ``participants``; its
Known limits described a workaround of the gateway's that the code no longer has), the cluster tag a
topology file's nodes run with, and every operation the client can send, with the call the gateway makes."""

from __future__ import annotations

import re
from pathlib import Path

from sparkbus.bus import contract as c
from sparkbus.roles.client import Gateway, Op
from sparkbus.roles.client.gateway import ROUTES
from sparkbus.roles.client.messages import Request
from sparkbus.roles.query import QueryRole
from sparkbus.topologies.busnode import bus_config
from sparkbus.topologies.schema import load

DOC = Path(__file__).resolve().parents[3] / "docs" / "CLIENT.md"


def test_sql_participants_are_documented_as_the_gateway_and_query_role_choose_them() -> None:
    role = QueryRole("n1", incarnation="x")
    role.handle(c.PeerUp(peer="client:ab", connection_id="cid"), 0.0)
    role.handle(c.PeerUp(peer="n2"), 0.0)
    assert role.peers_up == {"n2"}
    gw = Gateway("n1", ["query"])
    gw.handle(c.PeerUp(peer="client:ab", connection_id="cid"), 0.0)
    sql = Request(request_id=1, op=Op.SQL, args={"sql": "SELECT x FROM t"})
    (call,) = gw.handle(c.MessageReceived(peer="client:ab", message=sql), 0.0)
    assert isinstance(call, c.Call) and "participants" not in call.args
    text = " ".join(DOC.read_text().split())
    assert "thin-client sessions are never participants" in text
    assert "so the gateway sets `participants`" not in text


def test_the_documented_cluster_tag_is_the_one_a_topology_files_nodes_run_with() -> None:
    root = DOC.parents[1]
    doc = DOC.read_text()
    example = re.search(r'sparkbus\.connect\(\[[^\]]*\], cluster_tag="([^"]+)"\)', doc)
    assert example is not None
    tag = bus_config(load(root / "topologies" / "processes.toml")).cluster_tag
    assert example.group(1) == tag  # the example's nodes are those of processes.toml, named next to it
    assert "`<name>/<tag>`" in doc and f"`{tag}` for `topologies/processes.toml`" in doc


def test_every_operation_has_a_row_naming_where_the_gateway_sends_it() -> None:
    rows = [
        line for line in DOC.read_text().splitlines() if re.match(r"\| \d+(\D\d+)? \| [A-Z_, ]+ \|", line)
    ]
    for op in Op:
        (row,) = [r for r in rows if op.name in re.split(r"[ ,|]+", r.split("|")[2])]
        route = ROUTES.get(op)
        if route is not None and "," not in row.split("|")[2]:
            assert f"`{route[0]}.{route[1]}`" in row, (op.name, route)
