"""The life of one query on one member: its state, its phases and the table of allowed transitions.

``PENDING`` exists only on a participant that received a batch before ``start`` (Mustang 3.5.1: such a
batch is retained; the state is created lazily and replayed on start). ``RUNNING`` follows ``start``
(or, on the initiator, the ``execute`` call). ``DONE`` is terminal: the state leaves the registry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.bus.contract import LocalProtocolError, RemoteProtocolError
from sparkbus.roles.query import engine
from sparkbus.roles.query import exchange as x
from sparkbus.roles.query.messages import QueryId, QueryStarted
from sparkbus.roles.query.plan import Fragment


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


class Step(enum.Enum):
    """What happened to a query (the events of the table below)."""

    START = "start"  # start received (participant) or the query was executed here (initiator)
    BATCH = "batch"  # a batch arrived for it
    CREDIT = "credit"  # one of its outbound streams got credit
    COMPLETE = "complete"  # every fragment here finished (and the result was delivered, on the initiator)
    CANCEL = "cancel"  # cancel received from the initiator, or forwarded to it by a participant
    FAIL = "fail"  # failed here: an operator error, a lost peer, a timeout, the user's cancel
    INACTIVE = "inactive"  # check_response says the initiator no longer runs it


#: (phase, step) -> next phase. Anything else is a protocol error naming both.
TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (Phase.PENDING, Step.START): Phase.RUNNING,
    (Phase.PENDING, Step.BATCH): Phase.PENDING,
    (Phase.PENDING, Step.CANCEL): Phase.DONE,
    (Phase.PENDING, Step.FAIL): Phase.DONE,
    (Phase.PENDING, Step.INACTIVE): Phase.DONE,
    (Phase.RUNNING, Step.BATCH): Phase.RUNNING,
    (Phase.RUNNING, Step.CREDIT): Phase.RUNNING,
    (Phase.RUNNING, Step.COMPLETE): Phase.DONE,
    (Phase.RUNNING, Step.CANCEL): Phase.DONE,
    (Phase.RUNNING, Step.FAIL): Phase.DONE,
    # A check answered after start arrived is stale: a running query ends by completion or cancel.
    (Phase.RUNNING, Step.INACTIVE): Phase.RUNNING,
}

#: Steps that only a peer can cause; out of state, they are the peer's fault.
REMOTE_STEPS = frozenset({Step.START, Step.BATCH, Step.CREDIT, Step.CANCEL, Step.INACTIVE})


def next_phase(phase: Phase, step: Step, query_id: str) -> Phase:
    """The phase after ``step``.

    Raises:
        RemoteProtocolError: a peer's message is not allowed in ``phase`` (e.g. a second start).
        LocalProtocolError: our own step is not allowed in ``phase``.
    """
    nxt = TRANSITIONS.get((phase, step))
    if nxt is None:
        text = f"query {query_id}: {step.value} is not allowed in phase {phase.value}"
        raise RemoteProtocolError(text) if step in REMOTE_STEPS else LocalProtocolError(text)
    return nxt


@dataclass(eq=False)
class Outbox:
    """One outbound stream: the rows still to send to ``peer`` and the credit left for them."""

    peer: str
    stream: str
    table: pa.Table | None
    credit: int
    max_credit: int
    offset: int = 0
    finished: bool = False


@dataclass(eq=False)
class FragmentRun:
    """One fragment running here; ``waiting`` are the members whose last batch has not arrived yet."""

    fragment: Fragment
    inbox: engine.Inbox | None
    waiting: set[str]
    done: bool = False
    #: what of its scanned tables this node served when the fragment first ran (``TableCatalog.served``)
    served: tuple[frozenset[str], ...] | None = None


@dataclass(eq=False)
class QueryState:
    """One query on this member: its phase, its fragments here, its streams and exchange calls."""

    id: QueryId
    phase: Phase
    created: float
    initiator: bool
    start: QueryStarted | None = None
    call_id: int | None = None
    owner: str | None = None  # the execute call's owner: only a cancel naming it ends the query
    pending: list[c.BatchReceived] = field(default_factory=list)
    runs: dict[int, FragmentRun] = field(default_factory=dict)
    outboxes: dict[tuple[str, str], Outbox] = field(default_factory=dict)
    inbound: set[tuple[str, str]] = field(default_factory=set)
    exchange: str = x.PUSH
    # binx and http: the sources pulled and the buffers being published, by call tag
    sources: dict[str, x.Fetch] = field(default_factory=dict)
    publishing: dict[str, x.Publish] = field(default_factory=dict)
    published: list[tuple[str, x.Publish]] = field(default_factory=list)  # (consumer, buffer)

    def step(self, step: Step) -> None:
        self.phase = next_phase(self.phase, step, str(self.id))
