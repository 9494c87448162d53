"""Fuzz tier: counts the cases each test ran, and writes them out when ``SPARKBUS_FUZZ_REPORT`` names a file."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

CASES: Counter[str] = Counter()


def count(what: str, n: int = 1) -> None:
    CASES[what] += n


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("SPARKBUS_FUZZ_REPORT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"cases": dict(CASES), "failed": session.testsfailed, "exit": int(exitstatus)}, f)
