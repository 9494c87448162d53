"""Hypothesis strategies for every registered message class, from its type hints.

Values are drawn near the edges a peer could pick (0, -1, 2**64-1, empty and odd strings, the names the
roles use), then the class's own constructor checks them: an instance a constructor refuses is one the
decoder would refuse too, so it is rejected and another is drawn.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any

from hypothesis import strategies as st

# Every family registers its messages when imported: all of them, so every decoder is fuzzed whichever
# test modules were collected first.
import sparkbus.roles.client
import sparkbus.roles.compute
import sparkbus.roles.exchange
import sparkbus.roles.query
import sparkbus.roles.query.exchange
import sparkbus.roles.replication
import sparkbus.topologies.echo  # noqa: F401
from sparkbus.codecs import REGISTRY, EnvelopeCodec

#: Names a role may recognise: peers of processes.toml, tables, stream prefixes, ids.
NAMES = (
    "coordinator",
    "store-0",
    "store-1",
    "store-2",
    "orders",
    "orders/0",
    "q1",
    "local",
    "1",
    "replication/orders/0/1",
    "echo/1",
    "query/1",
    "t1.0.0.0",
)
small = st.integers(min_value=0, max_value=8)
ints = st.one_of(
    small,
    small,
    small,
    st.integers(min_value=-1, max_value=1 << 20),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**63 - 1, 2**64 - 1]),
)
texts = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(NAMES),
    st.text(max_size=12),
    st.sampled_from(NAMES).map(lambda s: s + "/x"),
)
#: Fields whose valid values a generic draw almost never hits.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "magic": st.sampled_from([b"SBUS", b"SBUX"]),
    "version": st.tuples(small, small, small),
    "kind": st.sampled_from(["node", "client", "peer"]),
}
#: The same, where a field name means a type of its own (a replication store's epoch is 8 bytes).
TYPED_FIELDS: dict[tuple[str, Any], st.SearchStrategy[Any]] = {
    ("epoch", bytes): st.one_of(st.binary(min_size=8, max_size=8), st.just(b"")),
    ("state", str): st.one_of(st.sampled_from(["member", "rejoining", "joined"]), texts),
}
blobs = st.one_of(st.binary(max_size=64), st.just(b""))
plain_values = st.one_of(st.none(), st.booleans(), ints, texts, blobs)


def _field(name: str, hint: Any) -> st.SearchStrategy[Any]:
    if name in FIELDS:
        return FIELDS[name]
    if (name, hint) in TYPED_FIELDS:
        return TYPED_FIELDS[name, hint]
    return _for(hint)


def _for(hint: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return st.recursive(plain_values, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        return ints
    if hint is float:
        return st.one_of(ints.map(float), st.floats(allow_nan=False, width=64))
    if hint is str:
        return texts
    if hint in (bytes, memoryview, bytearray):
        return blobs
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return instances(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_for(a) for a in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(_for(args[0]), max_size=4).map(tuple)
        return st.tuples(*(_for(a) for a in args))
    if origin in (list, typing.Sequence):
        return st.lists(_for(args[0]), max_size=4)
    if origin in (dict, typing.Mapping):
        return st.dictionaries(_for(args[0]), _for(args[1]), max_size=3)
    if origin in (frozenset, set):
        return st.frozensets(_for(args[0]), max_size=3)
    return plain_values


def _build(cls: type, values: dict[str, Any]) -> Any:
    try:
        return cls(**values)
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def _query_started() -> st.SearchStrategy[Any]:
    """Valid starts: plans of real queries (a generic draw never makes a fragment tree)."""
    from sparkbus.roles.query.messages import QueryId, QueryStarted
    from sparkbus.roles.query.plan import fragment_to_plain
    from sparkbus.roles.query.planner import plan_fragments
    from sparkbus.roles.query.sql import parse_sql

    sqls = (
        "SELECT COUNT(*) AS n FROM orders",
        "SELECT k, SUM(v) AS s FROM t WHERE v > ? GROUP BY k ORDER BY s DESC LIMIT 3",
        "SELECT a, b FROM t ORDER BY a",
    )

    def build(
        sql: str, members: list[str], repartition: bool, timeout: float, credit: int, local: str
    ) -> Any:
        fragments = plan_fragments(
            parse_sql(sql), initiator="q1", participants=members, repartition=repartition
        )
        edges = sorted({f.send.edge for f in fragments if f.send is not None})
        return QueryStarted(
            query_id=QueryId(member="q1", local=local),
            fragments=tuple(fragment_to_plain(f) for f in fragments),
            parameters=(1,) if "?" in sql else (),
            participants=tuple(dict.fromkeys(["q1", *members])),
            edge_credits=dict.fromkeys(edges, credit),
            timeout=timeout,
        )

    return st.builds(
        build,
        st.sampled_from(sqls),
        st.lists(st.sampled_from(["q1", "store-0", "store-1"]), min_size=1, max_size=3, unique=True),
        st.booleans(),
        st.floats(min_value=0, max_value=1e6),
        st.integers(min_value=1, max_value=2**63 - 1),
        st.sampled_from(["t1.0.0.0", "a.1", "x"]),
    )


def _segment_accepted() -> st.SearchStrategy[Any]:
    from sparkbus.roles.replication.messages import SegmentAccepted, stream_key

    def build(partition: str, segment: str, attempt: int, credit: int) -> Any:
        return SegmentAccepted(
            partition=partition,
            segment_id=segment,
            stream=stream_key(partition, segment, attempt),
            credit=credit,
        )

    return st.builds(
        build,
        st.sampled_from(["orders/0", "events/7", "p"]),
        st.sampled_from(["1-0001", "s", "9" * 20]),
        st.integers(min_value=0, max_value=2**32),
        st.integers(min_value=1, max_value=2**63 - 1),
    )


def _exchange_chosen() -> st.SearchStrategy[Any]:
    from sparkbus.roles.query.exchange import EXCHANGES, PUSH, ExchangeChosen
    from sparkbus.roles.query.messages import QueryId

    return st.builds(
        lambda local, kind: ExchangeChosen(query_id=QueryId(member="q1", local=local), exchange=kind),
        st.sampled_from(["t1.0.0.0", "a.1", "x"]),
        st.sampled_from([k for k in EXCHANGES if k != PUSH]),  # push is the default: no message
    )


def _create_dataflow() -> st.SearchStrategy[Any]:
    from sparkbus.roles.compute.messages import CreateDataflow
    from sparkbus.roles.compute.plans import ViewDef

    def build(view: Any, name: str, t: int, index: bool, export: str) -> Any:
        exports = {"index_exports": (export,)} if index else {"sink_exports": (export,)}
        return _build(
            CreateDataflow, {"name": name, "as_of": (t,), "imports": (view.source,), "view": view, **exports}
        )

    return st.builds(
        build,
        instances(ViewDef),
        texts,
        st.integers(min_value=0, max_value=2**63 - 1),
        st.booleans(),
        st.sampled_from(["idx/1", "sub/2", "v"]),
    ).filter(lambda m: m is not None)


#: Classes whose constructors accept almost nothing a generic draw makes: valid instances built directly.
BUILT: dict[str, Any] = {
    "CreateDataflow": _create_dataflow,
    "QueryStarted": _query_started,
    "SegmentAccepted": _segment_accepted,
    "ExchangeChosen": _exchange_chosen,
}


@cache
def instances(cls: type) -> st.SearchStrategy[Any]:
    """Instances of the dataclass ``cls`` that its constructor accepts."""
    if cls.__name__ in BUILT:
        built: st.SearchStrategy[Any] = BUILT[cls.__name__]()
        return built
    hints = typing.get_type_hints(cls)
    fields = {f.name: _field(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return (
        st.fixed_dictionaries(fields).map(lambda values: _build(cls, values)).filter(lambda m: m is not None)
    )


def message_classes() -> list[type]:
    return [cls for _, cls in sorted(REGISTRY.codes().items())]


def any_message() -> st.SearchStrategy[Any]:
    return st.one_of(*(instances(c) for c in message_classes()))


CODEC = EnvelopeCodec(REGISTRY)


@st.composite
def mutated_frames(draw: st.DrawFn, base: st.SearchStrategy[list[bytes]]) -> list[bytes]:
    """Frames of a valid message, then damaged the ways a hostile peer or a broken link would."""
    frames = [bytes(f) for f in draw(base)]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "truncate", "extend", "drop", "dup", "swap", "random", "type"]))
        i = draw(st.integers(min_value=0, max_value=max(0, len(frames) - 1)))
        if not frames:
            frames = [draw(st.binary(max_size=32))]
            continue
        f = frames[i]
        if op == "flip" and f:
            j = draw(st.integers(min_value=0, max_value=len(f) - 1))
            frames[i] = f[:j] + bytes([f[j] ^ draw(st.integers(min_value=1, max_value=255))]) + f[j + 1 :]
        elif op == "truncate":
            frames[i] = f[: draw(st.integers(min_value=0, max_value=len(f)))]
        elif op == "extend":
            frames[i] = f + draw(st.binary(min_size=1, max_size=16))
        elif op == "drop":
            del frames[i]
        elif op == "dup":
            frames.insert(i, f)
        elif op == "swap" and len(frames) > 1:
            frames[0], frames[-1] = frames[-1], frames[0]
        elif op == "random":
            frames[i] = draw(st.binary(max_size=64))
        elif op == "type":
            # The same body under another registered type code: the decoder must refuse the mismatch.
            code = draw(st.sampled_from(sorted(REGISTRY.codes())))
            frames[0] = CODEC.encode(draw(instances(REGISTRY.codes()[code])))[0]
    return frames


def encoded(cls: type) -> st.SearchStrategy[list[bytes]]:
    return instances(cls).map(lambda m: [bytes(f) for f in CODEC.encode(m)])
