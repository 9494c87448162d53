"""The last batches of a credit stream lost in a short silent cut, on the real NodeCore driven by SimBus.

The replication property test found it: a cut without a disconnect notice, shorter than the heartbeat
interval, lost the batches in flight while no control message was, and healed. The control sequence went
on without a gap (the next HEARTBEAT was the next number) and the data sequence too, since the sender,
waiting for credit, sent no further batch. The sender waited for credit and the receiver for batches, for
ever, and nobody was told. A HEARTBEAT now counts the batches its direction has sent on data (in the
header's stream slot, docs/PROTOCOL.md section 4); a receiver short of that count that gets none of the
rest for ``peer_timeout`` breaks the link as for any sequence gap.
"""

from __future__ import annotations

import heapq

import pytest

from sparkbus.bus import BusConfig, PeerLost, PeerUp, SimBus
from sparkbus.bus import contract as c
from sparkbus.bus.messages import Heartbeat

from .roles import Recorder
from .test_sessions import do

SEEDS = [1, 2, 3, 7, 42]
CFG = BusConfig(cluster_tag="t")  # heartbeat_interval 0.3 s, peer_timeout 1.5 s
BATCH = 1024


def streaming(seed: int) -> tuple[SimBus, Recorder, Recorder]:
    """a opens a stream to b and spends its whole credit on three batches, which are now in flight."""
    sim = SimBus(seed=seed, config=CFG)
    a, b = Recorder(), Recorder()
    sim.add_node("a", [a])
    sim.add_node("b", [b])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    sim.run_for(1.0)  # the handshake's messages are long delivered: the link is idle
    assert sim.idle()
    do(
        sim,
        "a",
        c.OpenStream(peer="b", stream="rec/s", credit=3 * BATCH),
        *(c.SendBatch(peer="b", stream="rec/s", data=b"x" * BATCH) for _ in range(3)),
    )
    return sim, a, b


@pytest.mark.parametrize("seed", SEEDS)
def test_a_silent_cut_that_loses_the_last_batches_breaks_the_link(seed: int) -> None:
    sim, a, b = streaming(seed)
    start = sim.now
    sim.cut("a", "b", notify=False)  # the three batches are lost; no control message was in flight
    sim.run_for(0.1)  # shorter than the heartbeat interval: no heartbeat was lost
    sim.heal("a", "b")
    sim.run_until(lambda: bool(a.of(PeerLost)) and bool(b.of(PeerLost)), limit=10)
    # Found from the first heartbeat after the heal, within peer_timeout (plus an interval) of it.
    assert sim.now - start <= CFG.heartbeat_interval * 2 + CFG.peer_timeout + 0.01
    assert not b.of(c.BatchReceived)
    lost_b = b.of(PeerLost)[0]
    assert lost_b.peer == "a" and "sequence gap on data" in lost_b.reason and "3 lost" in lost_b.reason
    assert a.of(PeerLost)[0].peer == "b", "the stream's sender is told too"
    assert sim.node("b").core.refusals["SEQUENCE_GAP"] == 1
    assert not sim.node("a").core._peers["b"].senders, "the stream ended with the link"
    # Then both come back in new sessions, and the stream's role can open it again.
    sim.run_until(lambda: sim.all_up() and len(a.of(PeerUp)) == 2 and len(b.of(PeerUp)) == 2, limit=10)
    do(
        sim,
        "a",
        c.OpenStream(peer="b", stream="rec/s", credit=3 * BATCH),
        c.SendBatch(peer="b", stream="rec/s", data=b"y" * BATCH, last=True),
    )
    sim.run_until(lambda: bool(b.of(c.BatchReceived)), limit=5)
    assert b.of(c.BatchReceived)[0].ordinal == 0
    sim.run_for(5.0)
    assert len(a.of(PeerLost)) == 1 and len(b.of(PeerLost)) == 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stall", [0.5, 1.4])
def test_batches_late_by_less_than_the_peer_timeout_do_not_break_the_link(seed: int, stall: float) -> None:
    """The heartbeat that counts the batches comes long before them: they are awaited, not given up."""
    sim, a, b = streaming(seed)
    sim.stall("a", "b", stall, channels=("data",))
    sim.run_until(lambda: len(b.of(c.BatchReceived)) == 3, limit=5)
    assert sim.node("a").core.counters["heartbeats_out"] > 3, "heartbeats counting them came first"
    sim.run_for(5.0)
    assert not a.of(PeerLost) and not b.of(PeerLost)
    assert [e.ordinal for e in b.of(c.BatchReceived)] == [0, 1, 2]
    assert not sim.node("b").core.refusals


