"""Roles in the simulator get blobs and stream batches as the node's sockets hand them over.

A real node keeps a control blob of at least ``zero_copy_threshold`` bytes, and every stream batch, as a
memoryview on ZeroMQ's buffer (``Node._drain_control``, ``sockets.recv_message``); the simulator does the
same, so a role that needs ``bytes`` fails here, not first on real sockets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkbus.bus import BusConfig, SimBus
from sparkbus.bus import contract as c
from sparkbus.codecs import message


@message(0x7103)
@dataclass(frozen=True, kw_only=True)
class Blobbed:
    tag: str
    data: bytes = field(metadata={"blob": True})


@dataclass
class Keeper:
    name: str = "keep"
    messages: ClassVar[tuple[type, ...]] = (Blobbed,)
    got: list[tuple[str, Any]] = field(default_factory=list)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, c.MessageReceived):
            self.got.append((event.message.tag, event.message.data))
        elif isinstance(event, c.BatchReceived):
            self.got.append(("batch", event.data))
            return [c.Consumed(peer=event.peer, stream=event.stream, size=event.size)]
        elif isinstance(event, c.LocalCall):
            return [*event.args["actions"], c.Reply(call_id=event.call_id, result="ok")]
        return []


def test_large_blobs_and_batches_arrive_as_views_small_blobs_as_bytes() -> None:
    config = BusConfig(cluster_tag="t", zero_copy_threshold=1000)
    sim = SimBus(seed=3, config=config)
    a, b = Keeper(), Keeper()
    sim.add_node("a", [a])
    sim.add_node("b", [b])
    sim.start()
    sim.run_until(sim.all_up, limit=5)
    small, large = b"s" * 999, bytes(range(256)) * 4  # 999 and 1,024 bytes
    actions = [
        c.Send(peer="b", message=Blobbed(tag="small", data=small)),
        c.Send(peer="b", message=Blobbed(tag="large", data=large)),
        c.OpenStream(peer="b", stream="keep/s", credit=1 << 20),
        c.SendBatch(peer="b", stream="keep/s", data=b"tiny", last=True),
    ]
    sim.call("a", "keep", "go", {"actions": actions})
    sim.run_until(lambda: len(b.got) == 3, limit=5)
    kinds = {tag: (type(data), bytes(data)) for tag, data in b.got}
    assert kinds == {
        "small": (bytes, small),
        "large": (memoryview, large),
        "batch": (memoryview, b"tiny"),
    }
