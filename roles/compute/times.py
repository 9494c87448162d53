"""Timestamps and frontiers for a totally ordered time.

Materialize's timestamps are ``u64`` and its frontiers are antichains. For a totally ordered time an antichain
has at most one element, so a frontier is a tuple: ``(t,)`` means "every time ``>= t`` may still change", and
``()`` (the empty antichain) means "nothing can change any more", which is the frontier of a closed or dropped
collection and compares above every non-empty one.
"""

from __future__ import annotations

Frontier = tuple[int, ...]

#: The frontier of a collection that will never change again (the empty antichain).
CLOSED: Frontier = ()


def check_frontier(frontier: Frontier, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``frontier`` is a valid antichain of a total order."""
    if type(frontier) is not tuple or len(frontier) > 1:
        raise ValueError(f"{what} must be () or (t,) for a totally ordered time, got {frontier!r}")
    for t in frontier:
        check_time(t, what)


#: The largest timestamp: times travel in Arrow's int64 ``__time`` columns.
MAX_TIME = 2**63 - 1


def check_time(t: int, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``t`` is a non-negative int timestamp (at most ``MAX_TIME``)."""
    if type(t) is not int or not 0 <= t <= MAX_TIME:
        raise ValueError(f"{what} must be an int timestamp from 0 to 2**63 - 1, got {t!r}")


def frontier_leq(a: Frontier, b: Frontier) -> bool:
    """``a <= b`` in the antichain order (the empty frontier is the top)."""
    if not b:
        return True
    if not a:
        return False
    return a[0] <= b[0]


def frontier_meet(a: Frontier, b: Frontier) -> Frontier:
    """The lower of two frontiers (their greatest lower bound)."""
    return a if frontier_leq(a, b) else b


def frontier_join(a: Frontier, b: Frontier) -> Frontier:
    """The higher of two frontiers (their least upper bound)."""
    return b if frontier_leq(a, b) else a


def not_beyond(t: int, frontier: Frontier) -> bool:
    """True when time ``t`` is complete at ``frontier``: ``t`` is strictly below it."""
    return not frontier or t < frontier[0]


def readable(t: int, since: Frontier) -> bool:
    """True when ``since`` allows reading at ``t`` (the collection was not compacted past ``t``)."""
    return bool(since) and since[0] <= t
