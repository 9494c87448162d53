"""The compute controller role (``compute.controller``): tables, views, peeks and subscribes over replicas.

The controller records every command in a ``CommandHistory`` and sends it to every connected replica. A
replica that connects (``PeerUp``), including one that failed and came back, is hydrated with a new epoch
(one more than its last) and the reduced history; the tables' contents follow ``CreateInstance`` as
``AppendUpdates`` snapshots, standing in for persist. Peeks and subscribes are answered by whichever replica
answers first (protocol-facts 5.5).

Local calls (``LocalCall.name`` and its ``args``):

* ``create_table(name, schema, key=None)``: ``name`` a non-empty str, ``schema`` a ``pyarrow.Schema`` or its IPC bytes, with distinct
  column names, none starting with ``__``, of types Arrow can group by (no list, struct or map). With ``key``
  (column names) the table is an upsert table, as Materialize's ``ENVELOPE UPSERT`` source: a written row
  replaces the row with the same key. Result ``{"upper"}``. A name taken is refused with what has it:
  ``'t' already exists: a table keyed by ['k']`` (or ``a table without a key``, or ``a view``).
* ``write(table, batch)``: ``batch`` an Arrow IPC stream of the table's columns and an optional int64
  ``__diff`` without nulls (default +1 per row; a retraction of a row the table does not hold leaves it at a
  negative multiplicity, see docs/COMPUTE.md; not for an upsert table, whose writes are rows, the last of a key
  in one batch winning). The controller assigns the write's time. Result ``{"time"}``.
* ``create_view(name, view)``: ``view`` a ``ViewDef``. Result ``{"as_of"}``.
* ``drop_view(name)``: a view no other view (nor a subscribe) reads; a new view may then take its name.
  Result None.
* ``peek(view, timestamp=None, literal_constraints=None, finishing=None, target_replica=None)``: completes
  with the rows as Arrow IPC bytes, or an error. ``finishing`` is a ``Finishing`` (the gateway converts a
  thin client's plain map). Without a timestamp it reads the latest write
  (read-your-writes). A table name peeks the table itself.
* ``cancel_peek(call_id)``: cancel the peek started by that call.
* ``subscribe(view, target_replica=None)``: result ``{"id", "as_of"}``; ``fetch(id)`` returns and clears
  the received batches; ``unsubscribe(id)``. An error batch (a failed view, a batch beyond
  ``max_result_size``, a replica's error it cannot get past) or a batch whose upper is closed is the last:
  the subscribe is dropped, ``dropped_at`` set to the upper delivered before it.
* ``allow_writes()``: for a controller created ``read_only``.

Choices where the spec is silent (also in docs/COMPUTE.md): timestamps are assigned by the controller, one
per write, shared by all tables (a write advances every table's frontier, as Materialize's table writes do);
a view is compacted to ``write frontier - 1 - compaction_lag`` and a table to ``last write -
compaction_lag``, but never past a pending peek's timestamp, the since a dependent view still reads at, or
one below the upper a subscribe has delivered. A cancel is answered at once, as Materialize's
``Instance::cancel_peek`` does (and MaterializeInc/materialize#11781 asks for when no replica is connected).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.bus.contract import (
    Action,
    Event,
    HandlerFailed,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Send,
)
from sparkbus.codecs import DecodeError
from sparkbus.roles.compute.arrangement import (
    DIFF,
    TIME,
    Arrangement,
    canonical_nans,
    decode_table,
    decoded,
    encode_table,
    i64,
    plain_schema,
    ungroupable,
    update_schema,
)
from sparkbus.roles.compute.dataflow import output_schema
from sparkbus.roles.compute.history import CommandHistory
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
from sparkbus.roles.compute.plans import Finishing, ViewDef
from sparkbus.roles.compute.reduction import ViewError
from sparkbus.roles.compute.stages import Input, Stage, StageError, next_stage
from sparkbus.roles.compute.times import Frontier, frontier_join, frontier_leq

#: A row-number column the upsert bookkeeping adds and drops (table columns never start with ``__``).
_ROW = "__row"


def _distinct(data: pa.Table, key: list[str]) -> bool:
    """Whether ``data`` holds each value of one key column once (``unique``, cheaper than a group-by);
    False for a composite key, or a key type ``unique`` has no kernel for: the general path decides."""
    if len(key) == 1:
        try:
            return bool(len(pc.unique(data.column(key[0]))) == data.num_rows)
        except pa.ArrowNotImplementedError:  # no hash kernel for the type
            pass
    return False


def _replaced(current: pa.Table, data: pa.Table, key: list[str]) -> pa.Array:
    """Which rows of ``current`` a key of ``data`` replaces: ``is_in`` over one key column, a semi-join for
    a composite key or a key type ``is_in`` has no kernel for (decimal32, decimal64, float16, a dictionary:
    every write to such a table failed with ArrowNotImplementedError)."""
    if len(key) == 1:
        try:
            return pc.is_in(current.column(key[0]), value_set=data.column(key[0]))
        except pa.ArrowNotImplementedError:
            pass
    numbered = current.select(key).append_column(_ROW, _row_numbers(current.num_rows))
    replaced = numbered.join(data.select(key), key, join_type="left semi", use_threads=False)
    return pc.is_in(numbered.column(_ROW), value_set=replaced.column(_ROW))


def _row_numbers(n: int) -> pa.Array:
    """0 .. n-1 as an int64 array, made by numpy (from a Python range, 600k took 0.2 s)."""
    return pa.array(np.arange(n, dtype=np.int64))


log = logging.getLogger(__name__)

TARGET_FAILED = "target replica failed or was dropped"
#: The largest ``generation``: epochs are ``generation << 32 | n``, and CreateTimely carries a uint64.
MAX_GENERATION = 2**32 - 1


@dataclass(slots=True)
class ReplicaLink:
    """What the controller knows of one replica: its epoch, connection stage and reported frontiers."""

    epoch: int = 0
    stage: Stage = Stage.DISCONNECTED
    frontiers: dict[str, Frontier] = field(default_factory=dict)
    #: Why the replica refused this connection's ``CreateTimely`` (its ``Status``); None if it did not.
    refused: str | None = None


@dataclass(slots=True)
class Collection:
    """A view's index or a subscribe, as the controller tracks it."""

    id: str
    source: str
    schema: pa.Schema
    as_of: int
    since: int
    subscribe: bool = False
    write: Frontier = (0,)


