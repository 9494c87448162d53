"""The allocator thresholds: set once per process where glibc has mallopt, reported, never fatal elsewhere."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import subprocess
import sys
from typing import Any

import pytest

from sparkbus.bus import BusConfig, allocator
from sparkbus.bus.node import Node

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if nothing had tuned it yet (the module keeps what it did once per process)."""
    monkeypatch.setattr(allocator, "_state", None)


def test_state_is_default_before_any_tuning(fresh: None) -> None:
    assert allocator.state() == "default"


def test_tuning_happens_once_and_is_reported(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    monkeypatch.setattr(allocator, "_mallopt", lambda: mallopt)
    first = allocator.tune()
    assert first == "tuned: mmap_threshold 32MiB, trim_threshold 64MiB"
    assert allocator.tune() == first
    assert allocator.state() == first
    # The mmap threshold first, then the trim threshold; and only once.
    assert calls == [
        (allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD),
        (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD),
    ]


def test_a_refused_setting_is_reported_not_raised(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda param, value: 0)
    assert allocator.tune() == f"default (mallopt(-3, {allocator.MMAP_THRESHOLD}) refused)"


def test_without_glibc_nothing_is_changed(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert allocator.tune() == "default (no glibc mallopt here)"


def test_a_c_library_without_glibc_symbols_is_left_alone(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NotGlibc:
        def __init__(self, name: str) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    monkeypatch.setattr(ctypes, "CDLL", NotGlibc)
    assert allocator.tune() == "default (no glibc mallopt here)"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds() -> None:
    # In a process of its own: the settings are process-wide and last for the process's life.
    code = "from sparkbus.bus import allocator; print(allocator.state()); print(allocator.tune())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["default", "tuned: mmap_threshold 32MiB, trim_threshold 64MiB"]


@pytest.mark.parametrize("tune", [True, False])
def test_a_node_tunes_on_bind_only_when_configured(
    fresh: None, monkeypatch: pytest.MonkeyPatch, tune: bool
) -> None:
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda param, value: 1)
    node = Node("a", BusConfig(cluster_tag="t", tune_allocator=tune), [])
    node.bind()
    node.start({})
    try:
        status = node.status(timeout=10)
    finally:
        node.stop()
    expected = "tuned: mmap_threshold 32MiB, trim_threshold 64MiB" if tune else "default"
    assert allocator.state() == expected
    assert status["allocator"] == expected


def test_the_real_mallopt_is_found_on_glibc() -> None:
    fn = allocator._mallopt()
    assert (fn is not None) == GLIBC
