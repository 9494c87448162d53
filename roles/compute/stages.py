"""The four protocol stages of one controller-replica connection, as one transition table.

Both sides run the same machine over the commands of a connection: the controller as it sends them (a
violation is its own bug: ``LocalProtocolError``), the replica as it receives them (``RemoteProtocolError``).
A new connection starts in ``DISCONNECTED``; only ``CreateTimely`` leaves it. Stages never go back except by
losing the connection.

    DISCONNECTED --CreateTimely--> CREATION --CreateInstance--> INITIALIZATION
    INITIALIZATION --computation*, InitializationComplete--> READ_ONLY
    READ_ONLY --computation*, AllowWrites--> READ_WRITE --computation*--> READ_WRITE
"""

from __future__ import annotations

import enum


class Stage(enum.Enum):
    """Where a connection is in the protocol."""

    DISCONNECTED = "disconnected"
    CREATION = "creation"
    INITIALIZATION = "initialization"
    READ_ONLY = "computation (read-only)"
    READ_WRITE = "computation (read-write)"


class Input(enum.Enum):
    """The kinds of command a stage reacts to."""

    CREATE_TIMELY = "CreateTimely"
    CREATE_INSTANCE = "CreateInstance"
    INITIALIZATION_COMPLETE = "InitializationComplete"
    ALLOW_WRITES = "AllowWrites"
    COMPUTATION = "a computation command"
    STORAGE = "AppendUpdates"
    RESPONSE = "a response"


_D, _C, _I, _RO, _RW = (
    Stage.DISCONNECTED,
    Stage.CREATION,
    Stage.INITIALIZATION,
    Stage.READ_ONLY,
    Stage.READ_WRITE,
)

#: (stage, input) -> next stage. Anything missing is a protocol error naming both.
TRANSITIONS: dict[tuple[Stage, Input], Stage] = {
    (_D, Input.CREATE_TIMELY): _C,
    (_C, Input.CREATE_INSTANCE): _I,
    (_I, Input.COMPUTATION): _I,
    (_I, Input.STORAGE): _I,
    (_I, Input.INITIALIZATION_COMPLETE): _RO,
    # The replica may answer commands of the initialization stage early (the spec allows it), so responses
    # are legal from initialization on; in creation the replica must stay silent.
    (_I, Input.RESPONSE): _I,
    (_RO, Input.COMPUTATION): _RO,
    (_RO, Input.STORAGE): _RO,
    (_RO, Input.RESPONSE): _RO,
    (_RO, Input.ALLOW_WRITES): _RW,
    (_RW, Input.COMPUTATION): _RW,
    (_RW, Input.STORAGE): _RW,
    (_RW, Input.RESPONSE): _RW,
}


class StageError(Exception):
    """An input that the transition table does not allow in the current stage."""

    def __init__(self, peer: str, stage: Stage, event: Input) -> None:
        super().__init__(f"{event.value} is not allowed in stage {stage.value} (peer {peer})")
        self.peer = peer
        self.stage = stage
        self.event = event


def next_stage(peer: str, stage: Stage, event: Input) -> Stage:
    """The stage after ``event`` in ``stage``.

    Raises:
        StageError: the pair is not in ``TRANSITIONS``; it names the stage, the event and the peer.
    """
    try:
        return TRANSITIONS[(stage, event)]
    except KeyError:
        raise StageError(peer, stage, event) from None
