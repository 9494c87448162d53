"""BinX over the simulated bus: seeded interleavings, link cuts and server crashes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sparkbus.bus.sim import SimBus
from sparkbus.codecs import DecodeError, EnvelopeCodec
from sparkbus.roles.exchange import (
    BackoffPolicy,
    BinRequest,
    BinxClient,
    BinxServer,
    OutputBuffers,
    RequestType,
)

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


def _data_requests_in_flight(sim: SimBus) -> list[str]:
    """Task ids of the DATA requests on the wire now (the simulator's queue, decoded)."""
    codec = EnvelopeCodec()
    tasks = []
    for d in sim._queue:
        try:
            msg = codec.decode(d.frames).message
        except DecodeError:
            continue
        if isinstance(msg, BinRequest) and msg.requestType == RequestType.DATA:
            tasks.append(msg.taskId)
    return tasks


@pytest.mark.parametrize("seed", [3, 8, 21])
def test_exchanges_share_the_link_with_one_data_request_each(seed: int) -> None:
    """The benchmark's shape: several buffers pulled at once, one chunk per request, over one link. The
    requests of different sources travel together (pipelined); a source never has two DATA requests out."""
    sim = cluster(seed, max_request_bytes=1)
    tasks = [f"q7.{i}.0.0" for i in range(6)]
    rng = random.Random(seed)
    expected = {t: [rng.randbytes(rng.randrange(1, 64)) for _ in range(20)] for t in tasks}
    for t in tasks:
        for name, args in (("create", {}), ("add_pages", {"pages": expected[t]}), ("no_more_pages", {})):
            sim.result(sim.call("worker", "binx.server", name, {"task_id": t, "buffer_id": 0, **args}))
    got: dict[str, list[bytes]] = {t: [] for t in tasks}
    calls = {}
    for t in tasks:
        calls[
            sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": t, "buffer_id": 0})
        ] = t
    most_in_flight = 0

    def progress() -> bool:
        nonlocal most_in_flight
        in_flight = _data_requests_in_flight(sim)
        assert len(in_flight) == len(set(in_flight)), f"two DATA requests of one source: {in_flight}"
        most_in_flight = max(most_in_flight, len(in_flight))
        return any(sim.reply(c) is not None for c in calls)

    while calls:
        sim.run_until(progress)
        for cid in [c for c in calls if sim.reply(c) is not None]:
            task = calls.pop(cid)
            res = sim.result(cid)
            got[task] += res["pages"]
            if not res["complete"]:
                args = {"peer": "worker", "task_id": task, "buffer_id": 0}
                calls[sim.call("consumer", "binx.client", "fetch", args)] = task
    assert got == expected
    assert most_in_flight > 1
    sim.run_until_idle()  # every DELETE answered and no request timer left behind
    server = sim.node("worker").roles["binx.server"]
    assert isinstance(server, BinxServer) and not server.buffers.keys()
    assert sim.node("consumer").roles["binx.client"].counters["requests"] == 6 * 20 + 6


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_restarted_consumer_reusing_its_old_sequences_is_not_refused(seed: int) -> None:
    """A consumer that restarts numbers its requests from 1 again, while the server may still hold its old
    incarnation's long-poll under the same (peer, sequence), which would be BAD_REQUEST (final). The bus
    reports the old link lost before the new session's first message, so the old request is dropped."""
    sim = cluster(seed, max_wait=20.0)
    produce(sim, [], finish=False)
    sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    server = sim.node("worker").roles["binx.server"]
    assert isinstance(server, BinxServer)
    sim.run_until(lambda: bool(server._parked))
    [(peer, old_sequence)] = server._parked
    sim.crash("consumer", notify=False)  # the worker sees nothing: its parked request stays
    sim.restart("consumer", roles=[BinxClient(rng=random.Random(seed), max_wait=20.0, max_request_bytes=400)])
    cid = sim.call("consumer", "binx.client", "fetch", {"peer": "worker", "task_id": T, "buffer_id": 0})
    sim.run_until(lambda: server.counters["requests"] >= 2 or sim.reply(cid) is not None)
    assert server.counters["dropped_waiters"] == 1  # the old incarnation's request
    assert list(server._parked) == [(peer, old_sequence)]  # the new one: the same number, parked
    produce(sim, PAGES[:2], create=False)
    assert sim.result(cid)["pages"] == PAGES[:2]
    assert server.counters["bad_requests"] == 0


@pytest.mark.parametrize("seed", [41, 42, 43])
@pytest.mark.parametrize(
    "bad", [{"buffer_id": -1}, {"buffer_id": 2**64}, {"task_id": ""}, {"task_id": "x" * 2000}]
)
def test_a_fetch_naming_a_buffer_no_request_can_carry_is_refused_while_the_link_is_down(
    seed: int, bad: dict[str, Any]
) -> None:
    """Such a fetch used to wait for the link with the good one; the link's return then built its request,
    which raised and lost the good source's request and timers: neither fetch was ever answered."""
    sim = cluster(seed)
    produce(sim, PAGES)
    sim.cut("consumer", "worker")
    args = {"peer": "worker", "task_id": T, "buffer_id": 0}
    good = sim.call("consumer", "binx.client", "fetch", args)
    refused = sim.reply(sim.call("consumer", "binx.client", "fetch", {**args, **bad}))
    assert refused is not None and refused.error is not None, "refused at the call, not when the link is up"
    assert refused.error.startswith("LocalProtocolError: bad arguments") and next(iter(bad)) in refused.error
    sim.heal("consumer", "worker")
    first = sim.result(good, limit=300.0)
    assert first["pages"] + ([] if first["complete"] else fetch_all(sim)) == PAGES
    client = sim.node("consumer").roles["binx.client"]
    assert isinstance(client, BinxClient) and client.counters.get("broken_sources", 0) == 0
