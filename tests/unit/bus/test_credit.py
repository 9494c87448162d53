"""The credit machines through their public API: every operation against every state (Hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
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
    r.received(0, 10, 90, last=True)
    with pytest.raises(RemoteProtocolError, match="after the last"):
        r.received(1, 10, 80, last=False)
    with pytest.raises(LocalProtocolError, match="consumed"):
        r.consumed(11)


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
