"""The query role's settings."""

from __future__ import annotations

from dataclasses import dataclass

from sparkbus.bus.config import BusConfig
from sparkbus.codecs import MiB
from sparkbus.roles.query import exchange as x


@dataclass(frozen=True, kw_only=True, slots=True)
class QueryConfig:
    """Settings of the query role.

    Attributes:
        check_period: seconds between checks of queries that never got start (Hazelcast: 1 s).
        batch_bytes: the most bytes a batch carries (Hazelcast: 512 KiB).
        edge_credit: initial credit in bytes of every stream (Hazelcast: 1 MiB at low memory pressure).
            At most ``bus_initial_credit``: a batch that overtakes ``start`` meets a stream its receiver's
            bus accepted with that credit, and a sender holding more breaks the stream (the bus drops the
            link).
        default_timeout: seconds before a query without its own timeout is cancelled; 0 for never.
        exchange: the exchange of a query whose ``execute`` names none (``push``, ``binx`` or ``http``).
        bus_initial_credit: ``BusConfig.initial_credit`` of the cluster's nodes (the credit of a stream
            accepted on its first batch); the role cannot ask its bus, so it is told (the topology
            factory passes the topology's).
        members: the cluster's members that run the query role; None when unknown (a role built outside
            a topology). A query without its own ``participants`` runs on this node and every peer that is
            up and in ``members``: a peer that runs no query role would refuse ``start``, and its initiator
            would wait for its batches for ever. The topology factory passes the nodes that list
            ``query``.
        curve: the cluster's bus uses CURVE, so no node serves the HTTP exchange (plain HTTP, neither
            encrypted nor authenticated; docs/EXCHANGE.md section 5) and a query asking for ``http`` is
            refused at once. The topology factory passes the topology's mode.
    """

    check_period: float = 1.0
    batch_bytes: int = 512 * 1024
    edge_credit: int = 1 * MiB
    default_timeout: float = 0.0
    exchange: str = x.PUSH
    bus_initial_credit: int = BusConfig().initial_credit
    members: frozenset[str] | None = None
    curve: bool = False

    def __post_init__(self) -> None:
        if (
            self.check_period <= 0
            or self.batch_bytes <= 0
            or self.edge_credit <= 0
            or self.default_timeout < 0
        ):
            raise ValueError(f"QueryConfig: periods, sizes and credits must be positive: {self}")
        if self.members is not None and not (
            isinstance(self.members, frozenset) and all(isinstance(m, str) for m in self.members)
        ):
            raise ValueError(f"QueryConfig.members: a frozenset of member ids or None, got {self.members!r}")
        if self.exchange not in x.EXCHANGES:
            raise ValueError(f"QueryConfig.exchange: one of {', '.join(x.EXCHANGES)}, got {self.exchange!r}")
        if self.curve and self.exchange == x.HTTP:
            raise ValueError(f"QueryConfig.exchange: {x.HTTP_UNDER_CURVE}")
        if self.edge_credit > self.bus_initial_credit:
            raise ValueError(
                f"QueryConfig.edge_credit ({self.edge_credit} bytes) exceeds the bus's initial credit "
                f"({self.bus_initial_credit} bytes, BusConfig.initial_credit): a batch that overtakes start "
                "would break its stream; lower edge_credit, or raise the bus's initial credit and tell "
                "QueryConfig.bus_initial_credit"
            )
