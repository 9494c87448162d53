"""The SQL front end: one ``SELECT`` over one table, parsed with sqlglot (Spark dialect) into a logical plan.

Supported: expressions (arithmetic, comparisons, AND/OR/NOT, IS [NOT] NULL, IN, BETWEEN, [NOT] LIKE, ABS,
LOWER, UPPER, LENGTH, COALESCE, CAST (to BOOLEAN, the integer types, FLOAT, DOUBLE, DECIMAL(p,s), STRING, DATE,
TIMESTAMP, TIMESTAMP_NTZ; ``DATE '...'`` and ``TIMESTAMP '...'`` literals)), ``?`` parameters (numbered left to right), ``*`` or
``t.*`` as the whole select list, WHERE (a BOOLEAN condition, as Spark requires), GROUP BY (expressions or
select-list ordinals; a name is the table's column, else the select list's alias of that name, as in Spark;
without the table's columns the alias, which the scan checks), HAVING (a condition that is no predicate is
cast to BOOLEAN, as Spark's parser casts it), ORDER BY (output names, ordinals or expressions, whose names
mean outputs before input columns; ASC/DESC; NULLS FIRST/LAST with Spark's defaults: first for ASC, last for
DESC), LIMIT and OFFSET, and the aggregates COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM, MIN, MAX, AVG.
Everything else is refused with a ``SqlError`` that points at the offending part of the text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp

from sparkbus.roles.query.errors import QueryError, SqlError
from sparkbus.roles.query.expressions import (
    MAX_DEPTH,
    MAX_TERMS,
    Call,
    Column,
    Expr,
    Literal,
    Param,
    columns_of,
    depth_of,
    fits_int32,
    fold,
    like_regex,
    outside_int64,
)
from sparkbus.roles.query.plan import (
    MAX_ROWS,
    AggCall,
    Aggregate,
    Filter,
    Limit,
    PlanNode,
    Project,
    Scan,
    Sort,
    SortKey,
    chain,
)

_BINARY: dict[type[exp.Expr], str] = {
    exp.Add: "add",
    exp.Sub: "sub",
    exp.Mul: "mul",
    exp.Div: "div",
    exp.Mod: "mod",
    exp.EQ: "eq",
    exp.NEQ: "ne",
    exp.LT: "lt",
    exp.LTE: "le",
    exp.GT: "gt",
    exp.GTE: "ge",
    exp.And: "and",
    exp.Or: "or",
    exp.Like: "like",
}
_FUNCS: dict[type[exp.Expr], str] = {
    exp.Abs: "abs",
    exp.Lower: "lower",
    exp.Upper: "upper",
    exp.Length: "length",
}
_AGGS: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "avg",
}
_CLAUSES = frozenset({"expressions", "from_", "where", "group", "having", "order", "limit", "offset"})
_THIS = frozenset({"this"})
_OPERANDS = frozenset({"this", "expression"})
#: the parts of each expression node the translation reads (a flag that is false is no part)
_READS: dict[type[exp.Expr], frozenset[str]] = {
    **dict.fromkeys(_BINARY, _OPERANDS),
    exp.Div: _OPERANDS | {"safe"},  # Spark's `/` is marked safe; `typed` would be integer division
    exp.Like: _OPERANDS | {"negate"},
    **dict.fromkeys(_FUNCS, _THIS),
    **dict.fromkeys((exp.Paren, exp.Neg, exp.Not, exp.Boolean), _THIS),
    exp.Column: frozenset({"this", "table"}),
    exp.Literal: frozenset({"this", "is_string"}),
    exp.Null: frozenset(),
    exp.Placeholder: frozenset(),  # a named parameter (:p) would be bound by position
    exp.Is: _OPERANDS,
    exp.Between: frozenset({"this", "low", "high"}),
    exp.In: frozenset({"this", "expressions", "query"}),
    exp.Coalesce: frozenset({"this", "expressions", "is_nvl", "is_null"}),
    # CAST(x AS type) (sqlglot reads Spark's CAST as TryCast, and TRY_CAST as one marked safe)
    exp.Cast: frozenset({"this", "to"}),
    exp.TryCast: frozenset({"this", "to", "safe"}),
}
#: operators whose value is a BOOLEAN whatever their arguments' types (the predicates, and the casts to it)
_PREDICATES = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "is_null", "is_not_null", "in", "like"}
)
_BOOLEAN_OPS = _PREDICATES | {"to_boolean", "condition"}
_NUMBER_OPS = frozenset({"add", "sub", "mul", "div", "mod", "neg", "abs", "length"})
_TEXT_OPS = frozenset({"lower", "upper"})
#: how a refusal names a kind of value (``_kind``) that is not a BOOLEAN
_KINDS = {"null": "an untyped NULL (Spark's type VOID)", "number": "a number", "string": "a STRING"}

Hook = Callable[[exp.Expr], Expr | None]
#: the column names of a table, or None when they are not known (``parse_sql``)
Columns = Callable[[str], Sequence[str] | None]


_CAST_NAMES = {
    exp.DataType.Type.BOOLEAN: "BOOLEAN",
    exp.DataType.Type.TINYINT: "TINYINT",
    exp.DataType.Type.SMALLINT: "SMALLINT",
    exp.DataType.Type.INT: "INT",
    exp.DataType.Type.BIGINT: "BIGINT",
    exp.DataType.Type.FLOAT: "FLOAT",
    exp.DataType.Type.DOUBLE: "DOUBLE",
    exp.DataType.Type.TEXT: "STRING",
    exp.DataType.Type.VARCHAR: "STRING",
    exp.DataType.Type.CHAR: "STRING",
    exp.DataType.Type.DATE: "DATE",
    exp.DataType.Type.TIMESTAMP: "TIMESTAMP",
    exp.DataType.Type.TIMESTAMPTZ: "TIMESTAMP",
    exp.DataType.Type.TIMESTAMPLTZ: "TIMESTAMP",
    exp.DataType.Type.TIMESTAMPNTZ: "TIMESTAMP_NTZ",
}


def _cast_name(to: exp.DataType) -> str | None:
    """The name ``casts.cast`` takes for the CAST target ``to`` (a DECIMAL as ``DECIMAL(p,s)``, Spark's
    default DECIMAL(10,0)), None for a type that is not cast here."""
    if to.this == exp.DataType.Type.DECIMAL:
        digits = [
            str(e.this.this) if isinstance(e, exp.DataTypeParam) and isinstance(e.this, exp.Literal) else ""
            for e in to.expressions
        ]
        if len(digits) > 2 or not all(d.isdigit() for d in digits):
            return None
        precision, scale = int(digits[0]) if digits else 10, int(digits[1]) if len(digits) == 2 else 0
        return f"DECIMAL({precision},{scale})" if 1 <= precision <= 38 and scale <= precision else None
    return None if to.expressions else _CAST_NAMES.get(to.this)


class _Ask(Exception):
    """The translation needs the columns of ``table``: a GROUP BY name is also a select-list alias."""

    def __init__(self, table: str) -> None:
        super().__init__(table)
        self.table = table


@dataclass(frozen=True)
class _Asked:
    """``_parse``'s answer when the text needs the columns of ``table`` (kept like a plan)."""

    table: str


