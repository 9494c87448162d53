"""Output buffers: tokens, acknowledgement, memory bounds, producer events, long-poll waiters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.bus.contract import LocalProtocolError
from sparkbus.roles.exchange import (
    BufferEvent,
    BufferFullError,
    BufferState,
    ErrorCode,
    OutputBuffer,
    OutputBuffers,
    Waiter,
)
from sparkbus.roles.exchange.buffers import _TRANSITIONS

T, B = "q1.1.0.0", 0


def filled(*pages: bytes, **kw: int) -> OutputBuffers:
    bufs = OutputBuffers(instance_id="inst", **kw)
    bufs.create(T, B)
    if pages:
        bufs.add_pages(T, B, list(pages))
    return bufs


def test_read_returns_pages_from_the_token_within_max_bytes() -> None:
    bufs = filled(b"aa", b"bbb", b"c")
    r = bufs.read(T, B, 0, 5)
    assert r.pages == (b"aa", b"bbb") and (r.token, r.next_token) == (0, 2)
    assert r.remaining_bytes == (1,) and not r.complete and r.instance_id == "inst"


def test_first_page_is_sent_even_when_larger_than_max_bytes() -> None:
    r = filled(b"x" * 100, b"y").read(T, B, 0, 10)
    assert r.pages == (b"x" * 100,)


def test_repeated_token_resends_the_same_pages() -> None:
    bufs = filled(b"a", b"b", b"c")
    assert bufs.read(T, B, 1, 1).pages == bufs.read(T, B, 1, 1).pages == (b"b",)


def test_reading_token_n_acknowledges_everything_before_n() -> None:
    bufs = filled(b"a", b"bb", b"ccc")
    assert bufs.bytes_held == 6
    bufs.read(T, B, 2, 10)
    assert bufs.bytes_held == 3
    buf = bufs.get(T, B)
    assert buf is not None and buf.ack_token == 2 and buf.next_token == 3


def test_token_below_the_ack_is_gone() -> None:
    bufs = filled(b"a", b"b")
    bufs.read(T, B, 2, 10)
    r = bufs.read(T, B, 1, 10)
    assert r.error_code is ErrorCode.TOKEN_GONE and not r.pages
    assert T in r.error_message and "below the acknowledged token 2" in r.error_message


def test_token_past_the_end_is_refused() -> None:
    r = filled(b"a").read(T, B, 5, 10)
    assert r.error_code is ErrorCode.TOKEN_AHEAD
    assert filled(b"a").acknowledge(T, B, 5) is ErrorCode.TOKEN_AHEAD


def test_explicit_ack_frees_and_late_acks_are_harmless() -> None:
    bufs = filled(b"a", b"bb")
    assert bufs.acknowledge(T, B, 1) is ErrorCode.NONE
    assert bufs.bytes_held == 2
    assert bufs.acknowledge(T, B, 0) is ErrorCode.NONE
    assert bufs.acknowledge("nope", 1, 0) is ErrorCode.NONE


def test_completion_is_reported_with_the_last_page() -> None:
    bufs = filled(b"a", b"b")
    bufs.no_more_pages(T, B)
    assert not bufs.read(T, B, 0, 1).complete
    last = bufs.read(T, B, 1, 1)
    assert last.pages == (b"b",) and last.complete
    assert bufs.read(T, B, 2, 1).complete


def test_size_probe_lists_sizes_and_acknowledges() -> None:
    bufs = filled(b"a", b"bb", b"ccc")
    r = bufs.read(T, B, 1, 0, size_only=True)
    assert r.pages == () and r.remaining_bytes == (2, 3) and r.next_token == 1
    assert bufs.bytes_held == 5


def test_unknown_buffer() -> None:
    r = OutputBuffers().read("ghost", 9, 0, 10)
    assert r.error_code is ErrorCode.UNKNOWN_BUFFER and "ghost" in r.error_message


def test_memory_bound_per_buffer_and_per_node() -> None:
    bufs = filled(b"x" * 8, max_buffer_bytes=10, max_total_bytes=15)
    assert bufs.room(T, B) == 2
    with pytest.raises(BufferFullError, match="bound of 10"):
        bufs.add_pages(T, B, [b"yyy"])
    assert bufs.bytes_held == 8
    bufs.create(T, 1)
    with pytest.raises(BufferFullError, match="node bound"):
        bufs.add_pages(T, 1, [b"z" * 8])
    bufs.read(T, B, 1, 1)  # frees the first buffer
    bufs.add_pages(T, 1, [b"z" * 8])
    assert bufs.bytes_held == 8


def test_a_page_larger_than_the_bound_enters_an_empty_buffer() -> None:
    bufs = filled(max_buffer_bytes=4)
    bufs.add_pages(T, B, [b"x" * 10])
    assert bufs.bytes_held == 10


def test_a_batch_beyond_a_bound_is_refused_even_where_nothing_is_held_unless_it_is_a_whole_output() -> None:
    # The per-buffer bound: a streaming producer's batch of small pages cannot pass it in one call.
    bufs = filled(max_buffer_bytes=1000)
    with pytest.raises(BufferFullError, match="bound of 1000"):
        bufs.add_pages(T, B, [b"x" * 100] * 100)
    assert bufs.bytes_held == 0 and bufs.room(T, B) == 1000
    bufs.add_pages(T, B, [b"x" * 100] * 10)  # what room() allows enters
    # The node's bound, with every buffer empty.
    bufs = filled(max_buffer_bytes=10_000, max_total_bytes=2000)
    with pytest.raises(BufferFullError, match="node bound of 2000"):
        bufs.add_pages(T, B, [b"y" * 100] * 30)
    assert bufs.bytes_held == 0
    # A producer's whole output in one call (what publish adds) cannot wait for room: it enters an empty
    # buffer on a node holding nothing, and only there.
    assert bufs.add_pages(T, B, [b"y" * 100] * 300, whole=True) == 30_000
    bufs.create(T, 1)
    with pytest.raises(BufferFullError, match="node bound"):
        bufs.add_pages(T, 1, [b"z"] * 2, whole=True)


def test_producer_abort_frees_pages_and_answers_aborted() -> None:
    bufs = filled(b"a", b"b")
    bufs.abort(T, B, "division by zero")
    assert bufs.bytes_held == 0
    r = bufs.read(T, B, 0, 10)
    assert r.error_code is ErrorCode.ABORTED and "division by zero" in r.error_message
    with pytest.raises(LocalProtocolError, match="add_pages is not allowed in state aborted"):
        bufs.add_pages(T, B, [b"c"])


def test_delete_frees_and_leaves_a_tombstone() -> None:
    bufs = filled(b"a", b"b")
    bufs.delete(T, B)
    bufs.delete(T, B)
    assert bufs.bytes_held == 0 and (T, B) not in bufs
    r = bufs.read(T, B, 0, 10)
    assert r.complete and not r.pages and r.error_code is ErrorCode.NONE
    assert bufs.add_pages(T, B, [b"late"]) == 0  # the producer may still run: dropped
    bufs.no_more_pages(T, B)
    assert bufs.bytes_held == 0


def test_a_delete_before_the_buffer_is_created_drops_the_producers_pages() -> None:
    """Spec 002's race of DELETE with setup: a consumer that closes before the producer started must not
    leave the producer's pages held for ever (nobody would read or delete them again)."""
    bufs = OutputBuffers(instance_id="inst")
    bufs.delete(T, B)
    buf = bufs.create(T, B)
    assert buf.state is BufferState.DESTROYED
    assert bufs.add_pages(T, B, [b"y" * 1000]) == 0
    bufs.no_more_pages(T, B)
    assert bufs.bytes_held == 0 and (T, B) not in bufs
    assert bufs.read(T, B, 0, 10).complete


