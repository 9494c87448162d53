"""The factory the topology registry calls for ``query``: one query role per node, named by the node id."""

from __future__ import annotations

from typing import Any

from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.role import QueryRole


def make_role(ctx: Any) -> QueryRole:
    """A query role for node ``ctx.node_id``.

    It scans the node's shared catalog (``ctx.catalog``: loaded tables plus those other roles publish,
    such as replicated tables) when the node has one, else an empty partition store (``load`` fills it).
    Its edges' credit is the default, lowered to the topology's ``bus.initial_credit`` if that is smaller
    (``QueryConfig.edge_credit`` may not exceed it). Its default participants are the nodes of the topology
    that run ``query`` (``QueryConfig.members``), never a node that runs only other roles. Under CURVE it
    refuses the ``http`` exchange (``QueryConfig.curve``): no node serves it. It refuses to ``load`` a table
    the topology declares (``QueryRole``'s ``declared``): those rows go to the table's replicated partitions.
    """
    bus = ctx.topology.bus.initial_credit
    config = QueryConfig(
        edge_credit=min(QueryConfig().edge_credit, bus),
        bus_initial_credit=bus,
        members=frozenset(ctx.topology.hosting("query")),
        curve=ctx.topology.bus.security.mode == "curve",
    )
    declared = [table.name for table in getattr(ctx.topology, "tables", ())]
    return QueryRole(
        ctx.node_id,
        config=config,
        store=getattr(ctx, "catalog", None),
        declared=declared,
        replicating=ctx.topology.hosting("replication") if declared else (),
    )