def _unread(node: exp.Expr, read: Collection[str]) -> tuple[str, exp.Expr | None] | None:
    """The first part of ``node`` outside ``read`` (its name, and its node if it is one), or None.

    sqlglot parses much more than the subset and marks some syntax in flags (``k NOT LIKE p`` is a Like
    marked ``negate``): a part the translation does not read would be silently ignored, so it is refused.
    """
    for key, value in node.args.items():
        if value and key not in read:
            part = value[0] if isinstance(value, list) else value
            return key, part if isinstance(part, exp.Expr) else None
    return None


def _is_star(item: exp.Expr) -> bool:
    """``*`` or ``t.*`` in a select list."""
    return isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))


def _terms(node: exp.And | exp.Or) -> list[exp.Expr]:
    """The terms of a chain of ``node``'s operator (``a OR b OR c`` nests as ``(a OR b) OR c``), in order;
    a parenthesised chain is one term."""
    terms: list[exp.Expr] = []
    stack: list[exp.Expr] = [node]
    while stack:
        n = stack.pop()
        if type(n) is type(node) and _unread(n, _OPERANDS) is None:
            stack += [n.expression, n.this]
        else:
            terms.append(n)
    return terms


def _aliases(outputs: dict[str, Expr], then: Hook | None) -> Hook:
    """ORDER BY's name resolution, as Spark SQL's: an unqualified name that the select list outputs means
    that output, also inside an expression (``SELECT -x AS x ... ORDER BY x + 0`` sorts by ``-x``), before
    any input column of that name; other nodes go to ``then``. Names compare case-insensitively."""
    outputs = {fold(name): e for name, e in outputs.items()}

    def hook(node: exp.Expr) -> Expr | None:
        if isinstance(node, exp.Column) and not node.table and fold(node.name) in outputs:
            return outputs[fold(node.name)]
        return then(node) if then is not None else None

    return hook


def _having(outputs: dict[str, Expr], keys: list[Expr], then: Hook) -> Hook:
    """HAVING's name resolution, as Spark SQL's: an unqualified name that the select list outputs means
    that output (``SELECT k, sum(x) AS x ... HAVING x > 2`` filters on ``sum(x)``), unless it names a
    GROUP BY column, which it then means (``SELECT upper(k) AS k ... GROUP BY k HAVING k = 'a'``); inside
    an aggregate, names are input columns. Other nodes go to ``then``. Names compare case-insensitively."""
    outputs = {fold(name): e for name, e in outputs.items()}

    def hook(node: exp.Expr) -> Expr | None:
        named = isinstance(node, exp.Column) and not node.table and fold(node.name) in outputs
        if named and Column(name=fold(node.name)) not in keys:
            return outputs[fold(node.name)]
        return then(node)

    return hook


