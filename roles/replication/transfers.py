"""The two transfer state machines of a segment offer, as transition tables.

An outgoing transfer (the offering side)::

    OFFERED --accepted--> SENDING --drained--> DRAINED --acked--> DONE
    OFFERED --declined--> DONE;  SENDING/DRAINED --acked (error)--> DONE;  any --lost--> DONE

An incoming transfer (the receiving side) needs both the stream's last chunk and the sender's
SEGMENT_TRANSIT summary; they travel on different channels (data and control), so either may come
first::

    RECEIVING --chunk--> RECEIVING;  RECEIVING --last_chunk--> HAVE_DATA;  RECEIVING --summary--> HAVE_SUMMARY
    HAVE_DATA --summary--> COMPLETE;  HAVE_SUMMARY --chunk--> HAVE_SUMMARY;  HAVE_SUMMARY --last_chunk--> COMPLETE
    any --lost--> DONE

Every other (state, event) pair is a protocol error naming both. The events come from the peer, so the
error is a ``RemoteProtocolError`` unless the role itself drove the event (``drained``).
"""

from __future__ import annotations

import enum

from sparkbus.bus.contract import LocalProtocolError, RemoteProtocolError


class OutState(enum.Enum):
    OFFERED = "OFFERED"
    SENDING = "SENDING"
    DRAINED = "DRAINED"
    DONE = "DONE"


class OutEvent(enum.Enum):
    ACCEPTED = "accepted"
    DECLINED = "declined"
    CREDIT = "credit"
    DRAINED = "drained"
    ACKED = "acked"
    LOST = "lost"


class InState(enum.Enum):
    RECEIVING = "RECEIVING"
    HAVE_DATA = "HAVE_DATA"
    HAVE_SUMMARY = "HAVE_SUMMARY"
    COMPLETE = "COMPLETE"
    DONE = "DONE"


class InEvent(enum.Enum):
    CHUNK = "chunk"
    LAST_CHUNK = "last_chunk"
    SUMMARY = "summary"
    LOST = "lost"


OUT_TRANSITIONS: dict[tuple[OutState, OutEvent], OutState] = {
    (OutState.OFFERED, OutEvent.ACCEPTED): OutState.SENDING,
    (OutState.OFFERED, OutEvent.DECLINED): OutState.DONE,
    (OutState.OFFERED, OutEvent.LOST): OutState.DONE,
    (OutState.SENDING, OutEvent.CREDIT): OutState.SENDING,
    (OutState.SENDING, OutEvent.DRAINED): OutState.DRAINED,
    (OutState.SENDING, OutEvent.ACKED): OutState.DONE,
    (OutState.SENDING, OutEvent.LOST): OutState.DONE,
    (OutState.DRAINED, OutEvent.CREDIT): OutState.DRAINED,
    (OutState.DRAINED, OutEvent.ACKED): OutState.DONE,
    (OutState.DRAINED, OutEvent.LOST): OutState.DONE,
}

IN_TRANSITIONS: dict[tuple[InState, InEvent], InState] = {
    (InState.RECEIVING, InEvent.CHUNK): InState.RECEIVING,
    (InState.RECEIVING, InEvent.LAST_CHUNK): InState.HAVE_DATA,
    (InState.RECEIVING, InEvent.SUMMARY): InState.HAVE_SUMMARY,
    (InState.RECEIVING, InEvent.LOST): InState.DONE,
    (InState.HAVE_DATA, InEvent.SUMMARY): InState.COMPLETE,
    (InState.HAVE_DATA, InEvent.LOST): InState.DONE,
    (InState.HAVE_SUMMARY, InEvent.CHUNK): InState.HAVE_SUMMARY,
    (InState.HAVE_SUMMARY, InEvent.LAST_CHUNK): InState.COMPLETE,
    (InState.HAVE_SUMMARY, InEvent.LOST): InState.DONE,
}

_LOCAL_OUT = {OutEvent.DRAINED, OutEvent.LOST}


def next_out(state: OutState, event: OutEvent, what: str) -> OutState:
    """The next state of an outgoing transfer ``what`` (partition, segment, peer), or a protocol error."""
    try:
        return OUT_TRANSITIONS[state, event]
    except KeyError:
        error = LocalProtocolError if event in _LOCAL_OUT else RemoteProtocolError
        raise error(
            f"{what}: outgoing transfer in state {state.value} cannot take event {event.value}"
        ) from None


def next_in(state: InState, event: InEvent, what: str) -> InState:
    """The next state of an incoming transfer ``what``, or a ``RemoteProtocolError``."""
    try:
        return IN_TRANSITIONS[state, event]
    except KeyError:
        raise RemoteProtocolError(
            f"{what}: incoming transfer in state {state.value} cannot take event {event.value}"
        ) from None
