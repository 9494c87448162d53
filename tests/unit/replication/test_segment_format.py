"""Segment file format versions: version 4 (XXH3-128) is written, version 3 (BlockDigest) is still read and
verified, on disk, in a store and when a peer offers it; older versions are refused by name."""

from __future__ import annotations

import errno
import os
import random
import struct
from dataclasses import replace

import pyarrow as pa
import pytest
import xxhash

from sparkbus.roles.replication.layout import PartitionSpec, Replica
from sparkbus.roles.replication.role import ReplicationConfig
from sparkbus.roles.replication.segments import (
    MAGIC,
    TRAILER_BYTES,
    TRAILER_MAGIC,
    BlockDigest,
    SegmentCorrupt,
    TrailerCheck,
    UnsupportedSegmentFormat,
    iter_batches,
    magic,
    read_schema,
    read_table,
    verify_segment,
)
from sparkbus.roles.replication.storage import MemoryStorage
from sparkbus.roles.replication.store import PartitionStore, StoreConfig, segment_file
from tests.sim.replication.cluster import Unreadable

from .harness import Cluster, flushed

P = "t/0"
CFG = StoreConfig(flush_rows=4, compact_minors=2)


def rows(*keys: int) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "v": [f"v{k}" for k in keys]})


def as_version(data: bytes, version: int) -> bytes:
    """A version-4 segment file rewritten as ``version``: other magic, trailer with version 3's checksum."""
    body = magic(version) + data[8:-TRAILER_BYTES]
    digest = BlockDigest()
    digest.update(body)
    return body + TRAILER_MAGIC + struct.pack(">Q", len(body)) + digest.digest()


def rewrite_segments(storage: MemoryStorage, version: int) -> list[str]:
    """Turn every listed segment of the store in ``storage`` into a file of ``version``, manifest included."""
    store = PartitionStore.open(storage, P, 1, replace(CFG, verify_on_open=False))
    entries, names = [], []
    for entry in store.entries:
        name = segment_file(entry.segment_id)
        storage._files[name] = as_version(storage.read(name), version)
        entries.append(replace(entry, checksum=storage.read(name)[-16:], size=storage.size(name)))
        names.append(name)
    store.entries = entries
    store.save_manifest()
    return names


def test_a_new_segment_is_version_4_with_the_xxh3_128_of_its_bytes() -> None:
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(1, 2, 3, 4))
    data = st.read(segment_file(entry.segment_id))
    assert data[:8] == MAGIC == b"SBSEG\x04\x00\x00"
    body = data[:-TRAILER_BYTES]
    assert data[-TRAILER_BYTES:] == TRAILER_MAGIC + struct.pack(">Q", len(body)) + entry.checksum
    assert (
        entry.checksum
        == xxhash.xxh3_128(body).digest()
        == xxhash.xxh3_128(body).intdigest().to_bytes(16, "big")
    )
    assert len(entry.checksum) == 16 and entry.size == len(data)


def test_a_store_of_version_3_files_opens_verifies_reads_and_detects_damage() -> None:
    st = MemoryStorage()
    store = PartitionStore.open(st, P, 1, CFG)
    for keys in ((1, 2, 3, 4), (5, 6, 7, 8)):
        store.write(rows(*keys), 0.0)
        store.flush()
    names = rewrite_segments(st, 3)
    assert len(names) == 2 and all(st.read(n)[:8] == b"SBSEG\x03\x00\x00" for n in names)
    again = PartitionStore.open(st, P, 1, CFG)  # verifies every listed segment with BlockDigest
    assert sorted(again.rows().column("key").to_pylist()) == list(range(1, 9))
    assert read_table(st, names[0]).num_rows == 4
    # New segments are version 4 beside the old ones.
    again.write(rows(9, 10, 11, 12), 0.0)
    again.flush()
    assert st.read(segment_file(again.entries[-1].segment_id))[:8] == MAGIC
    data = st.read(names[0])
    st._files[names[0]] = data[:60] + bytes([data[60] ^ 4]) + data[61:]
    with pytest.raises(SegmentCorrupt, match="checksum"):
        PartitionStore.open(st, P, 1, CFG)


