"""MaterializeInc compute protocol (specs, "Computation Stage (read-write)"): "The replica cannot transition
back to the read-only computation stage from the read-write stage." Computation commands after AllowWrites
keep the connection read-write, and a second AllowWrites there is a protocol error naming that stage."""

from __future__ import annotations

import pytest

from sparkbus.bus.contract import RemoteProtocolError
from sparkbus.roles.compute import AllowCompaction, AllowWrites, Schedule, Stage
from sparkbus.roles.compute.stages import Input, StageError, next_stage
from tests.unit.compute.test_replica import dataflow, peek, started, table


def test_computation_commands_keep_a_read_write_connection_read_write() -> None:
    d = started(dataflow(), Schedule(id="v"))
    d.send(AllowWrites())
    assert d.replica.stage is Stage.READ_WRITE
    d.send(table(1, 3, [("a", 1)]), peek("p", 2), AllowCompaction(id="v", frontier=(1,)))
    assert d.replica.stage is Stage.READ_WRITE and d.replica.writes_allowed
    with pytest.raises(RemoteProtocolError, match="read-write"):
        d.send(AllowWrites())


def test_the_stage_table_has_no_way_back_from_read_write() -> None:
    for kind in Input:
        try:
            after = next_stage("ctl", Stage.READ_WRITE, kind)
        except StageError:
            continue
        assert after is Stage.READ_WRITE, (kind, after)
