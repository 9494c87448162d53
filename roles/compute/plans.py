"""View definitions carried inside ``CreateDataflow``, and peek finishing, as plain frozen dataclasses.

A view reads one collection (an input table or another view's index) and applies, in this order: ``maps``
(computed columns), ``filters`` (a conjunction of predicates), ``project`` (the columns kept), then an optional
reduction: ``group_by`` keys with ``aggregates``. ``group_by`` without aggregates is ``SELECT DISTINCT``.
Without ``group_by``, aggregates are global and, as in SQL, an empty input yields one row (count 0, the rest
null). Materialize ships its plans as an MIR/LIR tree; this is the subset the issue asks for, kept small enough
to validate completely in constructors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PredicateOp = Literal["eq", "ne", "lt", "le", "gt", "ge", "is_null", "is_not_null"]
MapOp = Literal["add", "subtract", "multiply", "divide"]
AggFunc = Literal["count", "sum", "avg", "min", "max"]
Scalar = int | float | str | bool | None

_RESERVED_PREFIX = "__"
#: The largest limit or offset: Arrow slices by int64, as Materialize's ``RowSetFinishing`` limits by one.
_MAX_ROWS = 2**63 - 1


def _check_name(name: str, what: str) -> None:
    if type(name) is not str or not name:
        raise ValueError(f"{what} must be a non-empty str, got {name!r}")
    if name.startswith(_RESERVED_PREFIX):
        raise ValueError(f"{what} {name!r}: names starting with '__' are reserved")
    try:
        name.encode()  # carried in commands to the replicas, which must encode it
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} must be UTF-8 text, got a lone surrogate at character {exc.start}"
        ) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicate:
    """``column op value``; ``is_null`` / ``is_not_null`` take no value."""

    column: str
    op: PredicateOp
    value: Scalar = None

    def __post_init__(self) -> None:
        _check_name(self.column, "Predicate.column")
        if self.op in ("is_null", "is_not_null"):
            if self.value is not None:
                raise ValueError(f"Predicate.value must be None for {self.op}")
        elif self.value is None:
            raise ValueError(f"Predicate.value is required for {self.op} (use is_null to test for null)")


@dataclass(frozen=True, kw_only=True, slots=True)
class MapExpr:
    """A computed column ``name = left op (right | literal)``: exactly one of ``right`` and ``literal``."""

    name: str
    op: MapOp
    left: str
    right: str | None = None
    literal: int | float | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "MapExpr.name")
        _check_name(self.left, "MapExpr.left")
        if (self.right is None) == (self.literal is None):
            raise ValueError(f"MapExpr {self.name!r}: give exactly one of right and literal")
        if self.right is not None:
            _check_name(self.right, "MapExpr.right")


@dataclass(frozen=True, kw_only=True, slots=True)
class Aggregate:
    """``func(column) AS name``; ``count`` with ``column=None`` is ``count(*)``."""

    func: AggFunc
    column: str | None
    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "Aggregate.name")
        if self.column is None:
            if self.func != "count":
                raise ValueError(f"Aggregate {self.name!r}: {self.func} needs a column")
        else:
            _check_name(self.column, "Aggregate.column")


@dataclass(frozen=True, kw_only=True, slots=True)
class ViewDef:
    """The definition of a maintained view over the collection ``source``."""

    source: str
    maps: tuple[MapExpr, ...] = ()
    filters: tuple[Predicate, ...] = ()
    project: tuple[str, ...] | None = None
    group_by: tuple[str, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()

    def __post_init__(self) -> None:
        if type(self.source) is not str or not self.source:
            raise ValueError(f"ViewDef.source must be a non-empty str, got {self.source!r}")
        if self.project is not None:
            if not self.project:
                raise ValueError("ViewDef.project must keep at least one column (or be None for all)")
            if len(set(self.project)) != len(self.project):
                raise ValueError(f"ViewDef.project names a column twice: {self.project}")
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"ViewDef.group_by names a column twice: {self.group_by}")
        out = [*self.group_by, *(a.name for a in self.aggregates)]
        if len(set(out)) != len(out):
            raise ValueError(f"ViewDef output names collide: {out}")
        names = [m.name for m in self.maps]
        if len(set(names)) != len(names):
            raise ValueError(f"ViewDef.maps define a column twice: {names}")

    @property
    def reduces(self) -> bool:
        """True for a view with a group-by or aggregates (a reduction); False for a linear view."""
        return bool(self.group_by or self.aggregates)


@dataclass(frozen=True, kw_only=True, slots=True)
class SortKey:
    """One ``ORDER BY`` key of a peek's finishing."""

    column: str
    descending: bool = False

    def __post_init__(self) -> None:
        _check_name(self.column, "SortKey.column")


@dataclass(frozen=True, kw_only=True, slots=True)
class Finishing:
    """Materialize's ``RowSetFinishing``: order, offset, limit and final projection of a peek's rows.

    Nulls sort last in ascending and first in descending order (PostgreSQL's default, which Materialize
    follows). ``limit`` and ``offset`` are int64 (at most 2**63 - 1).
    """

    order_by: tuple[SortKey, ...] = ()
    limit: int | None = None
    offset: int = 0
    project: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (type(self.limit) is not int or not 0 <= self.limit <= _MAX_ROWS):
            raise ValueError(
                f"Finishing.limit must be an int from 0 to 2**63 - 1 or None, got {self.limit!r}"
            )
        if type(self.offset) is not int or not 0 <= self.offset <= _MAX_ROWS:
            raise ValueError(f"Finishing.offset must be an int from 0 to 2**63 - 1, got {self.offset!r}")
        if self.project is not None and not self.project:
            raise ValueError("Finishing.project must keep at least one column (or be None for all)")
