"""Keep the C allocator's memory for ZeroMQ's receive buffers instead of giving it back after every batch.

ZeroMQ's I/O thread reads each large message into a buffer of its own from ``malloc``, and the node frees
it once the role has had the batch. glibc's defaults make that expensive: its trim threshold follows the
largest block freed so far (twice it, so about 2 MiB with 1 MiB batches), and a thread's heap whose free
top grows past it is given back to the kernel (``MADV_DONTNEED``). With a credit window of several
batches in flight the free top passes that mark again and again, so the next buffers are fresh pages. In
a stream of 1 MiB batches the receiving I/O thread took 22 to 47 minor page faults and 150 to 205 us of
CPU per MiB; with the thresholds below, under one fault and 80 to 110 us (docs/BENCHMARKS.md, "The
allocator", has the stream figures).

``tune`` fixes both thresholds for the process: blocks up to 32 MiB (glibc's largest mmap threshold on
64-bit) come from the heaps, and a heap keeps up to 64 MiB of free memory at its top. What a process can
keep is bounded by what it used at its peak (for the bus: the streams' credit and the high-water marks).
Arrow buffers are not affected: PyArrow allocates with its own (mimalloc here). Other C libraries' and
Python's large blocks in the same process are, in the same way.

Only glibc has ``mallopt``; elsewhere (musl, macOS) nothing is changed. Settings last for the process's
life and cross ``fork``. ``BusConfig.tune_allocator`` (``[bus] tune_allocator`` in a topology) turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

from sparkbus.codecs import MiB

log = logging.getLogger("sparkbus.bus")

#: glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Blocks at most this large come from the heaps, not from a fresh mmap (glibc's maximum on 64-bit).
MMAP_THRESHOLD = 32 * MiB
#: A heap gives memory back to the kernel only when more than this is free at its top.
TRIM_THRESHOLD = 64 * MiB

_lock = threading.Lock()
_state: str | None = None


def tune() -> str:
    """Set the thresholds once per process; say what was done (also given by ``state``)."""
    global _state
    with _lock:
        if _state is None:
            _state = _apply()
            log.debug("allocator: %s", _state)
        return _state


def state() -> str:
    """``"tuned ..."`` once ``tune`` succeeded, why not if it could not, ``"default"`` before any call."""
    return _state or "default"


def _apply() -> str:
    mallopt = _mallopt()
    if mallopt is None:
        return "default (no glibc mallopt here)"
    # M_MMAP_THRESHOLD first: setting either one turns off glibc's adjustment of both.
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        if mallopt(param, value) != 1:
            return f"default (mallopt({param}, {value}) refused)"
    return f"tuned: mmap_threshold {MMAP_THRESHOLD // MiB}MiB, trim_threshold {TRIM_THRESHOLD // MiB}MiB"


def _mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        # Only glibc exports gnu_get_libc_version; other C libraries' mallopt (if any) mean other things.
        libc.gnu_get_libc_version  # noqa: B018
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn
