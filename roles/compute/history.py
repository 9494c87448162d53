"""The reducible command history (Materialize's ``ComputeCommandHistory``, protocol-facts 5.3).

The controller records every command it sends; a replica that connects (or reconnects) is sent the reduced
history, which builds the same state as the full one. A replica keeps its own history of what it executed,
and reconciles the old one against a new controller's commands (``reconcile``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from sparkbus.bus.contract import LocalProtocolError
from sparkbus.roles.compute.messages import (
    AllowCompaction,
    AllowWrites,
    CancelPeek,
    ComputeCommand,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    InitializationComplete,
    Peek,
    Schedule,
    UpdateConfiguration,
)
from sparkbus.roles.compute.times import Frontier, frontier_join, frontier_meet


class CommandHistory:
    """Commands in the order sent, reduced whenever the list doubles past its last reduced size.

    ``push`` appends and calls ``reduce`` when ``len > 2 * reduced_count``; ``reduced_count`` starts at 0 so
    the first push reduces. Hence ``len(history) <= 2 * reduced_count`` after every push.
    """

    def __init__(self, commands: Iterable[ComputeCommand] = ()) -> None:
        self._commands: list[ComputeCommand] = list(commands)
        self.reduced_count = 0

    def __len__(self) -> int:
        return len(self._commands)

    def __iter__(self) -> Iterator[ComputeCommand]:
        return iter(self._commands)

    @property
    def commands(self) -> tuple[ComputeCommand, ...]:
        return tuple(self._commands)

    def push(self, command: ComputeCommand) -> None:
        """Record ``command``; reduce when the history has more than doubled since the last reduction."""
        self._commands.append(command)
        if len(self._commands) > 2 * self.reduced_count:
            self.reduce()

    def discard_peeks(self) -> None:
        """Forget every ``Peek`` and ``CancelPeek`` (a reconnecting replica drops pending peeks)."""
        self._commands = [c for c in self._commands if not isinstance(c, Peek | CancelPeek)]

    def reduce(self) -> None:
        """Rewrite the history into the shortest equivalent one, in the fixed order of protocol-facts 5.3.

        Order: CreateTimely, CreateInstance, UpdateConfiguration (merged, only if something is set),
        CreateDataflow..., Schedule..., Peek... (live ones), AllowCompaction... (after peeks),
        InitializationComplete, AllowWrites.

        Raises:
            LocalProtocolError: the history holds a second CreateTimely or CreateInstance.
        """
        timely: CreateTimely | None = None
        instance: CreateInstance | None = None
        config = UpdateConfiguration()
        dataflows: list[CreateDataflow] = []
        schedules: list[Schedule] = []
        final_frontiers: dict[str, Frontier] = {}
        live_peeks: dict[str, Peek] = {}
        initialized = False
        writes_allowed = False

        for command in self._commands:
            if isinstance(command, CreateTimely):
                if timely is not None:
                    raise LocalProtocolError("command history holds two CreateTimely commands")
                timely = command
            elif isinstance(command, CreateInstance):
                if instance is not None:
                    raise LocalProtocolError("command history holds two CreateInstance commands")
                instance = command
            elif isinstance(command, InitializationComplete):
                initialized = True
            elif isinstance(command, AllowWrites):
                writes_allowed = True
            elif isinstance(command, UpdateConfiguration):
                config = config.update(command)
            elif isinstance(command, CreateDataflow):
                dataflows.append(command)
            elif isinstance(command, Schedule):
                schedules.append(command)
            elif isinstance(command, AllowCompaction):
                final_frontiers[command.id] = command.frontier
            elif isinstance(command, Peek):
                live_peeks[command.uuid] = command
            else:
                live_peeks.pop(command.uuid, None)

        live: list[CreateDataflow] = []
        for dataflow in dataflows:
            as_of: Frontier = ()
            for export in dataflow.export_ids:
                as_of = frontier_meet(as_of, final_frontiers.get(export, dataflow.as_of))
            # Compaction below the initial as_of is a no-op: the as_of never regresses (Materialize
            # soft-asserts this).
            if as_of:
                as_of = frontier_join(as_of, dataflow.as_of)
            for export in dataflow.export_ids:
                if final_frontiers.get(export) == as_of:
                    del final_frontiers[export]
            if as_of:
                live.append(dataclasses.replace(dataflow, as_of=as_of))
        exported = {e for d in live for e in d.export_ids}

        reduced: list[ComputeCommand] = []
        if timely is not None:
            reduced.append(timely)
        if instance is not None:
            reduced.append(instance)
        if not config.all_unset():
            reduced.append(config)
        reduced.extend(live)
        reduced.extend(s for s in schedules if s.id in exported)
        reduced.extend(live_peeks.values())
        reduced.extend(AllowCompaction(id=i, frontier=f) for i, f in final_frontiers.items())
        if initialized:
            reduced.append(InitializationComplete())
        if writes_allowed:
            reduced.append(AllowWrites())
        self._commands = reduced
        self.reduced_count = len(reduced)
