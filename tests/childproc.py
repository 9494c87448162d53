"""A child process driven over JSON lines on stdin/stdout, for the process tests of every tier.

Every read has a timeout (a reader thread feeds a queue); every process is waited for with a timeout and
killed if it does not exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

REPLY_TIMEOUT = 30.0


class Proc:
    """One child speaking JSON lines on stdin/stdout."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        prefix: list[str] | None = None,
        reply_timeout: float = REPLY_TIMEOUT,
    ) -> None:
        self.name = name
        self.reply_timeout = reply_timeout
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name=f"reader-{name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # only this thread touches stdout; it ends when the process does
            for line in self.proc.stdout:
                self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout: float | None = None) -> Any:
        timeout = self.reply_timeout if timeout is None else timeout
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer within {timeout} s") from None
        assert line is not None, f"{self.name} exited (status {self.proc.poll()})"
        return json.loads(line)

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def ask(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        self.send({"op": op, **args})
        return self.receive(timeout)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig``; for SIGSTOP, return only once every thread of the child is stopped.

        kill() returns before the signal takes effect: on a busy machine a runnable child may go on
        answering for a moment after SIGSTOP was sent, which a test of what a stopped peer does must not see.
        """
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            self._wait_stopped(timeout=10.0)

    def _wait_stopped(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = _thread_states(self.proc.pid)
            if states and all(s in "Tt" for s in states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: not stopped {timeout} s after SIGSTOP (threads: {states})"
                )
            time.sleep(0.001)

    def kill(self) -> None:
        """SIGKILL and wait (a stopped process dies too)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close()

    def reap(self) -> None:
        """Close stdin so the child stops on its own; kill it if it has not exited within 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped child cannot read its EOF
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.reader.join(timeout=10)

    def rss_bytes(self) -> int:
        """Resident memory of the child (from /proc)."""
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def _thread_states(pid: int) -> str:
    """One letter per thread of ``pid`` from /proc (R, S, T, ...); empty if the process is gone."""
    states = []
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/stat") as f:
                # The state follows the command name, which is in parentheses and may hold spaces.
                states.append(f.read().rpartition(")")[2].split()[0])
    return "".join(states)