def test_at_least_one_tombstone_is_kept() -> None:
    with pytest.raises(ValueError, match="max_tombstones >= 1"):
        OutputBuffers(max_tombstones=0)


def test_tombstones_are_bounded() -> None:
    bufs = OutputBuffers(max_tombstones=2)
    for i in range(4):
        bufs.create(T, i)
        bufs.delete(T, i)
    assert bufs.get(T, 0) is None and bufs.get(T, 3) is not None


def test_no_pages_after_no_more_pages_and_no_double_create() -> None:
    bufs = filled(b"a")
    bufs.no_more_pages(T, B)
    with pytest.raises(LocalProtocolError, match="add_pages is not allowed in state no_more_pages"):
        bufs.add_pages(T, B, [b"b"])
    with pytest.raises(LocalProtocolError, match="already exists"):
        bufs.create(T, B)
    with pytest.raises(LocalProtocolError, match="does not exist"):
        bufs.add_pages("other", 0, [b"x"])


@given(state=st.sampled_from(BufferState), event=st.sampled_from(BufferEvent))
def test_every_state_event_pair_is_in_the_table_or_names_both(state: BufferState, event: BufferEvent) -> None:
    buf = OutputBuffer(T, B, instance_id="i", max_bytes=100)
    buf.state = state
    calls = {
        BufferEvent.ADD_PAGES: lambda: buf.add_pages([b"p"]),
        BufferEvent.NO_MORE_PAGES: buf.no_more_pages,
        BufferEvent.ABORT: lambda: buf.abort("r"),
        BufferEvent.DELETE: buf.destroy,
    }
    if (state, event) in _TRANSITIONS:
        calls[event]()
        assert buf.state is _TRANSITIONS[(state, event)]
    else:
        with pytest.raises(LocalProtocolError) as err:
            calls[event]()
        assert state.value in str(err.value) and event.value in str(err.value) and T in str(err.value)


