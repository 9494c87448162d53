"""A peer's FLOW_CONTROL beyond the stream's window, on the real NodeCore driven by SimBus.

Fuzzing found that the bus applied any grant up to 2**64 - 1: the sender then believed it could put that
many bytes in flight to a receiver that had accepted a window of a few KiB. The sender now refuses such a
grant as STREAM_VIOLATION (an ERROR to the peer, a counted refusal), keeps its credit, and the link and the
stream stay usable, as for the other flow-control refusals (docs/PROTOCOL.md section 5).
"""

from __future__ import annotations

import pytest

from sparkbus.bus import BusConfig, ErrorCode, PeerLost, SimBus, Transmit
from sparkbus.bus import contract as c
from sparkbus.bus.messages import FlowControl

from .roles import Recorder
from .test_sessions import do

SEEDS = [1, 2, 3, 7, 42]
WINDOW = 4 << 20  # agreed when the stream is opened; larger than the bus's initial_credit
INITIAL = BusConfig(cluster_tag="t").initial_credit


def pair(seed: int) -> tuple[SimBus, Recorder, Recorder]:
    sim = SimBus(seed=seed, config=BusConfig(cluster_tag="t"))
    a, b = Recorder(), Recorder(consume=False)
    sim.add_node("a", [a])
    sim.add_node("b", [b])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    return sim, a, b


def open_stream(sim: SimBus, b: Recorder, credit: int, *, accept: bool) -> None:
    """a opens rec/s to b with ``credit`` (b accepting it first if ``accept``) and sends 400 bytes."""
    if accept:
        do(sim, "b", c.AcceptStream(peer="a", stream="rec/s", credit=credit))
    do(sim, "a", c.OpenStream(peer="b", stream="rec/s", credit=credit))
    do(sim, "a", c.SendBatch(peer="b", stream="rec/s", data=b"x" * 400))
    sim.run_until(lambda: bool(b.of(c.BatchReceived)), limit=5)


def forge_grant(sim: SimBus, ordinal: int, credit: int, acked: int) -> None:
    """b plays a hostile receiver: a FLOW_CONTROL on its own session, which no role action can make."""
    core = sim.node("b").core
    core._send_to_peer("a", FlowControl(ordinal=ordinal, credit=credit, acked=acked), sim.now, "rec/s")
    for out in core.take():
        assert isinstance(out, Transmit)
        sim.send_raw("b", "a", out.channel, out.frames)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("credit", [WINDOW + 1, 2**64 - 1], ids=["window+1", "2**64-1"])
def test_a_grant_beyond_the_window_is_refused_counted_and_changes_nothing(seed: int, credit: int) -> None:
    sim, a, b = pair(seed)
    open_stream(sim, b, WINDOW, accept=True)
    forge_grant(sim, ordinal=0, credit=credit, acked=0)
    sim.run_until_idle()
    core_a, core_b = sim.node("a").core, sim.node("b").core
    assert core_a.refusals[ErrorCode.STREAM_VIOLATION.name] == 1
    assert core_b.counters["errors_from_peers"] == 1  # b was told, with the code
    sender = core_a._peers["b"].senders["rec/s"][1]
    assert sender.credit == WINDOW - 400  # nothing applied
    assert not a.of(c.CreditChanged)
    # The sender may still use what it had, and the link is not broken by the refusal.
    do(sim, "a", c.SendBatch(peer="b", stream="rec/s", data=b"y" * 600, last=True))
    sim.run_until_idle()
    assert [e.size for e in b.of(c.BatchReceived)] == [400, 600]
    assert not a.of(PeerLost) and not b.of(PeerLost)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("opened", "granted", "refused"),
    [
        (WINDOW, WINDOW, False),  # the agreed window itself
        (1000, INITIAL, False),  # a receiver that was not told grants its initial_credit
        (1000, INITIAL + 1, True),  # and never more
    ],
    ids=["agreed", "receiver-default", "beyond-default"],
)
def test_the_window_is_the_agreed_credit_or_the_receivers_default(
    seed: int, opened: int, granted: int, refused: bool
) -> None:
    sim, a, b = pair(seed)
    open_stream(sim, b, opened, accept=opened == WINDOW)
    forge_grant(sim, ordinal=0, credit=granted, acked=0)
    sim.run_until_idle()
    assert sim.node("a").core.refusals[ErrorCode.STREAM_VIOLATION.name] == int(refused)
    assert [e.credit for e in a.of(c.CreditChanged)] == ([] if refused else [granted])