@pytest.mark.parametrize("version", [1, 2, 5])
def test_a_store_refuses_a_file_of_another_version_naming_it(version: int) -> None:
    st = MemoryStorage()
    store = PartitionStore.open(st, P, 1, CFG)
    store.write(rows(1, 2, 3, 4), 0.0)
    store.flush()
    (name,) = rewrite_segments(st, version)
    with pytest.raises(
        UnsupportedSegmentFormat, match=f"{name}: format version {version}, .* reads versions 3 and 4"
    ):
        PartitionStore.open(st, P, 1, CFG)
    # Without verification the first read of the file refuses it the same way (it is not "bad magic").
    with pytest.raises(UnsupportedSegmentFormat) as caught:
        PartitionStore.open(st, P, 1, replace(CFG, verify_on_open=False))
    assert caught.value.version == version and caught.value.name == name
    assert st.exists(name)  # refused, not deleted


def test_trailer_check_picks_the_checksum_from_the_magic_however_the_bytes_are_chunked() -> None:
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(*range(4)))
    v4 = st.read(segment_file(entry.segment_id))
    v3 = as_version(v4, 3)
    rng = random.Random(3)
    for data, version, checksum in ((v4, 4, entry.checksum), (v3, 3, v3[-16:])):
        for first in (1, 3, 7, 8, 9, 40, len(data)):
            check = TrailerCheck("x")
            at = 0
            while at < len(data):
                n = first if at == 0 else rng.randint(1, 700)
                check.feed(memoryview(data)[at : at + n])
                at += n
            assert check.finish() == checksum and check.version == version
    for bad, error in (
        (b"SBSEX" + v4[5:], "bad magic"),
        (as_version(v4, 2), "format version 2"),
        (v4[:5], "partial file"),
        (v4[:-1], "partial file"),
    ):
        check = TrailerCheck("x")
        check.feed(bad)
        with pytest.raises(SegmentCorrupt, match=error):
            check.finish()
    st._files["seg-old"] = as_version(v4, 2)
    with pytest.raises(UnsupportedSegmentFormat, match="seg-old: format version 2"):
        verify_segment(st, "seg-old")


def _leader_alone() -> Cluster:
    """``a`` leads and has flushed segments that ``b`` (down until now) has never been offered."""
    spec = PartitionSpec(
        partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2))
    )
    config = ReplicationConfig(store=CFG, chunk_bytes=300, credit_bytes=900, retry_after=0.5)
    c = Cluster(["a", "b"], [spec], config, seed=4)
    c.crash("b")
    for k in range(8):
        assert c.write("a", P, {"key": [k], "v": [f"v{k}"]}).error is None
    c.settle(5)
    return c


def test_a_leader_holding_version_3_segments_replicates_them_to_a_follower() -> None:
    c = _leader_alone()
    c.crash("a")
    names = rewrite_segments(c.storages["a", P], 3)
    c.restart("a")
    c.restart("b")
    c.settle(20)
    assert c.read("b", P) == c.read("a", P) and sorted(c.read("b", P)["key"]) == list(range(8))
    received = c.storages["b", P]
    assert all(received.read(n) == c.storages["a", P].read(n) for n in names)  # kept as version 3
    assert c.status("b")["counters"].get("fast_forwards", 0) >= 1


def test_a_follower_refuses_offered_bytes_of_an_unsupported_version_and_keeps_nothing() -> None:
    c = _leader_alone()
    leader = c.storages["a", P]
    for name in [n for n in leader.names() if n.startswith("seg-")]:
        leader._files[name] = as_version(leader.read(name), 2)  # same size; the offer keeps the old checksum
    c.restart("b")
    c.settle(3)
    assert c.status("b")["counters"].get("incoming_failed", 0) >= 1
    assert c.status("b")["counters"].get("fast_forwards", 0) == 0
    assert not [n for n in c.storages["b", P].names() if n.startswith("seg-")]
    assert c.status("a")["counters"].get("acked", 0) == 0


