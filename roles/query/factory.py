"""The factory the topology registry calls for ``query``: one query role per node, named by the node id."""

from __future__ import annotations

from typing import Any

from sparkbus.roles.query.role import QueryRole


def make_role(ctx: Any) -> QueryRole:
    """A query role for node ``ctx.node_id``.

    It scans the node's shared catalog (``ctx.catalog``: loaded tables plus those other roles publish,
    such as replicated tables) when the node has one, else an empty partition store (``load`` fills it).
    """
    return QueryRole(ctx.node_id, store=getattr(ctx, "catalog", None))