def _cast_kind(e: Call) -> str | None:
    """``"number"`` or ``"string"`` for a ``cast`` to a number or to STRING, None for one to a DATE or a
    TIMESTAMP."""
    name = e.args[1].value if isinstance(e.args[1], Literal) else None
    if name == "STRING":
        return "string"
    return (
        "number"
        if isinstance(name, str)
        and (name.endswith("INT") or name in ("FLOAT", "DOUBLE") or name.startswith("DECIMAL"))
        else None
    )


def _kind(e: Expr) -> str | None:
    """What ``e``'s value is, as far as the text tells without the table's columns or the parameters' values:
    ``"boolean"``, ``"null"`` (the untyped NULL, Spark's VOID), ``"number"``, ``"string"``; None when that
    depends on a column or a parameter."""
    if isinstance(e, Literal):
        if e.value is None:
            return "null"
        if isinstance(e.value, bool):
            return "boolean"
        return "string" if isinstance(e.value, str) else "number"
    if not isinstance(e, Call):
        return None
    if e.op in _BOOLEAN_OPS:
        return "boolean"
    if e.op in _NUMBER_OPS or (e.op == "cast" and _cast_kind(e) == "number"):
        return "number"
    if e.op == "cast" and _cast_kind(e) == "string":
        return "string"
    if e.op in _TEXT_OPS:
        return "string"
    if e.op == "coalesce":  # its arguments' common type: a typed one tells it, NULLs alone are NULL
        kinds = [_kind(a) for a in e.args]
        typed = [k for k in kinds if k not in (None, "null")]
        if typed:
            return next((k for k in typed if k != "boolean"), "boolean")
        return "null" if all(k == "null" for k in kinds) else None
    return None


@dataclass
class _Context:
    sql: str
    table: str
    alias: str | None
    params: dict[int, int] = field(default_factory=dict)

    def error(self, reason: str, node: exp.Expr | None = None) -> SqlError:
        start, end = _span(node) if node is not None else (None, None)
        return SqlError(reason, self.sql, start, end)


def _span_of(node: exp.Expr | None) -> tuple[int | None, int | None]:
    return _span(node) if node is not None else (None, None)


def _text(key: str, part: exp.Expr | None) -> str:
    """How an error names a part: its SQL, or for a flag its name (``all`` is ``ALL``)."""
    return part.sql(dialect="spark") if part is not None else _name(key)


def _name(key: str) -> str:
    """A part's name as SQL spells it (``except_`` is ``EXCEPT``)."""
    return key.replace("_", " ").strip().upper()


def _span(node: exp.Expr) -> tuple[int | None, int | None]:
    """Character offsets of ``node`` in the text, from the tokens sqlglot kept positions for."""
    starts, ends = [], []
    for n in node.walk():
        meta = getattr(n, "_meta", None) or {}
        if "start" in meta:
            starts.append(meta["start"])
            ends.append(meta["end"] + 1)
    if not starts:
        return None, None
    return min(starts), max(ends)


def parse_sql(sql: str, columns: Columns | None = None) -> PlanNode:
    """A logical plan for ``sql``.

    A GROUP BY name that is also a select-list alias is resolved as Spark SQL resolves it
    (``spark.sql.groupByAliases``): the table's column when the table has one, else the alias's expression.
    That needs the table's columns: ``columns`` gives them (None when unknown), and is asked only for such a
    text. Where they are not known (the planning node holds no partition of the table) the name is the alias's
    expression, and the plan's scan names it in ``group_aliases``: a partition that has such a column refuses
    the query rather than group by the alias where Spark would group by the column.

    Plans are immutable, so the plans of recently parsed texts (with the columns asked) are kept: a dashboard
    repeating the same query skips sqlglot (0.2 to 0.4 ms a query). Errors are not cached.

    Raises:
        SqlError: a syntax error or a construct outside the subset, pointing at the offending text.
    """
    plan = _parse(sql, None, columns is not None)
    if isinstance(plan, _Asked):
        assert columns is not None
        names = columns(plan.table)
        plan = _parse(sql, None if names is None else tuple(names), False)
    assert not isinstance(plan, _Asked)
    return plan


