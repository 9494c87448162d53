"""protocol-facts 5.2 (Materialize ``Frontiers``): "Frontiers never regress, and the first report is never
below ``as_of``"; and 5.4: a dataflow reused on a new connection reports again from that connection's
``as_of`` ("retained: not reported, lower = new as_of"). A reused dataflow whose new ``as_of`` is beyond its
input's upper reports its frontiers at the ``as_of`` at least."""

from __future__ import annotations

from sparkbus.roles.compute import Frontiers, Schedule
from tests.unit.compute.test_replica import dataflow, started, table


def test_a_reused_dataflow_reports_no_frontier_below_its_new_as_of() -> None:
    d = started(dataflow(), Schedule(id="v"))  # the table is at upper 1
    before = d.replica.dataflow("v")
    d.lose()
    out = d.connect(2, None, table(0, 1), dataflow(as_of=5), Schedule(id="v"))
    assert d.replica.dataflow("v") is before  # reused
    reports = [m for m in out if isinstance(m, Frontiers) and m.id == "v"]
    assert reports, out
    first = reports[0]
    assert first.write is not None and first.write[0] >= 5, first
    assert first.input is not None and first.input[0] >= 5, first
    assert first.output is not None and first.output[0] >= 5, first
