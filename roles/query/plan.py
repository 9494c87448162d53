"""The plan language: operator trees, fragments, and their msgpack-able form.

A plan is a chain of operators over one table (each operator has at most one input). Logical plans
(built by hand or by the SQL front end) use ``Scan``, ``Filter``, ``Project``, ``Aggregate`` (phase
``single``), ``Sort`` and ``Limit``; the planner turns them into fragments that also use ``Aggregate``
phases ``partial`` / ``final``, ``TopK``, ``MergeSort``, ``Send`` and ``Receive``.

Plain form: every node is a msgpack map with an ``"op"`` tag and exactly its fields; decoding is strict
(an unknown op, a missing, extra or mistyped field is a ``PlanError`` naming the path to it), except that a
field added later (a scan's ``group_aliases``) is written only when it holds something and read as none when
missing, so a plan without it reads as before. Plans never travel as pickles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

from sparkbus.roles.query.errors import PlanError
from sparkbus.roles.query.expressions import Expr, expr_from_plain, expr_to_plain

AggFunc = Literal["count", "sum", "min", "max", "avg", "count_distinct"]
AGG_FUNCS: tuple[str, ...] = ("count", "sum", "min", "max", "avg", "count_distinct")
Phase = Literal["single", "partial", "final"]
SendMode = Literal["gather", "hash"]
_MAX_DEPTH = 64
#: the most rows a count or an offset names: more than any table holds, and two of them add up within
#: int64 (SQL clamps larger LIMIT and OFFSET values to it; a plan carrying more is refused)
MAX_ROWS = 1 << 62


def _name(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise PlanError(what, f"expected a non-empty name, got {value!r}")


def _names(values: tuple[str, ...], what: str) -> None:
    for i, v in enumerate(values):
        _name(v, f"{what}[{i}]")
    if len(set(values)) != len(values):
        raise PlanError(what, f"duplicate names in {list(values)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class AggCall:
    """One aggregate: ``name = func(column)``; ``column`` None only for ``count`` (``COUNT(*)``)."""

    name: str
    func: AggFunc
    column: str | None

    def __post_init__(self) -> None:
        _name(self.name, "agg.name")
        if self.func not in AGG_FUNCS:
            raise PlanError(
                f"agg[{self.name}]", f"unknown function {self.func!r}; known: {', '.join(AGG_FUNCS)}"
            )
        if self.column is None and self.func != "count":
            raise PlanError(f"agg[{self.name}]", f"{self.func} needs a column")
        if self.column is not None:
            _name(self.column, f"agg[{self.name}].column")


@dataclass(frozen=True, kw_only=True, slots=True)
class SortKey:
    """Sort by ``column``; where NULLs go is explicit (the SQL front end picks Spark's defaults)."""

    column: str
    descending: bool = False
    nulls_first: bool = True

    def __post_init__(self) -> None:
        _name(self.column, "sort_key.column")


@dataclass(frozen=True, kw_only=True, slots=True)
class Scan:
    """Read the local partition of ``table``: only ``columns`` (None: all), rows where ``predicate`` holds.

    ``group_aliases`` are GROUP BY names that the plan reads as the select list's aliases without knowing the
    table's columns (its initiator holds no partition of the table): right only where the table has no column
    of such a name, which Spark SQL would group by instead. A partition that has one refuses the query
    rather than answer it otherwise than Spark (``engine``). Names compare case-insensitively.
    """

    table: str
    columns: tuple[str, ...] | None = None
    predicate: Expr | None = None
    group_aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _name(self.table, "scan.table")
        if self.columns is not None:
            _names(self.columns, "scan.columns")
        _names(self.group_aliases, "scan.group_aliases")


@dataclass(frozen=True, kw_only=True, slots=True)
class Filter:
    """Rows of ``input`` where ``predicate`` is true (NULL counts as false)."""

    input: PlanNode
    predicate: Expr


@dataclass(frozen=True, kw_only=True, slots=True)
class Project:
    """One output column per item: ``(name, expression over input)``."""

    input: PlanNode
    items: tuple[tuple[str, Expr], ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise PlanError("project.items", "a projection needs at least one item")
        _names(tuple(n for n, _ in self.items), "project.items")


@dataclass(frozen=True, kw_only=True, slots=True)
class Aggregate:
    """Group ``input`` by ``keys`` (column names) and compute ``aggs``.

    ``single`` computes the answer in one step; ``partial`` emits mergeable states (one column per
    aggregate, two for ``avg``: ``name$sum`` and ``name$count``; ``count_distinct`` adds a row per
    distinct value, see ``aggregate``); ``final`` merges partial states and finishes them. Without keys the result has
    exactly one row, even for no input (SQL's global aggregate).
    """

    input: PlanNode
    keys: tuple[str, ...]
    aggs: tuple[AggCall, ...]
    phase: Phase = "single"

    def __post_init__(self) -> None:
        _names(self.keys, "aggregate.keys")
        _names(tuple(a.name for a in self.aggs) + self.keys, "aggregate.outputs")
        if self.phase not in ("single", "partial", "final"):
            raise PlanError("aggregate.phase", f"expected single, partial or final, got {self.phase!r}")
        if not self.aggs and not self.keys:
            raise PlanError("aggregate", "needs keys or aggregates")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sort:
    """Sort ``input`` (stably) by ``keys``."""

    input: PlanNode
    keys: tuple[SortKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise PlanError("sort.keys", "a sort needs at least one key")


@dataclass(frozen=True, kw_only=True, slots=True)
class MergeSort:
    """Merge inputs that are each sorted by ``keys`` (the initiator's side of a distributed sort)."""

    input: PlanNode
    keys: tuple[SortKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise PlanError("merge_sort.keys", "a merge sort needs at least one key")


@dataclass(frozen=True, kw_only=True, slots=True)
class TopK:
    """The first ``count`` rows of ``input`` in ``keys`` order (a local sort fused with a limit)."""

    input: PlanNode
    keys: tuple[SortKey, ...]
    count: int

    def __post_init__(self) -> None:
        if not self.keys:
            raise PlanError("top_k.keys", "a top-k needs at least one key")
        if type(self.count) is not int or not 0 <= self.count <= MAX_ROWS:
            raise PlanError("top_k.count", f"expected an int in 0..2**62, got {self.count!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    """Skip ``offset`` rows of ``input``, then keep at most ``count``."""

    input: PlanNode
    count: int
    offset: int = 0

    def __post_init__(self) -> None:
        for label, v in (("count", self.count), ("offset", self.offset)):
            if type(v) is not int or not 0 <= v <= MAX_ROWS:
                raise PlanError(f"limit.{label}", f"expected an int in 0..2**62, got {v!r}")

    @property
    def rows(self) -> int:
        """The rows this limit needs from below it (``offset + count``, at most ``MAX_ROWS``)."""
        return min(self.offset + self.count, MAX_ROWS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Send:
    """Send ``input`` on ``edge`` to the members of the receiving fragment.

    ``gather`` sends everything to each receiving member (there is one: the initiator); ``hash`` sends
    each row to one member chosen by a hash of ``keys``.
    """

    input: PlanNode
    edge: int
    mode: SendMode = "gather"
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if type(self.edge) is not int or self.edge < 0:
            raise PlanError("send.edge", f"expected an int >= 0, got {self.edge!r}")
        if self.mode not in ("gather", "hash"):
            raise PlanError("send.mode", f"expected gather or hash, got {self.mode!r}")
        _names(self.keys, "send.keys")
        if self.mode == "hash" and not self.keys:
            raise PlanError("send.keys", "a hash send needs keys")


@dataclass(frozen=True, kw_only=True, slots=True)
class Receive:
    """The rows that arrive on ``edge`` from every member of the sending fragment."""

    edge: int

    def __post_init__(self) -> None:
        if type(self.edge) is not int or self.edge < 0:
            raise PlanError("receive.edge", f"expected an int >= 0, got {self.edge!r}")


PlanNode = Scan | Filter | Project | Aggregate | Sort | MergeSort | TopK | Limit | Send | Receive


@dataclass(frozen=True, kw_only=True, slots=True)
class Fragment:
    """A part of a plan that runs on each of ``members`` (node names)."""

    id: int
    root: PlanNode
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        if type(self.id) is not int or self.id < 0:
            raise PlanError("fragment.id", f"expected an int >= 0, got {self.id!r}")
        if not self.members:
            raise PlanError(f"fragment[{self.id}].members", "a fragment needs at least one member")
        _names(self.members, f"fragment[{self.id}].members")

    @property
    def send(self) -> Send | None:
        """The fragment's ``Send`` (its root), or None for the root fragment."""
        return self.root if isinstance(self.root, Send) else None

    @property
    def receive(self) -> Receive | None:
        """The fragment's ``Receive`` (its leaf), or None for a fragment that scans."""
        leaf = chain(self.root)[0]
        return leaf if isinstance(leaf, Receive) else None


def chain(node: PlanNode) -> list[PlanNode]:
    """The operators of a plan from the leaf (scan or receive) up to ``node``."""
    out: list[PlanNode] = []
    cur: PlanNode | None = node
    while cur is not None:
        out.append(cur)
        cur = getattr(cur, "input", None)
    out.reverse()
    return out


def walk(node: PlanNode) -> Iterator[PlanNode]:
    """Every operator of the plan, from ``node`` down."""
    yield from reversed(chain(node))


# ---------------------------------------------------------------- plain form


def _key_to_plain(k: SortKey) -> dict[str, Any]:
    return {"column": k.column, "descending": k.descending, "nulls_first": k.nulls_first}


def plan_to_plain(node: PlanNode) -> dict[str, Any]:
    """The msgpack-able form of a plan tree."""
    if isinstance(node, Scan):
        plain = {
            "op": "scan",
            "table": node.table,
            "columns": list(node.columns) if node.columns is not None else None,
            "predicate": expr_to_plain(node.predicate) if node.predicate is not None else None,
        }
        if node.group_aliases:  # only when there are some: a plan without them reads as before
            plain["group_aliases"] = list(node.group_aliases)
        return plain
    if isinstance(node, Receive):
        return {"op": "receive", "edge": node.edge}
    base: dict[str, Any] = {"input": plan_to_plain(node.input)}
    if isinstance(node, Filter):
        return {"op": "filter", **base, "predicate": expr_to_plain(node.predicate)}
    if isinstance(node, Project):
        return {"op": "project", **base, "items": [[n, expr_to_plain(e)] for n, e in node.items]}
    if isinstance(node, Aggregate):
        aggs = [{"name": a.name, "func": a.func, "column": a.column} for a in node.aggs]
        return {"op": "aggregate", **base, "keys": list(node.keys), "aggs": aggs, "phase": node.phase}
    if isinstance(node, Sort | MergeSort):
        op = "sort" if isinstance(node, Sort) else "merge_sort"
        return {"op": op, **base, "keys": [_key_to_plain(k) for k in node.keys]}
    if isinstance(node, TopK):
        return {"op": "top_k", **base, "keys": [_key_to_plain(k) for k in node.keys], "count": node.count}
    if isinstance(node, Limit):
        return {"op": "limit", **base, "count": node.count, "offset": node.offset}
    return {"op": "send", **base, "edge": node.edge, "mode": node.mode, "keys": list(node.keys)}


class _Reader:
    """Strict access to one plain node's fields, with the path for errors."""

    def __init__(
        self, plain: Any, path: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> None:
        if type(plain) is not dict:
            raise PlanError(path, f"expected a map, got {type(plain).__name__}")
        extra = set(plain) - set(fields) - set(optional) - {"op"}
        if extra:
            raise PlanError(path, f"unexpected field {sorted(map(str, extra))[0]!r}")
        for f in fields:
            if f not in plain:
                raise PlanError(path, f"missing field {f!r}")
        self.plain = plain
        self.path = path

    def get(self, name: str, kind: type | tuple[type, ...], label: str) -> Any:
        value = self.plain[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if type(value) not in kinds:
            raise PlanError(f"{self.path}.{name}", f"expected {label}, got {type(value).__name__}")
        return value

    def strs(self, name: str) -> tuple[str, ...]:
        values = self.get(name, list, "an array of names")
        for i, v in enumerate(values):
            if type(v) is not str:
                raise PlanError(f"{self.path}.{name}[{i}]", f"expected str, got {type(v).__name__}")
        return tuple(values)

    def keys(self, name: str) -> tuple[SortKey, ...]:
        out = []
        for i, k in enumerate(self.get(name, list, "an array of sort keys")):
            r = _Reader(k, f"{self.path}.{name}[{i}]", ("column", "descending", "nulls_first"))
            out.append(_wrap(r.path, _sort_key_builder(r)))
        return tuple(out)


def _sort_key_builder(r: _Reader) -> Callable[[], SortKey]:
    def build() -> SortKey:
        return SortKey(
            column=r.get("column", str, "str"),
            descending=r.get("descending", bool, "bool"),
            nulls_first=r.get("nulls_first", bool, "bool"),
        )

    return build


def _agg_builder(r: _Reader) -> Callable[[], AggCall]:
    def build() -> AggCall:
        return AggCall(
            name=r.get("name", str, "str"),
            func=r.get("func", str, "str"),
            column=r.get("column", (str, type(None)), "str or nil"),
        )

    return build


def _wrap(path: str, build: Callable[[], Any]) -> Any:
    """Build a node; a constructor's own complaint is re-raised with the full path."""
    try:
        return build()
    except PlanError as exc:
        if exc.path.startswith(path):
            raise
        raise PlanError(f"{path}.{exc.path}", exc.reason) from None


_FIELDS: dict[str, tuple[str, ...]] = {
    "scan": ("table", "columns", "predicate"),
    "filter": ("input", "predicate"),
    "project": ("input", "items"),
    "aggregate": ("input", "keys", "aggs", "phase"),
    "sort": ("input", "keys"),
    "merge_sort": ("input", "keys"),
    "top_k": ("input", "keys", "count"),
    "limit": ("input", "count", "offset"),
    "send": ("input", "edge", "mode", "keys"),
    "receive": ("edge",),
}
#: fields an operator may leave out, meaning none (added after the plain form was first read)
_OPTIONAL: dict[str, tuple[str, ...]] = {"scan": ("group_aliases",)}


def plan_from_plain(plain: Any, path: str = "plan", depth: int = 0) -> PlanNode:
    """Decode and validate a plan tree.

    Raises:
        PlanError: naming the path of the first malformed node or field.
    """
    if depth > _MAX_DEPTH:
        raise PlanError(path, f"plan nested deeper than {_MAX_DEPTH}")
    if type(plain) is not dict:
        raise PlanError(path, f"expected a map, got {type(plain).__name__}")
    op = plain.get("op")
    if op not in _FIELDS:
        raise PlanError(f"{path}.op", f"unknown operator {op!r}; known: {', '.join(sorted(_FIELDS))}")
    path = f"{path}<{op}>"
    r = _Reader(plain, path, _FIELDS[op], _OPTIONAL.get(op, ()))
    if op == "scan":
        columns = None if r.plain["columns"] is None else r.strs("columns")
        pred = r.plain["predicate"]
        predicate = None if pred is None else expr_from_plain(pred, f"{path}.predicate")
        aliases = r.strs("group_aliases") if "group_aliases" in r.plain else ()
        return cast(
            PlanNode,
            _wrap(
                path,
                lambda: Scan(
                    table=r.get("table", str, "str"),
                    columns=columns,
                    predicate=predicate,
                    group_aliases=aliases,
                ),
            ),
        )
    if op == "receive":
        return cast(PlanNode, _wrap(path, lambda: Receive(edge=r.get("edge", int, "int"))))
    child = plan_from_plain(r.plain["input"], f"{path}.input", depth + 1)
    return cast(PlanNode, _wrap(path, lambda: _build(op, r, child, path)))


def _build(op: str, r: _Reader, child: PlanNode, path: str) -> PlanNode:
    if op == "filter":
        return Filter(input=child, predicate=expr_from_plain(r.plain["predicate"], f"{path}.predicate"))
    if op == "project":
        items = []
        for i, item in enumerate(r.get("items", list, "an array of [name, expression]")):
            if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
                raise PlanError(f"{path}.items[{i}]", "expected [name, expression]")
            items.append((item[0], expr_from_plain(item[1], f"{path}.items[{i}]")))
        return Project(input=child, items=tuple(items))
    if op == "aggregate":
        aggs = []
        for i, a in enumerate(r.get("aggs", list, "an array of aggregates")):
            ar = _Reader(a, f"{path}.aggs[{i}]", ("name", "func", "column"))
            aggs.append(_wrap(ar.path, _agg_builder(ar)))
        phase = r.get("phase", str, "str")
        return Aggregate(input=child, keys=r.strs("keys"), aggs=tuple(aggs), phase=phase)
    if op == "sort":
        return Sort(input=child, keys=r.keys("keys"))
    if op == "merge_sort":
        return MergeSort(input=child, keys=r.keys("keys"))
    if op == "top_k":
        return TopK(input=child, keys=r.keys("keys"), count=r.get("count", int, "int"))
    if op == "limit":
        return Limit(input=child, count=r.get("count", int, "int"), offset=r.get("offset", int, "int"))
    return Send(
        input=child, edge=r.get("edge", int, "int"), mode=r.get("mode", str, "str"), keys=r.strs("keys")
    )


def fragment_to_plain(fragment: Fragment) -> dict[str, Any]:
    """The msgpack-able form of a fragment."""
    return {"id": fragment.id, "root": plan_to_plain(fragment.root), "members": list(fragment.members)}


def fragment_from_plain(plain: Any, path: str = "fragment") -> Fragment:
    """Decode and validate a fragment (``PlanError`` names the path)."""
    r = _Reader(plain, path, ("id", "root", "members"))
    fid = r.get("id", int, "int")
    root = plan_from_plain(r.plain["root"], f"{path}[{fid}].root")
    return cast(Fragment, _wrap(path, lambda: Fragment(id=fid, root=root, members=r.strs("members"))))


def check_fragments(fragments: tuple[Fragment, ...]) -> None:
    """Validate a fragment set as a whole: unique ids, every edge sent by one fragment and received by one.

    Raises:
        PlanError: naming the fragment or edge at fault.
    """
    ids = [f.id for f in fragments]
    if len(set(ids)) != len(ids):
        raise PlanError("fragments", f"duplicate fragment ids {ids}")
    senders: dict[int, int] = {}
    receivers: dict[int, int] = {}
    roots = 0
    for f in fragments:
        for node in walk(f.root):
            if isinstance(node, Send) and node is not f.root:
                raise PlanError(f"fragment[{f.id}]", "send must be the root of its fragment")
            if isinstance(node, Receive | Scan) and node is not chain(f.root)[0]:
                raise PlanError(f"fragment[{f.id}]", "receive and scan must be leaves")
            if isinstance(node, Receive):
                if node.edge in receivers:
                    raise PlanError(f"fragment[{f.id}]", f"edge {node.edge} is received twice")
                receivers[node.edge] = f.id
        send = f.send
        if send is None:
            roots += 1
        elif send.edge in senders:
            raise PlanError(f"fragment[{f.id}]", f"edge {send.edge} is sent twice")
        else:
            senders[send.edge] = f.id
    if roots != 1:
        raise PlanError("fragments", f"expected exactly one root fragment (without send), got {roots}")
    if set(senders) != set(receivers):
        odd = sorted(set(senders) ^ set(receivers))
        raise PlanError("fragments", f"edges {odd} have a sender without a receiver or the reverse")
