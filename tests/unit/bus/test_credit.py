"""The credit machines through their public API: every operation against every state (Hypothesis)."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbus.bus import CreditReceiver, CreditSender, LocalProtocolError, RemoteProtocolError

MAX = 1000


def test_sender_spends_and_refuses_beyond_credit() -> None:
    s = CreditSender("q/1", 100)
    assert s.spend(60, last=False) == (0, 40)
    with pytest.raises(LocalProtocolError, match="exceeds credit 40"):
        s.spend(41, last=False)
    with pytest.raises(LocalProtocolError, match="empty batch"):
        s.spend(0, last=False)
    assert s.spend(0, last=True) == (1, 40)
    with pytest.raises(LocalProtocolError, match="after the last"):
        s.spend(0, last=True)


def test_flow_control_sets_credit_and_stale_ordinals_are_ignored() -> None:
    s = CreditSender("q/1", 100)
    s.spend(100, last=False)
    assert s.grant(ordinal=1, credit=80, acked=0)
    assert s.credit == 80
    assert not s.grant(ordinal=0, credit=95, acked=0)  # reordered, older grant
    assert not s.grant(ordinal=1, credit=95, acked=0)  # repeated
    assert s.credit == 80


def test_grant_subtracts_bytes_in_flight_after_the_acked_batch() -> None:
    s = CreditSender("q/1", 100)
    s.spend(30, last=False)  # ordinal 0
    s.spend(30, last=False)  # ordinal 1, not yet seen by the receiver
    assert s.grant(ordinal=0, credit=90, acked=0)
    assert s.credit == 60


def test_sender_refuses_bad_flow_control() -> None:
    s = CreditSender("q/1", 100)
    with pytest.raises(RemoteProtocolError, match="negative"):
        s.grant(ordinal=0, credit=-1, acked=-1)
    with pytest.raises(RemoteProtocolError, match="never sent"):
        s.grant(ordinal=0, credit=10, acked=3)


def test_receiver_refuses_protocol_violations() -> None:
    r = CreditReceiver("q/1", 100)
    with pytest.raises(RemoteProtocolError, match="ordinal 1, expected 0"):
        r.received(1, 10, 90, last=False)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        r.received(0, 101, 0, last=False)
    with pytest.raises(RemoteProtocolError, match="out of range"):
        r.received(0, 10, 1000, last=False)
    # Only the last batch may be empty (the sender's rule, checked on arrival too).
    with pytest.raises(RemoteProtocolError, match="empty batch 0 that is not the last"):
        r.received(0, 0, 100, last=False)
    r.received(0, 10, 90, last=True)
    with pytest.raises(RemoteProtocolError, match="after the last"):
        r.received(1, 10, 80, last=False)
    with pytest.raises(LocalProtocolError, match="consumed"):
        r.consumed(11)


def test_an_empty_last_batch_ends_the_stream() -> None:
    r = CreditReceiver("q/1", 100)
    r.received(0, 10, 90, last=False)
    r.received(1, 0, 90, last=True)
    assert r.done and r.acked == 1


def test_grant_policy_is_mustangs_40_percent_rule() -> None:
    r = CreditReceiver("q/1", 1000, lwm=0.4)
    r.received(0, 500, 500, last=False)
    r.consumed(500)
    assert r.take_grant() is None  # sender still has 50%
    r.received(1, 200, 300, last=False)  # sender at 30%
    assert r.take_grant() is None  # not consumed yet: we have 80% free, but no consume event
    r.consumed(200)
    assert r.take_grant() == (0, 1000, 1)
    assert r.take_grant() is None


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("send"), st.integers(0, MAX // 2)),
            st.tuples(st.just("deliver"), st.integers(0, 3)),
            st.tuples(st.just("consume"), st.integers(0, 3)),
            st.tuples(st.just("flow"), st.integers(0, 3)),
        ),
        max_size=80,
    )
)
def test_random_schedules_never_exceed_the_credit(ops: list[tuple[str, int]]) -> None:
    """Whatever the interleaving of sends, deliveries, consumption and (reordered) grants, the receiver
    never holds more than the stream's credit, and a sender that respects its credit is never refused."""
    sender, receiver = CreditSender("s", MAX), CreditReceiver("s", MAX)
    wire: list[tuple[int, int, int]] = []  # batches in flight (ordinal, size, remaining)
    held: list[int] = []  # sizes received, not yet consumed
    grants: list[tuple[int, int, int]] = []  # flow control in flight, may be reordered
    for op, n in ops:
        if op == "send" and 0 < n <= sender.credit:
            ordinal, remaining = sender.spend(n, last=False)
            wire.append((ordinal, n, remaining))
        elif op == "deliver" and wire:
            ordinal, size, remaining = wire.pop(0)  # the data pipe is FIFO
            receiver.received(ordinal, size, remaining, last=False)
            held.append(size)
        elif op == "consume" and held:
            receiver.consumed(held.pop(0))
            grant = receiver.take_grant()
            if grant is not None:
                grants.append(grant)
        elif op == "flow" and grants:
            sender.grant(*grants.pop(n % len(grants)))
        assert sum(held) + sum(s for _, s, _ in wire) <= MAX
        assert receiver.local >= 0
        # A grant leaves the sender above the mark in the receiver's reckoning: only a batch received
        # since can bring it low again, so there is never more than one grant per batch received.
        assert receiver.next_grant <= receiver.expected_ordinal


