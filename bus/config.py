"""Bus settings, with the defaults a single machine wants."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkbus.codecs import Compression, KiB, Limits, MiB

#: Protocol versions this build speaks, newest first (major, minor, patch).
SUPPORTED_VERSIONS: tuple[tuple[int, int, int], ...] = ((1, 0, 0),)

#: Feature bits (IEP-76 style: bit n is bit n % 8 of byte n // 8 of the bitset).
FEATURE_STREAMS = 0
FEATURE_COMPRESSION = 1
FEATURE_RESTORE = 2
ALL_FEATURES = (FEATURE_STREAMS, FEATURE_COMPRESSION, FEATURE_RESTORE)


@dataclass(frozen=True, kw_only=True)
class CurveSettings:
    """CURVE encryption and authentication of every link (``sparkbus.bus.security``).

    Attributes:
        key_dir: the key directory: ``public/*.key`` (the keys allowed to connect) and
            ``private/*.key_secret`` (this node's own pair, or the shared ``cluster`` pair).
        allow_addresses: IP addresses allowed to connect; empty means any address (keys still apply).
    """

    key_dir: str
    allow_addresses: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    """Everything the bus needs to know besides the roles and the peers.

    Attributes:
        cluster_tag: links to nodes of another cluster are refused (CLUSTER_ID_MISMATCH), never retried.
        heartbeat_interval: a direction idle this long sends a heartbeat (seconds).
        peer_timeout: a peer silent this long is lost (seconds). The server's idle timeout in WELCOME.
        handshake_timeout: a HELLO unanswered this long is sent again (seconds).
        batch_size: the size roles should cut stream batches to (bytes; Mustang's 512 KiB).
        initial_credit: credit of a stream accepted on its first batch (bytes; Mustang's 1 MiB at low
            memory pressure).
        low_watermark: flow control is sent when the sender's credit is at or below this fraction of the
            stream's maximum and the receiver's free memory is above it (Mustang's 0.4).
        max_peers: thin-client sessions beyond this are refused (the topology's nodes always get one).
        max_streams: open streams per peer beyond this are refused.
        hwm: ZeroMQ high-water mark per pipe, in messages (credits bound memory; this is a backstop).
        zero_copy_threshold: frames at least this large are sent without copying.
        limits: decoder limits for everything a peer sends.
        compression: payload compression for outgoing messages (None: off).
        versions: protocol versions offered, newest first.
        features: feature bits offered.
        curve: CURVE on every socket (None: plain TCP, for one machine or a trusted network).
        tune_allocator: let the node set glibc's allocator thresholds for its process, so that ZeroMQ's
            receive buffers are reused rather than returned to the system after every batch
            (``sparkbus.bus.allocator``). Process-wide: the first node that binds decides.
        idle_spin: after a loop turn that served input, how long the loop keeps polling its sockets
            without sleeping, yielding the CPU between polls, before it sleeps in poll(2) (seconds; 0:
            sleep at once). An answer that comes back within it is read without the wake-up of a
            sleeping thread, which is most of a round trip's cost over loopback. Only after two waits
            in a row that ended within it, and never past the loop's next timer: a node with spaced
            traffic or nothing to serve does not spin. docs/BENCHMARKS.md, "Polling before sleeping".
    """

    cluster_tag: str = "sparkbus"
    heartbeat_interval: float = 0.3
    peer_timeout: float = 1.5
    handshake_timeout: float = 1.0
    batch_size: int = 512 * KiB
    initial_credit: int = 1 * MiB
    low_watermark: float = 0.4
    max_peers: int = 256
    max_streams: int = 4096
    hwm: int = 10_000
    zero_copy_threshold: int = 64 * KiB
    limits: Limits = field(default_factory=Limits)
    compression: Compression | None = None
    versions: tuple[tuple[int, int, int], ...] = SUPPORTED_VERSIONS
    features: tuple[int, ...] = ALL_FEATURES
    curve: CurveSettings | None = None
    tune_allocator: bool = True
    idle_spin: float = 0.0002

    def __post_init__(self) -> None:
        if not self.cluster_tag:
            raise ValueError("BusConfig.cluster_tag must not be empty")
        if not 0 < self.heartbeat_interval < self.peer_timeout:
            raise ValueError(
                f"BusConfig needs 0 < heartbeat_interval ({self.heartbeat_interval}) < peer_timeout ({self.peer_timeout})"
            )
        if not 0 <= self.idle_spin < self.heartbeat_interval:
            raise ValueError(
                f"BusConfig needs 0 <= idle_spin ({self.idle_spin}) < heartbeat_interval ({self.heartbeat_interval})"
            )
        if self.handshake_timeout <= 0:
            raise ValueError("BusConfig.handshake_timeout must be positive")
        if self.batch_size <= 0 or self.initial_credit < self.batch_size:
            raise ValueError(
                f"BusConfig needs 0 < batch_size ({self.batch_size}) <= initial_credit ({self.initial_credit})"
            )
        if not 0 < self.low_watermark < 1:
            raise ValueError(f"BusConfig.low_watermark must be in (0, 1), got {self.low_watermark}")
        for name in ("max_peers", "max_streams", "hwm"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BusConfig.{name} must be positive")
        if not self.versions:
            raise ValueError("BusConfig.versions must name at least one version")
