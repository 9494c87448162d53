"""A small simulated cluster of query roles for the sim tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sparkbus.bus import BusConfig
from sparkbus.bus.sim import SimBus
from sparkbus.codecs import encode_batch
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.role import QueryRole


def table(rows: int) -> pa.Table:
    keys = pa.array(["a", "b", "c", None])
    idx = pa.array(range(rows), pa.int64())
    import pyarrow.compute as pc

    return pa.table(
        {
            "k": pc.take(keys, pc.bit_wise_and(idx, 3)),
            "x": idx,
            "y": pc.multiply(pc.cast(idx, pa.float64()), 0.5),
        }
    )


class Cluster:
    """An initiator ``i`` and participants ``p1``, ``p2`` holding halves of table ``t``.

    ``others`` adds roles by node: beside the query role on ``i``, ``p1`` and ``p2``, or as the only roles of
    another node (a member outside every query).
    """

    def __init__(
        self,
        seed: int,
        rows: int = 400,
        config: QueryConfig | None = None,
        bus: BusConfig | None = None,
        others: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        self.sim = SimBus(seed=seed, config=bus)
        self.config = config or QueryConfig()
        self.roles: dict[str, QueryRole] = {}
        others = others or {}
        for name in ("i", "p1", "p2"):
            self.roles[name] = QueryRole(name, config=self.config, incarnation=f"{name}0")
            self.sim.add_node(name, roles=[self.roles[name], *others.get(name, ())])
        for name, roles in others.items():
            if name not in self.roles:
                self.sim.add_node(name, roles=list(roles))
        self.sim.start()
        self.sim.run_until(self.sim.all_up)
        self.data = table(rows)
        half = rows // 2
        self.load("p1", self.data.slice(0, half))
        self.load("p2", self.data.slice(half))

    def load(self, node: str, part: pa.Table, name: str = "t") -> None:
        batches = [bytes(encode_batch(b)) for b in part.to_batches(max_chunksize=100)]
        self.sim.result(self.sim.call(node, "query", "load", {"table": name, "batches": batches}))

    def execute(self, sql: str, **args: Any) -> tuple[str, int]:
        return self.sim.call("i", "query", "execute", {"sql": sql, **args})

    def outcome(self, cid: tuple[str, int], limit: float = 60.0) -> tuple[pa.Table | None, str | None]:
        self.sim.run_until(lambda: self.sim.reply(cid) is not None, limit=limit)
        done = self.sim.reply(cid)
        assert done is not None
        if done.error is not None:
            return None, done.error
        return pa.ipc.open_stream(done.result).read_all(), None

    def leaks(self) -> dict[str, int]:
        """Query states and call ids still held, per live node."""
        return {n: len(r.queries) + len(r.calls) for n, r in self.roles.items() if self.sim.node(n).alive}

    def settle(self) -> None:
        """Run past the check period until nothing is in flight."""
        self.sim.run_for(3 * self.config.check_period)
        self.sim.run_until_idle()
