"""Two network namespaces joined by a veth pair, with faults on the link between them.

Needs root, ``ip`` and ``tc``. ``netns_pair()`` skips the test naming the command that was refused, and
removes both namespaces (and with them the veth pair) in a ``finally``. Faults: ``netem`` (delay, loss)
where the kernel has the netem qdisc, ``tbf`` (a slow link), and a partition (netem loss 100 %, or both
ends of the veth link taken down where there is no netem: packets are then dropped without a reset, as
on a cut cable).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

SUBNET = "10.213.0"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=20)


def _unshared(script: str) -> str | None:
    """Run ``script`` in a new network namespace; its error output if it failed, else None."""
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=20, check=False
    )
    return probe.stderr.strip() or f"status {probe.returncode}" if probe.returncode != 0 else None


def _refusal() -> str | None:
    """Why namespaces joined by a veth pair cannot be used here, or None."""
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if os.geteuid() != 0:
        return "network namespaces and tc need root"
    failed = _unshared("ip link add fx0 type veth peer name fx1 && ip link set fx0 up")
    if failed is not None:
        return f"`unshare -n` with a veth pair is not permitted here: {failed}"
    return None


def _qdisc_refusal(kind: str, *spec: str) -> str | None:
    """Why the ``kind`` qdisc cannot be used here, or None."""
    failed = _unshared(f"ip link set lo up && tc qdisc add dev lo root {kind} {' '.join(spec)}")
    if failed is not None:
        return f"`tc qdisc add dev lo root {kind}` is refused here ({failed}): the kernel lacks sch_{kind}"
    return None


def netem_refusal() -> str | None:
    return _qdisc_refusal("netem", "delay", "1ms")


def tbf_refusal() -> str | None:
    return _qdisc_refusal("tbf", "rate", "1mbit", "burst", "32kbit", "latency", "400ms")


@dataclass
class NetnsPair:
    """Namespaces ``a`` and ``b`` (addresses ``SUBNET.1`` and ``SUBNET.2``)."""

    a: str
    b: str
    veth_a: str
    veth_b: str

    def address(self, side: str) -> str:
        return f"{SUBNET}.{1 if side == 'a' else 2}"

    def exec_prefix(self, side: str) -> list[str]:
        return ["ip", "netns", "exec", self.a if side == "a" else self.b]

    def netem(self, *spec: str) -> None:
        """Set the netem of both ends (each shapes what leaves its namespace), e.g. ``delay 20ms loss 2%``."""
        for ns, dev in ((self.a, self.veth_a), (self.b, self.veth_b)):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", *spec)

    def tbf(self, *spec: str) -> None:
        """A token bucket on both ends, e.g. ``rate 4mbit burst 32kbit latency 2s`` (a slow link)."""
        for ns, dev in ((self.a, self.veth_a), (self.b, self.veth_b)):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", *spec)

    def partition(self) -> str:
        """Cut the link; returns how."""
        if netem_refusal() is None:
            self.netem("loss", "100%")
            return "netem loss 100%"
        for ns, dev in ((self.a, self.veth_a), (self.b, self.veth_b)):
            _run("ip", "-n", ns, "link", "set", dev, "down")
        return "veth link down"

    def heal(self) -> None:
        if netem_refusal() is None:
            self.netem("delay", "0ms")
            return
        for ns, dev in ((self.a, self.veth_a), (self.b, self.veth_b)):
            _run("ip", "-n", ns, "link", "set", dev, "up")


@contextmanager
def netns_pair() -> Iterator[NetnsPair]:
    reason = _refusal()
    if reason is not None:
        pytest.skip(reason)
    tag = f"{os.getpid() % 100000}"
    pair = NetnsPair(a=f"faults-{tag}-a", b=f"faults-{tag}-b", veth_a=f"fa{tag}", veth_b=f"fb{tag}")
    try:
        _run("ip", "netns", "add", pair.a)
        _run("ip", "netns", "add", pair.b)
        _run("ip", "link", "add", pair.veth_a, "type", "veth", "peer", "name", pair.veth_b)
        _run("ip", "link", "set", pair.veth_a, "netns", pair.a)
        _run("ip", "link", "set", pair.veth_b, "netns", pair.b)
        for ns, dev, host in ((pair.a, pair.veth_a, 1), (pair.b, pair.veth_b, 2)):
            _run("ip", "-n", ns, "addr", "add", f"{SUBNET}.{host}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.a, pair.b):  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20, check=False)
        subprocess.run(["ip", "link", "del", pair.veth_a], capture_output=True, timeout=20, check=False)