def test_waiters_are_answered_by_pages_and_by_deadline() -> None:
    bufs = filled()
    buf = bufs.get(T, B)
    assert buf is not None
    buf.wait(Waiter(key="w1", token=0, max_bytes=10, size_only=False, deadline=5.0))
    buf.wait(Waiter(key="w2", token=0, max_bytes=10, size_only=True, deadline=2.0))
    with pytest.raises(LocalProtocolError, match="already waits"):
        buf.wait(Waiter(key="w1", token=0, max_bytes=10, size_only=False, deadline=5.0))
    assert bufs.take_ready(T, B, now=1.0) == []
    [(w, r, timed_out)] = bufs.take_ready(T, B, now=2.0)
    assert w.key == "w2" and timed_out and not r.remaining_bytes
    bufs.add_pages(T, B, [b"abc"])
    [(w, r, timed_out)] = bufs.take_ready(T, B, now=3.0)
    assert w.key == "w1" and not timed_out and r.pages == (b"abc",)
    assert buf.waiters == ()


def test_waiters_are_answered_by_completion_abort_and_delete() -> None:
    for finish in ("no_more_pages", "abort", "delete"):
        bufs = filled()
        buf = bufs.get(T, B)
        assert buf is not None
        buf.wait(Waiter(key="w", token=0, max_bytes=10, size_only=False, deadline=99.0))
        if finish == "no_more_pages":
            bufs.no_more_pages(T, B)
        elif finish == "abort":
            bufs.abort(T, B, "boom")
        else:
            bufs.delete(T, B)
        [(_, r, timed_out)] = bufs.take_ready(T, B, now=0.0)
        assert not timed_out
        assert r.complete or r.error_code is ErrorCode.ABORTED
    assert bufs.take_ready("ghost", 1, now=0.0) == []


def test_cancel_wait() -> None:
    buf = OutputBuffer(T, B, instance_id="i", max_bytes=10)
    buf.wait(Waiter(key="w", token=0, max_bytes=10, size_only=False, deadline=1.0))
    assert buf.cancel_wait("w") is not None and buf.cancel_wait("w") is None


@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    reads=st.lists(st.tuples(st.integers(0, 35), st.integers(1, 100)), max_size=30),
)
def test_accounting_matches_unacknowledged_pages(sizes: list[int], reads: list[tuple[int, int]]) -> None:
    bufs = OutputBuffers(max_buffer_bytes=10_000, max_total_bytes=10_000)
    bufs.create(T, B)
    pages = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    bufs.add_pages(T, B, pages)
    acked = 0
    for token, max_bytes in reads:
        r = bufs.read(T, B, token, max_bytes)
        if token < acked:
            assert r.error_code is ErrorCode.TOKEN_GONE
        elif token > len(pages):
            assert r.error_code is ErrorCode.TOKEN_AHEAD
        else:
            acked = token
            assert r.pages == tuple(pages[token : r.next_token])
            assert r.next_token == len(pages) or r.pages or token == len(pages)
        assert bufs.bytes_held == sum(sizes[acked:])


