"""A bus node in its own process, for integration tests.

Usage: python peer_proc.py NODE_ID CLUSTER_TAG HEARTBEAT PEER_TIMEOUT [IPC_DIR]
Prints its endpoints as one JSON line (ipc sockets in IPC_DIR if given, else TCP on 127.0.0.1), reads the
peer table as one JSON line, runs an echo role (every Note is answered with a Note "echo:<text>", the Note
"whoami" with "pid:<its process id>"), answers each stdin line "refused" with the links refused for good
and the peers it stopped dialling (``Node.status``) as one JSON line, and exits when stdin closes.
"""

from __future__ import annotations

import json
import os
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
            text = event.message.text
            answer = f"pid:{os.getpid()}" if text == "whoami" else f"echo:{text}"
            return [Send(peer=event.peer, message=Note(text=answer))]
        return []


def main() -> None:
    node_id, tag, hb, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    config = BusConfig(cluster_tag=tag, heartbeat_interval=hb, peer_timeout=timeout)
    if len(sys.argv) > 5:
        node = Node(node_id, config, [Echo()], transport="ipc", ipc_dir=sys.argv[5])
    else:
        node = Node(node_id, config, [Echo()])
    print(json.dumps(node.bind().to_json()), flush=True)
    peers = {k: Endpoints.from_json(v) for k, v in json.loads(sys.stdin.readline()).items()}
    node.start(peers)
    for line in sys.stdin:  # until the test closes our stdin
        if line.strip() == "refused":
            status = node.status()
            print(json.dumps({"refused": status["refused"], "hung_up": status["hung_up"]}), flush=True)
    node.stop()


if __name__ == "__main__":
    main()
