"""The node loop sends a credit grant as soon as handling a batch produced one, not at the end of its turn."""

from __future__ import annotations

from typing import Any

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Node


class Core:
    """Stands in for the node's core: each batch's first frame says how many grants handling it sends."""

    def __init__(self) -> None:
        self.grants_sent = 0

    def on_data(self, frames: list[Any], now: float) -> None:
        self.grants_sent += frames[0]


def test_a_batch_that_made_a_grant_is_followed_by_a_flush_and_others_are_not() -> None:
    node = Node("n", BusConfig(), [])
    flushes: list[int] = []
    core = Core()
    node.core = core  # type: ignore[assignment]
    node._flush = lambda: flushes.append(core.grants_sent)  # type: ignore[method-assign]
    for grants in (0, 0, 1, 0, 2, 0):
        node._on_data([grants])
    assert flushes == [1, 3]
