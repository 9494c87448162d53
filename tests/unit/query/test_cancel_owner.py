"""``cancel`` by ``owner`` ends only the query whose ``execute`` named that owner (the client gateway names a
client's request so), whatever call or query id the same call names."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.roles.query.role import QueryRole


def running(owner: object) -> tuple[QueryRole, list[c.Action]]:
    role = QueryRole("i", incarnation="x")
    role.handle(c.PeerUp(peer="p1"), 0.0)
    args = {"sql": "SELECT x FROM t", "participants": ["p1"], "owner": owner}
    return role, role.handle(c.LocalCall(call_id=1, name="execute", args=args), 0.0)


def cancel(role: QueryRole, **args: object) -> object:
    acts = role.handle(c.LocalCall(call_id=9, name="cancel", args=args), 0.0)
    (reply,) = [a for a in acts if isinstance(a, c.Reply) and a.call_id == 9]
    assert reply.error is None
    return reply.result


def test_cancel_by_owner_ends_only_that_owners_query() -> None:
    role, _ = running("conn-a/1")
    assert cancel(role, owner="conn-b/1") is False
    assert cancel(role, owner="conn-b/1", call_id=1, query_id="i@x.1") is False  # owner alone counts
    assert len(role.queries) == 1
    assert cancel(role, owner="conn-a/1") is True
    assert role.queries == {} and role.calls == {}


def test_an_owner_that_is_no_str_is_refused() -> None:
    role, acts = running(7)
    assert len(acts) == 1 and isinstance(acts[0], c.Reply) and acts[0].error is not None
    assert acts[0].error.startswith("[1005 PARSING] owner must be a str, got int")
    assert role.queries == {}
