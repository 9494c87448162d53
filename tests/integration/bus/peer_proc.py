"""A bus node in its own process, for integration tests.

Usage: python peer_proc.py NODE_ID CLUSTER_TAG HEARTBEAT PEER_TIMEOUT
Prints its endpoints as one JSON line, reads the peer table as one JSON line, runs an echo role (every Note
is answered with a Note "echo:<text>"), and exits when stdin closes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from sparkbus.bus import BusConfig, MessageReceived, Send
from sparkbus.bus import contract as c
from sparkbus.bus.node import Endpoints, Node
from sparkbus.codecs import message


@message(0x7201)
@dataclass(frozen=True, kw_only=True)
class Note:
    text: str


@dataclass
class Echo:
    name: str = "echo"
    messages: ClassVar[tuple[type, ...]] = (Note,)

    def handle(self, event: c.Event, now: float) -> Iterable[c.Action]:
        if isinstance(event, MessageReceived):
            return [Send(peer=event.peer, message=Note(text=f"echo:{event.message.text}"))]
        return []


def main() -> None:
    node_id, tag, hb, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    node = Node(node_id, BusConfig(cluster_tag=tag, heartbeat_interval=hb, peer_timeout=timeout), [Echo()])
    print(json.dumps(node.bind().to_json()), flush=True)
    peers = {k: Endpoints.from_json(v) for k, v in json.loads(sys.stdin.readline()).items()}
    node.start(peers)
    sys.stdin.read()  # until the test closes our stdin
    node.stop()


if __name__ == "__main__":
    main()