def with_body(data: bytes, body: bytes) -> bytes:
    """Segment file ``data`` (version 4) with ``body`` for its Arrow IPC stream, under a trailer that fits."""
    (hlen,) = struct.unpack(">I", data[8:12])
    before = data[: 12 + hlen] + body
    return before + TRAILER_MAGIC + struct.pack(">Q", len(before)) + xxhash.xxh3_128(before).digest()


def ipc_body(data: bytes) -> bytes:
    (hlen,) = struct.unpack(">I", data[8:12])
    return data[12 + hlen : -TRAILER_BYTES]


READS = {
    "schema": read_schema,
    "batches": lambda st, name: list(iter_batches(st, name)),
    "table": read_table,
}


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("body", ["not Arrow", "message cut short"])
def test_a_body_arrow_cannot_read_is_corrupt_though_its_checksum_holds(body: str, read: str) -> None:
    """Bad bytes under a good checksum (as a sender's bug would write them) are found by Arrow: an
    ``ArrowInvalid``, or for a message cut short an ``OSError`` Arrow raises itself, which has no errno."""
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(1, 2, 3, 4))
    name = segment_file(entry.segment_id)
    good = ipc_body(st.read(name))
    bad = b"\xff" * 64 if body == "not Arrow" else good[:-9]  # the last batch's body loses a byte
    if body == "message cut short":
        with pytest.raises(OSError) as raw:
            pa.ipc.open_stream(bad).read_all()
        assert raw.value.errno is None and not isinstance(raw.value, pa.ArrowInvalid)
        if read == "schema":
            return  # the schema message is whole
    st._files[name] = with_body(st.read(name), bad)
    verify_segment(st, name)
    with pytest.raises(SegmentCorrupt, match=f"{name}: bad Arrow IPC body"):
        READS[read](st, name)


@pytest.mark.parametrize("read", READS)
def test_the_storages_read_error_under_arrow_is_raised_as_it_is(read: str) -> None:
    """An ``OSError`` of the file Arrow reads reaches the caller as Arrow passes it on, errno included: a
    read error, not a bad body (``SegmentCorrupt``), which a store's open and a receiver take for damage."""
    st = MemoryStorage()
    _, entry = flushed(st, P, CFG, rows(1, 2, 3, 4))
    name = segment_file(entry.segment_id)
    readable = st.open
    st.open = lambda n: Unreadable(readable(n), errno.EIO)  # type: ignore[method-assign]
    with pytest.raises(OSError) as caught:
        READS[read](st, name)
    assert type(caught.value) is OSError and caught.value.errno == errno.EIO
    assert str(caught.value) == f"[Errno {errno.EIO}] {os.strerror(errno.EIO)}"


def test_open_tells_a_listed_segment_arrow_cannot_read_from_a_read_error() -> None:
    """Both fail the open; only the bad body is ``SegmentCorrupt``, which the role sets aside as damage."""
    st = MemoryStorage()
    store = PartitionStore.open(st, P, 1, CFG)
    store.write(rows(1, 2, 3, 4), 0.0)
    store.flush()
    readable = st.open
    st.open = lambda n: Unreadable(readable(n), errno.EIO)  # type: ignore[method-assign]
    with pytest.raises(OSError) as caught:
        PartitionStore.open(st, P, 1, CFG)
    assert not isinstance(caught.value, SegmentCorrupt) and caught.value.errno == errno.EIO
    del st.open
    assert PartitionStore.open(st, P, 1, CFG).rows().column("key").to_pylist() == [1, 2, 3, 4]
    (entry,) = store.entries
    name = segment_file(entry.segment_id)
    st._files[name] = with_body(st.read(name), b"\xff" * 64)
    store.entries = [replace(entry, checksum=st.read(name)[-16:], size=st.size(name))]
    store.save_manifest()  # the manifest agrees: only Arrow finds it bad
    with pytest.raises(SegmentCorrupt, match=f"{name}: bad Arrow IPC body"):
        PartitionStore.open(st, P, 1, CFG)
