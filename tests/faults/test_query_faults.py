"""SIGKILL and SIGSTOP of a query participant while a query runs on it.

The initiator ``i`` runs in the test process, the participants ``p1`` and ``p2`` are processes on ipc
sockets (so a restarted participant is found where it was). To be sure the signal lands *during* the
query, ``p1`` is stopped first, the query is started, and the test polls until the initiator holds it.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future
from typing import Any

import pytest

from sparkbus.bus.node import Node
from sparkbus.roles.query import ErrorCode, Query, QueryError, error_from_reply, result_table, sql

from .cluster import GROUPED, QueryCluster, grouped_reference, query_cluster
from .node_proc import open_streams
from .procs import children, until

pytestmark = pytest.mark.timeout(120)


def start_query(node: Node) -> Future[Any]:
    # Members named, so p1 is one even if the initiator had lost it (the default is the peers that are up).
    query = Query(sql=GROUPED, timeout=30, participants=("i", "p1", "p2"))
    return node.call_async("query", "execute", query.args())


def failure(fut: Future[Any]) -> QueryError:
    exc = fut.exception(timeout=40)
    assert exc is not None, "the query succeeded"
    return error_from_reply(str(exc))


def assert_no_leaks(cluster: QueryCluster, survivors: tuple[str, ...]) -> None:
    """Nothing open on the initiator or the surviving participants once the query has ended."""
    assert cluster.node is not None
    until("the initiator holds no query", lambda: not any(cluster.open_state().values()))
    until("the initiator has no stream open", lambda: open_streams(cluster.node.status()) == 0)  # type: ignore[union-attr]
    for name in survivors:
        p = cluster.participants[name]
        until(f"{name} holds no query and no stream", lambda p=p: _idle(p.ask("state")))


def _idle(state: dict[str, Any]) -> bool:
    return not any(state["open"].values()) and open_streams(state["status"]) == 0


def test_sigkill_of_a_participant_mid_query_fails_it_with_member_leave(fds_back: None) -> None:
    """What the user sees: the running query fails at once with ``QueryError`` code MEMBER_LEAVE
    (1002) naming p1; after p1 is restarted on its data, the same query returns the correct result.
    Nothing is left open on the initiator or on p2."""
    with children() as procs, query_cluster(procs) as cluster:
        node = cluster.node
        assert node is not None
        assert sql(node, GROUPED).to_pylist() == grouped_reference()
        p1 = cluster.participants["p1"]
        until("p1 is up", lambda: cluster.up("p1"))
        p1.signal(signal.SIGSTOP)
        fut = start_query(node)
        until("the initiator holds the query", lambda: cluster.open_state()["queries"] == 1)
        killed = time.monotonic()
        p1.kill()
        err = failure(fut)
        detected = time.monotonic() - killed
        assert err.code is ErrorCode.MEMBER_LEAVE, err
        assert "p1" in str(err)
        assert_no_leaks(cluster, ("p2",))
        cluster.restart("p1")
        assert sql(node, GROUPED).to_pylist() == grouped_reference()
        print(f"FAULT query-sigkill detected={detected:.3f}")


def test_sigstop_of_a_participant_mid_query_fails_it_after_the_peer_timeout(fds_back: None) -> None:
    """What the user sees: the query fails with ``QueryError`` code MEMBER_LEAVE (1002) once p1 has been
    silent for the peer timeout (1.5 s); after SIGCONT p1 rejoins by itself and the next query returns the
    correct result. Nothing is left open on the initiator, p2 or p1."""
    with children() as procs, query_cluster(procs) as cluster:
        node = cluster.node
        assert node is not None
        p1 = cluster.participants["p1"]
        until("p1 is up", lambda: cluster.up("p1"))
        p1.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        fut = start_query(node)
        err = failure(fut)
        detected = time.monotonic() - stopped
        assert err.code is ErrorCode.MEMBER_LEAVE, err
        assert_no_leaks(cluster, ("p2",))
        p1.signal(signal.SIGCONT)
        resumed = time.monotonic()
        until("p1 is up again", lambda: cluster.up("p1"), timeout=30)
        table = result_table(node.call("query", "execute", Query(sql=GROUPED, timeout=30).args(), timeout=40))
        recovered = time.monotonic() - resumed
        assert table.to_pylist() == grouped_reference()
        assert_no_leaks(cluster, ("p1", "p2"))
        print(f"FAULT query-sigstop detected={detected:.3f} recovered={recovered:.3f}")
