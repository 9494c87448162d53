"""BinX over the simulated bus: seeded interleavings, link cuts and server crashes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.roles.exchange import BackoffPolicy, BinxClient, BinxServer, OutputBuffers

T = "q5.1.0.0"
PAGES = [bytes([i]) * (50 + 37 * i) for i in range(30)]


def cluster(seed: int, **client_kw: Any) -> SimBus:
    sim = SimBus(seed=seed)
    sim.add_node("worker", roles=[BinxServer(OutputBuffers(instance_id="w1"))])
    client_kw.setdefault("max_request_bytes", 400)
    sim.add_node("consumer", roles=[BinxClient(rng=random.Random(seed), **client_kw)])
    sim.start()
    sim.run_until(sim.all_up)
    return sim


def produce(sim: SimBus, pages: list[bytes], *, create: bool = True, finish: bool = True) -> None:
    if create:
        sim.result(sim.call("worker", "binx.server", "create", {"task_id": T, "buffer_id": 0}))
    if pages:
        sim.result(
            sim.call("worker", "binx.server", "add_pages", {"task_id": T, "buffer_id": 0, "pages": pages})
        )
    if finish:
        sim.result(sim.call("worker", "binx.server", "no_more_pages", {"task_id": T, "buffer_id": 0}))


def fetch_all(sim: SimBus, *, limit: float = 600.0) -> list[bytes]:
    got: list[bytes] = []
    while True:
        res = sim.result(
            sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0}),
            limit=limit,
        )
        got += res["pages"]
        if res["complete"]:
            return got


@pytest.mark.parametrize("seed", [1, 2, 3, 11, 42])
def test_transfer_is_whole_and_ordered(seed: int) -> None:
    sim = cluster(seed)
    produce(sim, PAGES)
    assert fetch_all(sim) == PAGES
    sim.run_until_idle()
    server = sim.node("worker").roles["binx.server"]
    assert isinstance(server, BinxServer) and server.buffers.bytes_held == 0 and not server.buffers.keys()


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_pages_produced_while_the_consumer_long_polls(seed: int) -> None:
    sim = cluster(seed)
    produce(sim, [], finish=False)
    cid = sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    sim.run_for(0.5)
    assert sim.reply(cid) is None
    produce(sim, PAGES[:3], create=False)
    first = sim.result(cid)["pages"]
    assert first + fetch_all(sim) == PAGES[:3]


@pytest.mark.parametrize("seed", [8, 9])
def test_server_crash_without_recovery_gives_up_clearly(seed: int) -> None:
    sim = cluster(seed, policy=BackoffPolicy(max_error_duration=20.0))
    produce(sim, PAGES[:2], finish=False)
    assert fetch_all_once(sim) == PAGES[:2]
    cid = sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    sim.crash("worker")
    sim.restart("worker", roles=[BinxServer(OutputBuffers(instance_id="w2"))])
    with pytest.raises(
        RuntimeError, match=r"ExchangeGaveUp: binx source task q5\.1\.0\.0 buffer 0 at peer worker"
    ) as err:
        sim.result(cid, limit=120.0)
    assert "UNKNOWN_BUFFER" in str(err.value)


@pytest.mark.parametrize("seed", [12, 13])
def test_producer_restarted_elsewhere_fails_on_the_instance_change(seed: int) -> None:
    sim = cluster(seed)
    produce(sim, PAGES[:2], finish=False)
    assert fetch_all_once(sim) == PAGES[:2]
    sim.crash("worker")
    sim.restart("worker", roles=[BinxServer(OutputBuffers(instance_id="w2"))])
    sim.run_until(sim.all_up, limit=60.0)
    produce(sim, PAGES[:5], finish=False)
    cid = sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    with pytest.raises(RuntimeError, match="task instance changed from 'w1' to 'w2'"):
        sim.result(cid, limit=60.0)


def fetch_all_once(sim: SimBus) -> list[bytes]:
    res = sim.result(
        sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    )
    pages: list[bytes] = res["pages"]
    return pages


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_link_cut_mid_transfer_resumes_from_the_token(seed: int) -> None:
    sim = cluster(seed)
    produce(sim, PAGES)
    got = fetch_all_once(sim)
    sim.cut("worker", "consumer")
    client = sim.node("consumer").roles["binx.client"]
    assert isinstance(client, BinxClient) and client.counters["retries"] >= 1  # a request was in flight
    sim.run_for(1.0)
    sim.heal("worker", "consumer")
    sim.run_until(sim.all_up, limit=120.0)
    assert got + fetch_all(sim) == PAGES
