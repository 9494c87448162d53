"""Every role's ``handle``, fed what a hostile or confused peer can make the bus deliver.

A fake peer set (the other nodes of processes.toml, all up) sends registered messages the role handles,
stream batches on the role's streams, and the timers the role set fire early, late or twice; peers are
lost and come back. ``handle`` must return actions, or raise a protocol error the bus reports as
``HandlerFailed``, and the role must still take ``PeerLost`` for every peer afterwards (its state is not
corrupted). Anything else is a crash.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbus.bus import contract as c
from sparkbus.roles.query.errors import QueryError
from sparkbus.topologies import load, shipped
from sparkbus.topologies.echo import MAX_WINDOW_BATCHES
from sparkbus.topologies.registry import ROLES, RegistryError, RoleContext

from .conftest import count
from .strategies import any_message, instances, texts

TOPOLOGY = load(shipped("processes.toml"))
#: What the bus turns into HandlerFailed by design: the peer (or the caller) broke the protocol.
HANDLED = (c.RemoteProtocolError, c.LocalProtocolError, QueryError)
ACTIONS = typing.get_args(c.Action)


def _roles() -> list[tuple[str, str]]:
    out = []
    for nid in ("coordinator", "store-0"):
        spec = TOPOLOGY.spec_of(nid)
        out += [(nid, name) for name in (*spec.roles, *spec.services)]
    return out


def _build(node_id: str, name: str) -> c.Role:
    ctx = RoleContext(node_id=node_id, spec=TOPOLOGY.spec_of(node_id), topology=TOPOLOGY)
    try:
        return ROLES.build(name, ctx)
    except RegistryError as exc:
        pytest.skip(f"{name} cannot be built here: {exc}")


def _events(role: c.Role, peers: list[str]) -> st.SearchStrategy[Any]:
    own = [instances(m) for m in role.messages] or [any_message()]
    peer = st.sampled_from(peers)
    stream = st.one_of(st.just(f"{role.name}/1"), texts.map(lambda s: f"{role.name}/{s}"))
    return st.one_of(
        st.builds(lambda p, m: c.MessageReceived(peer=p, message=m), peer, st.one_of(*own)),
        st.builds(lambda p, m: c.MessageReceived(peer=p, message=m), peer, st.one_of(*own)),
        st.builds(lambda p, m: c.MessageReceived(peer=p, message=m), peer, any_message()),
        st.builds(
            lambda p, s, o, last, d, rem: c.BatchReceived(
                peer=p, stream=s, ordinal=o, last=last, data=d, size=len(d), remaining=rem
            ),
            peer,
            stream,
            st.integers(0, 3),
            st.booleans(),
            st.binary(max_size=64),
            st.integers(0, 1 << 20),
        ),
        st.builds(
            lambda p, s, cr: c.CreditChanged(peer=p, stream=s, credit=cr),
            peer,
            stream,
            st.integers(0, 1 << 20),
        ),
        st.builds(lambda p: c.PeerLost(peer=p, reason="fuzz"), peer),
        st.builds(lambda p: c.PeerUp(peer=p), peer),
        st.just("fire-a-timer"),
    )


def _feed(role: c.Role, event: c.Event, now: float, timers: list[str]) -> None:
    count("role_events")
    try:
        actions = list(role.handle(event, now) or ())
    except HANDLED:
        count("role_refusals")
        return
    # One event cannot make a role build without bound (what a peer sends must not decide memory).
    assert len(actions) <= 4 * MAX_WINDOW_BATCHES, f"{role.name}: {len(actions)} actions for one event"
    for action in actions:
        assert isinstance(action, ACTIONS), f"{role.name} returned {action!r}, not a bus action"
        if isinstance(action, c.SetTimer):
            timers.append(action.key)


@pytest.mark.parametrize(("node_id", "name"), _roles(), ids=str)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_role_survives_what_peers_can_send(node_id: str, name: str, data: st.DataObject) -> None:
    role = _build(node_id, name)
    try:
        _run(role, node_id, data)
    finally:  # as Node.stop does: a replication role's temporary data directory goes with it
        close = getattr(role, "close", None)
        if close is not None:
            close()


def _run(role: c.Role, node_id: str, data: st.DataObject) -> None:
    peers = [p for p in TOPOLOGY.node_ids() if p != node_id]
    now = 1000.0
    timers: list[str] = []
    for p in peers:
        _feed(role, c.PeerUp(peer=p), now, timers)
    for drawn in data.draw(st.lists(_events(role, peers), min_size=1, max_size=25)):
        now += data.draw(st.sampled_from([0.0, 0.001, 0.5, 30.0]))
        event = drawn
        if drawn == "fire-a-timer":
            if not timers:
                continue
            event = c.TimerFired(key=data.draw(st.sampled_from(timers)))
        _feed(role, event, now, timers)
    for p in peers:  # still consistent: every peer can be lost, and the role answers
        _feed(role, c.PeerLost(peer=p, reason="fuzz done"), now + 60, timers)
