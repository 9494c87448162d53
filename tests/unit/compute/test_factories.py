"""The topology factories: a controller's generation grows across the restarts of its node."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkbus.roles.compute import make_controller
from sparkbus.roles.compute.factories import DATA_DIR_ENV, GENERATION_FILE, next_generation

NOW = 1_700_000_000.5


def test_a_kept_generation_grows_by_one_each_start_even_within_one_second(tmp_path: Path) -> None:
    first = next_generation(tmp_path, NOW)
    assert first == int(NOW)
    assert [next_generation(tmp_path, NOW) for _ in range(3)] == [first + 1, first + 2, first + 3]
    assert (tmp_path / GENERATION_FILE).read_text() == f"{first + 3}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [GENERATION_FILE]  # no temporary file left


def test_the_clock_is_a_floor_so_a_lost_directory_still_grows(tmp_path: Path) -> None:
    (tmp_path / GENERATION_FILE).write_text("7\n")
    assert next_generation(tmp_path, 100.0) == 100
    assert next_generation(tmp_path, 50.0) == 101
    assert next_generation(None, NOW) == int(NOW)


@pytest.mark.parametrize(("content", "needle"), [("x\n", "not a controller generation"), ("", "not a")])
def test_a_file_that_holds_no_generation_is_an_error(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / GENERATION_FILE).write_text(content)
    with pytest.raises(ValueError, match=needle):
        next_generation(tmp_path, NOW)


def test_a_generation_beyond_32_bits_is_an_error() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        next_generation(None, float(2**32))


def test_a_directory_that_cannot_be_written_falls_back_to_the_clock(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert next_generation(tmp_path / "file" / "sub", NOW) == int(NOW)


class _Topology:
    cluster = SimpleNamespace(name="c1")

    def hosting(self, role: str) -> list[str]:
        return ["r1"]


@pytest.mark.parametrize("where", ["context", "environment"])
def test_make_controller_keeps_the_generation_in_the_nodes_data_directory(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    if where == "environment":
        monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    ctx = SimpleNamespace(
        topology=_Topology(),
        node_id="n0",
        data_dir=str(tmp_path) if where == "context" else None,
        started_at=time.time(),
    )
    epochs = [make_controller(ctx).links["r1"].epoch for _ in range(3)]
    kept = int((tmp_path / "c1" / "n0" / GENERATION_FILE).read_text())
    assert epochs == [(kept - 2) << 32, (kept - 1) << 32, kept << 32]
