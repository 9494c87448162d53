"""Shared test helpers: random tables, a reference in plain pyarrow, and fragment execution in-process."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

from sparkbus.codecs import encode_batch
from sparkbus.roles.query import engine
from sparkbus.roles.query.plan import Fragment, PlanNode
from sparkbus.roles.query.planner import plan_fragments

KEYS = ["a", "b", "c", None]


@st.composite
def tables(draw: st.DrawFn, max_rows: int = 40) -> pa.Table:
    n = draw(st.integers(0, max_rows))
    k = draw(st.lists(st.sampled_from(KEYS), min_size=n, max_size=n))
    g = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n))
    x = draw(st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=n, max_size=n))
    y = draw(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False)), min_size=n, max_size=n))
    return pa.table(
        {
            "k": pa.array(k, pa.string()),
            "g": pa.array(g, pa.int64()),
            "x": pa.array(x, pa.int64()),
            "y": pa.array(y, pa.float64()),
        }
    )


def split(table: pa.Table, cuts: list[int]) -> list[pa.Table]:
    """``table`` cut at the given row offsets (clamped) into consecutive parts."""
    bounds = sorted({0, table.num_rows, *(min(c, table.num_rows) for c in cuts)})
    parts = [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    return parts or [table]


def stores(parts: list[pa.Table], name: str = "t") -> list[engine.PartitionStore]:
    out = []
    for p in parts:
        s = engine.PartitionStore()
        s.load(name, p)
        out.append(s)
    return out


def _ipc(table: pa.Table | None) -> list[bytes]:
    if table is None:
        return [b""]
    batches = table.to_batches(max_chunksize=7) or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    return [bytes(encode_batch(b)) for b in batches]


def run_fragments(
    fragments: tuple[Fragment, ...], members: list[engine.PartitionStore], params: tuple[object, ...] = ()
) -> pa.Table | None:
    """Run fragments in-process: member i of every non-root fragment uses ``members[i]``."""
    by_edge_out: dict[int, list[list[bytes]]] = {}
    pending = [f for f in fragments if f.send is not None]
    root = next(f for f in fragments if f.send is None)
    done: set[int] = set()
    while pending:
        for f in list(pending):
            rec = f.receive
            if rec is not None and rec.edge not in done:
                continue
            send = f.send
            assert send is not None
            outs: list[list[bytes]] = [[] for _ in range(len(members))]
            for i, store in enumerate(members):
                inbox_table = None
                if rec is not None:
                    inbox = engine.Inbox(f.root)
                    for data in by_edge_out[rec.edge][i]:
                        inbox.add(data)
                    inbox_table = inbox.table
                out = engine.run(f.root, store, params, inbox_table)  # type: ignore[arg-type]
                if send.mode == "hash" and out is not None:
                    for j, part in enumerate(engine.hash_partition(out, send.keys, len(members))):
                        outs[j].extend(_ipc(part))
                elif send.mode == "hash":
                    for j in range(len(members)):
                        outs[j].append(b"")
                else:
                    outs[0].extend(_ipc(out))
            by_edge_out[send.edge] = outs
            done.add(send.edge)
            pending.remove(f)
    rec = root.receive
    assert rec is not None
    inbox = engine.Inbox(root.root)
    for lst in by_edge_out[rec.edge]:
        for data in lst:
            inbox.add(data)
    return engine.run(root.root, engine.PartitionStore(), params, inbox.table)  # type: ignore[arg-type]


def distributed(plan: PlanNode, parts: list[pa.Table], *, repartition: bool = False) -> pa.Table | None:
    names = [f"p{i}" for i in range(len(parts))]
    fragments = plan_fragments(plan, initiator="i", participants=names, repartition=repartition)
    return run_fragments(fragments, stores(parts))


def canonical(table: pa.Table) -> list[tuple[object, ...]]:
    """Rows as a sorted list (None sorts first), floats rounded, for order-insensitive comparison."""
    rows = []
    for row in table.to_pylist():
        rows.append(tuple((v is not None, round(v, 6) if isinstance(v, float) else v) for v in row.values()))
    return sorted(rows, key=repr)


def reference_group(table: pa.Table, keys: list[str], column: str) -> pa.Table:
    """count(*), count, sum, min, max, avg, count distinct of ``column`` per group, straight from pyarrow."""
    aggs = [
        ([], "count_all"),
        (column, "count"),
        (column, "sum"),
        (column, "min"),
        (column, "max"),
        (column, "mean"),
        (column, "count_distinct"),
    ]
    if keys:
        out = table.group_by(keys).aggregate(aggs)
        return out.select([*keys, *(c for c in out.column_names if c not in keys)])
    x = table.column(column)
    return pa.table(
        {
            "n": [table.num_rows],
            "c": [pc.count(x).as_py()],
            "s": [pc.sum(x).as_py()],
            "lo": [pc.min_max(x)["min"].as_py()],
            "hi": [pc.min_max(x)["max"].as_py()],
            "a": [pc.mean(x).as_py()],
            "d": [pc.count_distinct(x).as_py()],
        }
    )
