"""Stand-in roles for the client sim tests: a ``query`` whose answer takes a set time, one that runs until
cancelled, and a ``replication`` that counts writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.roles.query import table_to_ipc


@dataclass
class SlowQuery:
    """``execute`` answers ``delay`` seconds later with a one-row table holding the call's ordinal."""

    delay: float = 2.0
    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()
    calls: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.calls.append(event.args)
            return [c.SetTimer(key=str(event.call_id), at=now + self.delay)]
        if isinstance(event, c.TimerFired):
            n = len(self.calls)
            body = table_to_ipc(pa.table({"n": [n], "sql": [self.calls[-1].get("sql", "")]}))
            return [c.Reply(call_id=int(event.key), result=body)]
        return []


@dataclass
class CountingWrites:
    name: str = "replication"
    messages: ClassVar[tuple[type, ...]] = ()
    writes: int = 0
    delay: float = 2.0

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.writes += 1
            return [c.SetTimer(key=str(event.call_id), at=now + self.delay)]
        if isinstance(event, c.TimerFired):
            return [c.Reply(call_id=int(event.key), result={"rows": 1})]
        return []


@dataclass
class BigQuery:
    """``execute`` answers ``delay`` seconds later with ``rows`` rows (column ``i`` = 0, 1, ...)."""

    rows: int = 10_000
    delay: float = 1.0
    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()
    calls: int = 0

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall):
            self.calls += 1
            return [c.SetTimer(key=str(event.call_id), at=now + self.delay)]
        if isinstance(event, c.TimerFired):
            table = pa.table({"i": pa.array(range(self.rows), pa.int64())})
            return [c.Reply(call_id=int(event.key), result=table_to_ipc(table))]
        return []


@dataclass
class Endless:
    """A ``query`` whose ``execute`` runs until its owner cancels it (``cancel`` by ``owner``)."""

    name: str = "query"
    messages: ClassVar[tuple[type, ...]] = ()
    running: dict[str, int] = field(default_factory=dict)  # owner -> call id

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.LocalCall) and event.name == "execute":
            self.running[event.args["owner"]] = event.call_id
            return []
        if isinstance(event, c.LocalCall) and event.name == "cancel":
            call_id = self.running.pop(event.args.get("owner", ""), None)
            out: list[c.Action] = [c.Reply(call_id=event.call_id, result=call_id is not None)]
            if call_id is not None:
                out.append(c.Reply(call_id=call_id, error="[1003 CANCELLED_BY_USER] cancelled"))
            return out
        return []