def test_batches_sent_before_a_grant_was_applied_do_not_call_for_another() -> None:
    """They carry the sender's older, lower credit; the receiver counts the grant in flight as applied."""
    sender, receiver = CreditSender("s", MAX), CreditReceiver("s", MAX, lwm=0.4)
    for _ in range(3):
        _, remaining = sender.spend(300, last=False)
    assert remaining == 100
    receiver.received(0, 300, 700, last=False)
    receiver.consumed(300)
    receiver.received(1, 300, 400, last=False)
    receiver.consumed(300)
    grant = receiver.take_grant()
    assert grant == (0, MAX, 1)  # the sender reported 40 %: at the mark
    receiver.received(2, 300, 100, last=False)  # sent before the grant arrived: 10 % left, it says
    receiver.consumed(300)
    assert receiver.take_grant() is None
    assert receiver.remote == 700  # the grant less the 300 bytes received after batch 1
    assert sender.grant(*grant)
    assert sender.credit == 700  # exact: nothing is in flight any more


def test_a_sender_out_of_credit_is_granted_again() -> None:
    """With nothing in flight the reckoning is exact: a sender that spent its grant is granted again."""
    sender, receiver = CreditSender("s", MAX), CreditReceiver("s", MAX, lwm=0.4)
    for _ in range(5):  # five windows, each spent to the last byte before the grant arrives
        while sender.credit:
            size = min(300, sender.credit)
            ordinal, remaining = sender.spend(size, last=False)
            receiver.received(ordinal, size, remaining, last=False)
        assert receiver.remote == 0 and receiver.local == 0
        receiver.consumed(MAX)
        grant = receiver.take_grant()
        assert grant is not None and grant[1] == MAX
        assert receiver.remote == MAX
        assert sender.grant(*grant) and sender.credit == MAX


