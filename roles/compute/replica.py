"""The compute replica role (``compute.replica``): runs dataflows, answers peeks, reports frontiers.

The replica is a sans-IO state machine: commands arrive as ``MessageReceived`` from its controller; responses
leave as ``Send`` actions. Its connection follows the stage table in ``stages``. Commands of the
initialization stage are buffered and applied at ``InitializationComplete`` by ``_initialize``, which
reconciles them against the state of a previous connection exactly as protocol-facts 5.4 describes.

Choices where the spec is silent (also in docs/COMPUTE.md):

* "Halt" on an incompatible ``CreateInstance`` cannot exit a process here. The replica does what a halted
  and restarted Materialize replica ends up doing: it discards all of its state and builds the new
  connection's commands from scratch (``halts`` counts it).
* A connection is refused (an epoch not above every one seen, or a second controller) with a ``Status``
  naming its epoch, sent once back in ``DISCONNECTED``, so that its controller stops waiting on it; the
  rest of that connection's commands are ignored.
* A peek at an unknown collection, or whose collection is dropped or compacted past its timestamp while it
  waits, is answered with ``PeekResponse(ERROR)`` rather than treated as a protocol violation, since the
  protocol is asynchronous and a graceful answer is what a client can act on.
* A table is compacted by ``AllowCompaction`` with the table's id, as an index is; a table cannot be
  dropped, so the empty frontier for one is a protocol error. A replay whose ``since`` is at or beyond this
  replica's upper for the table is merged by difference (``_append``); a snapshot of another history than
  the one held (a restarted controller's table, ``storage.same_history``) replaces the table. A table the new
  connection sends no snapshot of is a previous controller's and is dropped at reconciliation. A command
  reconciliation cannot take is refused alone (logged, ``reconciliation_refusals``), and the rest applied.
* An append whose updates its table cannot take stops that table only (``refused``): the tables it
  advances still move, later appends skip it, peeks at times it will never reach get an ``Error``, and the
  subscribes over it get that error in a batch whose upper is closed. Dataflows over a table never created
  here (its first append refused) are not built (``unbuilt``), and answer the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import ClassVar

import pyarrow as pa

from sparkbus.bus.contract import (
    Action,
    Event,
    HandlerFailed,
    LocalCall,
    MessageReceived,
    PeerLost,
    RemoteProtocolError,
    Reply,
    Send,
)
from sparkbus.roles.compute.arrangement import (
    Arrangement,
    consolidate,
    encode_table,
    update_schema,
)
from sparkbus.roles.compute.dataflow import Dataflow, constrain, finish, index_key
from sparkbus.roles.compute.history import CommandHistory
from sparkbus.roles.compute.keyed import index_arrangement
from sparkbus.roles.compute.messages import (
    AllowCompaction,
    AllowWrites,
    AppendUpdates,
    CancelPeek,
    ComputeCommand,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    Frontiers,
    InitializationComplete,
    Peek,
    PeekResponse,
    PeekResult,
    Schedule,
    Status,
    SubscribeBatch,
    SubscribeDropped,
    TargetKind,
    UpdateConfiguration,
)
from sparkbus.roles.compute.reduction import ViewError
from sparkbus.roles.compute.stages import Input, Stage, StageError, next_stage
from sparkbus.roles.compute.storage import append_where, checked_updates, plan_append, same_history
from sparkbus.roles.compute.times import CLOSED, Frontier, readable

log = logging.getLogger(__name__)

_Reported = tuple[Frontier, Frontier, Frontier]


class LiveDataflow:
    """A built dataflow: its engine, its output arrangement (if it exports indexes) and its subscribes."""

    def __init__(self, desc: CreateDataflow, source_schema: pa.Schema) -> None:
        self.desc = desc
        self.as_of = desc.as_of[0]
        self.engine = Dataflow(desc.view, source_schema, self.as_of, desc.name)
        self.schema = self.engine.schema
        self.output = (
            index_arrangement(desc.view, self.schema, since=self.as_of, upper=self.as_of)
            if desc.index_exports
            else None
        )
        self.index_since: dict[str, int] = {e: self.as_of for e in desc.index_exports}
        self.subscribes: dict[str, int] = {s: self.as_of for s in desc.sink_exports}
        self.pending: list[pa.Table] = []
        self.upper = self.as_of
        self.input_upper = 0
        #: Frontiers are never reported below this (the as_of a reconnected controller asked for).
        self.floor = self.as_of
        self.scheduled = False
        #: Why the view could not be computed from its data; then its peeks and subscribes get this error.
        self.error: str | None = None
        #: Subscribes whose last batch closed their upper: nothing more is sent for them, not even a drop.
        self.ended: set[str] = set()

    @property
    def live_exports(self) -> list[str]:
        return [*self.index_since, *self.subscribes]

    def apply(self, updates: pa.Table, input_upper: int) -> pa.Table:
        """Feed complete source updates; returns the output updates.

        A view that fails on its data (an Arrow cast or kernel its values do not fit, an overflow) fails
        alone, as a Materialize dataflow's error stream would make it: its frontiers move on, it outputs
        nothing more, and the dataflows and tables fed by the same append go on. It stays failed until it
        is dropped, even once the offending rows are retracted: the failed step's output (its good rows
        too) never reached the index or the state, so going on from there would be wrong, and a subscriber
        cannot be told an error is taken back (Materialize poisons a subscribe until it is dropped). Created
        again, it is computed from the data as it is then; the error says so.
        """
        out: pa.Table | None = None
        if self.error is None:
            try:
                out = self.engine.feed(updates)
            except (pa.ArrowException, ArithmeticError) as exc:
                self.error = (
                    f"view {self.desc.name!r} failed on its data: {exc}; "
                    "a failed view stays failed until it is dropped: drop and create it again"
                )
                log.warning("compute.replica: %s", self.error)
        if out is None:
            out = update_schema(self.schema).empty_table()
        self.input_upper = max(self.input_upper, input_upper)
        self.upper = max(self.upper, input_upper, self.as_of)
        if self.output is not None:
            self.output.append(out, self.upper, self.engine.steps_of(out))
        if self.subscribes and out.num_rows:
            self.pending.append(out)
        return out


class ComputeReplica:
    """The replica side of the compute protocol.

    Attributes:
        stage: the stage of the current connection.
        controller: the peer the current connection is with (None when disconnected).
        halts: how many times an incompatible ``CreateInstance`` made the replica start over.
        reconciliation_failures: dataflows that could not be reused on a reconnect and were rebuilt.
        reconciliation_refusals: initialization commands refused at reconciliation (each logged; the others
            are applied). Outside reconciliation a refused command raises ``RemoteProtocolError``, which the
            node counts and logs.
    """

    name = "compute.replica"
    messages: ClassVar[tuple[type, ...]] = (
        CreateTimely,
        CreateInstance,
        InitializationComplete,
        AllowWrites,
        UpdateConfiguration,
        CreateDataflow,
        Schedule,
        AllowCompaction,
        Peek,
        CancelPeek,
        AppendUpdates,
    )

    def __init__(self) -> None:
        self.stage = Stage.DISCONNECTED
        self.controller: str | None = None
        self.epoch = -1
        #: The peer whose last ``CreateTimely`` was refused: the rest of that connection is ignored.
        self._refused: str | None = None
        self.halts = 0
        self.reconciliation_failures = 0
        self.reconciliation_refusals = 0
        self._reset_state()
        self._out: list[Action] = []

    def _reset_state(self) -> None:
        self.instance: CreateInstance | None = None
        #: Set by ``AllowWrites`` and kept across connections: the spec allows no way back to read-only.
        self._writes_allowed = False
        self.config = UpdateConfiguration()
        self.history = CommandHistory()
        self.tables: dict[str, Arrangement] = {}
        #: Tables whose last append this replica refused (``_append``), and why: they stay at their upper.
        self.refused: dict[str, str] = {}
        #: Exports of the dataflows not built because a refused table is under them, and why (``_create``).
        self.unbuilt: dict[str, str] = {}
        self.dataflows: list[LiveDataflow] = []
        self._by_export: dict[str, LiveDataflow] = {}
        self.peeks: dict[str, Peek] = {}
        self._reported: dict[str, _Reported] = {}
        self._init_commands: list[ComputeCommand | AppendUpdates] = []
        self._new_instance: CreateInstance | None = None
        self._new_timely: CreateTimely | None = None

    # ---------------------------------------------------------------- public views

    @property
    def writes_allowed(self) -> bool:
        """True once ``AllowWrites`` arrived (read-write computation).

        It never goes back, not when the link is lost nor while the next connection initializes (the spec:
        "The replica cannot transition back to the read-only computation stage"); only a halt, which stands
        for a process restart, starts over read-only.
        """
        return self._writes_allowed

    def collection(self, id: str) -> Arrangement | None:
        """The arrangement of index ``id`` or table ``id`` (None if unknown or dropped)."""
        flow = self._by_export.get(id)
        if flow is not None:
            return flow.output
        return self.tables.get(id)

    def dataflow(self, export_id: str) -> LiveDataflow | None:
        return self._by_export.get(export_id)

    # ---------------------------------------------------------------- the role

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one event; raises ``RemoteProtocolError`` for a controller that broke the protocol."""
        self._out = []
        if isinstance(event, MessageReceived):
            self._on_message(event.peer, event.message)
        elif isinstance(event, PeerLost):
            if event.peer == self.controller:
                self.stage = Stage.DISCONNECTED
                self.controller = None
                self._init_commands = []
            if event.peer == self._refused:
                self._refused = None
        elif isinstance(event, LocalCall):
            self._out.append(
                Reply(call_id=event.call_id, error=f"compute.replica has no call {event.name!r}")
            )
        elif isinstance(event, HandlerFailed):
            log.warning("compute.replica: handling %r failed: %s", event.event, event.error)
        if self.stage in (Stage.READ_ONLY, Stage.READ_WRITE):
            self._flush()
        out, self._out = self._out, []
        return out

    def _step(self, peer: str, kind: Input) -> None:
        try:
            self.stage = next_stage(peer, self.stage, kind)
        except StageError as exc:
            raise RemoteProtocolError(str(exc)) from None

    def _on_message(self, peer: str, msg: object) -> None:
        if peer == self._refused and not isinstance(msg, CreateTimely):
            log.debug(
                "compute.replica: ignoring %s of the connection refused to %s", type(msg).__name__, peer
            )
            return
        if self.controller is not None and peer != self.controller:
            if isinstance(msg, CreateTimely):
                self._refuse(peer, msg, f"this replica is connected to {self.controller}")
                return
            raise RemoteProtocolError(
                f"{type(msg).__name__} from {peer}, but the controller is {self.controller}"
            )
        if isinstance(msg, CreateTimely):
            self._step(peer, Input.CREATE_TIMELY)
            if msg.epoch <= self.epoch:
                self.stage = Stage.DISCONNECTED
                self._refuse(peer, msg, f"epoch {msg.epoch} <= seen {self.epoch}")
                return
            self._refused = None
            self.epoch = msg.epoch
            self.controller = peer
            self._new_timely = msg
        elif isinstance(msg, CreateInstance):
            self._step(peer, Input.CREATE_INSTANCE)
            self._new_instance = msg
            self._init_commands = []
        elif isinstance(msg, InitializationComplete):
            self._step(peer, Input.INITIALIZATION_COMPLETE)
            self._initialize()
        elif isinstance(msg, AllowWrites):
            self._step(peer, Input.ALLOW_WRITES)
            self._writes_allowed = True
            self.history.push(msg)
        elif isinstance(msg, AppendUpdates):
            self._step(peer, Input.STORAGE)
            if self.stage is Stage.INITIALIZATION:
                self._init_commands.append(msg)
            else:
                self._append(msg)
        elif isinstance(
            msg, UpdateConfiguration | CreateDataflow | Schedule | AllowCompaction | Peek | CancelPeek
        ):
            self._step(peer, Input.COMPUTATION)
            if self.stage is Stage.INITIALIZATION:
                self._init_commands.append(msg)
            else:
                self.history.push(msg)
                self._execute(msg)
        else:
            raise RemoteProtocolError(f"compute.replica cannot handle {type(msg).__name__} from {peer}")

    def _refuse(self, peer: str, msg: CreateTimely, why: str) -> None:
        """Refuse the connection ``msg`` opens, and tell ``peer``: a ``Status`` naming the refused epoch. It
        is no response within the connection (the spec allows none in creation): the connection never
        starts. The rest of its commands are ignored.

        A connection is refused when its epoch is not above every one seen (a controller of an earlier
        generation, or one that reused its generation), or while another controller is connected."""
        self._refused = peer
        detail = f"CreateTimely from {peer}: {why}"
        log.warning("compute.replica: refused %s", detail)
        self._out.append(Send(peer=peer, message=Status(detail=detail, refused_epoch=msg.epoch)))

    # ---------------------------------------------------------------- initialization and reconciliation

    def _initialize(self) -> None:
        """Apply the buffered initialization commands, reusing what the previous connection built."""
        timely, new_instance = self._new_timely, self._new_instance
        assert timely is not None and new_instance is not None
        commands, self._init_commands = self._init_commands, []
        if self.instance is not None and not self.instance.compatible_with(new_instance):
            # Materialize halts the process here; a restarted replica has no state and builds everything anew.
            log.warning(
                "compute.replica: incompatible CreateInstance from %s (%r, was %r): starting over",
                self.controller,
                new_instance,
                self.instance,
            )
            self.halts += 1
            self._reset_state()
        # A table whose snapshot is another history than ours (a restarted controller's, rebuilt anew) cannot
        # be served from what we hold: it is loaded again from the snapshot, and the dataflows reading it are
        # built again.
        snapshots = [c for c in commands if isinstance(c, AppendUpdates) and c.lower == 0]
        reloaded = {c.id for c in snapshots if c.id in self.tables and not self._ours(c)}
        # The controller sends a snapshot of every table it has: a table it names none of is a previous
        # controller's (tables cannot be dropped), which would hold memory for good and keep its id from a
        # view of the new one. It goes, and so do the dataflows reading it (not reused).
        named = {c.id for c in snapshots}
        reloaded |= set(self.tables) - named
        for table_id in reloaded:
            del self.tables[table_id]
        # Each table's snapshot decides afresh whether it is refused, and what was not built is tried again.
        self.refused.clear()
        self.unbuilt.clear()
        old_flows = list(self.dataflows)
        by_exports = {frozenset(f.desc.export_ids): f for f in old_flows}
        retained: set[int] = set()
        plan: list[ComputeCommand | AppendUpdates] = []
        for command in commands:
            if isinstance(command, CreateDataflow):
                old = by_exports.get(frozenset(command.export_ids))
                if old is not None and not old.scheduled:
                    # Built but never run (the link broke between CreateDataflow and Schedule): nothing
                    # to keep, and its as_of may be below what its import has since been compacted to.
                    old = None
                if old is not None and self._reusable(old, command, retained, reloaded):
                    retained.add(id(old))
                    old.floor = command.as_of[0]
                    plan.extend(AllowCompaction(id=e, frontier=command.as_of) for e in command.index_exports)
                    continue
                if old is not None:
                    self.reconciliation_failures += 1
                    log.info("compute.replica: dataflow reconciliation failed for %s", command.name)
            plan.append(command)
        # Pending peeks belong to the old connection: drop them without a response.
        self.peeks.clear()
        for flow in old_flows:
            if id(flow) in retained:
                for e in flow.index_since:
                    self._reported.pop(e, None)
            else:
                for e in flow.live_exports:
                    self._drop_export(e, silent=True)
        self.instance = new_instance
        # The parameters are the new connection's alone (the spec: the replica's state matches what the
        # initialization commands request), as Materialize's controller sends every one: a reconnecting
        # controller's reduced history carries its merged UpdateConfiguration, and a controller that sets
        # none is not held to its predecessor's (a max_result_size it never asked for).
        self.config = UpdateConfiguration()
        self.history = CommandHistory()
        self.history.push(timely)
        self.history.push(new_instance)
        for command in commands:
            if not isinstance(command, AppendUpdates):
                self.history.push(command)
        self.history.push(InitializationComplete())
        for command in plan:
            try:
                if isinstance(command, AppendUpdates):
                    self._append(command, compared=True)
                else:
                    self._execute(command)
            except RemoteProtocolError as exc:
                # A command this replica cannot take is refused alone, as outside reconciliation (a table
                # refused, a dataflow not built), and the rest of the connection's state is built: raised,
                # it would leave the commands after it unapplied. Each command changes nothing until its
                # checks pass, so nothing is half applied.
                self.reconciliation_refusals += 1
                log.error("compute.replica: reconciliation refused %s: %s", type(command).__name__, exc)

    def _ours(self, snapshot: AppendUpdates) -> bool:
        """Whether ``snapshot`` continues the history of the table of its name we hold. Not if it cannot be
        read (``_append`` refuses it): what we hold cannot be told to be its history, and is dropped."""
        try:
            updates = checked_updates(snapshot, append_where(snapshot, self.controller))
        except RemoteProtocolError:
            return False
        return same_history(self.tables[snapshot.id], snapshot, updates)

    def _reusable(
        self, old: LiveDataflow, new: CreateDataflow, retained: set[int], reloaded: set[str]
    ) -> bool:
        if not old.desc.compatible_with(new) or old.desc.sink_exports or new.sink_exports:
            return False
        if new.view.source in reloaded:
            return False
        if len(old.index_since) != len(old.desc.index_exports):
            return False  # an export was dropped: compacted beyond any as_of
        if any(since > new.as_of[0] for since in old.index_since.values()):
            return False
        source = self._by_export.get(new.view.source)
        return source is None or id(source) in retained

    # ---------------------------------------------------------------- computation commands

    def _execute(self, command: ComputeCommand) -> None:
        if isinstance(command, UpdateConfiguration):
            self.config = self.config.update(command)
        elif isinstance(command, CreateDataflow):
            self._create(command)
        elif isinstance(command, Schedule):
            self._schedule(command.id)
        elif isinstance(command, AllowCompaction):
            self._compact(command.id, command.frontier)
        elif isinstance(command, Peek):
            self._peek(command)
        elif isinstance(command, CancelPeek) and self.peeks.pop(command.uuid, None) is not None:
            # A peek answered already is not pending any more: its CancelPeek is ignored.
            self._send(PeekResponse(uuid=command.uuid, result=PeekResult.CANCELED))

    def _source_schema(self, source: str, where: str) -> tuple[pa.Schema, Arrangement | LiveDataflow]:
        table = self.tables.get(source)
        if table is not None:
            return table.schema, table
        flow = self._by_export.get(source)
        if flow is not None and source in flow.index_since:
            return flow.schema, flow
        raise RemoteProtocolError(
            f"{where} imports {source!r}, which does not exist (peer {self.controller})"
        )

    def _create(self, desc: CreateDataflow) -> None:
        where = f"CreateDataflow {desc.name!r}"
        for e in desc.export_ids:
            if e in self._by_export or e in self.tables or e in self.unbuilt:
                raise RemoteProtocolError(
                    f"{where}: export id {e!r} is already in use (peer {self.controller})"
                )
        source = desc.view.source
        stopped = None if source in self._by_export else self._stopped(source)
        if stopped is not None and source not in self.tables:
            # The table under it was refused before it was created here (or a view over it was not built):
            # there is nothing to build it from, and nothing will come. Its peeks get the reason, and so do
            # its subscribes, at once and closed.
            self.unbuilt.update(dict.fromkeys(desc.export_ids, stopped))
            for sink in desc.sink_exports:
                self._send(SubscribeBatch(id=sink, lower=desc.as_of, upper=CLOSED, error=stopped))
            return
        schema, _ = self._source_schema(source, where)
        try:
            flow = LiveDataflow(desc, schema)
        except ViewError as exc:
            raise RemoteProtocolError(f"{exc} (peer {self.controller})") from None
        self.dataflows.append(flow)
        for e in desc.export_ids:
            self._by_export[e] = flow

    def _schedule(self, export_id: str) -> None:
        flow = self._by_export.get(export_id)
        if flow is None or flow.scheduled:
            return  # a retained dataflow is already running; a dropped one needs nothing
        source = flow.desc.view.source
        _, src = self._source_schema(source, f"Schedule {export_id!r}")
        arrangement = src if isinstance(src, Arrangement) else src.output
        assert arrangement is not None
        if not readable(flow.as_of, arrangement.since):
            raise RemoteProtocolError(
                f"dataflow {flow.desc.name!r}: import {source!r} is not readable at as_of {flow.as_of} "
                f"(since {arrangement.since}, peer {self.controller})"
            )
        flow.scheduled = True
        upper = arrangement.upper[0] if arrangement.upper else flow.as_of
        out = flow.apply(arrangement.snapshot(flow.as_of), upper)
        self._propagate(flow, out)

    def _propagate(self, flow: LiveDataflow, out: pa.Table) -> None:
        for e in flow.index_since:
            self._changed(e, out, flow.upper)

    def _changed(self, source: str, updates: pa.Table, upper: int) -> None:
        """Feed new updates of collection ``source`` (and its new upper) to the dataflows reading it."""
        for flow in self.dataflows:
            if flow.scheduled and flow.desc.view.source == source:
                self._propagate(flow, flow.apply(updates, upper))

    def _compact(self, export_id: str, frontier: Frontier) -> None:
        table = self.tables.get(export_id)
        if table is not None:
            if not frontier:
                raise RemoteProtocolError(
                    f"AllowCompaction({export_id!r}, ()) from {self.controller}: a table cannot be dropped"
                )
            table.compact(frontier)
            return
        if export_id in self.unbuilt:
            if not frontier:
                del self.unbuilt[export_id]  # never reported, and its subscribes were closed
            return
        flow = self._by_export.get(export_id)
        if flow is None:
            return  # already dropped: compaction of a dropped collection is a no-op
        if not frontier:
            self._drop_export(export_id, silent=False)
            return
        if export_id in flow.index_since and frontier[0] > flow.index_since[export_id]:
            flow.index_since[export_id] = frontier[0]
            assert flow.output is not None
            flow.output.compact((min(flow.index_since.values()),))

    def _drop_export(self, export_id: str, *, silent: bool) -> None:
        flow = self._by_export.pop(export_id, None)
        if flow is None:
            return
        if export_id in flow.subscribes:
            at = flow.subscribes.pop(export_id)
            if not silent and export_id not in flow.ended:  # after a closed upper, nothing (Materialize)
                self._send(SubscribeDropped(id=export_id, at=(at,)))
            flow.ended.discard(export_id)
        else:
            flow.index_since.pop(export_id, None)
            last = self._reported.pop(export_id, None)
            if not silent and last != (CLOSED, CLOSED, CLOSED):
                # After a drop the replica reports empty frontiers once, then nothing for this id.
                self._send(Frontiers(id=export_id, write=CLOSED, input=CLOSED, output=CLOSED))
            for uuid, peek in list(self.peeks.items()):
                if peek.target is TargetKind.INDEX and peek.target_id == export_id:
                    del self.peeks[uuid]
                    self._send(_error(uuid, f"collection {export_id!r} was dropped"))
        if not flow.live_exports:
            self.dataflows.remove(flow)
            if flow.output is not None:
                flow.output.compact(CLOSED)

    # ---------------------------------------------------------------- storage

    def _append(self, msg: AppendUpdates, *, compared: bool = False) -> None:
        """Apply ``msg`` to its table; ``compared``: a snapshot ``_initialize`` found to be our history.

        Everything is checked before anything changes. A table in ``advanced`` that does not exist or has a
        gap changes nothing. Updates the target table cannot take leave it as it was, and it is marked
        ``refused``; the tables in ``advanced`` still move their upper, since the append says they have no
        updates in ``[lower, upper)`` whatever is wrong with the target's. Later appends skip a refused
        table in their ``advanced``. Otherwise one refused append would leave every table it advances
        behind, and the replica would refuse every later append (each lists them) as a gap.
        """
        where = append_where(msg, self.controller)
        for other in msg.advanced:
            if other == msg.id or (other not in self.tables and other not in self.refused):
                raise RemoteProtocolError(
                    f"{where}: advanced table {other!r} does not exist or is the target"
                )
        advanced = [other for other in msg.advanced if other not in self.refused]
        for other in advanced:
            if self.tables[other].upper[0] < msg.lower:
                raise RemoteProtocolError(f"{where}: table {other!r} has a gap below lower")
        try:
            table = self.tables.get(msg.id)
            read = any(f.desc.view.source == msg.id for f in self.dataflows)
            plan = plan_append(table, msg, where, compared=compared, read=read)
        except RemoteProtocolError as exc:
            # The first refusal says what went wrong; later ones of the table are its gap.
            self.refused.setdefault(msg.id, str(exc))
            self._advance(advanced, msg.upper)
            raise
        self.refused.pop(msg.id, None)
        if plan.replace:
            del self.tables[msg.id]
        table = self.tables.get(msg.id)
        if table is None:
            table = self.tables[msg.id] = Arrangement(plan.schema, since=msg.since)
        if plan.fresh is not None:
            if plan.compact_to is not None:
                table.compact((plan.compact_to,))
            table.append(plan.fresh, msg.upper)
            self._changed(msg.id, plan.fresh, msg.upper)
        self._advance(advanced, msg.upper)

    def _advance(self, tables: list[str], upper: int) -> None:
        """Move the upper of ``tables`` (an append's ``advanced``) to ``upper``: no updates until then."""
        for other in tables:
            arrangement = self.tables[other]
            if upper > arrangement.upper[0]:
                arrangement.append(update_schema(arrangement.schema).empty_table(), upper)
                self._changed(other, update_schema(arrangement.schema).empty_table(), upper)

    # ---------------------------------------------------------------- peeks

    def _peek(self, peek: Peek) -> None:
        error = self._peek_error(peek)
        if error is not None:
            self._send(_error(peek.uuid, error))
        else:
            self.peeks[peek.uuid] = peek

    def _peek_target(self, peek: Peek) -> tuple[Arrangement | None, list[str]]:
        if peek.target is TargetKind.PERSIST:
            table = self.tables.get(peek.target_id)
            return table, list(table.schema.names) if table is not None else []
        flow = self._by_export.get(peek.target_id)
        if flow is None or peek.target_id not in flow.index_since:
            return None, []
        return flow.output, index_key(flow.desc.view, flow.schema)

    def _failure(self, flow: LiveDataflow | None) -> str | None:
        """The error of ``flow`` or of a view it reads, directly or not (None if they all compute)."""
        while flow is not None:
            if flow.error is not None:
                return flow.error
            flow = self._by_export.get(flow.desc.view.source)
        return None

    def _stopped(self, id: str) -> str | None:
        """Why collection ``id`` (a table, or a view or subscribe over one, built or not) moves no further
        here: the table under it stays at its upper, this replica having refused its updates (None: it
        does not)."""
        while id not in self.unbuilt:
            flow = self._by_export.get(id)
            if flow is None:
                reason = self.refused.get(id)
                if reason is None:
                    return None
                return f"table {id!r} stays at its upper: this replica refused its updates ({reason})"
            id = flow.desc.view.source
        return self.unbuilt[id]

    def _peek_error(self, peek: Peek) -> str | None:
        arrangement, _ = self._peek_target(peek)
        if arrangement is None:
            return self._stopped(peek.target_id) or f"collection {peek.target_id!r} does not exist"
        if peek.target is TargetKind.INDEX:
            failure = self._failure(self._by_export.get(peek.target_id))
            if failure is not None:
                return failure
        if arrangement.upper and peek.timestamp >= arrangement.upper[0]:
            # A time the collection will never reach here is answered now rather than never.
            refusal = self._stopped(peek.target_id)
            if refusal is not None:
                return refusal
        if not readable(peek.timestamp, arrangement.since):
            return (
                f"timestamp {peek.timestamp} is not readable for {peek.target_id!r}: "
                f"it is below the since {arrangement.since}"
            )
        return None

    def _answer(self, peek: Peek, arrangement: Arrangement, key: list[str]) -> PeekResponse:
        try:
            rows = arrangement.read_at(peek.timestamp)
            if peek.literal_constraints is not None:
                rows = constrain(rows, key, peek.literal_constraints)
            rows = finish(rows, peek.finishing)
        except (ValueError, KeyError, pa.ArrowException) as exc:
            return _error(peek.uuid, f"peek {peek.uuid} on {peek.target_id!r}: {exc}")
        data = encode_table(rows)
        limit = self.config.max_result_size
        if limit is not None and len(data) > limit:
            return _error(peek.uuid, f"result exceeds max size of {limit} bytes")
        return PeekResponse(uuid=peek.uuid, result=PeekResult.ROWS, rows=data)

    # ---------------------------------------------------------------- responses

    def _send(self, message: object) -> None:
        assert self.controller is not None
        self._out.append(Send(peer=self.controller, message=message))

    def _flush(self) -> None:
        """Send what changed: frontiers, subscribe batches, and answers to peeks whose time has come."""
        for flow in self.dataflows:
            if not flow.scheduled:
                continue
            upper = (max(flow.upper, flow.floor),)
            current: _Reported = (upper, (max(flow.input_upper, flow.floor),), upper)
            for e in flow.index_since:
                last = self._reported.get(e)
                if last != current:
                    self._reported[e] = current
                    changed = [
                        c if last is None or c != p else None
                        for c, p in zip(current, last or current, strict=True)
                    ]
                    self._send(Frontiers(id=e, write=changed[0], input=changed[1], output=changed[2]))
            self._flush_subscribes(flow)
        for uuid, peek in list(self.peeks.items()):
            arrangement, key = self._peek_target(peek)
            error = self._peek_error(peek)
            if error is not None:
                del self.peeks[uuid]
                self._send(_error(uuid, error))
            elif arrangement is not None and arrangement.upper and peek.timestamp < arrangement.upper[0]:
                del self.peeks[uuid]
                self._send(self._answer(peek, arrangement, key))

    def _flush_subscribes(self, flow: LiveDataflow) -> None:
        if not flow.subscribes:
            flow.pending = []
            return
        failure = self._failure(flow)
        stopped = self._stopped(flow.desc.view.source)
        for sink, lower in flow.subscribes.items():
            if sink in flow.ended:
                continue
            if flow.upper > lower:
                self._send_subscribe_batch(flow, sink, lower, failure)
            if stopped is not None:
                # The table under it stays at its upper here, so the subscribe can make no more progress:
                # it is told why, once, with a closed upper (nothing more will come), as a Materialize
                # subscribe is, which an error poisons until it is dropped.
                last = (flow.subscribes[sink],)
                self._send(SubscribeBatch(id=sink, lower=last, upper=CLOSED, error=failure or stopped))
                flow.ended.add(sink)
        flow.pending = []

    def _send_subscribe_batch(self, flow: LiveDataflow, sink: str, lower: int, failure: str | None) -> None:
        """Send subscribe ``sink`` its updates (or ``failure``) in ``[lower, flow.upper)``."""
        error, data = failure or "", b""
        if not error:
            parts = list(flow.pending)
            updates = (
                consolidate(pa.concat_tables(parts)) if parts else update_schema(flow.schema).empty_table()
            )
            data = encode_table(updates)
            limit = self.config.max_result_size
            if limit is not None and len(data) > limit:
                error, data = f"result exceeds max size of {limit} bytes", b""
        self._send(SubscribeBatch(id=sink, lower=(lower,), upper=(flow.upper,), error=error, updates=data))
        flow.subscribes[sink] = flow.upper


def _error(uuid: str, text: str) -> PeekResponse:
    return PeekResponse(uuid=uuid, result=PeekResult.ERROR, error=text)
