"""The thin client's pure policies: retries (IEP-82), keepalive (IEP-83), address order (IEP-90)."""

from __future__ import annotations

import random

import pytest

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import (
    RETRY_NONE,
    ClientConnectionError,
    ClusterMismatchError,
    ConnectionUnknownError,
    Keepalive,
    Op,
    OperationError,
    RetryLimitPolicy,
    RetryReadPolicy,
    encode_response,
    keepalive_interval,
    parse_address,
    resolve_order,
)

LOST = ClientConnectionError("lost")


def test_the_default_policy_retries_reads_up_to_16_times_and_never_writes() -> None:
    policy = RetryReadPolicy()
    assert policy.should_retry(Op.SQL, 1, LOST) and policy.should_retry(Op.PEEK, 16, LOST)
    assert not policy.should_retry(Op.SQL, 17, LOST)
    for op in (Op.WRITE, Op.LOAD, Op.SUBSCRIBE, Op.FETCH):
        assert not policy.should_retry(op, 1, LOST)
    assert policy.should_retry(Op.SQL, 1, ConnectionUnknownError("gone"))


def test_only_connection_errors_are_retried_and_a_cluster_mismatch_never() -> None:
    for policy in (RetryReadPolicy(-1), RetryLimitPolicy(-1)):
        assert not policy.should_retry(Op.SQL, 1, ClusterMismatchError("other cluster"))
        assert not policy.should_retry(Op.SQL, 1, OperationError(1005, "parse error"))
        assert not policy.should_retry(Op.SQL, 1, ClientConnectionError("x", ErrorCode.CLUSTER_ID_MISMATCH))
    assert RetryLimitPolicy(2).should_retry(Op.WRITE, 2, LOST)
    assert not RetryLimitPolicy(2).should_retry(Op.WRITE, 3, LOST)
    assert not RETRY_NONE.should_retry(Op.SQL, 1, LOST)
    assert RetryReadPolicy(-1).should_retry(Op.SQL, 10_000, LOST)


@pytest.mark.parametrize(
    ("configured", "idle", "expected"),
    [
        (30.0, 1.5, 0.5),
        (30.0, 0.3, 0.5),
        (30.0, 90.0, 30.0),
        (2.0, 9.0, 2.0),
        (0.1, 9.0, 0.5),
        (30.0, 0.0, None),
    ],
)
def test_keepalive_interval_is_min_of_configured_and_a_third_of_idle_at_least_half_a_second(
    configured: float, idle: float, expected: float | None
) -> None:
    assert keepalive_interval(configured, idle) == expected


def test_heartbeat_only_when_idle_and_timeout_ignored_when_anything_arrived() -> None:
    k = Keepalive(interval=0.5, timeout=5.0, last_sent=0.0)
    assert not k.heartbeat_due(0.4)
    k.sent(0.4)  # a request went out: no heartbeat needed yet
    assert not k.heartbeat_due(0.8) and k.heartbeat_due(0.9)
    k.pinged(0.9)
    assert not k.dead(5.8) and k.dead(5.9)
    k2 = Keepalive(interval=0.5, timeout=5.0)
    k2.pinged(1.0)
    k2.received(2.0)  # any response clears the heartbeat timeout
    assert not k2.dead(100.0)
    assert Keepalive(interval=None).heartbeat_due(1e9) is False


def test_addresses_parse_and_resolve_in_a_new_random_order_each_time() -> None:
    assert parse_address("tcp://127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert parse_address("db.example:80") == ("db.example", 80)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad in ("nohost", "h:0", "h:x", "ipc://x:1"):
        with pytest.raises(ValueError):
            parse_address(bad)
    four = [f"tcp://10.0.0.{i}:1" for i in range(4)]
    rng = random.Random(3)
    orders = {tuple(resolve_order("lb:1", rng, lambda h, p: four)) for _ in range(20)}
    assert len(orders) > 1 and all(sorted(o) == four for o in orders)
    with pytest.raises(OSError):
        resolve_order("x:1", rng, lambda h, p: [])


def test_names_resolve_through_the_system_in_the_driver_and_only_literals_in_the_core() -> None:
    from sparkbus.topologies.client import system_resolver

    assert "tcp://127.0.0.1:7" in resolve_order("localhost:7", random.Random(0), system_resolver)
    assert resolve_order("127.0.0.1:7", random.Random(0)) == ["tcp://127.0.0.1:7"]
    with pytest.raises(OSError):
        resolve_order("localhost:7", random.Random(0))


def test_results_are_chunked_and_errors_keep_a_query_code() -> None:
    chunks = encode_response(5, b"x" * 2500, None, chunk_bytes=1000)
    assert [(r.chunk, r.last) for r in chunks] == [(0, False), (1, False), (2, True)]
    err = encode_response(6, None, "[1005 PARSING] bad sql")
    assert err[0].code == 1005 and err[0].last
    assert encode_response(7, None, "boom")[0].code == ErrorCode.PROTOCOL
    assert encode_response(8, object(), None)[0].code == ErrorCode.PROTOCOL
