"""The factory the topology registry calls for ``query``: one query role per node, named by the node id."""

from __future__ import annotations

from typing import Any

from sparkbus.roles.query.role import QueryRole


def make_role(ctx: Any) -> QueryRole:
    """A query role for node ``ctx.node_id`` with an empty partition store (``load`` fills it)."""
    return QueryRole(ctx.node_id)
