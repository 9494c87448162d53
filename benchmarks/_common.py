"""Shared helpers for the benchmark scripts: argument parsing, timing, JSON output, a table."""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds of every thread of process ``pid`` so far (Linux's per-thread ``schedstat``, in ns;
    0 where there is no ``/proc``)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    p.add_argument("--out", type=Path, required=True, help="JSON file to write the figures to")
    return p


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def write(out: Path, name: str, figures: dict[str, Any], quick: bool) -> None:
    doc = {
        "benchmark": name,
        "quick": quick,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, sep, *body])