@functools.lru_cache(maxsize=256)
def _parse(sql: str, columns: tuple[str, ...] | None, ask: bool) -> PlanNode | _Asked:
    """``parse_sql``'s plan, given the table's ``columns`` (None: not known); with ``ask``, a text that needs
    them (and has not got them) is answered ``_Asked``."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except RecursionError:
        raise SqlError(_too_deep(), sql) from None
    except sqlglot.errors.ParseError as exc:
        info = exc.errors[0] if exc.errors else {}
        line, col = info.get("line"), info.get("col")
        start = None
        if isinstance(line, int) and isinstance(col, int):
            line_start = 0
            for _ in range(line - 1):
                line_start = sql.find("\n", line_start) + 1
            start = max(0, line_start + col - len(info.get("highlight") or " "))
        reason = str(info.get("description") or exc).split("<Token")[0].strip()
        raise SqlError(
            f"syntax error: {reason}",
            sql,
            start,
            start + len(info.get("highlight") or " ") if start is not None else None,
        ) from None
    except sqlglot.errors.SqlglotError as exc:
        raise SqlError(f"syntax error: {exc}", sql) from None
    if len(statements) != 1:
        raise SqlError(f"expected one statement, got {len(statements)}", sql)
    select = statements[0]
    if not isinstance(select, exp.Select):
        raise SqlError(f"only SELECT is supported, not {select.key.upper()}", sql, *_span(select))
    try:
        plan = _Translator(sql, select, columns, ask).plan()
    except RecursionError:
        raise SqlError(_too_deep(), sql) from None
    except _Ask as needed:
        return _Asked(needed.table)
    for node in chain(plan):
        exprs = [e for _, e in node.items] if isinstance(node, Project) else []
        predicate = node.predicate if isinstance(node, Scan | Filter) else None
        if any(depth_of(e) > MAX_DEPTH for e in [*exprs, *([predicate] if predicate else [])]):
            raise SqlError(_too_deep(), sql)
    return plan


def _too_deep() -> str:
    return f"an expression nests deeper than {MAX_DEPTH} levels (a chain of AND or OR terms is one level)"


def _table(sql: str, select: exp.Select) -> exp.Table:
    """The one table ``select`` reads, once every clause is known to hold only parts the translation reads.

    Raises:
        SqlError: naming the first part outside the subset.
    """
    unread = _unread(select, _CLAUSES)
    if unread is not None:
        key, part = unread
        hint = "; use GROUP BY" if key == "distinct" else ""
        raise SqlError(f"{key.upper()} is not supported{hint}", sql, *_span_of(part))
    source = select.args.get("from_")
    if source is None:
        raise SqlError("a query needs FROM <table>", sql, *_span(select))
    table = source.this
    if (
        not isinstance(table, exp.Table)
        or not isinstance(table.this, exp.Identifier)
        or table.args.get("db")
        or table.args.get("catalog")
    ):
        raise SqlError("FROM takes one table name", sql, *_span(source))
    unread = _unread(table, ("this", "alias"))
    if unread is not None:  # TABLESAMPLE, PIVOT, hints, time travel ...
        raise SqlError(f"{_text(*unread)} in FROM is not supported", sql, *_span_of(unread[1]))
    alias = table.args.get("alias")
    if alias is not None and _unread(alias, _THIS) is not None:
        raise SqlError("a table alias that renames columns is not supported", sql, *_span(alias))
    group = select.args.get("group")
    unread = _unread(group, ("expressions",)) if group is not None else None
    if unread is not None:  # WITH ROLLUP, WITH CUBE, ALL ...
        raise SqlError(f"GROUP BY {_text(*unread)} is not supported", sql, *_span_of(unread[1]))
    order = select.args.get("order")
    for ordered in order.expressions if order is not None else []:
        unread = _unread(ordered, ("this", "desc", "nulls_first"))
        if unread is not None:
            raise SqlError(f"ORDER BY ... {_text(*unread)} is not supported", sql, *_span(ordered))
    return table


class _Translator:
    def __init__(self, sql: str, select: exp.Select, columns: tuple[str, ...] | None, ask: bool) -> None:
        self.select = select
        self.columns = None if columns is None else {fold(c) for c in columns}
        self.ask = ask
        #: GROUP BY names read as aliases without the columns (``_grouped``), for ``Scan.group_aliases``
        self.group_aliases: list[str] = []
        table = _table(sql, select)
        self.ctx = _Context(sql, table.name, table.alias or None)
        order = 0
        for clause in ("expressions", "where", "group", "having", "order"):
            value = select.args.get(clause)
            for node in value if isinstance(value, list) else [value] if value is not None else []:
                for sub in node.walk(bfs=False):
                    if isinstance(sub, exp.Placeholder):
                        self.ctx.params[id(sub)] = order
                        order += 1

    def error(self, reason: str, node: exp.Expr | None = None) -> SqlError:
        return self.ctx.error(reason, node)

    # -------------------------------------------------------------- expressions

    def expr(self, node: exp.Expr, hook: Hook | None = None) -> Expr:
        if hook is not None:
            hooked = hook(node)
            if hooked is not None:
                return hooked
        reads = _READS.get(type(node))
        unread = _unread(node, reads) if reads is not None else None
        if unread is not None:
            if isinstance(node, exp.Placeholder):
                raise self.error(
                    f"named parameters ({node.sql(dialect='spark')}) are not supported; use ?", node
                )
            raise self.error(f"{node.key.upper()} with {_name(unread[0])} is not supported", node)
        if isinstance(node, exp.Paren):
            return self.expr(node.this, hook)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                raise self.error(
                    f"{node.sql(dialect='spark')} is supported only as the whole select list", node
                )
            self._qualifier(node)
            # Names compare case-insensitively, as in Spark SQL: spelt one way, a participant finds its column
            # case-insensitively too (``expressions.resolve``).
            return Column(name=fold(node.name))
        if isinstance(node, exp.Literal):
            if node.is_string:
                return Literal(value=node.this)
            return Literal(value=self._number(node))
        if isinstance(node, exp.Boolean):
            return Literal(value=bool(node.this))
        if isinstance(node, exp.Null):
            return Literal(value=None)
        if isinstance(node, exp.Placeholder):
            return Param(index=self.ctx.params[id(node)])
        if isinstance(node, exp.Neg):
            if isinstance(node.this, exp.Literal) and not node.this.is_string:
                return Literal(value=self._number(node.this, negative=True))
            inner = self.expr(node.this, hook)
            if (
                isinstance(inner, Literal)
                and isinstance(inner.value, int | float)
                and not isinstance(inner.value, bool)
                # an INT (or BIGINT) whose negation leaves its type overflows, as in Spark: -(-2147483648)
                and (fits_int32(inner.value) == fits_int32(-inner.value) and not outside_int64(-inner.value))
            ):
                return Literal(value=-inner.value)
            return Call(op="neg", args=(inner,))
        if isinstance(node, exp.Not):
            if isinstance(node.this, exp.Is):
                return Call(op="is_not_null", args=(self._is_null_arg(node.this, hook),))
            return Call(op="not", args=(self.expr(node.this, hook),))
        if isinstance(node, exp.Is):
            return Call(op="is_null", args=(self._is_null_arg(node, hook),))
        if isinstance(node, exp.Between):
            x = self.expr(node.this, hook)
            low, high = self.expr(node.args["low"], hook), self.expr(node.args["high"], hook)
            return Call(op="and", args=(Call(op="ge", args=(x, low)), Call(op="le", args=(x, high))))
        if isinstance(node, exp.In):
            if node.args.get("query") or not node.expressions:
                raise self.error("IN takes a list of constants", node)
            if len(node.expressions) > MAX_TERMS:
                raise self.error(f"IN takes at most {MAX_TERMS} values, got {len(node.expressions)}", node)
            items = tuple(self.expr(e, hook) for e in node.expressions)
            for e, item in zip(node.expressions, items, strict=True):
                if not isinstance(item, Literal | Param):
                    raise self.error("IN takes a list of constants", e)
            return Call(op="in", args=(self.expr(node.this, hook), *items))
        if isinstance(node, exp.Cast):
            return self._cast(node, hook)
        if isinstance(node, exp.Coalesce):
            args = [node.this, *node.expressions]
            return Call(op="coalesce", args=tuple(self.expr(a, hook) for a in args))
        if isinstance(node, exp.And | exp.Or):
            # One call for the whole chain: sqlglot nests `a OR b OR c ...` one level per term.
            terms = _terms(node)
            if len(terms) > MAX_TERMS:
                raise self.error(
                    f"{node.key.upper()} of {len(terms)} terms; at most {MAX_TERMS} are supported", node
                )
            return Call(op=_BINARY[type(node)], args=tuple(self.expr(t, hook) for t in terms))
        op = _BINARY.get(type(node))
        if op is not None:
            call = Call(op=op, args=(self.expr(node.this, hook), self.expr(node.expression, hook)))
            pattern = call.args[1]
            if op == "like" and isinstance(pattern, Literal) and isinstance(pattern.value, str):
                try:  # a pattern Spark refuses is refused before anything runs (a `?` when it is bound)
                    like_regex(pattern.value)
                except QueryError as exc:
                    raise self.error(exc.message, node.expression) from None
            # sqlglot reads `k NOT LIKE p` as one Like node marked negate
            return Call(op="not", args=(call,)) if node.args.get("negate") else call
        op = _FUNCS.get(type(node))
        if op is not None:
            return Call(op=op, args=(self.expr(node.this, hook),))
        if isinstance(node, exp.AggFunc):
            raise self.error(f"aggregate {node.sql(dialect='spark')} is not allowed here", node)
        raise self.error(f"unsupported expression {node.sql(dialect='spark')!r}", node)

    def _qualifier(self, node: exp.Column) -> None:
        """Refuse a column qualified by a name other than the table's or its alias's (in any case)."""
        qualifier = node.table
        if qualifier and fold(qualifier) not in (fold(self.ctx.table), fold(self.ctx.alias or "")):
            raise self.error(f"unknown table {qualifier!r} (the query reads {self.ctx.table!r})", node)

    def _number(self, node: exp.Literal, *, negative: bool = False) -> int | float:
        """A numeric literal: an int within int64 (BIGINT; there are no decimals here), else a float."""
        try:
            value: int | float = int(node.this)
        except ValueError:
            try:
                value = float(node.this)
            except ValueError:  # a token sqlglot reads as a number, such as `1e`
                raise self.error(f"malformed number {node.this}", node) from None
            if math.isinf(value):  # as Spark SQL: a literal beyond DOUBLE's range is an error, not infinity
                raise self.error(
                    f"numeric literal {node.this} is outside the range of DOUBLE", node
                ) from None
        if negative:
            value = -value
        if outside_int64(value):
            raise self.error(f"integer literal {value} is outside the range of BIGINT (64-bit)", node)
        return value

    def _cast(self, node: exp.Cast, hook: Hook | None) -> Expr:
        """``CAST(x AS type)`` as Spark's ANSI cast: to BOOLEAN ``to_boolean``, to a number, STRING, DATE,
        TIMESTAMP or DECIMAL(p,s) ``cast`` (``casts.cast``); ``DATE '...'`` and ``TIMESTAMP '...'`` literals are
        such casts. TRY_CAST, and casts to other types (BINARY, nested types, intervals), are refused."""
        if node.args.get("safe"):
            raise self.error("TRY_CAST is not supported (CAST is)", node)
        to = node.args.get("to")
        name = _cast_name(to) if isinstance(to, exp.DataType) else None
        if name is None:
            target = to.sql(dialect="spark") if isinstance(to, exp.Expr) else "?"
            raise self.error(
                f"CAST to {target} is not supported (to BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, "
                "DECIMAL(p,s), STRING, DATE, TIMESTAMP and TIMESTAMP_NTZ are)",
                node,
            )
        x = self.expr(node.this, hook)
        if name == "BOOLEAN":
            return Call(op="to_boolean", args=(x,))
        return Call(op="cast", args=(x, Literal(value=name)))

    def _where(self, node: exp.Expr) -> Expr:
        """The WHERE condition, which must be a BOOLEAN, as Spark SQL requires (FILTER_NOT_BOOLEAN): one the
        text shows is not (``WHERE NULL``, ``WHERE 1``, ``WHERE upper(NULL)``) is refused here; one made of
        parameters only is checked when they are bound (``condition``); one that reads a column, by the scan.

        Raises:
            SqlError: naming the condition and what it is.
        """
        e = self.expr(node)
        kind = _kind(e)
        if kind is None and not columns_of(e):
            return Call(op="condition", args=(e,))
        if kind is not None and kind != "boolean":
            raise self.error(
                f"the WHERE condition {node.sql(dialect='spark')} is {_KINDS[kind]}, not a BOOLEAN, as Spark SQL "
                "refuses it (DATATYPE_MISMATCH.FILTER_NOT_BOOLEAN)",
                node,
            )
        return e

    def _is_null_arg(self, node: exp.Is, hook: Hook | None) -> Expr:
        if not isinstance(node.expression, exp.Null):
            raise self.error("only IS NULL and IS NOT NULL are supported", node)
        return self.expr(node.this, hook)

    # -------------------------------------------------------------- the query

    def plan(self) -> PlanNode:
        s = self.select
        where = s.args.get("where")
        scan = Scan(table=self.ctx.table, predicate=self._where(where.this) if where is not None else None)
        items = s.expressions
        group = s.args.get("group")
        having = s.args.get("having")
        aggregated = (
            group is not None
            or having is not None
            or any(isinstance(n, exp.AggFunc) for i in items for n in i.walk())
        )
        star = len(items) == 1 and _is_star(items[0])
        if any(_is_star(i) for i in items) and not star:
            raise self.error("* must be the only item of the select list", items[0])
        if star and isinstance(items[0], exp.Column):  # t.*: every column of the one table
            self._qualifier(items[0])
            if _unread(items[0], ("this", "table")) is not None:
                raise self.error("* qualified by a database is not supported", items[0])
        unread = (
            _unread(items[0].this if isinstance(items[0], exp.Column) else items[0], ()) if star else None
        )
        if unread is not None:
            raise self.error(f"* with {_name(unread[0])} is not supported", items[0])
        if aggregated:
            if star:
                raise self.error("SELECT * cannot be aggregated", items[0])
            return self._aggregated(scan, group, having)
        return self._plain(scan, star)

    def _names(self) -> list[str]:
        names: list[str] = []
        for item in self.select.expressions:
            name = (
                item.alias
                if isinstance(item, exp.Alias)
                else item.name
                if isinstance(item, exp.Column)
                else item.sql(dialect="spark")
            )
            if fold(name) in map(fold, names) or name.startswith("__"):
                # Names compare case-insensitively: `x` and `X` would be one name to ORDER BY and HAVING.
                raise self.error(f"duplicate or reserved output name {name!r}; use AS", item)
            names.append(name)
        return names

    def _item_expr(self, item: exp.Expr) -> exp.Expr:
        return item.this if isinstance(item, exp.Alias) else item

    def _ordinal(self, node: exp.Expr, clause: str) -> int | None:
        if isinstance(node, exp.Literal) and not node.is_string:
            n = int(node.this) if node.this.isdigit() else 0
            if not 1 <= n <= len(self.select.expressions):
                raise self.error(f"{clause} position {node.this} is not in the select list", node)
            return n - 1
        return None

    def _order(
        self, names: list[str], hook: Hook | None, star: bool
    ) -> tuple[list[SortKey], list[tuple[str, Expr]]]:
        keys: list[SortKey] = []
        hidden: list[tuple[str, Expr]] = []
        order = self.select.args.get("order")
        for i, ordered in enumerate(order.expressions if order is not None else []):
            node = ordered.this
            desc = bool(ordered.args.get("desc"))
            nulls_first = ordered.args.get("nulls_first")
            nulls_first = (not desc) if nulls_first is None else bool(nulls_first)
            if star and not isinstance(node, exp.Column):
                # The output columns are the table's, unknown until a member reads it: names only.
                raise self.error(
                    "with SELECT *, ORDER BY takes column names, not positions or expressions", node
                )
            position = self._ordinal(node, "ORDER BY")
            output = (
                [fold(n) for n in names].index(fold(node.name))
                if isinstance(node, exp.Column) and not node.table and fold(node.name) in map(fold, names)
                else None
            )
            if position is not None:
                column = names[position]
            elif output is not None:
                column = names[output]
            elif star:
                column = node.name
            else:
                column = f"__o{i}"
                hidden.append((column, self.expr(node, hook)))
            keys.append(SortKey(column=column, descending=desc, nulls_first=nulls_first))
        return keys, hidden

    def _limit(self, node: PlanNode) -> PlanNode:
        limit, offset = self.select.args.get("limit"), self.select.args.get("offset")
        if limit is None and offset is None:
            return node
        count = self._count(limit.expression, "LIMIT") if limit is not None else MAX_ROWS
        skip = self._count(offset.expression, "OFFSET") if offset is not None else 0
        return Limit(input=node, count=count, offset=skip)

    def _count(self, node: exp.Expr, clause: str) -> int:
        """A LIMIT or OFFSET value; beyond ``MAX_ROWS`` (more rows than any table holds) it is ``MAX_ROWS``,
        so ``LIMIT 9223372036854775807`` means "no limit" and the planner's sums stay within int64."""
        if not isinstance(node, exp.Literal) or node.is_string or not node.this.isdigit():
            raise self.error(f"{clause} takes a non-negative integer", node)
        return min(int(node.this), MAX_ROWS)

    def _finish(
        self, node: PlanNode, names: list[str], keys: list[SortKey], hidden: list[tuple[str, Expr]]
    ) -> PlanNode:
        if keys:
            node = Sort(input=node, keys=tuple(keys))
        node = self._limit(node)
        if hidden:
            node = Project(input=node, items=tuple((n, Column(name=n)) for n in names))
        return node

    def _plain(self, scan: Scan, star: bool) -> PlanNode:
        if star:
            keys, _ = self._order([], None, star=True)
            return self._finish(scan, [], keys, [])
        names = self._names()
        items = [
            (n, self.expr(self._item_expr(i))) for n, i in zip(names, self.select.expressions, strict=True)
        ]
        keys, hidden = self._order(names, _aliases(dict(items), None), star=False)
        node = Project(input=scan, items=tuple(items + hidden))
        return self._finish(node, names, keys, hidden)

    def _grouped(self, aliases: dict[str, exp.Expr], hints: list[str]) -> Hook:
        """GROUP BY's name resolution, as Spark SQL's (``spark.sql.groupByAliases``): an unqualified name is
        the table's column when the table has one, else the select list's alias of that name, also inside an
        expression (``GROUP BY p + 1``). Names compare case-insensitively. A name kept as a column although
        an alias has it adds a hint to ``hints``, for the error of a select item the column leaves ungrouped.
        Where the columns are not known the name is the alias, and goes to ``group_aliases``, for the scan: a
        partition with such a column refuses the plan. But it is the column when the alias's expression reads
        a column of that name (the table has one, or the query fails anyway), and when the alias holds an
        aggregate (the one reading that can be right).

        Raises:
            _Ask: such a name when the columns are not known and may be asked.
            SqlError: the alias's expression holds an aggregate (Spark's GROUP_BY_AGGREGATE).
        """

        def hook(node: exp.Expr) -> Expr | None:
            if not isinstance(node, exp.Column) or node.table or fold(node.name) not in aliases:
                return None
            name = node.name
            if self.columns is None and self.ask:
                raise _Ask(self.ctx.table)
            if self.columns is not None and fold(name) in self.columns:
                hints.append(
                    f"; GROUP BY {name} means the column {name} of table {self.ctx.table}, which comes before "
                    "the select list's alias, as in Spark: group by the alias's expression or its position"
                )
                return None
            alias = aliases[fold(name)]
            if self.columns is None and fold(name) in {fold(c.name) for c in alias.find_all(exp.Column)}:
                return None  # the alias reads a column of its name (upper(k) AS k): the table has it, as in Spark
            if any(isinstance(n, exp.AggFunc) for n in alias.walk()):
                if self.columns is None:
                    return None  # the column: the one reading that can be right (else the scan finds none)
                raise self.error(
                    f"GROUP BY cannot hold an aggregate: {name} is the select list's alias of "
                    f"{alias.sql(dialect='spark')}",
                    node,
                )
            e = self.expr(alias)
            if self.columns is None and fold(name) not in self.group_aliases:
                self.group_aliases.append(fold(name))  # right only where the table has no such column
            return e

        return hook

    def _aggregated(self, scan: Scan, group: exp.Group | None, having: exp.Having | None) -> PlanNode:
        names = self._names()
        aliases = {fold(i.alias): i.this for i in self.select.expressions if isinstance(i, exp.Alias)}
        hints: list[str] = []
        grouped = self._grouped(aliases, hints)
        key_exprs: list[Expr] = []
        for g in group.expressions if group is not None else []:
            position = self._ordinal(g, "GROUP BY")
            node = self._item_expr(self.select.expressions[position]) if position is not None else g
            if any(isinstance(n, exp.AggFunc) for n in node.walk()):
                raise self.error("GROUP BY cannot hold an aggregate", g)
            e = self.expr(node, grouped if position is None else None)
            if e not in key_exprs:
                key_exprs.append(e)
        if self.group_aliases:
            scan = replace(scan, group_aliases=tuple(self.group_aliases))
        args: list[Expr] = []
        aggs: list[tuple[str, Expr | None]] = []
        hint = hints[0] if hints else ""

        def post(node: exp.Expr) -> Expr | None:
            if isinstance(node, exp.AggFunc):
                return Column(name=f"__g{self._agg(node, args, aggs)}")
            if any(isinstance(n, exp.AggFunc) for n in node.walk()):
                return None
            e = self.expr(node)
            if e in key_exprs:
                return Column(name=f"__k{key_exprs.index(e)}")
            if isinstance(node, exp.Column):
                raise self.error(
                    f"column {node.name!r} must appear in GROUP BY or inside an aggregate{hint}", node
                )
            return None

        items = [
            (n, self.expr(self._item_expr(i), post))
            for n, i in zip(names, self.select.expressions, strict=True)
        ]
        having_expr = (
            self.expr(having.this, _having(dict(items), key_exprs, post)) if having is not None else None
        )
        keys, hidden = self._order(names, _aliases(dict(items), post), star=False)
        pre_items = [(f"__k{i}", e) for i, e in enumerate(key_exprs)] + [
            (f"__a{i}", e) for i, e in enumerate(args)
        ]
        pre: PlanNode = (
            Project(input=scan, items=tuple(pre_items)) if pre_items else replace(scan, columns=())
        )
        calls = tuple(
            AggCall(name=f"__g{i}", func=func, column=None if arg is None else f"__a{args.index(arg)}")  # type: ignore[arg-type]
            for i, (func, arg) in enumerate(aggs)
        )
        result: PlanNode = Aggregate(
            input=pre, keys=tuple(f"__k{i}" for i in range(len(key_exprs))), aggs=calls
        )
        if having_expr is not None:
            # As Spark's parser: a HAVING condition that is no predicate is cast to BOOLEAN, so HAVING 1 keeps
            # every group, HAVING NULL none, and HAVING count(*) - 1 the groups of more than one row.
            if not (isinstance(having_expr, Call) and having_expr.op in _PREDICATES):
                having_expr = Call(op="to_boolean", args=(having_expr,))
            result = Filter(input=result, predicate=having_expr)
        result = Project(input=result, items=tuple(items + hidden))
        return self._finish(result, names, keys, hidden)

    def _agg(self, node: exp.AggFunc, args: list[Expr], aggs: list[tuple[str, Expr | None]]) -> int:
        func = _AGGS.get(type(node))
        if func is None:
            raise self.error(f"unsupported aggregate {node.sql(dialect='spark')}", node)
        if _unread(node, ("this", "big_int")) is not None:  # max(x, y), count(x, k)
            raise self.error(f"{func.upper()} of more than one argument is not supported", node)
        inner = node.this
        if isinstance(inner, exp.Distinct):
            if func != "count" or len(inner.expressions) != 1:
                raise self.error("only COUNT(DISTINCT x) of one expression is supported", node)
            func, inner = "count_distinct", inner.expressions[0]
        arg: Expr | None
        if func == "count" and (
            isinstance(inner, exp.Star) or (isinstance(inner, exp.Literal) and not inner.is_string)
        ):
            arg = None  # COUNT(*) and COUNT(1) count rows
        elif inner is None or isinstance(inner, exp.Star):
            raise self.error(f"{func.upper()} needs an argument", node)
        else:
            if any(isinstance(n, exp.AggFunc) for n in inner.walk()):
                raise self.error("aggregates cannot be nested", node)
            arg = self.expr(inner)
            if arg not in args:
                args.append(arg)
        if (func, arg) not in aggs:
            aggs.append((func, arg))
        return aggs.index((func, arg))
