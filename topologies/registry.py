"""Roles and services by name.

A topology names what each node runs (``roles = ["replication", "query"]``); this registry maps each
name to a factory. Entries are module path strings resolved on first use, so a topology can be validated
before the family that implements a role is installed, and loading the registry never imports a family.

A factory is called once per node with a ``RoleContext`` and returns an object that satisfies
``sparkbus.bus.contract.Role``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from sparkbus.bus.contract import Role

if TYPE_CHECKING:
    from sparkbus.topologies.model import NodeSpec, Topology

Kind = Literal["role", "service"]


@dataclass(frozen=True, kw_only=True)
class RoleContext:
    """What a role factory is given when its node is built.

    Attributes:
        node_id: the node's name in the topology (executor nodes are ``f"{name}-{index}"``).
        spec: the ``[[nodes]]`` entry the node comes from.
        topology: the whole validated topology (peers, tables, bus settings).
        local_data: the rows this node loads, as Arrow record batches (the Spark task's input partition;
            empty outside Spark).
        catalog: the node's table catalog (``sparkbus.roles.query.catalog.TableCatalog``), one object
            shared by every role of the node, so rows a role owns (replication) are what the query role
            scans; None when the node is built without one.
        data_dir: the directory under which the node keeps its data (a Spark task's, which the runtime
            removes); None: ``$SPARKBUS_DATA_DIR``, or a temporary directory.
        started_at: the wall clock (seconds since the epoch) when the node is built, read here so that
            role factories read no clock of their own (the compute controller's generation floor).
    """

    node_id: str
    spec: NodeSpec
    topology: Topology
    local_data: tuple[Any, ...] = field(default=())
    catalog: Any = None
    data_dir: str | None = None
    started_at: float = field(default_factory=time.time)


RoleFactory = Callable[[RoleContext], Role]


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One registered name.

    Attributes:
        name: what topology files write.
        kind: ``"role"`` (a protocol role, listed under ``roles``) or ``"service"`` (a helper listed under
            ``services``).
        target: ``"module:attribute"`` of the factory.
        summary: one line for ``sparkbus validate`` and the docs.
    """

    name: str
    kind: Kind
    target: str
    summary: str

    def __post_init__(self) -> None:
        module, sep, attr = self.target.partition(":")
        if not (module and sep and attr):
            raise ValueError(
                f"registry target for {self.name!r} must be 'module:attribute', got {self.target!r}"
            )


class RegistryError(LookupError):
    """A name is not registered, or its factory cannot be loaded."""


class Registry:
    """Names to lazily imported factories."""

    def __init__(self, entries: Mapping[str, Entry] | None = None) -> None:
        self._entries: dict[str, Entry] = dict(entries or {})

    def register(self, name: str, kind: Kind, target: str, summary: str) -> None:
        """Add ``name``; registering the same name twice with a different target is an error."""
        entry = Entry(name=name, kind=kind, target=target, summary=summary)
        old = self._entries.get(name)
        if old is not None and old != entry:
            raise RegistryError(f"{kind} {name!r} is already registered to {old.target}")
        self._entries[name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown role or service {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self, kind: Kind | None = None) -> list[str]:
        """Registered names, sorted; only those of ``kind`` when given."""
        return sorted(e.name for e in self._entries.values() if kind is None or e.kind == kind)

    def resolve(self, name: str) -> RoleFactory:
        """Import and return the factory for ``name``.

        Raises:
            RegistryError: the name is unknown, or its module or attribute is missing (the family that
                implements it is not installed yet).
        """
        entry = self.entry(name)
        module_name, _, attr = entry.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegistryError(
                f"{entry.kind} {name!r} is registered to {entry.target}, but {module_name} cannot be imported: {exc}"
            ) from exc
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise RegistryError(
                f"{entry.kind} {name!r} is registered to {entry.target}, but {module_name} has no callable {attr!r} "
                "(the family implementing it has not landed yet)"
            )
        return cast(RoleFactory, factory)

    def available(self, name: str) -> bool:
        """Whether ``resolve(name)`` would succeed now."""
        try:
            self.resolve(name)
        except RegistryError:
            return False
        return True

    def build(self, name: str, context: RoleContext) -> Role:
        """Resolve ``name`` and call its factory; checks that the result is a ``Role``."""
        role = self.resolve(name)(context)
        if not isinstance(role, Role):
            raise RegistryError(
                f"the factory for {name!r} returned {type(role).__name__}, which is not a Role"
            )
        return role


#: The names sparkbus ships. Families publish their factories at these paths as they land.
ROLES = Registry()
ROLES.register("query", "role", "sparkbus.roles.query:make_role", "Mustang query participant")
ROLES.register("replication", "role", "sparkbus.roles.replication:make_role", "EventQL segment replication")
ROLES.register(
    "binx.server", "role", "sparkbus.roles.exchange:make_server", "Presto BinX page exchange, serving side"
)
ROLES.register(
    "binx.client", "role", "sparkbus.roles.exchange:make_client", "Presto BinX page exchange, fetching side"
)
ROLES.register(
    "http.client",
    "role",
    "sparkbus.roles.exchange:make_http_client",
    "Presto HTTP page exchange, fetching side (a query's exchange=http)",
)
ROLES.register(
    "compute.controller", "role", "sparkbus.roles.compute:make_controller", "Materialize compute controller"
)
ROLES.register(
    "compute.replica", "role", "sparkbus.roles.compute:make_replica", "Materialize compute replica"
)
ROLES.register("client.gateway", "role", "sparkbus.roles.client:make_gateway", "IEP-90 thin-client gateway")
ROLES.register(
    "echo", "service", "sparkbus.topologies.echo:make_echo", "request/reply and credit-stream probe"
)
