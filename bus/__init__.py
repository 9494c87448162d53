"""ZeroMQ sockets, sessions, liveness, credit streams and the node loop. Imports no role."""

from sparkbus.bus.config import BusConfig
from sparkbus.bus.contract import (
    AcceptStream,
    Action,
    BatchReceived,
    CancelTimer,
    CloseStream,
    Consumed,
    CreditChanged,
    Event,
    GrantCredit,
    HandlerFailed,
    LocalCall,
    LocalProtocolError,
    MessageReceived,
    OpenStream,
    PeerLost,
    PeerUp,
    RemoteProtocolError,
    Reply,
    Role,
    Send,
    SendBatch,
    SetTimer,
    TimerFired,
)
from sparkbus.bus.core import NodeCore
from sparkbus.bus.credit import CreditReceiver, CreditSender
from sparkbus.bus.messages import ErrorCode
from sparkbus.bus.sim import SimBus, SimTimeout
from sparkbus.bus.state import Completed, Transmit

__all__ = [
    "AcceptStream",
    "Action",
    "BatchReceived",
    "BusConfig",
    "CancelTimer",
    "CloseStream",
    "Completed",
    "Consumed",
    "CreditChanged",
    "CreditReceiver",
    "CreditSender",
    "ErrorCode",
    "Event",
    "GrantCredit",
    "HandlerFailed",
    "LocalCall",
    "LocalProtocolError",
    "MessageReceived",
    "NodeCore",
    "OpenStream",
    "PeerLost",
    "PeerUp",
    "RemoteProtocolError",
    "Reply",
    "Role",
    "Send",
    "SendBatch",
    "SetTimer",
    "SimBus",
    "SimTimeout",
    "TimerFired",
    "Transmit",
]
