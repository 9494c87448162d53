"""ZeroMQ sockets, sessions, liveness, credit streams and the node loop. Imports no role.

The names below are imported on first use, so importing one module of the bus (``sparkbus.bus.contract``
for the topology files, ``sparkbus.bus.security`` for ``sparkbus keys``) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkbus.bus.config import BusConfig
    from sparkbus.bus.contract import (
        AcceptStream,
        Action,
        BatchReceived,
        Call,
        CallResult,
        CancelTimer,
        CloseStream,
        Consumed,
        CreditChanged,
        Event,
        GrantCredit,
        HandlerFailed,
        HttpFetch,
        HttpFetched,
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

_LAZY = {
    "BusConfig": "sparkbus.bus.config",
    "AcceptStream": "sparkbus.bus.contract",
    "Action": "sparkbus.bus.contract",
    "BatchReceived": "sparkbus.bus.contract",
    "Call": "sparkbus.bus.contract",
    "CallResult": "sparkbus.bus.contract",
    "CancelTimer": "sparkbus.bus.contract",
    "CloseStream": "sparkbus.bus.contract",
    "Consumed": "sparkbus.bus.contract",
    "CreditChanged": "sparkbus.bus.contract",
    "Event": "sparkbus.bus.contract",
    "GrantCredit": "sparkbus.bus.contract",
    "HandlerFailed": "sparkbus.bus.contract",
    "HttpFetch": "sparkbus.bus.contract",
    "HttpFetched": "sparkbus.bus.contract",
    "LocalCall": "sparkbus.bus.contract",
    "LocalProtocolError": "sparkbus.bus.contract",
    "MessageReceived": "sparkbus.bus.contract",
    "OpenStream": "sparkbus.bus.contract",
    "PeerLost": "sparkbus.bus.contract",
    "PeerUp": "sparkbus.bus.contract",
    "RemoteProtocolError": "sparkbus.bus.contract",
    "Reply": "sparkbus.bus.contract",
    "Role": "sparkbus.bus.contract",
    "Send": "sparkbus.bus.contract",
    "SendBatch": "sparkbus.bus.contract",
    "SetTimer": "sparkbus.bus.contract",
    "TimerFired": "sparkbus.bus.contract",
    "NodeCore": "sparkbus.bus.core",
    "CreditReceiver": "sparkbus.bus.credit",
    "CreditSender": "sparkbus.bus.credit",
    "ErrorCode": "sparkbus.bus.messages",
    "SimBus": "sparkbus.bus.sim",
    "SimTimeout": "sparkbus.bus.sim",
    "Completed": "sparkbus.bus.state",
    "Transmit": "sparkbus.bus.state",
}

__all__ = [
    "AcceptStream",
    "Action",
    "BatchReceived",
    "BusConfig",
    "Call",
    "CallResult",
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
    "HttpFetch",
    "HttpFetched",
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkbus.bus' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
