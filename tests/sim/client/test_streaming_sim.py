"""Streamed results in the simulator: chunks come in order and once, at most ``window`` ahead of what the
caller consumed, through cuts and restores; requests over the message limit are refused up front."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.bus import BusConfig
from sparkbus.bus.messages import ErrorCode
from sparkbus.codecs import Limits
from sparkbus.roles.client import ClientConfig, ClientConnectionError, Gateway, Op, chunk_batches
from sparkbus.roles.client.gateway import MAX_HELD

from .harness import ClientSim, SimClient, error_of
from .roles import BigQuery

ROWS = 10_000  # 80 000 bytes of int64: about 40 chunks of 2 KiB


def cluster(
    seed: int, *, window: int = 4, chunk_bytes: int = 2048, restore_timeout: float = 10.0, **client: object
) -> tuple[ClientSim, SimClient, BigQuery, Gateway]:
    sim = ClientSim(seed, config=BusConfig(cluster_tag="sim"))
    query = BigQuery(rows=ROWS)
    gateway = Gateway("n1", ["query"], restore_timeout=restore_timeout, chunk_bytes=chunk_bytes)
    sim.add_node("n1", [query, gateway])
    sim.start()
    cfg = ClientConfig(cluster_tag="sim", window=window, **client)  # type: ignore[arg-type]
    c = sim.add_client("c", ["n1:1"], cfg)
    sim.run_until(lambda: c.core.connected, limit=5)
    return sim, c, query, gateway


def rows_of(c: SimClient, handle: int) -> list[int]:
    out: list[int] = []
    for chunk in c.chunks[handle]:
        assert chunk.arrow
        for batch in chunk_batches(chunk.payload):
            out += batch.column("i").to_pylist()
    return out


def read_all(sim: ClientSim, c: SimClient, handle: int, *, start: int = 0, each: float = 0.05) -> int:
    """Consume the stream one chunk at a time from chunk ``start``, ``each`` seconds apart (a slow
    reader); returns the most chunks ever held unconsumed."""
    consumed, most = start, 0
    while handle not in c.done or consumed < len(c.chunks[handle]):
        sim.run_until(lambda n=consumed: handle in c.done or len(c.chunks[handle]) > n, limit=30)
        most = max(most, len(c.chunks[handle]) - consumed)
        if consumed < len(c.chunks[handle]):
            sim.run_for(each)
            consumed += 1
            c.consume(sim, handle, consumed)
    return most


def test_a_stream_arrives_in_order_within_the_window() -> None:
    sim, c, query, gateway = cluster(1, window=4)
    handle = c.stream(sim, Op.SQL, {"sql": "select i"})
    sim.run_until(lambda: bool(c.chunks[handle]), limit=10)
    sim.run_for(2.0)  # a reader that does not read: the gateway stops at the window
    assert len(c.chunks[handle]) == 4 and handle not in c.done
    most = read_all(sim, c, handle)
    assert most <= 4
    assert c.done[handle].error is None
    assert rows_of(c, handle) == list(range(ROWS))
    assert len(c.chunks[handle]) > 30
    sim.run_for(1.0)
    assert all(not ctx.held for ctx in gateway.contexts.values())  # released once read whole
    assert query.calls == 1


def test_a_whole_result_of_many_chunks_is_one_table() -> None:
    sim, c, _, _ = cluster(2, window=2)
    result = sim.outcome(c, c.submit(sim, Op.SQL, {"sql": "select i"}))
    assert result.table().column("i").to_pylist() == list(range(ROWS))


def test_a_stream_cut_twice_is_delivered_once_in_order_without_running_again() -> None:
    sim, c, query, gateway = cluster(3, window=4)
    handle = c.stream(sim, Op.SQL, {"sql": "select i"})
    sim.run_until(lambda: len(c.chunks[handle]) >= 3, limit=10)
    c.consume(sim, handle, 2)
    sim.block("c", "n1")
    sim.run_for(2.5)
    sim.unblock("c", "n1")
    sim.run_until(lambda: len(c.chunks[handle]) >= 6, limit=20)  # the harness asserts order and no repeat
    c.consume(sim, handle, 5)
    sim.block("c", "n1")
    sim.run_for(0.3)
    sim.unblock("c", "n1")
    read_all(sim, c, handle, start=5)
    assert rows_of(c, handle) == list(range(ROWS))
    assert query.calls == 1 and gateway.counters["restored"] == 2


def test_a_stream_already_read_from_is_not_retried_when_its_connection_is_gone() -> None:
    sim, c, query, _ = cluster(4, restore_timeout=2.0)
    handle = c.stream(sim, Op.SQL, {"sql": "select i"})
    sim.run_until(lambda: bool(c.chunks[handle]), limit=10)
    sim.block("c", "n1")
    sim.run_for(6.0)
    sim.unblock("c", "n1")
    err = error_of(sim.wait(c, handle, limit=10))
    assert isinstance(err, ClientConnectionError) and "connection unknown" in str(err)
    assert query.calls == 1  # a read, but rows were handed out: starting over would repeat them


def test_an_abandoned_stream_is_released_on_the_gateway() -> None:
    sim, c, _, gateway = cluster(5, window=2)
    handle = c.stream(sim, Op.SQL, {"sql": "select i"})
    sim.run_until(lambda: len(c.chunks[handle]) == 2, limit=10)
    rid = c.core.ops[handle].request_id
    c.cancel(sim, handle)
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"  # the release rides on this request
    assert all(rid not in ctx.held for ctx in gateway.contexts.values())


@pytest.mark.parametrize("seed", [1, 2])
def test_a_burst_of_calls_past_the_held_limit_never_drops_a_stream_being_read(seed: int) -> None:
    sim, c, _, gateway = cluster(seed, window=2, chunk_bytes=8 * 1024)
    big = c.stream(sim, Op.SQL, {"sql": "select i"})
    sim.run_until(lambda: len(c.chunks[big]) == 2, limit=5)  # the window is full; the caller reads slowly
    small = [c.submit(sim, Op.STATUS) for _ in range(MAX_HELD)]  # meanwhile: a burst of futures
    sim.run_until(lambda: all(h in c.done for h in small), limit=30)
    assert all(c.done[h].error is None for h in small)  # room was made by results already sent whole
    read_all(sim, c, big)
    assert c.done[big].error is None and rows_of(c, big) == list(range(ROWS))
    assert all(len(ctx.held) + len(ctx.running) <= MAX_HELD for ctx in gateway.contexts.values())


def test_a_request_over_the_message_limit_is_refused_before_it_is_sent() -> None:
    limits = Limits(max_frame_bytes=64 * 1024, max_message_bytes=128 * 1024, max_decompressed_bytes=64 * 1024)
    sim, c, _, gateway = cluster(6, limits=limits)
    seq = c.core.links["n1:1"].seq
    handle = c.submit(sim, Op.WRITE, {"partition": "t/0", "rows": b"x" * 100_000})
    assert c.core.links["n1:1"].seq == seq  # nothing was sent
    err = error_of(sim.wait(c, handle))
    assert err.code == ErrorCode.LIMIT_EXCEEDED
    assert "65536-byte limit of one message" in str(err) and "not chunked" in str(err)
    assert sim.outcome(c, c.submit(sim, Op.STATUS))["node"] == "n1"  # the session serves on
    assert all(not ctx.running for ctx in gateway.contexts.values())


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    window=st.integers(1, 6),
    cut_at=st.integers(0, 30),
    away=st.floats(0.05, 4.0),
)
def test_property_cut_anywhere_every_chunk_once_in_order(
    seed: int, window: int, cut_at: int, away: float
) -> None:
    sim, c, query, _ = cluster(seed, window=window)
    handle = c.stream(sim, Op.SQL, {"sql": "select i"})
    consumed = 0
    while consumed < cut_at and handle not in c.done:
        sim.run_until(lambda n=consumed: handle in c.done or len(c.chunks[handle]) > n, limit=30)
        assert len(c.chunks[handle]) - consumed <= window
        consumed = min(consumed + 1, len(c.chunks[handle]))
        c.consume(sim, handle, consumed)
    sim.block("c", "n1")
    sim.run_for(away)
    sim.unblock("c", "n1")
    assert read_all(sim, c, handle, start=consumed, each=0.01) <= window
    assert rows_of(c, handle) == list(range(ROWS))
    assert query.calls == 1
