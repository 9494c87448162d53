"""A TCP proxy the test controls: ``down()`` breaks every connection and refuses new ones, ``up()``
accepts again on the same port. One thread; every wait has a timeout."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class Proxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.up()
        self._thread = threading.Thread(target=self._run, name="test-proxy", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def up(self) -> None:
        for attempt in range(200):  # the closed listener's port can take a moment to free
            lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                lst.bind(("127.0.0.1", self.port))
                break
            except OSError:
                lst.close()
                if attempt == 199:
                    raise
                self._stop.wait(0.01)
        lst.listen(16)
        self.port = lst.getsockname()[1]
        with self._lock:
            self._listener = lst

    def down(self) -> None:
        with self._lock:
            socks = list(self._pairs)
            self._pairs.clear()
            lst, self._listener = self._listener, None
        for s in [*socks, *([lst] if lst else [])]:
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.down()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                lst = self._listener
                socks = list(self._pairs)
            watch = socks + ([lst] if lst is not None else [])
            if not watch:
                self._stop.wait(0.01)
                continue
            try:
                readable, _, _ = select.select(watch, [], [], 0.05)
            except (OSError, ValueError):
                continue  # a socket was closed by down() meanwhile
            for s in readable:
                if s is lst:
                    self._accept(lst)
                else:
                    self._relay(s)

    def _accept(self, lst: socket.socket) -> None:
        try:
            client, _ = lst.accept()
            server = socket.create_connection(self.upstream, timeout=5.0)
        except OSError:
            return
        with self._lock:
            self._pairs[client] = server
            self._pairs[server] = client

    def _relay(self, s: socket.socket) -> None:
        with self._lock:
            other = self._pairs.get(s)
        if other is None:
            return
        try:
            data = s.recv(65536)
            if data:
                other.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            self._pairs.pop(s, None)
            self._pairs.pop(other, None)
        for x in (s, other):
            with contextlib.suppress(OSError):
                x.close()
