"""NodeCore's receive path builds a role's MessageReceived without its __init__: the same object."""

from __future__ import annotations

import dataclasses

import pytest

from sparkbus.bus import contract as c
from sparkbus.bus import core


def test_message_received_has_the_fields_the_core_sets_and_nothing_to_run_after() -> None:
    assert [f.name for f in dataclasses.fields(c.MessageReceived)] == ["peer", "message"]
    assert not hasattr(c.MessageReceived, "__post_init__")


def test_the_core_builds_a_message_received_equal_to_the_constructed_one() -> None:
    message = object()
    event = core._new(core._RECEIVED)
    core._received_peer(event, "n2")
    core._received_message(event, message)
    expected = c.MessageReceived(peer="n2", message=message)
    assert type(event) is c.MessageReceived
    assert event == expected
    assert hash(event) == hash(expected)
    assert repr(event) == repr(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.peer = "n3"  # type: ignore[misc]
