"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkbus.bus.node import Node


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Nodes a test made (it appends them); each is stopped at the end, whatever the test did."""
    made: list[Node] = []
    yield made
    for node in made:
        node.stop()
