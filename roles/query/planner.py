"""Split a logical plan into fragments at its exchanges (Mustang 3.4, snippets 7 and 8).

Participants run the row-local prefix of the plan (scan, filter, project) and the first half of the
operator that needs all rows: a partial aggregate, a local sort, a top-k, or a local limit. They send the
result to the initiator, which runs the other half (final aggregate, merge sort, limit) and everything
after it. With ``repartition``, a grouped aggregate gets a middle stage: participants hash-partition
their partial states by the group keys to each other, each merges its share of the groups, and the
initiator only concatenates; that keeps the initiator's work flat in the number of groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from sparkbus.roles.query.errors import PlanError
from sparkbus.roles.query.plan import (
    Aggregate,
    Filter,
    Fragment,
    Limit,
    MergeSort,
    PlanNode,
    Project,
    Receive,
    Scan,
    Send,
    Sort,
    TopK,
    chain,
    check_fragments,
)

ROOT_FRAGMENT = 0


def stack(ops: Sequence[PlanNode], base: PlanNode | None) -> PlanNode:
    """Rebuild the chain ``ops`` (leaf first) on top of ``base`` (None: ``ops[0]`` is the leaf)."""
    node = base
    for op in ops:
        node = op if node is None else cast(PlanNode, dataclasses.replace(cast(Any, op), input=node))
    if node is None:
        raise PlanError("plan", "empty plan")
    return node


def check_logical(plan: PlanNode) -> list[PlanNode]:
    """The operators of a logical plan, leaf first.

    Raises:
        PlanError: the plan does not start with a scan, or uses an operator that only the planner places.
    """
    ops = chain(plan)
    if not isinstance(ops[0], Scan):
        raise PlanError("plan", f"a logical plan starts with a scan, not {type(ops[0]).__name__}")
    for op in ops[1:]:
        if isinstance(op, Send | Receive | MergeSort | TopK | Scan):
            raise PlanError(
                "plan", f"{type(op).__name__} is placed by the planner, not written in a logical plan"
            )
        if isinstance(op, Aggregate) and op.phase != "single":
            raise PlanError("plan", "a logical aggregate has phase 'single'; the planner splits it")
    return ops


def plan_fragments(
    plan: PlanNode, *, initiator: str, participants: Sequence[str], repartition: bool = False
) -> tuple[Fragment, ...]:
    """Fragments for ``plan``: the root (fragment 0) on the initiator, the rest on ``participants``.

    Raises:
        PlanError: for a plan that is not a valid logical plan.
    """
    if not participants:
        raise PlanError("participants", "a query needs at least one participant")
    members = tuple(participants)
    ops = check_logical(plan)
    split = next((i for i, op in enumerate(ops) if not isinstance(op, Scan | Filter | Project)), len(ops))
    local, rest = ops[:split], ops[split:]
    head = rest[0] if rest else None
    after: list[PlanNode] = []
    leaf_top: list[PlanNode] = []
    root_ops: list[PlanNode] = []
    if head is None:
        pass
    elif isinstance(head, Aggregate):
        leaf_top = [dataclasses.replace(head, phase="partial")]
        final = dataclasses.replace(head, phase="final")
        if repartition and head.keys and len(members) > 1:
            leaf = stack([*local, *leaf_top], None)
            middle = stack([final], Receive(edge=1))
            staged: tuple[Fragment, ...] = (
                Fragment(id=ROOT_FRAGMENT, root=stack(rest[1:], Receive(edge=2)), members=(initiator,)),
                Fragment(id=1, root=Send(input=leaf, edge=1, mode="hash", keys=head.keys), members=members),
                Fragment(id=2, root=Send(input=middle, edge=2), members=members),
            )
            check_fragments(staged)
            return staged
        root_ops, after = [final], rest[1:]
    elif isinstance(head, Sort) and len(rest) > 1 and isinstance(rest[1], Limit):
        limit = rest[1]
        assert isinstance(limit, Limit)
        leaf_top = [TopK(input=head.input, keys=head.keys, count=limit.rows)]
        root_ops, after = [MergeSort(input=head.input, keys=head.keys), limit], rest[2:]
    elif isinstance(head, Sort):
        leaf_top = [head]
        root_ops, after = [MergeSort(input=head.input, keys=head.keys)], rest[1:]
    elif isinstance(head, Limit):
        leaf_top = [Limit(input=head.input, count=head.rows)]
        root_ops, after = [head], rest[1:]
    else:
        raise PlanError("plan", f"cannot distribute {type(head).__name__}")
    leaf = stack([*local, *leaf_top], None)
    fragments: tuple[Fragment, ...] = (
        Fragment(id=ROOT_FRAGMENT, root=stack([*root_ops, *after], Receive(edge=1)), members=(initiator,)),
        Fragment(id=1, root=Send(input=leaf, edge=1), members=members),
    )
    check_fragments(fragments)
    return fragments
