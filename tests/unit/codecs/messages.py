"""Message classes used only by the codec tests (their own registry, so the real one stays clean)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from sparkbus.codecs import Registry, blob

TEST_REGISTRY = Registry()


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


@dataclass(frozen=True, kw_only=True)
class Inner:
    name: str
    weight: float


@TEST_REGISTRY.register(0x7001)
@dataclass(frozen=True, kw_only=True)
class Everything:
    count: int
    ratio: float
    label: str
    raw: bytes
    flag: bool
    maybe: int | None
    items: tuple[int, ...]
    pair: tuple[str, int]
    table: dict[str, int]
    color: Color
    inner: Inner
    tree: Any
    data: bytes = blob()


@TEST_REGISTRY.register(0x7002)
@dataclass(frozen=True, kw_only=True)
class Ping:
    nonce: int

    def __post_init__(self) -> None:
        if self.nonce < 0:
            raise ValueError(f"nonce must be >= 0, got {self.nonce}")


@TEST_REGISTRY.register(0x7003)
@dataclass(frozen=True, kw_only=True)
class Plain:
    """Only fields whose wire value is the field value (the decoder's shortest path)."""

    count: int
    label: str
    raw: bytes
    flag: bool


@TEST_REGISTRY.register(0x7004)
@dataclass(frozen=True, kw_only=True)
class Chunk:
    """Plain body fields and a blob, checked on construction (the shape of a stream batch)."""

    ordinal: int
    last: bool
    data: bytes = blob()

    def __post_init__(self) -> None:
        if self.ordinal < 0:
            raise ValueError(f"ordinal must be >= 0, got {self.ordinal}")


@TEST_REGISTRY.register(0x7005)
@dataclass(frozen=True, kw_only=True)
class Tagged:
    """Plain fields whose ``__post_init__`` normalises one and caches a value that is not a field."""

    name: str
    weight: int

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"weight must be >= 0, got {self.weight}")
        object.__setattr__(self, "name", self.name.lower())
        object.__setattr__(self, "_key", (self.name, self.weight))


@TEST_REGISTRY.register(0x7006)
@dataclass(frozen=True, kw_only=True)
class Choice:
    """Literal fields, alone and in a union (the shape of plan operators and replication decisions)."""

    op: Literal["eq", "ne"]
    level: Literal[1, 2] | None
