"""The query role: initiator of the queries it starts, participant of everyone else's (Mustang 3).

One ``QueryRole`` per node, named ``"query"``, as Hazelcast's query service. Sans-IO: events in,
actions out (``sparkbus.bus.contract``).

Race rules (spec 3.5, protocol-facts 1.2):

* A batch for an unknown query on a participant creates the query's state lazily (``PENDING``); the
  batch is retained, unconsumed (so its credit bounds what a sender can pile up), and replayed on start.
* A batch for an unknown query on its initiator means the query finished: it is discarded.
* A ``PENDING`` state older than the check period is suspected: its ids go to the initiator in one
  ``QueriesSuspected`` per initiator; those answered in ``QueriesInactive`` are released.
* A cancel goes from where the failure happened to the initiator, which broadcasts it to every
  participant, the one it came from too (at most 2N messages); a cancel received from the initiator is
  not propagated.
* A lost peer fails every query that needs it at once (``MEMBER_LEAVE``); a participant that loses its
  initiator releases the query silently (the initiator is gone, nobody is left to tell).

Choices where the spec is silent: the participant list defaults to this node and every peer that is up
and runs the query role (``QueryConfig.members``; a node without a partition of the table sends an empty
last batch, "no data"); the initial credit per edge is 1 MiB, equal to the bus's default so a stream
opened before ``start`` arrives gets the same credit; a batch is at most 40 % of the edge's credit so a
starved sender always triggers a grant (a row wider than that fails its query with ``DATA_EXCEPTION``
under push: see ``_pump``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.bus.config import BusConfig
from sparkbus.roles.query import engine
from sparkbus.roles.query import exchange as x
from sparkbus.roles.query.catalog import SOURCES_READY, SourcePending
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, QueryError
from sparkbus.roles.query.expressions import fold, resolve
from sparkbus.roles.query.messages import (
    MESSAGES,
    QueriesInactive,
    QueriesSuspected,
    QueryCancelled,
    QueryId,
    QueryStarted,
    parse_stream_key,
    stream_key,
)
from sparkbus.roles.query.plan import Fragment, PlanNode, Scan, chain, fragment_to_plain, plan_from_plain
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.pulled import PulledExchange
from sparkbus.roles.query.sql import parse_sql
from sparkbus.roles.query.state import FragmentRun, Outbox, Phase, QueryState, Step

_CHECK_TIMER = "check"
_TIMEOUT_TIMER = "timeout/"
#: a pushed batch is at most this share of its edge's credit: the grant policy's low watermark (see _pump)
_BATCH_SHARE = BusConfig().low_watermark


#: queries whose fragments the initiator keeps, by SQL text, participants and repartition (with the logical
#: plan they were made for: a GROUP BY name's meaning can change with the table's columns)
_PLAN_CACHE = 256


class QueryRole(PulledExchange):
    """Initiator and participant of distributed queries over this node's table partitions.

    Local calls:
        ``execute``: ``sql`` (str) or ``plan`` (a plain logical plan); optional ``parameters`` (list),
            ``participants`` (list of members that run the query role; default: this node and every such
            peer that is up), ``timeout`` (seconds), ``repartition`` (bool),
            ``exchange`` (``push``, ``binx`` or ``http``; ``docs/QUERY.md``, section Exchanges), ``owner``
            (str: who may cancel it by name). Replies with the result as Arrow IPC stream bytes, or an error
            ``[code NAME] message (...)``.
        ``cancel``: ``query_id`` (str), ``call_id`` (the execute call) or ``owner`` (str, what the execute
            call gave as its ``owner``, as the client gateway names a client's request); replies True if it
            cancelled.
        ``load``: ``table`` (str), ``batches`` (list of Arrow IPC row batches), optional ``replace``;
            replies with the partition's row count. A table of ``declared`` is refused, on every node.

    Args:
        member: this node's member id (its bus node name).
        config: settings.
        store: the partitions (a new empty store by default).
        incarnation: makes query ids unique across restarts of this member (random by default; pass a
            fixed one in deterministic simulations).
        declared: the tables the topology declares (``[tables.*]``), whose rows live in replicated
            partitions: ``load`` refuses them, as a node's own copy would be scanned beside those partitions
            and every query would count its rows twice (compared case-insensitively, as SQL names are).
        replicating: the nodes that store those partitions (run ``replication``): a declared table that no
            participant serves fails with MEMBER_LEAVE when none of them takes part, and is not loaded
            (PARSING) when some do.
    """

    name = "query"
    messages: ClassVar[tuple[type, ...]] = (*MESSAGES, x.ExchangeChosen)

    def __init__(
        self,
        member: str,
        *,
        config: QueryConfig | None = None,
        store: engine.PartitionStore | None = None,
        incarnation: str | None = None,
        declared: Iterable[str] = (),
        replicating: Iterable[str] = (),
    ) -> None:
        self.member = member
        self.declared = {fold(name): name for name in declared}
        self.replicating = frozenset(replicating)
        self.config = config or QueryConfig()
        self.store = store if store is not None else engine.PartitionStore()
        self.incarnation = incarnation if incarnation is not None else uuid.uuid4().hex[:12]
        self.queries: dict[QueryId, QueryState] = {}
        self.calls: dict[int, QueryId] = {}
        self.peers_up: set[str] = set()
        self.counters: Counter[str] = Counter()
        self._next_local = 0
        #: (sql, participants, repartition) -> the logical plan, its fragments and their plain form, the oldest
        #: first
        self._plans: dict[
            tuple[str, tuple[str, ...], bool], tuple[PlanNode, tuple[Fragment, ...], tuple[Any, ...]]
        ] = {}
        self._check_at: float | None = None
        self._chosen: dict[QueryId, str] = {}  # ExchangeChosen received, start not yet
        self._tags: dict[str, QueryId] = {}  # binx/http call tag -> its query
        self._next_tag = 0
        # Buffers published for each consumer peer by queries that completed here: aborted if that peer is
        # lost before it deleted them (bounded; an older entry is dropped, and its buffer waits for DELETE).
        self._handed: dict[str, dict[x.Publish, None]] = {}
        # Fragments whose scan met a published table still being read (``SourcePending``), with the rows
        # they had received: run again at the publisher's ``SOURCES_READY``, if their query still runs.
        self._source_waits: dict[tuple[QueryId, int], tuple[FragmentRun, pa.Table | None]] = {}

    # ------------------------------------------------------------------ dispatch

    def handle(self, event: c.Event, now: float) -> list[c.Action]:
        """React to one bus event at time ``now``."""
        out: list[c.Action] = []
        if isinstance(event, c.BatchReceived):
            self._on_batch(event, now, out)
        elif isinstance(event, c.CreditChanged):
            self._on_credit(event, out)
        elif isinstance(event, c.MessageReceived):
            self._on_message(event.peer, event.message, now, out)
        elif isinstance(event, c.LocalCall):
            self._on_call(event, now, out)
        elif isinstance(event, c.CallResult):
            self._on_call_result(event, out)
        elif isinstance(event, c.TimerFired):
            self._on_timer(event.key, now, out)
        elif isinstance(event, c.PeerUp):
            if not event.connection_id:  # a thin client's session is not a query member
                self.peers_up.add(event.peer)
        elif isinstance(event, c.PeerLost):
            self._on_peer_lost(event.peer, out)
        elif isinstance(event, c.HandlerFailed):
            self._on_handler_failed(event, out)
        return out

    def _on_handler_failed(self, ev: c.HandlerFailed, out: list[c.Action]) -> None:
        """Our ``handle`` raised (or the bus could not carry out one of our actions): the actions of that
        call were dropped, so the query the event belonged to could wait for ever. End it instead."""
        self.counters["handler_failed"] += 1
        qid = self._query_of(ev.event)
        q = self.queries.get(qid) if qid is not None else None
        if q is None:
            return
        peer = getattr(ev.event, "peer", None)
        if isinstance(peer, str) and not self._has_say(q, peer):
            return  # a peer outside the query cannot end it (its message or batch was refused)
        if isinstance(ev.event, c.MessageReceived) and not q.initiator and peer != q.id.member:
            return  # nor, on a participant, a message from anyone but the initiator (refused, nothing changed)
        text = f"internal error on {self.member} at {type(ev.event).__name__}: {ev.error}"
        self._fail(q, ErrorCode.GENERIC, text, self.member, out)

    def _query_of(self, event: Any) -> QueryId | None:
        """The query an event (or an action of ours) belongs to, when it can be known."""
        stream = getattr(event, "stream", None)
        if isinstance(stream, str):
            try:
                return parse_stream_key(stream)[0]
            except ValueError:
                return None
        if isinstance(event, c.MessageReceived | c.Send):
            qid = getattr(event.message, "query_id", None)
            return qid if isinstance(qid, QueryId) else None
        if isinstance(event, c.LocalCall | c.Reply):
            return self.calls.get(event.call_id)
        if isinstance(event, c.CallResult | c.Call):
            return self._tags.get(event.tag)
        if isinstance(event, c.TimerFired) and event.key.startswith(_TIMEOUT_TIMER):
            try:
                return QueryId.parse(event.key[len(_TIMEOUT_TIMER) :])
            except ValueError:
                return None
        return None

    def _has_say(self, q: QueryState, peer: str) -> bool:
        """Whether ``peer`` takes part in ``q`` (its initiator, or one of its participants)."""
        return peer in (self.member, q.id.member) or (q.start is not None and peer in q.start.participants)

    def _failed_unexpectedly(self, q: QueryState, exc: Exception, where: str, out: list[c.Action]) -> None:
        """An operator raised something no check foresaw (a bug, or data it cannot handle): the query ends
        with ``DATA_EXCEPTION`` naming it, rather than waiting for ever."""
        self.counters["unexpected_errors"] += 1
        self._fail(q, ErrorCode.DATA_EXCEPTION, f"{where}: {type(exc).__name__}: {exc}", self.member, out)

    def _failed_at(
        self, q: QueryState, exc: Exception, where: str, out: list[c.Action], *, named: bool = True
    ) -> None:
        """``exc`` was raised at ``where`` while ``q`` ran: a ``QueryError`` fails it with its own code (its
        message after ``where`` when ``named``), anything else as ``_failed_unexpectedly``."""
        if isinstance(exc, QueryError):
            self._fail(q, exc.code, f"{where}: {exc.message}" if named else exc.message, self.member, out)
        else:
            self._failed_unexpectedly(q, exc, where, out)

    # ------------------------------------------------------------------ local calls

    def _on_call(self, call: c.LocalCall, now: float, out: list[c.Action]) -> None:
        try:
            if call.name == "execute":
                self._execute(call, now, out)
            elif call.name == "cancel":
                out.append(c.Reply(call_id=call.call_id, result=self._cancel_call(call.args, out)))
            elif call.name == "load":
                out.append(c.Reply(call_id=call.call_id, result=self._load(call.args)))
            elif call.name == SOURCES_READY:
                out.append(c.Reply(call_id=call.call_id, result=None))
                self._sources_ready(out)
            else:
                out.append(c.Reply(call_id=call.call_id, error=f"unknown call {call.name!r}"))
        except QueryError as exc:
            out.append(c.Reply(call_id=call.call_id, error=exc.describe()))
        except Exception as exc:
            # Not foreseen by any check: the call is still answered (through its query, if it has one).
            qid = self.calls.get(call.call_id)
            q = self.queries.get(qid) if qid is not None else None
            if q is not None:
                self._failed_unexpectedly(q, exc, call.name, out)
            else:
                self.counters["unexpected_errors"] += 1
                error = QueryError(ErrorCode.GENERIC, f"{call.name}: {type(exc).__name__}: {exc}")
                out.append(c.Reply(call_id=call.call_id, error=error.describe()))

    def _load(self, args: dict[str, Any]) -> int:
        table, batches = args.get("table"), args.get("batches")
        if not isinstance(table, str) or not isinstance(batches, list | tuple):
            raise ExecutionError("load takes table (str) and batches (a list of Arrow IPC row batches)")
        name = self.declared.get(fold(table))
        if name is not None:
            raise ExecutionError(
                f"{table} is a replicated table of the topology ([tables.{name}]): load it through its "
                f"partitions' leaders (`sparkbus load {name} FILE --topology FILE`), not into one node's catalog"
            )
        return self.store.load(table, engine.table_from_ipc(batches), replace=bool(args.get("replace")))

    def _logical(self, args: dict[str, Any]) -> PlanNode:
        sql, plan = args.get("sql"), args.get("plan")
        if isinstance(sql, str) and plan is None:
            return parse_sql(sql, self._columns)
        if sql is None and plan is not None:
            return plan_from_plain(plan)
        raise QueryError(ErrorCode.PARSING, "execute takes either sql (str) or plan (a plain plan tree)")

    def _columns(self, table: str) -> list[str] | None:
        """The columns of this node's partition of ``table``, None when it holds none: what a GROUP BY name
        that is also a select-list alias needs (``parse_sql``)."""
        found = resolve(table, self.store.names(), "table")
        rows = self.store.get(found) if found is not None else None
        return None if rows is None else list(rows.column_names)

    def _execute(self, call: c.LocalCall, now: float, out: list[c.Action]) -> None:
        args = call.args
        logical = self._logical(args)
        participants = args.get("participants")
        members = self.config.members
        if participants is None:
            peers = self.peers_up if members is None else self.peers_up & members
            participants = [self.member, *sorted(peers - {self.member})]
        if not isinstance(participants, list | tuple) or not all(isinstance(p, str) for p in participants):
            raise QueryError(ErrorCode.PARSING, "participants must be a list of member ids")
        if members is not None and (outside := [p for p in participants if p not in {*members, self.member}]):
            raise QueryError(ErrorCode.PARSING, f"member(s) {', '.join(outside)} run no query role")
        down = [p for p in participants if p != self.member and p not in self.peers_up]
        if down:
            raise QueryError(ErrorCode.MEMBER_CONNECTION, f"no connection to member(s) {', '.join(down)}")
        kind = x.exchange_kind(args.get("exchange", self.config.exchange), curve=self.config.curve)
        timeout = args.get("timeout", self.config.default_timeout)
        if not isinstance(timeout, int | float) or timeout < 0:
            raise QueryError(ErrorCode.PARSING, f"timeout must be seconds >= 0, got {timeout!r}")
        owner = args.get("owner")
        if owner is not None and not isinstance(owner, str):
            raise QueryError(ErrorCode.PARSING, f"owner must be a str, got {type(owner).__name__}")
        parameters = args.get("parameters")
        if parameters is not None and not isinstance(parameters, list | tuple):
            raise QueryError(ErrorCode.PARSING, f"parameters must be a list, got {type(parameters).__name__}")
        repartition = bool(args.get("repartition"))
        sql = args.get("sql")
        key = (sql, tuple(participants), repartition) if isinstance(sql, str) else None
        planned = self._plans.get(key) if key is not None else None
        if planned is None or planned[0] != logical:
            fragments = plan_fragments(
                logical, initiator=self.member, participants=participants, repartition=repartition
            )
            planned = (logical, fragments, tuple(fragment_to_plain(f) for f in fragments))
            if key is not None:
                if len(self._plans) >= _PLAN_CACHE:
                    del self._plans[next(iter(self._plans))]  # the oldest
                self._plans[key] = planned
        _, fragments, plain = planned
        self._next_local += 1
        qid = QueryId(member=self.member, local=f"{self.incarnation}.{self._next_local}")
        edges = {f.send.edge for f in fragments if f.send is not None}
        try:
            start = QueryStarted(
                query_id=qid,
                fragments=plain,
                parameters=tuple(parameters or ()),
                participants=tuple(dict.fromkeys([self.member, *participants])),
                edge_credits=dict.fromkeys(sorted(edges), self.config.edge_credit),
                timeout=float(timeout),
            )
        except (TypeError, ValueError) as exc:
            raise QueryError(ErrorCode.PARSING, str(exc)) from None
        q = QueryState(
            id=qid,
            phase=Phase.PENDING,
            created=now,
            initiator=True,
            start=start,  # before start goes out: whatever fails from here on cancels its participants
            call_id=call.call_id,
            owner=owner,
            exchange=kind,
        )
        self.queries[qid] = q
        self.calls[call.call_id] = qid
        self.counters["started"] += 1
        for p in start.participants:
            if p != self.member:
                if kind != x.PUSH:
                    out.append(c.Send(peer=p, message=x.ExchangeChosen(query_id=qid, exchange=kind)))
                out.append(c.Send(peer=p, message=start))
        if timeout > 0:
            out.append(c.SetTimer(key=f"{_TIMEOUT_TIMER}{qid}", at=now + timeout))
        self._start(q, start, now, out)

    def _cancel_call(self, args: dict[str, Any], out: list[c.Action]) -> bool:
        qid: QueryId | None = None
        if "owner" in args:  # a gateway's client: its own queries only, whatever else the call names
            owner = args["owner"]
            qid = next((q.id for q in self.queries.values() if q.initiator and q.owner == owner), None)
        elif isinstance(args.get("call_id"), int):
            qid = self.calls.get(args["call_id"])
        elif isinstance(args.get("query_id"), str):
            try:
                qid = QueryId.parse(args["query_id"])
            except ValueError:
                qid = None
        q = self.queries.get(qid) if qid is not None else None
        if q is None or not q.initiator:
            return False
        self._fail(q, ErrorCode.CANCELLED_BY_USER, "cancelled by the user", self.member, out)
        return True

    # ------------------------------------------------------------------ start

    def _start(self, q: QueryState, start: QueryStarted, now: float, out: list[c.Action]) -> None:
        q.step(Step.START)
        q.start = start
        by_edge = {f.send.edge: f for f in start.decoded if f.send is not None}
        for f in start.decoded:
            if self.member not in f.members:
                continue
            rec = f.receive
            waiting: set[str] = set()
            if rec is not None:
                waiting = set(by_edge[rec.edge].members)
                for s in waiting:
                    if q.exchange in x.PULLED:
                        if s != self.member:  # output to oneself is handed over when it is made
                            index = f.members.index(self.member)
                            fetch = x.Fetch(q.id, rec.edge, s, index, x.CLIENT_OF[q.exchange])
                            out.append(x.fetch_call(self._tag(q, q.sources, fetch), fetch))
                        continue
                    key = stream_key(q.id, rec.edge)
                    q.inbound.add((s, key))
                    if s == self.member or s in self.peers_up:
                        out.append(c.AcceptStream(peer=s, stream=key, credit=start.edge_credits[rec.edge]))
            q.runs[f.id] = FragmentRun(
                fragment=f, inbox=engine.Inbox(f.root) if rec is not None else None, waiting=waiting
            )
            if q.exchange in x.PULLED and f.send is not None:
                self._create_buffers(q, f.send.edge, out)
        pending, q.pending = q.pending, []
        for batch in pending:
            if q.phase is not Phase.RUNNING:
                return
            self._batch_for(q, batch, out)
        for run in list(q.runs.values()):
            if q.phase is Phase.RUNNING and run.inbox is None and not run.done:
                self._run_fragment(q, run, None, out)

    def _run_fragment(
        self, q: QueryState, run: FragmentRun, received: pa.Table | None, out: list[c.Action]
    ) -> None:
        assert q.start is not None
        start = q.start
        run.done = True
        scanned = [op.table for op in chain(run.fragment.root) if isinstance(op, Scan)]
        if scanned and (why := self.store.unserved(scanned, start.participants)) is not None:
            # Rows a leader outside the query holds would be missing, or rows two nodes serve counted
            # twice: fail the query rather than answer it short or long (a transient state, as a member
            # leaving is).
            self._fail(q, ErrorCode.MEMBER_LEAVE, why, self.member, out)
            return
        if run.served is not None and (why := self._served_since(run, scanned)) is not None:
            self._fail(q, ErrorCode.MEMBER_LEAVE, why, self.member, out)
            return
        try:
            folded = run.inbox is not None and run.inbox.folded
            table = engine.run(run.fragment.root, self.store, start.parameters, received, folded=folded)
        except SourcePending:
            # Read in steps by its publisher so that the loop keeps running: wait (the query's timeout
            # still bounds it) rather than fail the query with a transient MEMBER_LEAVE.
            if run.served is None:  # what the other members' scans, run about now, took this node to serve
                run.served = self.store.served(scanned)
            run.done = False
            self._source_waits[(q.id, id(run))] = (run, received)
            self.counters["source_waits"] += 1
            return
        except Exception as exc:
            self._failed_at(q, exc, f"fragment {run.fragment.id}", out, named=False)
            return
        send = run.fragment.send
        if send is None:
            self._deliver(q, table, out)
            return
        receivers = next(
            f.members for f in start.decoded if f.receive is not None and f.receive.edge == send.edge
        )
        parts: list[pa.Table | None]
        if send.mode == "hash" and table is not None:
            try:
                parts = list(engine.hash_partition(table, send.keys, len(receivers)))
            except Exception as exc:
                self._failed_at(q, exc, "hash partition", out, named=False)
                return
        else:
            parts = [table] * len(receivers)
        if q.exchange in x.PULLED:
            self._publish(q, send.edge, receivers, parts, out)
            return
        key = stream_key(q.id, send.edge)
        credit = start.edge_credits[send.edge]
        for peer, part in zip(receivers, parts, strict=True):
            if peer != self.member and peer not in self.peers_up:
                self._fail(
                    q, ErrorCode.MEMBER_CONNECTION, f"no connection to member {peer}", self.member, out
                )
                return
            box = q.outboxes[(peer, key)] = Outbox(
                peer=peer, stream=key, table=part, credit=credit, max_credit=credit
            )
            out.append(c.OpenStream(peer=peer, stream=key, credit=credit))
            self._pump(q, box, out)
            if q.phase is not Phase.RUNNING:
                return
        self._maybe_complete(q, out)

    def _served_since(self, run: FragmentRun, scanned: list[str]) -> str | None:
        """Why a fragment that waited for its sources may not run again here, or None. The other members
        scanned when it first ran: had the partitions this node serves changed since (a leadership moved
        while the rows were read), each coverage check would pass in its own moment and a partition be
        counted by no member, or by two."""
        assert run.served is not None
        for table, before, now in zip(scanned, run.served, self.store.served(scanned), strict=True):
            if before != now:
                moved = sorted(before ^ now)
                return (
                    f"the partitions of {table} {self.member} serves changed while its rows were read "
                    f"({', '.join(moved)}): leadership moved"
                )
        return None

    def _sources_ready(self, out: list[c.Action]) -> None:
        """Sources a scan waited for are read (or will not be): run those fragments again; each checks
        coverage anew and may wait again."""
        waiting, self._source_waits = self._source_waits, {}
        for (qid, _), (run, received) in waiting.items():
            q = self.queries.get(qid)
            if q is None or q.phase is not Phase.RUNNING or q.start is None or run.done:
                continue  # failed, cancelled or released meanwhile, or run again already
            self._run_fragment(q, run, received, out)

    def _deliver(self, q: QueryState, table: pa.Table | None, out: list[c.Action]) -> None:
        if table is None:
            assert q.start is not None
            tables = sorted(
                {op.table for f in q.start.decoded for op in chain(f.root) if isinstance(op, Scan)}
            )
            declared = [t for t in tables if fold(t) in self.declared]
            if declared and not self.replicating & set(q.start.participants):
                # The topology declares it and no node that stores it takes part (down, or not connected
                # yet): a transient state to retry, not the user's mistake. With its stores taking part it
                # holds no rows yet, and is not loaded (below).
                why = (
                    f"table {', '.join(declared)} is declared by the topology, but no node that serves its "
                    "partitions takes part in this query (its nodes are down or not connected yet)"
                )
                self._fail(q, ErrorCode.MEMBER_LEAVE, why, self.member, out)
                return
            self._fail(
                q,
                ErrorCode.PARSING,
                f"table {', '.join(tables)} is not loaded on any participant",
                self.member,
                out,
            )
            return
        if q.call_id is not None:
            out.append(c.Reply(call_id=q.call_id, result=engine.table_to_ipc(table)))
            q.call_id = None
        self.counters["completed"] += 1
        self._maybe_complete(q, out)

    # ------------------------------------------------------------------ streams

    def _pump(self, q: QueryState, box: Outbox, out: list[c.Action]) -> None:
        """Send what the credit allows; a batch is at most 40 % of the edge credit (see the module doc).

        A sender waits when its credit is below the next batch; since a batch is at most 40 % of the
        edge's credit, the sender is then at or below the low watermark and the receiver will grant. A
        batch can only be larger when it holds one row wider than that: its sender could wait above the
        watermark for a grant that never comes, so the query fails instead (whatever the credit left, so
        that the outcome does not depend on timing).
        """
        while not box.finished:
            if box.table is None:
                out.append(c.SendBatch(peer=box.peer, stream=box.stream, data=b"", last=True))
                box.finished = True
                break
            total = box.table.num_rows
            # Full-size batches only: filling a small leftover credit with a tiny batch would make every later
            # grant small too (the silly-window syndrome). Waiting is safe: see the docstring.
            limit = int(box.max_credit * _BATCH_SHARE)
            target = max(1, min(self.config.batch_bytes, limit))
            data, rows = x.next_batch(box.table, box.offset, target)
            if len(data) > limit:  # one row (next_batch halves batches of more down to the target)
                msg = (
                    f"a row of {len(data)} bytes (as one batch) exceeds the batch limit of {limit} bytes, "
                    f"{_BATCH_SHARE:.0%} of the edge credit {box.max_credit}"
                )
                self._fail(q, ErrorCode.DATA_EXCEPTION, msg, self.member, out)
                return
            if len(data) > box.credit:
                return  # starved: CreditChanged resumes
            last = box.offset + rows >= total
            out.append(c.SendBatch(peer=box.peer, stream=box.stream, data=data, last=last))
            self.counters["batches_out"] += 1
            self.counters["bytes_out"] += len(data)
            box.credit -= len(data)
            box.offset += rows
            box.finished = last

    def _on_batch(self, ev: c.BatchReceived, now: float, out: list[c.Action]) -> None:
        try:
            qid, _ = parse_stream_key(ev.stream)
        except ValueError as exc:
            raise c.RemoteProtocolError(f"batch from {ev.peer}: {exc}") from None
        q = self.queries.get(qid)
        if q is None:
            if qid.member == self.member:
                # Our own query is over: whatever still arrives for it is stale.
                self.counters["batches_discarded"] += 1
                out.append(c.CloseStream(peer=ev.peer, stream=ev.stream))
                return
            q = self.queries[qid] = QueryState(id=qid, phase=Phase.PENDING, created=now, initiator=False)
            self.counters["created_by_batch"] += 1
            self._arm_check(now, out)
        if q.phase is Phase.PENDING:
            q.step(Step.BATCH)
            q.pending.append(ev)
            q.inbound.add((ev.peer, ev.stream))
            return
        self._batch_for(q, ev, out)

    @staticmethod
    def _receiving(q: QueryState, edge: int) -> FragmentRun | None:
        return next(
            (
                r
                for r in q.runs.values()
                if r.fragment.receive is not None and r.fragment.receive.edge == edge
            ),
            None,
        )

    def _batch_for(self, q: QueryState, ev: c.BatchReceived, out: list[c.Action]) -> None:
        if not self._has_say(q, ev.peer):  # a peer outside the query cannot end it: its stream is closed
            self.counters["batches_refused"] += 1
            q.inbound.discard((ev.peer, ev.stream))
            out.append(c.CloseStream(peer=ev.peer, stream=ev.stream))
            return
        q.step(Step.BATCH)
        _, edge = parse_stream_key(ev.stream)
        run = self._receiving(q, edge)
        if run is None or run.inbox is None or ev.peer not in run.waiting:
            self._fail(
                q, ErrorCode.GENERIC, f"unexpected batch from {ev.peer} on {ev.stream}", self.member, out
            )
            return
        try:
            run.inbox.add(ev.data)
        except Exception as exc:
            self._failed_at(q, exc, f"batch from {ev.peer}", out)
            return
        self.counters["batches_in"] += 1
        out.append(c.Consumed(peer=ev.peer, stream=ev.stream, size=ev.size))
        if ev.last:
            run.waiting.discard(ev.peer)
            q.inbound.discard((ev.peer, ev.stream))
            out.append(c.CloseStream(peer=ev.peer, stream=ev.stream))
            if not run.waiting:
                self._run_fragment(q, run, run.inbox.table, out)

    def _on_credit(self, ev: c.CreditChanged, out: list[c.Action]) -> None:
        try:
            qid, _ = parse_stream_key(ev.stream)
        except ValueError:
            return
        q = self.queries.get(qid)
        box = q.outboxes.get((ev.peer, ev.stream)) if q is not None else None
        if q is None or box is None or box.finished:
            self.counters["credit_ignored"] += 1
            return
        q.step(Step.CREDIT)
        box.credit = ev.credit
        self._pump(q, box, out)
        if q.phase is Phase.RUNNING:
            self._maybe_complete(q, out)

    # ------------------------------------------------------------------ control messages

    def _on_message(self, peer: str, msg: Any, now: float, out: list[c.Action]) -> None:
        if isinstance(msg, QueryStarted):
            qid = msg.query_id
            if qid.member != peer or peer == self.member:
                raise c.RemoteProtocolError(f"start of query {qid} came from {peer}, not its initiator")
            if self.member not in msg.participants:
                raise c.RemoteProtocolError(
                    f"start of query {qid} from {peer}: {self.member} is not a participant"
                )
            q = self.queries.get(qid)
            if q is None:
                q = self.queries[qid] = QueryState(id=qid, phase=Phase.PENDING, created=now, initiator=False)
            q.exchange = self._chosen.pop(qid, x.PUSH)
            self._start(q, msg, now, out)
        elif isinstance(msg, x.ExchangeChosen):
            if msg.query_id.member != peer or peer == self.member:
                raise c.RemoteProtocolError(
                    f"exchange of query {msg.query_id} came from {peer}, not its initiator"
                )
            self._chosen[msg.query_id] = msg.exchange
        elif isinstance(msg, QueryCancelled):
            self._on_cancel(peer, msg, out)
        elif isinstance(msg, QueriesSuspected):
            inactive = tuple(i for i in msg.query_ids if i.member != self.member or i not in self.queries)
            out.append(c.Send(peer=peer, message=QueriesInactive(query_ids=inactive)))
        elif isinstance(msg, QueriesInactive):
            for qid in msg.query_ids:
                q = self.queries.get(qid)
                if q is not None and qid.member == peer and q.phase is Phase.PENDING:
                    self.counters["reaped"] += 1
                    self._release(q, Step.INACTIVE, out)
        else:
            raise c.RemoteProtocolError(f"query role got an unexpected {type(msg).__name__} from {peer}")

    def _on_cancel(self, peer: str, msg: QueryCancelled, out: list[c.Action]) -> None:
        q = self.queries.get(msg.query_id)
        if q is None:
            self.counters["cancel_unknown"] += 1
            if peer == msg.query_id.member:
                self._abort_handed(msg.query_id, out)
            return
        if q.initiator:
            if not self._has_say(q, peer):
                raise c.RemoteProtocolError(
                    f"cancel of query {msg.query_id} from {peer}, which is not one of its participants"
                )
            self._fail(q, msg.code, msg.message, msg.origin, out, sender=peer)
        elif peer == msg.query_id.member:
            self.counters["cancelled_remote"] += 1
            self._release(q, Step.CANCEL, out)
        else:
            raise c.RemoteProtocolError(
                f"cancel of query {msg.query_id} from {peer}, which is not its initiator"
            )

    # ------------------------------------------------------------------ failures and cleanup

    def _fail(
        self,
        q: QueryState,
        code: ErrorCode,
        message: str,
        origin: str,
        out: list[c.Action],
        *,
        sender: str | None = None,
    ) -> None:
        """End ``q`` with an error: tell the user (initiator) and the members that must know (2N at most).

        ``sender`` is the member whose cancel ends it (None: it failed here). The initiator tells every
        participant but itself, the sender too: a message names the member it came from, not the role, so
        the cancel may come from another role on that member while its query role still runs the query
        (its query role, if it sent the cancel, has released the query and ignores this one). ``origin``,
        which the sender chose, is only reported.
        """
        if q.phase is Phase.DONE:
            return
        if q.initiator:
            error = QueryError(code, message, query_id=str(q.id), origin=origin)
            if q.call_id is not None:
                out.append(c.Reply(call_id=q.call_id, error=error.describe()))
                q.call_id = None
            cancel = QueryCancelled(query_id=q.id, code=code, message=message, origin=origin)
            for p in q.start.participants if q.start is not None else ():
                if p != self.member and p in self.peers_up:
                    out.append(c.Send(peer=p, message=cancel))
        elif sender is None and q.phase is Phase.RUNNING and q.id.member in self.peers_up:
            cancel = QueryCancelled(query_id=q.id, code=code, message=message, origin=origin)
            out.append(c.Send(peer=q.id.member, message=cancel))
        self.counters["failed"] += 1
        self._release(q, Step.FAIL if sender is None else Step.CANCEL, out)

    def _maybe_complete(self, q: QueryState, out: list[c.Action]) -> None:
        if q.phase is not Phase.RUNNING or q.call_id is not None:
            return
        if (
            all(r.done for r in q.runs.values())
            and all(b.finished for b in q.outboxes.values())
            and not q.publishing
        ):
            self._release(q, Step.COMPLETE, out)

    def _release(self, q: QueryState, step: Step, out: list[c.Action]) -> None:
        q.step(step)
        if step is Step.INACTIVE and q.phase is not Phase.DONE:
            return
        for box in q.outboxes.values():
            if not box.finished and (box.peer == self.member or box.peer in self.peers_up):
                out.append(c.CloseStream(peer=box.peer, stream=box.stream))
        for peer, key in sorted(q.inbound):
            if peer == self.member or peer in self.peers_up:
                out.append(c.CloseStream(peer=peer, stream=key))
        if q.initiator and q.start is not None and q.start.timeout > 0:
            out.append(c.CancelTimer(key=f"{_TIMEOUT_TIMER}{q.id}"))
        self._release_binx(q, step, out)
        q.pending.clear()
        q.outboxes.clear()
        q.inbound.clear()
        q.runs.clear()
        self.queries.pop(q.id, None)
        for waiting in [k for k in self._source_waits if k[0] == q.id]:
            del self._source_waits[waiting]
        for call_id in [k for k, v in self.calls.items() if v == q.id]:
            del self.calls[call_id]

    def _on_peer_lost(self, peer: str, out: list[c.Action]) -> None:
        self.peers_up.discard(peer)
        for pub in self._handed.pop(peer, {}):
            out.append(x.abort_call(pub, f"consumer {peer} left"))
        for qid in [i for i in self._chosen if i.member == peer]:
            del self._chosen[qid]
        for q in list(self.queries.values()):
            if q.initiator:
                if q.start is not None and peer in q.start.participants:
                    self._fail(q, ErrorCode.MEMBER_LEAVE, f"member {peer} left the cluster", self.member, out)
            elif peer == q.id.member:
                # The initiator is gone: clean up locally, without messages (spec 3.3).
                self._release(q, Step.FAIL, out)
            elif q.phase is Phase.RUNNING and (
                any(p == peer for p, _ in [*q.inbound, *q.outboxes])
                or any(f.peer == peer for f in q.sources.values())
            ):
                self._fail(q, ErrorCode.MEMBER_LEAVE, f"member {peer} left the cluster", self.member, out)

    # ------------------------------------------------------------------ timers

    def _arm_check(self, now: float, out: list[c.Action]) -> None:
        if self._check_at is None:
            self._check_at = now + self.config.check_period
            out.append(c.SetTimer(key=_CHECK_TIMER, at=self._check_at))

    def _on_timer(self, key: str, now: float, out: list[c.Action]) -> None:
        if key == _CHECK_TIMER:
            self._check_at = None
            self._check(now, out)
        elif key.startswith(_TIMEOUT_TIMER):
            try:
                qid = QueryId.parse(key[len(_TIMEOUT_TIMER) :])
            except ValueError:
                return
            q = self.queries.get(qid)
            if q is not None and q.initiator:
                assert q.start is not None
                self._fail(
                    q, ErrorCode.TIMEOUT, f"query timed out after {q.start.timeout:g} s", self.member, out
                )

    def _check(self, now: float, out: list[c.Action]) -> None:
        """Ask each initiator about the queries here that never got start (protocol-facts 1.2)."""
        suspects: dict[str, list[QueryId]] = {}
        waiting = False
        for q in list(self.queries.values()):
            if q.phase is not Phase.PENDING:
                continue
            if q.id.member not in self.peers_up:
                self._release(q, Step.FAIL, out)
            elif now - q.created >= self.config.check_period:
                suspects.setdefault(q.id.member, []).append(q.id)
                waiting = True
            else:
                waiting = True
        for member, ids in sorted(suspects.items()):
            self.counters["checks_sent"] += 1
            out.append(c.Send(peer=member, message=QueriesSuspected(query_ids=tuple(ids))))
        if waiting:
            self._arm_check(now, out)