@dataclass(slots=True)
class PendingPeek:
    call_id: int
    target_id: str
    timestamp: int
    target_replica: str | None


@dataclass(slots=True)
class SubscribeState:
    """Batches received for a subscribe, not yet fetched; ``upper`` is the frontier delivered so far."""

    upper: int
    target_replica: str | None
    batches: list[tuple[int, int, bytes | None, str | None]] = field(default_factory=list)
    dropped_at: Frontier | None = None


class ComputeController:
    """The controller side of the compute protocol.

    Args:
        replicas: names of the replica peers to drive.
        instance: the ``CreateInstance`` every replica gets.
        config: an initial ``UpdateConfiguration`` (None: defaults).
        read_only: start without ``AllowWrites`` (send it later with the ``allow_writes`` call).
        compaction_lag: how many timestamps below the write frontier a view stays readable.
        workers: the timely worker count sent in ``CreateTimely``.
        generation: this controller's deployment generation (0 to ``MAX_GENERATION``), which must grow
            across controller restarts (``factories.next_generation``). Epochs are ``generation << 32 | n``
            for the n-th connection to a replica, so a restarted controller's epochs exceed its
            predecessor's, like Materialize's ``(envd epoch, replica epoch)``. A replica that has seen a
            higher epoch refuses the connection and says so (``Status.refused_epoch``): the controller stops
            driving it until it comes up again (``ReplicaLink.refused``).
    """

    name = "compute.controller"
    messages: ClassVar[tuple[type, ...]] = (Frontiers, PeekResponse, SubscribeBatch, SubscribeDropped, Status)

    def __init__(
        self,
        *,
        replicas: Iterable[str],
        instance: CreateInstance | None = None,
        config: UpdateConfiguration | None = None,
        read_only: bool = False,
        compaction_lag: int = 0,
        workers: int = 1,
        generation: int = 0,
    ) -> None:
        if type(generation) is not int or not 0 <= generation <= MAX_GENERATION:
            raise LocalProtocolError(
                f"generation must be an int from 0 to {MAX_GENERATION}, got {generation!r}"
            )
        self.links = {r: ReplicaLink(epoch=generation << 32) for r in replicas}
        if not self.links:
            raise LocalProtocolError("a compute controller needs at least one replica")
        self.compaction_lag = compaction_lag
        self.history = CommandHistory()
        self.history.push(CreateTimely(epoch=0, workers=workers))
        self.history.push(instance or CreateInstance())
        if config is not None and not config.all_unset():
            self.history.push(config)
        self.history.push(InitializationComplete())
        self.read_only = read_only
        if not read_only:
            self.history.push(AllowWrites())
        self.upper = 1
        self.tables: dict[str, pa.Schema] = {}
        #: Each table's updates, compacted as far as ``_compact`` allows (``Arrangement.since``).
        self._table_data: dict[str, Arrangement] = {}
        #: Upsert tables: their key columns, and their current rows (one per key).
        self.table_keys: dict[str, list[str]] = {}
        self._current: dict[str, pa.Table] = {}
        self.collections: dict[str, Collection] = {}
        #: View name -> collection id. Ids are never reused (a dropped id would poison the history).
        self.views: dict[str, str] = {}
        self._used_ids: set[str] = set()
        self.peeks: dict[str, PendingPeek] = {}
        self.subscribes: dict[str, SubscribeState] = {}
        self._peek_calls: dict[int, str] = {}
        self._counter = 0
        self._out: list[Action] = []

    # ---------------------------------------------------------------- the role

    def handle(self, event: Event, now: float) -> Iterable[Action]:
        """React to one event; raises ``RemoteProtocolError`` for a replica that broke the protocol."""
        self._out = []
        if isinstance(event, PeerUp):
            if event.peer in self.links:
                self._hydrate(event.peer)
        elif isinstance(event, PeerLost):
            if event.peer in self.links:
                self._lost(event.peer)
        elif isinstance(event, MessageReceived):
            self._on_response(event.peer, event.message)
        elif isinstance(event, LocalCall):
            self._on_call(event)
        elif isinstance(event, HandlerFailed):
            log.warning("compute.controller: handling %r failed: %s", event.event, event.error)
        try:
            self._compact()
        except Exception:
            # The event's actions are sent all the same: a reply or a write's update lost here would leave
            # its caller waiting for ever, with the controller's own state already moved on.
            log.exception("compute.controller: compaction after %r failed", event)
        out, self._out = self._out, []
        return out

    # ---------------------------------------------------------------- replicas

    def _send_to(self, replica: str, command: ComputeCommand | AppendUpdates) -> None:
        link = self.links[replica]
        if isinstance(command, CreateTimely):
            kind = Input.CREATE_TIMELY
        elif isinstance(command, CreateInstance):
            kind = Input.CREATE_INSTANCE
        elif isinstance(command, InitializationComplete):
            kind = Input.INITIALIZATION_COMPLETE
        elif isinstance(command, AllowWrites):
            kind = Input.ALLOW_WRITES
        elif isinstance(command, AppendUpdates):
            kind = Input.STORAGE
        else:
            kind = Input.COMPUTATION
        try:
            link.stage = next_stage(replica, link.stage, kind)
        except StageError as exc:
            raise LocalProtocolError(str(exc)) from None
        self._out.append(Send(peer=replica, message=command))

    def _connected(self) -> list[str]:
        return [r for r, link in self.links.items() if link.stage is not Stage.DISCONNECTED]

    def _broadcast(self, command: ComputeCommand) -> None:
        self.history.push(command)
        for replica in self._connected():
            self._send_to(replica, command)

    def _storage(self, message: AppendUpdates) -> None:
        for replica in self._connected():
            self._send_to(replica, message)

    def _hydrate(self, replica: str) -> None:
        """Send a (re)connected replica a new epoch, the reduced history and the tables' contents."""
        link = self.links[replica]
        link.epoch += 1
        link.stage = Stage.DISCONNECTED
        link.frontiers = {}
        link.refused = None
        self.history.reduce()
        for command in self.history:
            sent = command
            if isinstance(command, CreateTimely):
                sent = CreateTimely(epoch=link.epoch, workers=command.workers)
            self._send_to(replica, sent)
            if isinstance(command, CreateInstance):
                for table in self.tables:
                    self._send_to(replica, self._snapshot(table))

    def _snapshot(self, table: str, data: Arrangement | None = None) -> AppendUpdates:
        """Table ``table``'s contents (``data``, else what the controller holds of it) as one append."""
        if data is None:
            data = self._table_data[table]
        return AppendUpdates(
            id=table, lower=0, upper=self.upper, since=data.since[0], updates=encode_table(data.updates)
        )

    def _lost(self, replica: str) -> None:
        link = self.links[replica]
        link.stage = Stage.DISCONNECTED
        link.frontiers = {}
        for uuid, peek in list(self.peeks.items()):
            if peek.target_replica == replica:
                self._finish_peek(uuid, Reply(call_id=peek.call_id, error=TARGET_FAILED))
        for sid, sub in list(self.subscribes.items()):
            if sub.target_replica == replica and sub.dropped_at is None:
                sub.batches.append((sub.upper, sub.upper, None, TARGET_FAILED))
                sub.dropped_at = (sub.upper,)
                self._drop_collection(sid)

    # ---------------------------------------------------------------- responses

    def _on_response(self, peer: str, msg: Any) -> None:
        link = self.links.get(peer)
        if link is None:
            raise RemoteProtocolError(
                f"{type(msg).__name__} from {peer}, which is not a replica of this controller"
            )
        try:
            next_stage(peer, link.stage, Input.RESPONSE)
        except StageError as exc:
            raise RemoteProtocolError(str(exc)) from None
        if isinstance(msg, Frontiers):
            self._on_frontiers(peer, link, msg)
        elif isinstance(msg, PeekResponse):
            self._on_peek_response(peer, msg)
        elif isinstance(msg, SubscribeBatch):
            self._on_subscribe_batch(peer, msg)
        elif isinstance(msg, SubscribeDropped):
            sub = self.subscribes.get(msg.id)
            if sub is not None and sub.dropped_at is None:
                # DroppedAt follows only a drop, and the controller ends a subscribe before it drops it
                # (``unsubscribe``, or its target replica lost): this one is live, so no replica may end it.
                raise RemoteProtocolError(
                    f"SubscribeDropped from {peer} for {msg.id!r}, which was not dropped"
                )
        elif isinstance(msg, Status) and msg.refused_epoch is not None:
            self._on_refused(peer, link, msg)
        # Other Status carries nothing the controller's correctness may depend on.

    def _on_refused(self, peer: str, link: ReplicaLink, msg: Status) -> None:
        """The replica refused this connection's ``CreateTimely``: it has seen a higher epoch (a controller
        of a later generation, or this one's generation reused). It will answer nothing on this connection,
        so the controller stops driving it, as if the link were lost, until it comes up again."""
        if msg.refused_epoch != link.epoch:
            return  # an earlier connection's refusal
        log.error("compute.controller: replica %s refused epoch %d: %s", peer, link.epoch, msg.detail)
        self._lost(peer)
        link.refused = msg.detail or f"epoch {link.epoch} refused"
        refused = self._all_refused()
        if refused is not None:
            # No replica will answer: the waiting peeks are answered now rather than never.
            for uuid, peek in list(self.peeks.items()):
                self._finish_peek(uuid, Reply(call_id=peek.call_id, error=refused))

    def _all_refused(self) -> str | None:
        """Why no replica will take this controller's commands, if every one refused its epoch."""
        if any(link.refused is None for link in self.links.values()):
            return None
        return "every replica refused this controller's epoch: " + "; ".join(
            f"{r}: {link.refused}" for r, link in self.links.items()
        )

    def _on_frontiers(self, peer: str, link: ReplicaLink, msg: Frontiers) -> None:
        if msg.write is None:
            return
        coll = self.collections.get(msg.id)
        if coll is None:
            # Dropped (its empty frontier, or progress that crossed the drop) or never ours: nothing to
            # track, and nothing kept for ids a replica makes up.
            link.frontiers.pop(msg.id, None)
            return
        if not msg.write:
            # Only a drop empties a view's frontier, and the controller forgets a collection before it
            # drops it. Joined in, an empty frontier would stop the view's compaction, and its table's, for good.
            raise RemoteProtocolError(f"Frontiers from {peer}: an empty write frontier for live {msg.id!r}")
        previous = link.frontiers.get(msg.id)
        if previous is not None and not frontier_leq(previous, msg.write):
            raise RemoteProtocolError(
                f"Frontiers from {peer}: the write frontier of {msg.id!r} regressed from {previous} to {msg.write}"
            )
        link.frontiers[msg.id] = msg.write
        # Any replica's progress advances the collection (protocol-facts 5.5).
        coll.write = frontier_join(coll.write, msg.write)

    def _on_peek_response(self, peer: str, msg: PeekResponse) -> None:
        peek = self.peeks.get(msg.uuid)
        if peek is None:
            return  # answered already (the first response wins) or unknown: dropped
        if peek.target_replica is not None and peer != peek.target_replica:
            return
        if msg.result is PeekResult.CANCELED:
            # A canceled peek is finished at once (``_call_cancel_peek``), so a pending one was never canceled.
            raise RemoteProtocolError(
                f"PeekResponse(CANCELED) from {peer} for peek {msg.uuid}, which was not canceled"
            )
        if msg.result is PeekResult.ROWS:
            reply = Reply(call_id=peek.call_id, result=msg.rows)
        else:
            reply = Reply(call_id=peek.call_id, error=msg.error)
        self._finish_peek(msg.uuid, reply)

    def _finish_peek(self, uuid: str, reply: Reply) -> None:
        peek = self.peeks.pop(uuid)
        self._peek_calls.pop(peek.call_id, None)
        self._out.append(reply)
        # Tell the replicas to stop, and take the peek out of the history.
        self._broadcast(CancelPeek(uuid=uuid))

    def _on_subscribe_batch(self, peer: str, msg: SubscribeBatch) -> None:
        sub = self.subscribes.get(msg.id)
        if sub is None or sub.dropped_at is not None:
            return
        if sub.target_replica is not None and peer != sub.target_replica:
            return
        upper = msg.upper[0] if msg.upper else None
        if upper is not None and upper <= sub.upper:
            return  # another replica delivered this span already
        if msg.lower[0] > sub.upper:
            raise RemoteProtocolError(
                f"SubscribeBatch from {peer} for {msg.id!r} starts at {msg.lower} beyond the delivered {sub.upper}"
            )
        new_upper = upper if upper is not None and not msg.error else sub.upper
        if msg.error:
            # An error batch is the last, whatever its upper: the updates of its span are lost for good, so
            # a later batch would leave the subscriber's collection silently short of them. Materialize's
            # ``ActiveSubscribe::process_response`` ends a subscribe at its first error too.
            sub.batches.append((sub.upper, sub.upper, None, msg.error))
        else:
            try:
                updates = decode_table(msg.updates)
            except DecodeError as exc:
                raise RemoteProtocolError(f"SubscribeBatch from {peer} for {msg.id!r}: {exc}") from None
            # The collection lives as long as the subscribe is neither unsubscribed nor dropped (above).
            expected = update_schema(self.collections[msg.id].schema)
            if updates.schema.names != expected.names or updates.schema.types != expected.types:
                raise RemoteProtocolError(
                    f"SubscribeBatch from {peer} for {msg.id!r}: columns {updates.schema} are not the view's"
                )
            if msg.lower[0] < sub.upper and updates.num_rows:
                updates = updates.filter(pc.greater_equal(updates[TIME], i64(sub.upper)))
            sub.batches.append((sub.upper, new_upper, encode_table(updates), None))
        sub.upper = new_upper
        if upper is None or msg.error:
            # An error, or a closed upper: that replica sends nothing more for it (an error it cannot get
            # past, such as a table it refused). The subscribe ends there, as Materialize's controller stops
            # tracking one whose upper is empty: later batches from other replicas would follow an error.
            sub.dropped_at = (sub.upper,)
            self._drop_collection(msg.id)
            return
        coll = self.collections.get(msg.id)
        if coll is not None and new_upper - 1 > coll.since:
            # What it reads follows what it delivered: a subscribe built again (a replica rehydrated) starts
            # at the last delivered time, whose snapshot the span filter above drops, so its view and the
            # table under it may be compacted up to there instead of staying at the first as_of.
            coll.since = new_upper - 1
            self._broadcast(AllowCompaction(id=msg.id, frontier=(coll.since,)))

    # ---------------------------------------------------------------- compaction

    def _compact(self) -> None:
        """Advance each view's and table's since as far as its frontier, pending peeks and dependents allow.

        A table's since follows the last write (``upper - 1 - compaction_lag``) as a view's follows its
        write frontier; the controller's copy of the table is compacted with it, and the replicas are told
        with ``AllowCompaction``, so neither grows with the number of writes.
        """
        for coll in list(self.collections.values()):
            if coll.subscribe or not coll.write:
                continue
            target = self._held(coll.id, coll.write[0] - 1 - self.compaction_lag)
            if target > coll.since:
                coll.since = target
                self._broadcast(AllowCompaction(id=coll.id, frontier=(target,)))
        for name, data in self._table_data.items():
            target = self._held(name, self.upper - 1 - self.compaction_lag)
            if target > data.since[0]:
                data.compact((target,))
                self._broadcast(AllowCompaction(id=name, frontier=(target,)))

    def _held(self, id: str, target: int) -> int:
        """``target`` lowered to what collection ``id``'s pending peeks and readers still need."""
        for peek in self.peeks.values():
            if peek.target_id == id:
                target = min(target, peek.timestamp)
        for other in self.collections.values():
            if other.source == id:
                target = min(target, other.since)
        return target

    def _drop_collection(self, id: str) -> None:
        self.collections.pop(id, None)
        self._broadcast(AllowCompaction(id=id, frontier=()))

    # ---------------------------------------------------------------- local calls

    def _on_call(self, call: LocalCall) -> None:
        handler = _CALLS.get(call.name)
        if handler is None:
            self._out.append(
                Reply(call_id=call.call_id, error=f"compute.controller has no call {call.name!r}")
            )
            return
        try:
            result = handler(self, call)
        except (LocalProtocolError, ValueError, KeyError, TypeError, ArithmeticError) as exc:
            # Answered, never raised: a call that escapes ``handle`` is never answered.
            self._out.append(Reply(call_id=call.call_id, error=f"{call.name}: {exc}"))
            return
        if result is not _PENDING:
            self._out.append(Reply(call_id=call.call_id, result=result))

    def _resolve(self, name: str) -> tuple[pa.Schema, int, str]:
        """The schema, since and collection id of table or view ``name``."""
        if name in self.tables:
            return self.tables[name], self._table_data[name].since[0], name
        if name not in self.views:
            raise LocalProtocolError(f"no table or view named {name!r}")
        coll = self.collections[self.views[name]]
        return coll.schema, coll.since, coll.id

    def _new_id(self, name: str) -> str:
        """``name``, or ``name.N`` if that is taken: an id no collection has had (a view may be named so)."""
        self._counter += 1
        id = name
        while id in self._used_ids:
            self._counter += 1
            id = f"{name}.{self._counter}"
        self._used_ids.add(id)
        return id

    def _call_create_table(self, call: LocalCall) -> Any:
        name, schema = call.args["name"], call.args["schema"]
        _check_name(name, "table")
        if not isinstance(schema, pa.Schema):
            schema = pa.ipc.read_schema(pa.py_buffer(schema))
        schema = plain_schema(schema)  # a dictionary column is held as its values (``decoded``)
        if name in self.tables or name in self.views:
            raise LocalProtocolError(self._exists(name))
        if name in self._used_ids:
            # A table's collection id is its name, and ids are never reused: the commands of the collection
            # that had it (a dropped view) are still in the history and would apply to the table.
            raise LocalProtocolError(f"{name!r} was the id of a dropped collection; choose another name")
        if not schema.names or any(n.startswith("__") for n in schema.names):
            raise LocalProtocolError(f"table {name!r} needs columns, none starting with '__'")
        # What the replicas would refuse: they could never take the table, and it would stop for them.
        if len(set(schema.names)) != len(schema.names):
            raise LocalProtocolError(f"table {name!r}: its column names must be distinct, got {schema.names}")
        why = ungroupable(schema)
        if why is not None:
            raise LocalProtocolError(f"table {name!r}: its rows cannot be consolidated ({why})")
        key = call.args.get("key")
        if key is not None and (
            not isinstance(key, list | tuple)
            or not key
            or len(set(key)) != len(key)
            or any(k not in schema.names for k in key)
        ):
            raise LocalProtocolError(
                f"table {name!r}: key {key!r} is not a list of distinct columns of {schema.names}"
            )
        data = Arrangement(schema)
        # Built before the table is registered: a table registered with a snapshot that cannot be built
        # would stay in every later snapshot and compaction.
        snapshot = self._snapshot(name, data)
        if key is not None:
            self.table_keys[name] = list(key)
            self._current[name] = schema.empty_table()
        self.tables[name] = schema
        self._used_ids.add(name)
        self._table_data[name] = data
        self._storage(snapshot)
        return {"upper": self.upper}

    def _exists(self, name: str) -> str:
        """The refusal of a name taken: what has it, and a table's key (the list of its key columns, in
        Python's notation), so a caller learns how the table takes rows (``sparkbus load`` compares it with
        the replicated table's key)."""
        key = self.table_keys.get(name)
        if name in self.views:
            what = "a view"
        elif key is None:
            what = "a table without a key"
        else:
            what = f"a table keyed by {key!r}"
        return f"{name!r} already exists: {what}"

    def _call_write(self, call: LocalCall) -> Any:
        name = call.args["table"]
        schema = self.tables.get(name)
        if schema is None:
            raise LocalProtocolError(f"no table named {name!r}")
        try:
            batch = decode_table(call.args["batch"])
        except DecodeError as exc:
            raise LocalProtocolError(f"write to {name!r}: {exc}") from None
        diff = batch[DIFF] if DIFF in batch.column_names else None
        data = decoded(batch.select([n for n in batch.column_names if n != DIFF]))
        if not data.schema.equals(schema):
            raise LocalProtocolError(f"write to {name!r}: schema {data.schema} is not the table's {schema}")
        # One NaN, so that NaN equals NaN in every group, consolidation and upsert key, whatever bits the
        # client's NaNs have (Arrow's hash kernels compare floats by their bits).
        data = canonical_nans(data)
        key = self.table_keys.get(name)
        if key is not None:
            if diff is not None:
                raise LocalProtocolError(f"write to {name!r}: an upsert table takes rows, not __diff")
            data, diff = self._upsert(name, key, data)
        elif diff is None:
            diff = pa.repeat(pa.scalar(1, pa.int64()), data.num_rows)
        elif diff.type != pa.int64():
            raise LocalProtocolError(f"write to {name!r}: __diff must be int64, got {diff.type}")
        elif diff.null_count:
            # The replicas refuse an update without a diff, so the table would stop there for them.
            raise LocalProtocolError(f"write to {name!r}: __diff has nulls")
        t = self.upper
        updates = data.append_column(TIME, pa.repeat(pa.scalar(t, pa.int64()), data.num_rows))
        updates = updates.append_column(DIFF, diff).cast(update_schema(schema))
        self._table_data[name].append(updates, t + 1)
        self.upper = t + 1
        others = tuple(n for n in self.tables if n != name)
        self._storage(
            AppendUpdates(id=name, lower=t, upper=t + 1, advanced=others, updates=encode_table(updates))
        )
        return {"time": t}

    def _upsert(self, name: str, key: list[str], data: pa.Table) -> tuple[pa.Table, pa.Array]:
        """The updates of writing ``data`` to upsert table ``name``: the replaced rows retracted, the
        written ones inserted (the last of a key in ``data`` wins). A row written unchanged is retracted and
        inserted at the same time, which consolidation cancels."""
        for k in key:
            if data.column(k).null_count:
                raise LocalProtocolError(f"write to {name!r}: key column {k!r} has nulls")
        data = data.combine_chunks()
        # Applied in one turn of the node's loop: a 600k-row write took 1.75 s here with a Python range of
        # row numbers, a group-by of keys all distinct and a join, near the peers' heartbeat timeout. One
        # key column takes the cheaper paths (unique, is_in); a composite key the general ones.
        if data.num_rows > 1 and not _distinct(data, key):
            # The last row of each key: group the row numbers by key and keep the highest.
            numbered = data.select(key).append_column(_ROW, _row_numbers(data.num_rows))
            last = numbered.group_by(key, use_threads=False).aggregate([(_ROW, "max")])
            if last.num_rows < data.num_rows:
                data = data.take(last.column(f"{_ROW}_max"))  # keys in order of first appearance
        current = self._current[name]
        hit = _replaced(current, data, key)
        old = current.filter(hit)
        self._current[name] = pa.concat_tables([current.filter(pc.invert(hit)), data])
        rows = pa.concat_tables([old, data])
        diff = pa.concat_arrays(
            [
                pa.repeat(pa.scalar(-1, pa.int64()), old.num_rows),
                pa.repeat(pa.scalar(1, pa.int64()), data.num_rows),
            ]
        )
        return rows, diff

    def _call_create_view(self, call: LocalCall) -> Any:
        name, view = call.args["name"], call.args["view"]
        _check_name(name, "view")
        if not isinstance(view, ViewDef):
            raise LocalProtocolError(f"view {name!r}: expected a ViewDef, got {type(view).__name__}")
        if name in self.tables or name in self.views:
            raise LocalProtocolError(self._exists(name))
        schema, since, source = self._resolve(view.source)
        try:
            out = output_schema(view, schema, f"view {name!r}")
        except ViewError as exc:
            raise LocalProtocolError(str(exc)) from None
        id = self._new_id(name)
        view = dataclasses.replace(view, source=source)
        as_of = max(since, self.upper - 1)
        desc = CreateDataflow(name=name, as_of=(as_of,), imports=(source,), index_exports=(id,), view=view)
        self.collections[id] = Collection(id=id, source=source, schema=out, as_of=as_of, since=as_of)
        self.views[name] = id
        self._broadcast(desc)
        self._broadcast(Schedule(id=id))
        return {"as_of": as_of, "id": id}

    def _call_drop_view(self, call: LocalCall) -> Any:
        name: Any = call.args.get("name")
        _check_name(name, "view")
        id = self.views.get(name)
        if id is None:
            why = " (a table: tables cannot be dropped)" if name in self.tables else ""
            raise LocalProtocolError(f"no view named {name!r}{why}")
        users = sorted(c.id for c in self.collections.values() if c.source == id)
        if users:
            raise LocalProtocolError(f"view {name!r} is read by {users}; drop those first")
        del self.views[name]
        self._drop_collection(id)
        return None

    def _call_peek(self, call: LocalCall) -> Any:
        _, since, target_id = self._resolve(call.args["view"])
        kind = TargetKind.PERSIST if target_id in self.tables else TargetKind.INDEX
        timestamp = call.args.get("timestamp")
        if timestamp is None:
            timestamp = self.upper - 1
        target_replica = call.args.get("target_replica")
        if target_replica is not None:
            link = self.links.get(target_replica)
            if link is None or link.stage is Stage.DISCONNECTED:
                raise LocalProtocolError(TARGET_FAILED)
        if timestamp < since:
            raise LocalProtocolError(f"timestamp {timestamp} is below the since {since} of {target_id!r}")
        refused = self._all_refused()
        if refused is not None:
            raise LocalProtocolError(refused)
        self._counter += 1
        uuid = f"peek-{self._counter}"
        constraints = call.args.get("literal_constraints")
        finishing = call.args.get("finishing")
        if finishing is None:
            finishing = Finishing()
        elif not isinstance(finishing, Finishing):
            # A plain map (a thin client's) is converted by the gateway; anything else would reach no replica.
            raise LocalProtocolError(f"finishing must be a Finishing, got {type(finishing).__name__}")
        peek = Peek(
            uuid=uuid,
            target=kind,
            target_id=target_id,
            timestamp=timestamp,
            literal_constraints=tuple(tuple(c) for c in constraints) if constraints is not None else None,
            finishing=finishing,
        )
        self.peeks[uuid] = PendingPeek(call.call_id, target_id, timestamp, target_replica)
        self._peek_calls[call.call_id] = uuid
        self._broadcast(peek)
        return _PENDING

    def _call_cancel_peek(self, call: LocalCall) -> Any:
        uuid = self._peek_calls.get(call.args["call_id"])
        if uuid is None:
            return False
        # As Materialize's ``Instance::cancel_peek``: the caller is answered now, and the CancelPeek
        # ``_finish_peek`` sends stops the replicas and takes the peek out of the history, so their late
        # answers are dropped as unknown. Waiting for a replica's Canceled would hang for ever if the link
        # broke first, since the history replayed to the rehydrated replica no longer holds the peek.
        self._finish_peek(uuid, Reply(call_id=self.peeks[uuid].call_id, error=f"peek {uuid} canceled"))
        return True

    def _call_subscribe(self, call: LocalCall) -> Any:
        view = call.args["view"]
        if view not in self.views:
            raise LocalProtocolError(f"no view named {view!r}")
        coll = self.collections[self.views[view]]
        target_replica = call.args.get("target_replica")
        if (
            target_replica is not None
            and self.links.get(target_replica, ReplicaLink()).stage is Stage.DISCONNECTED
        ):
            raise LocalProtocolError(TARGET_FAILED)
        sid = self._new_id(f"{coll.id}.subscribe")
        as_of = max(coll.since, self.upper - 1)
        desc = CreateDataflow(
            name=sid, as_of=(as_of,), imports=(coll.id,), sink_exports=(sid,), view=ViewDef(source=coll.id)
        )
        self.collections[sid] = Collection(
            id=sid, source=coll.id, schema=coll.schema, as_of=as_of, since=as_of, subscribe=True
        )
        self.subscribes[sid] = SubscribeState(upper=as_of, target_replica=target_replica)
        self._broadcast(desc)
        self._broadcast(Schedule(id=sid))
        return {"id": sid, "as_of": as_of}

    def _call_fetch(self, call: LocalCall) -> Any:
        sid = call.args["id"]
        sub = self.subscribes.get(sid)
        if sub is None:
            raise LocalProtocolError(f"no subscribe {sid!r}")
        batches, sub.batches = sub.batches, []
        return {"batches": batches, "upper": sub.upper, "dropped_at": sub.dropped_at}

    def _call_unsubscribe(self, call: LocalCall) -> Any:
        sid = call.args["id"]
        if sid not in self.subscribes:
            raise LocalProtocolError(f"no subscribe {sid!r}")
        del self.subscribes[sid]
        if sid in self.collections:
            self._drop_collection(sid)
        return None

    def _call_allow_writes(self, call: LocalCall) -> Any:
        if self.read_only:
            self.read_only = False
            self._broadcast(AllowWrites())
        return None


def _check_name(name: object, what: str) -> None:
    """A table or view name is a non-empty str: it is (or starts) the collection's id in every command."""
    if type(name) is not str or not name:
        raise LocalProtocolError(f"a {what} name must be a non-empty str, got {name!r}")
    try:
        name.encode()  # every command to the replicas carries it: with no UTF-8 form, each failed to encode
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(
            f"a {what} name must be UTF-8 text, got a lone surrogate at character {exc.start}"
        ) from None


_PENDING = object()
_CALLS = {
    "create_table": ComputeController._call_create_table,
    "write": ComputeController._call_write,
    "create_view": ComputeController._call_create_view,
    "drop_view": ComputeController._call_drop_view,
    "peek": ComputeController._call_peek,
    "cancel_peek": ComputeController._call_cancel_peek,
    "subscribe": ComputeController._call_subscribe,
    "fetch": ComputeController._call_fetch,
    "unsubscribe": ComputeController._call_unsubscribe,
    "allow_writes": ComputeController._call_allow_writes,
}
