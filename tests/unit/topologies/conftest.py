"""Fixtures of the topology tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def spark_must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparkbus run`` fails the test if it gets as far as the step right before Spark starts (the check
    for Java): for mistakes it must refuse before that."""
    from sparkbus.topologies import mainjob

    def spark_would_start() -> None:
        raise AssertionError("the job went on to start Spark")

    monkeypatch.setattr(mainjob, "_check_java", spark_would_start)
