"""A storage that records which segment files are read, for tests of what a store reads and when."""

from __future__ import annotations

from typing import Any

from sparkbus.roles.replication.storage import MemoryStorage


class CountingStorage(MemoryStorage):
    """Records every read of a segment file (``read``, ``open`` and ``view`` of a ``seg-`` name)."""

    def __init__(self) -> None:
        super().__init__()
        self.segments_read: list[str] = []

    @property
    def segment_reads(self) -> int:
        return len(self.segments_read)

    def _note(self, name: str) -> None:
        if name.startswith("seg-"):
            self.segments_read.append(name)

    def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
        self._note(name)
        return super().read(name, offset, size)

    def open(self, name: str) -> Any:
        self._note(name)
        return super().open(name)

    def view(self, name: str) -> memoryview:
        self._note(name)
        return super().view(name)