def _end_many(bufs: OutputBuffers, n: int) -> None:
    """Buffers 0..n-1, each ended one of the three ways a buffer ends: aborted by its producer, deleted by
    its consumer, or finished and read to the end by a consumer that never deletes it."""
    for i in range(n):
        bufs.create(T, i)
        bufs.add_pages(T, i, [b"page"])
        if i % 3 == 0:
            bufs.abort(T, i, f"task {i} failed")
        elif i % 3 == 1:
            bufs.delete(T, i)
        else:
            bufs.no_more_pages(T, i)
            assert bufs.read(T, i, 1, 10).complete  # reading past the last page acknowledges it


def test_ended_buffers_leave_the_map_and_only_the_latest_are_remembered() -> None:
    """A long-running server must not keep an entry for every buffer that ever ended: aborted, deleted and
    fully read ones are remembered up to ``max_tombstones`` together, the oldest forgotten first."""
    bufs = OutputBuffers(instance_id="inst", max_tombstones=3)
    _end_many(bufs, 300)
    assert bufs.keys() == [] and bufs.bytes_held == 0
    assert [i for i in range(300) if bufs.get(T, i) is not None] == [297, 298, 299]
    # The remembered ones still answer as they ended ...
    aborted = bufs.read(T, 297, 1, 10)
    assert aborted.error_code is ErrorCode.ABORTED and "task 297 failed" in aborted.error_message
    finished = bufs.read(T, 299, 1, 10)
    assert finished.complete and finished.error_code is ErrorCode.NONE and finished.pages == ()
    assert bufs.read(T, 298, 0, 10).complete  # deleted
    # ... and a forgotten one is an unknown buffer: a clear answer, retried by the client until give-up.
    late = bufs.read(T, 0, 1, 10)
    assert late.error_code is ErrorCode.UNKNOWN_BUFFER and "no such buffer" in late.error_message


def test_an_ended_buffer_keeps_its_token_create_and_delete_rules() -> None:
    bufs = OutputBuffers(instance_id="inst")
    bufs.create(T, 0)
    bufs.add_pages(T, 0, [b"a", b"b"])
    bufs.no_more_pages(T, 0)
    assert bufs.read(T, 0, 1, 10).complete and (T, 0) in bufs  # the last page is not acknowledged yet
    assert bufs.read(T, 0, 2, 10).complete and (T, 0) not in bufs  # now it is: the buffer ended
    assert bufs.read(T, 0, 1, 10).error_code is ErrorCode.TOKEN_GONE
    assert bufs.read(T, 0, 3, 10).error_code is ErrorCode.TOKEN_AHEAD
    assert bufs.acknowledge(T, 0, 2) is ErrorCode.NONE
    bufs.no_more_pages(T, 0)  # the producer may say it twice
    with pytest.raises(LocalProtocolError, match="add_pages is not allowed in state no_more_pages"):
        bufs.add_pages(T, 0, [b"c"])
    with pytest.raises(LocalProtocolError, match=f"task {T} buffer 0 already exists"):
        bufs.create(T, 0)
    bufs.create(T, 1)
    bufs.abort(T, 1, "boom")
    with pytest.raises(LocalProtocolError, match=f"task {T} buffer 1 already exists"):
        bufs.create(T, 1)
    bufs.abort(T, 1, "again")  # idempotent, keeps the first reason
    assert "boom" in bufs.read(T, 1, 0, 10).error_message
    # A DELETE of an ended buffer destroys it, and the deleted buffer is what a later create gets.
    for buffer_id in (0, 1):
        bufs.delete(T, buffer_id)
        deleted = bufs.create(T, buffer_id)
        assert deleted.state is BufferState.DESTROYED and bufs.add_pages(T, buffer_id, [b"x"]) == 0
    assert bufs.keys() == [] and bufs.bytes_held == 0


def test_an_empty_buffer_finished_at_once_ends_at_once() -> None:
    bufs = OutputBuffers(instance_id="inst", max_tombstones=1)
    bufs.create(T, 0)
    bufs.no_more_pages(T, 0)
    assert bufs.keys() == [] and bufs.read(T, 0, 0, 10).complete
