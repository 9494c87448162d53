"""The fault tier: real node processes, signals, network namespaces; run with ``tox -e faults``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from sparkbus.bus.sockets import context

from .procs import fd_count, until


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "load: many concurrent operations against one cluster (faults tier)")


@pytest.fixture
def fds_back() -> Iterator[None]:
    """The test process's file descriptors return to their count before the test (polled: libzmq closes
    sockets on its reaper thread)."""
    # The process's ZeroMQ context lives for the whole session; its I/O and reaper threads (an epoll and
    # an eventfd each) start with its first socket, so one is made before counting.
    context().socket(zmq.PAIR).close(linger=0)
    before = fd_count()
    yield
    until(f"file descriptors back to {before} (now {fd_count()})", lambda: fd_count() <= before, timeout=10)
