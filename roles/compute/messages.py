"""Compute protocol messages (type codes 0x0300-0x03ff): commands, responses and the storage feed.

Commands travel controller -> replica, responses replica -> controller, in order on one link. Names and
payloads follow ``mz_compute_client::protocol`` (spec 004 and protocol-facts 5.1, 5.2), with timestamps as
ints and frontiers as tuples (see ``times``). Rows travel as Arrow IPC streams in blob frames.

``AppendUpdates`` is not a Materialize compute command: Materialize replicas read their inputs from persist.
sparkbus has no persist yet, so the controller feeds table updates to replicas itself, on the same ordered
link, with persist's ``[lower, upper)`` append semantics so a replay is idempotent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sparkbus.codecs import blob, message
from sparkbus.codecs.schema import quote
from sparkbus.roles.compute.plans import Finishing, ViewDef
from sparkbus.roles.compute.times import Frontier, check_frontier, check_time

# ---------------------------------------------------------------- helpers


def _check_id(value: str, what: str) -> None:
    if type(value) is not str or not value:
        raise ValueError(f"{what} must be a non-empty str, got {quote(value)}")


# ---------------------------------------------------------------- commands (controller -> replica)


@message(0x0300)
@dataclass(frozen=True, kw_only=True, slots=True)
class CreateTimely:
    """Create the dataflow runtime. ``epoch`` must exceed every epoch this replica has seen before."""

    epoch: int
    workers: int = 1

    def __post_init__(self) -> None:
        if type(self.epoch) is not int or self.epoch < 0:
            raise ValueError(f"CreateTimely.epoch must be a non-negative int, got {quote(self.epoch)}")
        if type(self.workers) is not int or self.workers < 1:
            raise ValueError(f"CreateTimely.workers must be a positive int, got {quote(self.workers)}")


@message(0x0301)
@dataclass(frozen=True, kw_only=True, slots=True)
class CreateInstance:
    """Initialise the instance. On reconnect the replica halts unless ``compatible_with`` the old one.

    Attributes:
        logging_interval_ms: the introspection logging interval (None: logging off); must match exactly.
        expiration_offset_ms: dataflow expiration offset (None: no expiration); may only shrink, and None
            (no expiration) may become an offset but not the other way round.
    """

    logging_interval_ms: int | None = None
    expiration_offset_ms: int | None = None

    def __post_init__(self) -> None:
        for name in ("logging_interval_ms", "expiration_offset_ms"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(
                    f"CreateInstance.{name} must be a non-negative int or None, got {quote(value)}"
                )

    def compatible_with(self, new: CreateInstance) -> bool:
        """Materialize's ``InstanceConfig::compatible_with``: same logging, expiration offset not larger.

        Materialize compares the offsets as antichains (``Antichain::from_iter(offset)``), not as ``Option``
        values: no offset is the empty antichain, above every offset. So switching expiration on (None to an
        offset) only strengthens it and is compatible, while switching it off is not.
        """
        if self.logging_interval_ms != new.logging_interval_ms:
            return False
        if self.expiration_offset_ms is None:
            return True
        return new.expiration_offset_ms is not None and new.expiration_offset_ms <= self.expiration_offset_ms


@message(0x0302)
@dataclass(frozen=True, kw_only=True, slots=True)
class InitializationComplete:
    """The end of the initialization stage: the replica reconciles and starts computing."""


@message(0x0303)
@dataclass(frozen=True, kw_only=True, slots=True)
class AllowWrites:
    """Leave the read-only stage, irreversibly."""


@message(0x0304)
@dataclass(frozen=True, kw_only=True, slots=True)
class UpdateConfiguration:
    """Compute parameters; ``None`` (or a missing dyncfg key) keeps the previous value; ``update`` merges.

    Attributes:
        max_result_size: the largest encoded peek result or subscribe batch, in bytes.
        workload_class: a label for metrics; ``""`` clears it.
        dyncfg: dynamic configuration values by name.
    """

    max_result_size: int | None = None
    workload_class: str | None = None
    dyncfg: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_result_size is not None and (
            type(self.max_result_size) is not int or self.max_result_size < 1
        ):
            raise ValueError(
                f"UpdateConfiguration.max_result_size must be a positive int, got {quote(self.max_result_size)}"
            )

    def update(self, other: UpdateConfiguration) -> UpdateConfiguration:
        """This configuration with every set field of ``other`` applied on top."""
        return UpdateConfiguration(
            max_result_size=other.max_result_size
            if other.max_result_size is not None
            else self.max_result_size,
            workload_class=other.workload_class if other.workload_class is not None else self.workload_class,
            dyncfg={**self.dyncfg, **other.dyncfg},
        )

    def all_unset(self) -> bool:
        return self.max_result_size is None and self.workload_class is None and not self.dyncfg


@message(0x0305)
@dataclass(frozen=True, kw_only=True, slots=True)
class CreateDataflow:
    """Build a dataflow computing ``view`` from ``imports`` as of ``as_of``.

    Attributes:
        name: a debug name (not an id).
        as_of: the time the dataflow's outputs are first correct at; never empty.
        imports: the collection ids read (inputs or other dataflows' indexes); exactly ``(view.source,)``.
        index_exports: ids of the peekable indexes the dataflow maintains.
        sink_exports: ids of the subscribes the dataflow feeds.
    """

    name: str
    as_of: Frontier
    imports: tuple[str, ...]
    index_exports: tuple[str, ...] = ()
    sink_exports: tuple[str, ...] = ()
    view: ViewDef

    def __post_init__(self) -> None:
        check_frontier(self.as_of, "CreateDataflow.as_of")
        if not self.as_of:
            raise ValueError(
                f"CreateDataflow.as_of of {quote(self.name)} must be set (not the empty frontier)"
            )
        if self.imports != (self.view.source,):
            raise ValueError(
                f"CreateDataflow.imports of {quote(self.name)} must be exactly ({quote(self.view.source)},)"
            )
        exports = self.export_ids
        if not exports:
            raise ValueError(f"CreateDataflow {quote(self.name)} exports nothing")
        for e in exports:
            _check_id(e, "CreateDataflow export id")
        if len(set(exports)) != len(exports):
            raise ValueError(
                f"CreateDataflow {quote(self.name)}: export ids are not unique: {quote(exports)}"
            )
        if self.view.source in exports:
            raise ValueError(
                f"CreateDataflow {quote(self.name)} imports its own export {quote(self.view.source)}"
            )

    @property
    def export_ids(self) -> tuple[str, ...]:
        return (*self.index_exports, *self.sink_exports)

    def compatible_with(self, new: CreateDataflow) -> bool:
        """True when an existing dataflow built from ``self`` can serve ``new``: same definition, and
        ``new`` does not ask for an earlier ``as_of``."""
        return (
            self.view == new.view
            and self.imports == new.imports
            and self.index_exports == new.index_exports
            and self.sink_exports == new.sink_exports
            and self.as_of[0] <= new.as_of[0]
        )


@message(0x0306)
@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """Start computing the dataflow that exports ``id`` (dataflows are created suspended)."""

    id: str

    def __post_init__(self) -> None:
        _check_id(self.id, "Schedule.id")


@message(0x0307)
@dataclass(frozen=True, kw_only=True, slots=True)
class AllowCompaction:
    """Times below ``frontier`` need no longer be readable for ``id``. The empty frontier drops ``id``."""

    id: str
    frontier: Frontier

    def __post_init__(self) -> None:
        _check_id(self.id, "AllowCompaction.id")
        check_frontier(self.frontier, "AllowCompaction.frontier")


class TargetKind(enum.IntEnum):
    """What a peek reads: an index exported by a dataflow, or an input collection directly."""

    INDEX = 1
    PERSIST = 2


@message(0x0308)
@dataclass(frozen=True, kw_only=True, slots=True)
class Peek:
    """Read collection ``target_id`` at ``timestamp``, once the collection's frontier is beyond it.

    Attributes:
        uuid: the peek's id; exactly one ``PeekResponse`` answers it.
        literal_constraints: key values to look up (``None``: the whole collection; never empty). The key
            is the view's group-by columns, or all its columns for a view without them.
        finishing: order, offset, limit and projection applied to the result.
    """

    uuid: str
    target: TargetKind
    target_id: str
    timestamp: int
    literal_constraints: tuple[tuple[Any, ...], ...] | None = None
    finishing: Finishing = field(default_factory=Finishing)

    def __post_init__(self) -> None:
        _check_id(self.uuid, "Peek.uuid")
        if not isinstance(self.target, TargetKind):
            raise ValueError(f"Peek.target must be a TargetKind, got {quote(self.target)}")
        _check_id(self.target_id, "Peek.target_id")
        check_time(self.timestamp, "Peek.timestamp")
        if not isinstance(self.finishing, Finishing):
            # Checked here, not only when decoded: a Peek that cannot be encoded and decoded again would
            # reach no replica, so it would never be answered, and it would stay in the command history.
            raise ValueError(f"Peek.finishing must be a Finishing, got {type(self.finishing).__name__}")
        if self.literal_constraints is not None and not self.literal_constraints:
            raise ValueError(f"Peek {self.uuid}: literal_constraints must be None or non-empty, never ()")


@message(0x0309)
@dataclass(frozen=True, kw_only=True, slots=True)
class CancelPeek:
    """Stop working on peek ``uuid``; a replica that has already answered it ignores this."""

    uuid: str

    def __post_init__(self) -> None:
        _check_id(self.uuid, "CancelPeek.uuid")


@message(0x030F)
@dataclass(frozen=True, kw_only=True, slots=True)
class AppendUpdates:
    """Table ``id`` has exactly ``updates`` at the times in ``[lower, upper)`` (a persist-style append).

    ``updates`` is an Arrow IPC stream of the table's columns plus ``__time`` and ``__diff`` (int64), every
    time in ``[lower, upper)``. The tables in ``advanced`` have no updates in that interval: their upper
    moves to ``upper`` too, which is how one write advances every table's frontier.

    ``since`` is persist's since: the updates are correct at times ``>= since``, those of earlier times
    having been advanced to it (a compacted table's contents); 0 for updates as written. A replica that
    holds the table up to an upper at or below ``since`` cannot tell its own updates in a replay from the
    new ones, and rebuilds (``ComputeReplica._append``).
    """

    id: str
    lower: int
    upper: int
    advanced: tuple[str, ...] = ()
    since: int = 0
    updates: bytes = blob()

    def __post_init__(self) -> None:
        _check_id(self.id, "AppendUpdates.id")
        check_time(self.lower, "AppendUpdates.lower")
        check_time(self.upper, "AppendUpdates.upper")
        check_time(self.since, "AppendUpdates.since")
        if self.upper < self.lower:
            raise ValueError(f"AppendUpdates {self.id}: upper {self.upper} is below lower {self.lower}")
        if self.since and self.since >= self.upper:
            raise ValueError(f"AppendUpdates {self.id}: since {self.since} is not below upper {self.upper}")
        if not self.updates:
            raise ValueError(
                f"AppendUpdates {self.id}: updates must be an Arrow IPC stream (with the schema)"
            )


ComputeCommand = (
    CreateTimely
    | CreateInstance
    | InitializationComplete
    | AllowWrites
    | UpdateConfiguration
    | CreateDataflow
    | Schedule
    | AllowCompaction
    | Peek
    | CancelPeek
)

# ---------------------------------------------------------------- responses (replica -> controller)


@message(0x0380)
@dataclass(frozen=True, kw_only=True, slots=True)
class Frontiers:
    """Frontiers of collection ``id`` advanced; ``None`` means unchanged, at least one is set."""

    id: str
    write: Frontier | None = None
    input: Frontier | None = None
    output: Frontier | None = None

    def __post_init__(self) -> None:
        _check_id(self.id, "Frontiers.id")
        if self.write is None and self.input is None and self.output is None:
            raise ValueError(f"Frontiers for {self.id} carries no update (has_updates is false)")
        for name in ("write", "input", "output"):
            value = getattr(self, name)
            if value is not None:
                check_frontier(value, f"Frontiers.{name}")


class PeekResult(enum.IntEnum):
    """The variants of Materialize's ``PeekResponse`` (``Stashed`` is not used: rows are always inline)."""

    ROWS = 1
    ERROR = 2
    CANCELED = 3


@message(0x0381)
@dataclass(frozen=True, kw_only=True, slots=True)
class PeekResponse:
    """The one answer to peek ``uuid``: rows (Arrow IPC in ``rows``), an error, or canceled."""

    uuid: str
    result: PeekResult
    error: str = ""
    rows: bytes = blob(default=b"")

    def __post_init__(self) -> None:
        _check_id(self.uuid, "PeekResponse.uuid")
        if (self.result is PeekResult.ROWS) != bool(self.rows):
            raise ValueError(f"PeekResponse {self.uuid}: rows are carried exactly when result is ROWS")
        if (self.result is PeekResult.ERROR) != bool(self.error):
            raise ValueError(
                f"PeekResponse {self.uuid}: an error text is carried exactly when result is ERROR"
            )


@message(0x0382)
@dataclass(frozen=True, kw_only=True, slots=True)
class SubscribeBatch:
    """Subscribe ``id``'s consolidated updates at times in ``[lower, upper)``, or an error for that span.

    ``updates`` is an Arrow IPC stream of the view's columns plus ``__time`` and ``__diff``; it is empty
    exactly when ``error`` is set.
    """

    id: str
    lower: Frontier
    upper: Frontier
    error: str = ""
    updates: bytes = blob(default=b"")

    def __post_init__(self) -> None:
        _check_id(self.id, "SubscribeBatch.id")
        check_frontier(self.lower, "SubscribeBatch.lower")
        check_frontier(self.upper, "SubscribeBatch.upper")
        if not self.lower or (self.upper and self.upper[0] <= self.lower[0]):
            raise ValueError(f"SubscribeBatch {self.id}: [{self.lower}, {self.upper}) is empty")
        if bool(self.error) == bool(self.updates):
            raise ValueError(f"SubscribeBatch {self.id}: carries exactly one of updates and error")


@message(0x0383)
@dataclass(frozen=True, kw_only=True, slots=True)
class SubscribeDropped:
    """Subscribe ``id`` was dropped (compacted to empty); ``at`` is the last batch's upper."""

    id: str
    at: Frontier

    def __post_init__(self) -> None:
        _check_id(self.id, "SubscribeDropped.id")
        check_frontier(self.at, "SubscribeDropped.at")


@message(0x0384)
@dataclass(frozen=True, kw_only=True, slots=True)
class Status:
    """Informational status (Materialize only has a placeholder), and a replica's refusal of a connection.

    Attributes:
        detail: text for a person.
        refused_epoch: the epoch of a ``CreateTimely`` the replica refused (it has seen a higher or equal
            one), so that the controller stops waiting on a connection the replica will never serve; None
            otherwise. Results never depend on a Status.
    """

    detail: str = ""
    refused_epoch: int | None = None

    def __post_init__(self) -> None:
        if self.refused_epoch is not None and (type(self.refused_epoch) is not int or self.refused_epoch < 0):
            raise ValueError(
                f"Status.refused_epoch must be a non-negative int or None, got {quote(self.refused_epoch)}"
            )


ComputeResponse = Frontiers | PeekResponse | SubscribeBatch | SubscribeDropped | Status