@pytest.mark.parametrize("seed", SEEDS)
def test_batches_that_keep_coming_slowly_are_awaited_past_the_peer_timeout(seed: int) -> None:
    """A backlog drained slowly (a receiver busy with each batch): one batch a second, the last one 3 s
    after the heartbeat that counted them, and never peer_timeout without one. No loss."""
    sim, a, b = streaming(seed)
    data = sorted((d for d in sim._queue if d.channel == "data"), key=lambda d: d.at)
    assert len(data) == 3
    for i, d in enumerate(data):
        d.at = sim.now + 1.0 * (i + 1)
    heapq.heapify(sim._queue)
    sim.run_until(lambda: len(b.of(c.BatchReceived)) == 3, limit=5)
    sim.run_for(5.0)
    assert not a.of(PeerLost) and not b.of(PeerLost)
    assert [e.ordinal for e in b.of(c.BatchReceived)] == [0, 1, 2]


@pytest.mark.parametrize("seed", SEEDS)
def test_batches_later_than_the_peer_timeout_after_their_count_break_the_link(seed: int) -> None:
    sim, a, b = streaming(seed)
    sim.stall("a", "b", CFG.peer_timeout + 2 * CFG.heartbeat_interval + 0.1, channels=("data",))
    sim.run_until(lambda: bool(b.of(PeerLost)), limit=5)
    assert "sequence gap on data" in b.of(PeerLost)[0].reason
    sim.run_until(lambda: bool(a.of(PeerLost)), limit=5)
    sim.run_until(sim.all_up, limit=10)
    sim.run_for(3.0)  # the stalled batches of the old session are refused as stale, and change nothing
    assert not b.of(c.BatchReceived)
    assert len(b.of(PeerLost)) == 1


def forge_heartbeat(sim: SimBus, stream: str | None) -> None:
    """a sends a HEARTBEAT on its session with ``stream`` in the header's stream slot."""
    core = sim.node("a").core
    out = core._outbound["b"]
    out.seq += 1
    out.last_sent = sim.now
    sim.send_raw(
        "a", "b", "ctl", core.codec.encode(Heartbeat(), session=out.session, seq=out.seq, stream=stream)
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_a_heartbeat_without_a_count_is_taken_as_before(seed: int) -> None:
    """A peer that predates the count sends nil there: a heartbeat as ever, nothing awaited."""
    sim, a, b = streaming(seed)
    sim.run_until(lambda: len(b.of(c.BatchReceived)) == 3, limit=5)
    before = sim.node("b").core.counters["heartbeats_in"]
    forge_heartbeat(sim, None)
    sim.run_for(3.0)
    assert sim.node("b").core.counters["heartbeats_in"] > before
    assert not sim.node("b").core.refusals and not a.of(PeerLost) and not b.of(PeerLost)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_count_beyond_what_was_sent_breaks_the_link_after_the_timeout(seed: int) -> None:
    sim, _a, b = streaming(seed)
    sim.run_until(lambda: len(b.of(c.BatchReceived)) == 3, limit=5)
    start = sim.now
    forge_heartbeat(sim, "5")
    sim.run_until(lambda: bool(b.of(PeerLost)), limit=5)
    assert CFG.peer_timeout <= sim.now - start <= CFG.peer_timeout + 0.01
    assert "5 batches sent, 3 arrived, none for 1.5 s (2 lost)" in b.of(PeerLost)[0].reason


@pytest.mark.parametrize("count", ["x3", "-1", "3.0", "1" * 21])
def test_a_malformed_count_is_refused_and_the_link_lives_on(count: str) -> None:
    sim, a, b = streaming(1)
    sim.run_until(lambda: len(b.of(c.BatchReceived)) == 3, limit=5)
    forge_heartbeat(sim, count)
    sim.run_for(3.0)
    assert sim.node("b").core.refusals == {"MALFORMED": 1}
    assert sim.node("a").core.counters["errors_from_peers"] == 1
    assert not a.of(PeerLost) and not b.of(PeerLost)
