"""Factories the topology registry calls (``binx.server``, ``binx.client``, ``http.client``) to put these roles
on a node."""

from __future__ import annotations

import random
from typing import Any

from sparkbus.roles.exchange.buffers import OutputBuffers, new_instance_id
from sparkbus.roles.exchange.client import BinxClient
from sparkbus.roles.exchange.http_client import HttpClient
from sparkbus.roles.exchange.server import BinxServer


def make_server(ctx: Any) -> BinxServer:
    """A BinX server with empty output buffers (producers on the node fill them), stamped with a fresh
    incarnation: a node built again (a restarted process) serves its buffers under another instance id, so
    its consumers see the restart."""
    return BinxServer(OutputBuffers(instance_id=new_instance_id()))


def make_client(ctx: Any) -> BinxClient:
    """A BinX client whose back-off jitter is seeded by the node id, so a node's retries are reproducible."""
    return BinxClient(rng=random.Random(f"binx-client/{getattr(ctx, 'node_id', '')}"))


def make_http_client(ctx: Any) -> HttpClient:
    """An HTTP exchange client (the node driver makes its requests), jitter seeded by the node id."""
    return HttpClient(rng=random.Random(f"http-client/{getattr(ctx, 'node_id', '')}"))
