"""A query participant in its own process, for the integration tests.

Usage: python participant_proc.py NODE_ID ROWS SEED PART NPARTS
Prints its endpoints as one JSON line, reads the peer table as one JSON line, starts a ``Node`` running
``QueryRole``, loads part PART of NPARTS of the generated table ``t``, prints ``{"loaded": rows}`` and exits
when stdin closes.
"""

from __future__ import annotations

import json
import random
import sys

import pyarrow as pa

KINDS = ["click", "view", "buy", "share", "like", "skip", "open", "close"]


def generate(rows: int, seed: int) -> pa.Table:
    """user int64, kind string, value float64, ts int64 (ts unique, so sorts by ts are deterministic)."""
    rng = random.Random(seed)
    users = max(1, rows // 20)
    ts = list(range(1_600_000_000_000, 1_600_000_000_000 + rows))
    rng.shuffle(ts)
    return pa.table(
        {
            "user": pa.array([rng.randrange(users) for _ in range(rows)], pa.int64()),
            "kind": pa.array(rng.choices(KINDS, k=rows), pa.string()),
            "value": pa.array([round(rng.random() * 100.0, 2) for _ in range(rows)], pa.float64()),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def part(table: pa.Table, index: int, count: int) -> pa.Table:
    step = -(-table.num_rows // count)
    return table.slice(index * step, step)


def main() -> None:
    from sparkbus.bus import BusConfig
    from sparkbus.bus.node import Endpoints, Node
    from sparkbus.roles.query import QueryRole, load

    node_id, rows, seed, index, count = sys.argv[1], *map(int, sys.argv[2:6])
    node = Node(node_id, BusConfig(cluster_tag="query-it"), [QueryRole(node_id)])
    print(json.dumps(node.bind().to_json()), flush=True)
    peers = {k: Endpoints.from_json(v) for k, v in json.loads(sys.stdin.readline()).items()}
    node.start(peers)
    try:
        loaded = load(node, "t", part(generate(rows, seed), index, count))
        print(json.dumps({"loaded": loaded}), flush=True)
        sys.stdin.read()  # until the test closes our stdin
    finally:
        node.stop()


if __name__ == "__main__":
    main()