@settings(max_examples=300, deadline=None)
@given(
    window_batches=st.integers(1, 16),
    batch=st.integers(1, 64),
    lwm=st.sampled_from([0.1, 0.25, 0.4, 0.5, 0.75]),
    n=st.integers(1, 300),
    rnd=st.randoms(use_true_random=False),
)
def test_a_stream_ends_with_a_bounded_number_of_grants(
    window_batches: int, batch: int, lwm: float, n: int, rnd: random.Random
) -> None:
    """A sender that sends what its credit allows (a short batch when less is left, like the replication
    sender) and a receiver that consumes each batch on arrival, with batches and grants each in order but
    delayed against each other at random. The stream always ends; the receiver never has to hold more than
    its credit; and it grants at most once per ``(1 - lwm)`` of the window received, plus once: the grants
    in flight no longer make it grant once per batch."""
    window = window_batches * batch
    sender, receiver = CreditSender("s", window), CreditReceiver("s", window, lwm=lwm)
    total = n * batch
    sent = 0
    wire: deque[tuple[int, int, int, bool]] = deque()  # batches in flight (ordinal, size, remaining, last)
    grants: deque[tuple[int, int, int]] = deque()  # flow control in flight
    received = 0
    while not receiver.done:
        can_send = sent < total and sender.credit > 0
        moves = [m for m, ok in (("send", can_send), ("deliver", wire), ("flow", grants)) if ok]
        assert moves, "the stream stalled: nothing in flight and the sender has no credit"
        move = rnd.choice(moves)
        if move == "send":
            size = min(batch, sender.credit, total - sent)
            sent += size
            ordinal, remaining = sender.spend(size, last=sent == total)
            wire.append((ordinal, size, remaining, sent == total))
        elif move == "deliver":
            ordinal, size, remaining, last = wire.popleft()
            receiver.received(ordinal, size, remaining, last)
            received += size
            receiver.consumed(size)
            grant = receiver.take_grant()
            if grant is not None:
                grants.append(grant)
        else:
            sender.grant(*grants.popleft())
        assert sum(size for _, size, _, _ in wire) + (window - receiver.local) <= window
    assert received == total
    per_grant = window - lwm * window  # bytes received from one grant to the next, at least
    assert receiver.next_grant <= total / per_grant + 1


@pytest.mark.parametrize("credit", [MAX + 1, 2**32, 2**64 - 1])
def test_a_grant_beyond_the_streams_window_is_refused_and_changes_nothing(credit: int) -> None:
    """The sender's initial credit is the window the receiver accepted; an honest receiver never grants
    more than it holds free, so a larger grant (found by fuzzing: up to 2**64 - 1) is the peer's error."""
    s = CreditSender("q/1", MAX)
    s.spend(400, last=False)
    with pytest.raises(RemoteProtocolError, match=f"grants {credit} bytes, more than the stream's window"):
        s.grant(ordinal=0, credit=credit, acked=0)
    assert (s.credit, s.last_grant, s.max_credit) == (MAX - 400, -1, MAX)
    assert s.grant(ordinal=0, credit=MAX, acked=0)  # the whole window is still a valid grant
    assert s.credit == MAX


def test_the_window_may_be_wider_than_the_initial_credit() -> None:
    """A receiver that was not told the credit accepts the stream with its own default (``window``)."""
    s = CreditSender("q/1", 100)
    assert s.grant(ordinal=0, credit=MAX, acked=-1, window=MAX)
    with pytest.raises(RemoteProtocolError, match="window of 1000"):
        s.grant(ordinal=1, credit=MAX + 1, acked=-1, window=MAX)
    with pytest.raises(RemoteProtocolError, match="window of 100"):
        CreditSender("q/2", 100).grant(ordinal=0, credit=101, acked=-1, window=50)  # never below the initial


@given(st.integers(0, MAX), st.integers(0, 4 * MAX))
def test_every_honest_receiver_grant_is_within_the_senders_window(consumed: int, extra: int) -> None:
    """Whatever the receiver grants through its own API, the sender accepts it: the bound refuses only
    what no honest receiver can send."""
    sender, receiver = CreditSender("s", MAX), CreditReceiver("s", MAX)
    ordinal, remaining = sender.spend(MAX, last=False)
    receiver.received(ordinal, MAX, remaining, last=False)
    receiver.consumed(consumed)
    with pytest.raises(LocalProtocolError):
        receiver.grant(consumed + 1 + extra)  # the receiver cannot grant what it does not have free
    assert sender.grant(*receiver.grant(consumed))
    assert sender.credit == consumed
