"""The query family's control messages (type codes 0x0100-0x011f).

Mustang's six messages map onto sparkbus as follows (``docs/QUERY.md`` has the details):

* ``start`` -> ``QueryStarted`` (0x0100), ``cancel`` -> ``QueryCancelled`` (0x0101), ``check`` ->
  ``QueriesSuspected`` (0x0102), ``check_response`` -> ``QueriesInactive`` (0x0103);
* ``batch`` and ``flow_control`` are the bus's credit streams: stream key ``query/{query id}/{edge id}``,
  a batch is ``SendBatch`` / ``BatchReceived`` (ordinal, last flag, remaining credit) and flow control is
  the bus's credit grant (it sets the credit, with an ordinal), so they have no message type here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkbus.codecs import message
from sparkbus.codecs.schema import quote
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.roles.query.expressions import is_literal_value, outside_int64
from sparkbus.roles.query.plan import Fragment, check_fragments, fragment_from_plain

MAX_FRAGMENTS = 64
MAX_PARTICIPANTS = 4096
MAX_PARAMETERS = 1024
MAX_CHECK_IDS = 65536
_SEP = "@"

ParamValue = int | float | str | bool | None


@dataclass(frozen=True, kw_only=True, slots=True)
class QueryId:
    """A cluster-wide unique query id (Mustang 3.1): the initiator's member id and an id unique there."""

    member: str
    local: str

    def __post_init__(self) -> None:
        if not isinstance(self.member, str) or not self.member:
            raise ValueError(f"member: expected a non-empty str, got {quote(self.member)}")
        if not isinstance(self.local, str) or not self.local or _SEP in self.local or "/" in self.local:
            raise ValueError(
                f"local: expected a non-empty str without {_SEP!r} or '/', got {quote(self.local)}"
            )

    def __str__(self) -> str:
        return f"{self.member}{_SEP}{self.local}"

    @classmethod
    def parse(cls, text: str) -> QueryId:
        """The id whose ``str`` is ``text``.

        Raises:
            ValueError: ``text`` is not ``member@local``.
        """
        member, sep, local = text.rpartition(_SEP)
        if not sep:
            raise ValueError(f"not a query id: {quote(text)}")
        return cls(member=member, local=local)


def stream_key(query_id: QueryId, edge: int) -> str:
    """The bus stream key of ``edge`` of a query: ``query/{query id}/{edge id}``."""
    return f"query/{query_id}/{edge}"


def parse_stream_key(key: str) -> tuple[QueryId, int]:
    """``(query id, edge id)`` of a query stream key.

    Raises:
        ValueError: ``key`` is not a query stream key.
    """
    prefix, _, rest = key.partition("/")
    qid, _, edge = rest.rpartition("/")
    if prefix != "query" or not qid or not edge.isdigit():
        raise ValueError(f"not a query stream key: {quote(key)}")
    return QueryId.parse(qid), int(edge)


def check_parameter(value: Any, where: str) -> None:
    """A parameter is what a literal can be: None, a bool, an int within int64, a float or a str.

    Raises:
        ValueError: anything else, naming ``where``.
    """
    if outside_int64(value):
        raise ValueError(f"{where}: {value} is outside int64")
    if not is_literal_value(value):
        raise ValueError(
            f"{where}: expected null, a bool, an int, a float or a str, got {type(value).__name__}"
        )


@message(0x0100)
@dataclass(frozen=True, kw_only=True, slots=True)
class QueryStarted:
    """``start``: the initiator started a query; each participant runs its fragments at once.

    Attributes:
        query_id: the query.
        fragments: the plan fragments (plain trees; ``plan.fragment_from_plain`` validates them here).
        parameters: values for the plan's parameters.
        participants: the fixed list of participating members (the initiator first).
        edge_credits: edge id -> initial credit in bytes of each stream on that edge.
        timeout: seconds after which the initiator cancels the query; 0 for none.
        decoded: the validated fragments (not on the wire).
    """

    query_id: QueryId
    fragments: tuple[Any, ...]
    parameters: tuple[ParamValue, ...]
    participants: tuple[str, ...]
    edge_credits: dict[int, int]
    timeout: float
    decoded: tuple[Fragment, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= len(self.fragments) <= MAX_FRAGMENTS:
            raise ValueError(f"fragments: expected 1..{MAX_FRAGMENTS}, got {len(self.fragments)}")
        if not 1 <= len(self.participants) <= MAX_PARTICIPANTS or len(set(self.participants)) != len(
            self.participants
        ):
            raise ValueError("participants: expected 1..4096 distinct members")
        if len(self.parameters) > MAX_PARAMETERS:
            raise ValueError(f"parameters: at most {MAX_PARAMETERS}")
        for i, value in enumerate(self.parameters):
            check_parameter(value, f"parameters[{i}]")
        if self.timeout < 0:
            raise ValueError(f"timeout: expected >= 0, got {self.timeout}")
        for edge, credit in self.edge_credits.items():
            if edge < 0 or credit <= 0:
                raise ValueError(f"edge_credits: edge {edge} has credit {credit}; credits must be > 0")
        # A PlanError names the path inside the plan; ValueError makes the codec report field "fragments".
        try:
            decoded = tuple(fragment_from_plain(f, f"fragments[{i}]") for i, f in enumerate(self.fragments))
            check_fragments(decoded)
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"fragments: {exc}") from None
        for f in decoded:
            send = f.send
            if send is not None and send.edge not in self.edge_credits:
                raise ValueError(f"edge_credits: no credit for edge {send.edge}")
            outsiders = set(f.members) - set(self.participants)
            if outsiders:
                raise ValueError(f"fragments: fragment {f.id} runs on non-participants {sorted(outsiders)}")
        object.__setattr__(self, "decoded", decoded)


@message(0x0101)
@dataclass(frozen=True, kw_only=True, slots=True)
class QueryCancelled:
    """``cancel``: the query failed; sent to the initiator, which broadcasts it to the participants.

    Attributes:
        query_id: the query.
        code: why.
        message: what happened, for the user.
        origin: the member where the failure happened (kept across the hop through the initiator).
    """

    query_id: QueryId
    code: ErrorCode
    message: str
    origin: str

    def __post_init__(self) -> None:
        if not self.origin:
            raise ValueError("origin: expected a member id")


@message(0x0102)
@dataclass(frozen=True, kw_only=True, slots=True)
class QueriesSuspected:
    """``check``: a participant asks the initiator which of these queries are no longer active."""

    query_ids: tuple[QueryId, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.query_ids) <= MAX_CHECK_IDS:
            raise ValueError(f"query_ids: expected 1..{MAX_CHECK_IDS} ids, got {len(self.query_ids)}")


@message(0x0103)
@dataclass(frozen=True, kw_only=True, slots=True)
class QueriesInactive:
    """``check_response``: the subset of the suspected queries that are not active on the initiator."""

    query_ids: tuple[QueryId, ...]

    def __post_init__(self) -> None:
        if len(self.query_ids) > MAX_CHECK_IDS:
            raise ValueError(f"query_ids: at most {MAX_CHECK_IDS} ids, got {len(self.query_ids)}")


MESSAGES: tuple[type, ...] = (QueryStarted, QueryCancelled, QueriesSuspected, QueriesInactive)
