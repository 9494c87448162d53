"""SIGKILL and SIGSTOP of a BinX server process while a client pulls one of its buffers.

The server ``w`` is a process on ipc sockets; the client ``c`` runs in the test process with small
requests (4 KiB), so the transfer takes many round trips and the signal lands in the middle of it: the
test fetches a first part, stops ``w``, and only then asks for more.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from sparkbus.bus import BusConfig
from sparkbus.bus.node import Endpoints, Node
from sparkbus.roles.exchange import BackoffPolicy, BinxClient

from .cluster import short_tmp
from .node_proc import Probe, open_streams
from .procs import NodeProc, Procs, children, until

pytestmark = pytest.mark.timeout(120)
T = "q7.1.0.0"
PAGES = [bytes([i % 251]) * 900 + i.to_bytes(4, "big") for i in range(120)]
GIVE_UP = 3.0  # max_error_duration of the client, seconds


class Exchange:
    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        self.ipc = short_tmp("faults-x-")
        self.client = BinxClient(
            rng=random.Random(7),
            policy=BackoffPolicy(min_delay=0.05, max_delay=0.5, max_error_duration=GIVE_UP),
            max_request_bytes=4096,
            max_wait=0.5,
            request_timeout=2.0,
        )
        self.node = Node(
            "c",
            BusConfig(cluster_tag="faults"),
            [self.client, Probe([self.client])],
            transport="ipc",
            ipc_dir=str(self.ipc),
        )
        self.server: NodeProc | None = None

    def endpoints(self) -> dict[str, Endpoints]:
        return {
            n: Endpoints(control=f"ipc://{self.ipc}/{n}-ctl", data=f"ipc://{self.ipc}/{n}-data") for n in "cw"
        }

    def start_server(self, buffer_id: int) -> NodeProc:
        self.server = NodeProc("binx", "w", f"ipc:{self.ipc}")
        self.procs.add(self.server)
        self.server.give_peers(self.endpoints())
        self.server.started()
        pages = [p.hex() for p in PAGES]
        assert self.server.ask("produce", task_id=T, buffer_id=buffer_id, pages=pages) == {"ok": True}
        return self.server

    def fetch(self, buffer_id: int) -> Future[Any]:
        return self.node.call_async(
            "binx.client", "fetch", {"peer": "w", "task_id": T, "buffer_id": buffer_id}
        )

    def fetch_rest(self, buffer_id: int, got: list[bytes]) -> list[bytes]:
        while True:
            res = self.fetch(buffer_id).result(timeout=30)
            got += res["pages"]
            if res["complete"]:
                return got

    def close(self, buffer_id: int) -> Any:
        args = {"peer": "w", "task_id": T, "buffer_id": buffer_id}
        return self.node.call("binx.client", "close", args, timeout=30)

    def up(self) -> bool:
        peer = self.node.status()["peers"].get("w")
        return bool(peer and peer["up"])


@pytest.fixture
def exchange(fds_back: None) -> Iterator[Exchange]:
    with children() as procs:
        ex = Exchange(procs)
        try:
            ex.node.bind()
            ex.start_server(0)
            ex.node.start(ex.endpoints())
            ex.node.wait_ready(30)
            yield ex
        finally:
            try:
                ex.node.stop()
            finally:
                procs.reap_all()
                shutil.rmtree(ex.ipc, ignore_errors=True)


def assert_no_leaks(ex: Exchange, *, server: bool = True) -> None:
    until(
        f"the client holds no source {ex.node.call('probe', 'open_state')}",
        lambda: not any(ex.node.call("probe", "open_state").values()),
    )
    until("no stream is open", lambda: open_streams(ex.node.status()) == 0)
    if server:
        assert ex.server is not None
        srv = ex.server
        until(
            "the server holds no buffer and no parked request",
            lambda: not any(srv.ask("state")["open"].values()),
        )


def test_sigstop_of_the_server_mid_transfer_resumes_and_delivers_every_page(exchange: Exchange) -> None:
    """What the user sees: the transfer pauses while w is stopped (the client loses the peer after 1.5 s
    and backs off), then completes after SIGCONT with every page exactly once and in order; the buffer is
    deleted on the server and nothing is left open on either side."""
    got: list[bytes] = exchange.fetch(0).result(timeout=30)["pages"]
    assert 0 < len(got) < len(PAGES)
    assert exchange.server is not None
    exchange.server.signal(signal.SIGSTOP)
    pending = exchange.fetch(0)
    until("the client lost w", lambda: not exchange.up())
    exchange.server.signal(signal.SIGCONT)
    resumed = time.monotonic()
    res = pending.result(timeout=30)
    got += res["pages"]
    if not res["complete"]:
        exchange.fetch_rest(0, got)
    recovered = time.monotonic() - resumed  # until the last page
    assert got == PAGES
    exchange.close(0)
    assert_no_leaks(exchange)
    print(f"FAULT binx-sigstop recovered={recovered:.3f}")


def test_sigkill_of_the_server_mid_transfer_fails_the_fetch_and_a_new_server_serves(
    exchange: Exchange,
) -> None:
    """What the user sees: the pending fetch fails with ``ExchangeGaveUp`` naming w, the task and the buffer
    once w has not answered for the client's max error duration (3 s here); the pages received before are
    a whole, ordered prefix of the buffer. A restarted w serves a new buffer completely. Nothing is left
    open on the client or on the new server."""
    got: list[bytes] = exchange.fetch(0).result(timeout=30)["pages"]
    assert exchange.server is not None
    exchange.server.signal(signal.SIGSTOP)
    pending = exchange.fetch(0)
    until("the client has a request out", lambda: exchange.node.call("probe", "open_state")["requests"] == 1)
    killed = time.monotonic()
    exchange.server.kill()
    with pytest.raises(
        RuntimeError, match=r"ExchangeGaveUp: binx source task q7\.1\.0\.0 buffer 0 at peer w"
    ):
        # pages that arrived before the stop are handed out first; then the fetch fails
        res = pending.result(timeout=30)
        while not res["complete"]:
            got += res["pages"]
            res = exchange.fetch(0).result(timeout=30)
    detected = time.monotonic() - killed
    assert got == PAGES[: len(got)]
    assert_no_leaks(exchange, server=False)  # the failed source is forgotten once its error was told
    restarted = time.monotonic()
    exchange.start_server(1)
    until("w is up again", exchange.up, timeout=30)
    assert exchange.fetch_rest(1, []) == PAGES
    recovered = time.monotonic() - restarted
    exchange.close(1)
    assert_no_leaks(exchange)
    print(f"FAULT binx-sigkill detected={detected:.3f} recovered={recovered:.3f}")
