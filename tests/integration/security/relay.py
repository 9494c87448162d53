"""A raw TCP relay that records every byte it carries, to see what an eavesdropper on the wire sees."""

from __future__ import annotations

import selectors
import socket
import threading


class Relay:
    """Listens on 127.0.0.1, connects each accepted connection to ``target`` and copies both ways.

    ``seen`` is everything relayed, in both directions. Use as a context manager; the thread stops and
    every socket is closed on exit.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, name=f"relay-{self.port}", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def captured(self) -> bytes:
        with self._lock:
            return bytes(self.seen)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive(), "relay thread did not stop"

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.05):
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._copy(sel, key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            sel.close()
            for s in [self.listener, *self._socks]:
                s.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            inbound, _ = self.listener.accept()
        except BlockingIOError:
            return
        outbound = socket.create_connection(self.target, timeout=5)
        for s in (inbound, outbound):
            s.setblocking(False)
            self._socks.append(s)
        sel.register(inbound, selectors.EVENT_READ, outbound)
        sel.register(outbound, selectors.EVENT_READ, inbound)

    def _copy(self, sel: selectors.BaseSelector, src: socket.socket, dst: socket.socket) -> None:
        try:
            data = src.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            for s in (src, dst):
                if s.fileno() != -1:
                    sel.unregister(s)
                    s.close()
            return
        with self._lock:
            self.seen += data
        dst.setblocking(True)
        try:
            dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.setblocking(False)
