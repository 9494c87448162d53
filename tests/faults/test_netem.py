"""Network faults between two nodes in two network namespaces (veth pair, ``tc netem``).

The initiator ``i`` runs in namespace a, the participant ``p1`` (holding all of ``t``) in namespace b;
both are processes on TCP. Skipped, with the refused command named, where namespaces or netem are not
permitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sparkbus.roles.query import ErrorCode

from .cluster import GROUPED, ROWS, SEED, grouped_reference
from .netns import NetnsPair, netem_refusal, netns_pair, tbf_refusal
from .node_proc import open_streams
from .procs import NodeProc, children, until

pytestmark = pytest.mark.timeout(120)


class Pair:
    def __init__(self, net: NetnsPair, i: NodeProc, p1: NodeProc) -> None:
        self.net, self.i, self.p1 = net, i, p1

    def sql(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.i.ask("sql", timeout=60, text=GROUPED, query_timeout=30)
        return answer

    def up(self) -> bool:
        peer = self.i.ask("state")["status"]["peers"].get("p1")
        return bool(peer and peer["up"])

    def idle(self) -> bool:
        state = self.i.ask("state")
        return not any(state["open"].values()) and open_streams(state["status"]) == 0


@pytest.fixture
def pair(fds_back: None) -> Iterator[Pair]:
    with netns_pair() as net, children() as procs:
        i = NodeProc("query", "i", f"tcp:{net.address('a')}", prefix=net.exec_prefix("a"))
        procs.add(i)
        p1 = NodeProc(
            "query",
            "p1",
            f"tcp:{net.address('b')}",
            str(ROWS),
            str(SEED),
            "0",
            "1",
            prefix=net.exec_prefix("b"),
        )
        procs.add(p1)
        peers = {"i": i.endpoints, "p1": p1.endpoints}
        i.give_peers(peers)
        p1.give_peers(peers)
        i.started()
        p1.started()
        until("i sees p1 up", lambda: Pair(net, i, p1).up(), timeout=30)
        yield Pair(net, i, p1)


def test_delay_and_loss_still_give_correct_results(pair: Pair) -> None:
    """What the user sees: with 20 ms +- 10 ms delay and 2 % loss each way, queries return the correct
    result (TCP retransmits; the bus's heartbeats keep the link up), just later."""
    reason = netem_refusal()
    if reason is not None:
        pytest.skip(reason)
    pair.net.netem("delay", "20ms", "10ms", "loss", "2%")
    started = time.monotonic()
    for _ in range(3):
        assert pair.sql() == {"rows": grouped_reference()}
    per_query = (time.monotonic() - started) / 3
    assert pair.up()
    until("nothing left open on i", pair.idle)
    print(f"FAULT netem-delay-loss per_query={per_query:.3f}")


def test_a_slow_link_still_gives_correct_results(pair: Pair) -> None:
    """What the user sees: over a 2 Mbit/s link (token bucket, both ways) the full-scan query returns all
    rows, correct, just later; the link stays up and nothing is left open."""
    reason = tbf_refusal()
    if reason is not None:
        pytest.skip(reason)
    pair.net.tbf("rate", "2mbit", "burst", "32kbit", "latency", "2s")
    started = time.monotonic()
    answer = pair.i.ask("sql", timeout=60, text="SELECT k, v FROM t ORDER BY k", query_timeout=30)
    elapsed = time.monotonic() - started
    assert [r["k"] for r in answer["rows"]] == list(range(ROWS))
    assert pair.up()
    until("nothing left open on i", pair.idle)
    print(f"FAULT tbf-2mbit full_scan={elapsed:.3f}")


def test_a_partition_fails_the_query_with_a_code_and_healing_restores_service(pair: Pair) -> None:
    """What the user sees: a query started across a partition fails with ``QueryError`` code MEMBER_LEAVE
    (1002) once p1 has been silent for the peer timeout (1.5 s) - or MEMBER_CONNECTION (1001) if i had
    already lost p1 when it started; after the partition heals, the link comes back by itself and the next
    query returns the correct result. Nothing is left open on i."""
    assert pair.sql() == {"rows": grouped_reference()}
    how = pair.net.partition()
    cut = time.monotonic()
    answer = pair.sql()
    detected = time.monotonic() - cut
    assert answer.get("error") in (ErrorCode.MEMBER_LEAVE, ErrorCode.MEMBER_CONNECTION), answer
    assert "p1" in answer["message"]
    until("nothing left open on i", pair.idle)
    pair.net.heal()
    healed = time.monotonic()
    until("i sees p1 up again", pair.up, timeout=30)
    assert pair.sql() == {"rows": grouped_reference()}
    recovered = time.monotonic() - healed
    until("nothing left open on i", pair.idle)
    print(
        f"FAULT netem-partition detected={detected:.3f} recovered={recovered:.3f} code={answer['error']} how={how!r}"
    )
