"""Every error a thin client raises prints its code's name: a bus ``ErrorCode``, a query code, or the
client's own OPERATION_TIMEOUT (Ignite's ``(3 << 16) | 11``, which no node sends)."""

from __future__ import annotations

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import OPERATION_TIMEOUT, ClientConnectionError, ClientError


def test_an_operation_timeout_is_named() -> None:
    text = str(ClientError(OPERATION_TIMEOUT, "operation WRITE took more than 35 s"))
    assert text == "[OPERATION_TIMEOUT] operation WRITE took more than 35 s"


def test_a_bus_code_is_named_and_an_unknown_one_printed_as_a_number() -> None:
    assert str(ClientConnectionError("gone")) == f"[{ErrorCode.CONNECTION.name}] gone"
    assert ClientError(987654, "x").code_name == "987654"
