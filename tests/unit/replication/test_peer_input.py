"""What a peer sends is checked before it reaches the disk or the segment list.

An offer's ids become file names and manifest entries, and a fast-forward lists the offer's fields as
the segment's entry: an id the store could not keep, a version that would overflow the clock, or a
file whose header is not the segment offered is refused, with an answer the sender acts on (a decline
or an error ack), never with an exception that leaves the sender waiting.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from sparkbus.bus.contract import BatchReceived, LocalCall, MessageReceived, PeerLost, PeerUp, Reply, Send
from sparkbus.codecs import encode_batch
from sparkbus.roles.replication.layout import Layout, PartitionSpec, Replica
from sparkbus.roles.replication.messages import (
    DeclineReason,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
)
from sparkbus.roles.replication.role import ReplicationConfig, ReplicationRole
from sparkbus.roles.replication.segments import (
    TRAILER_BYTES,
    TRAILER_MAGIC,
    SegmentCorrupt,
    SegmentEntry,
    SegmentHeader,
    chain,
    new_digest,
    parse_header,
    write_segment,
)
from sparkbus.roles.replication.storage import DiskStorage, FileWriter, MemoryStorage, Storage, Tap
from sparkbus.roles.replication.store import (
    MANIFEST,
    MAX_LSN,
    PartitionStore,
    StoreConfig,
    StoreError,
    read_manifest,
)
from tests.sim.replication.cluster import Unreadable

P = "t/0"
SPEC = PartitionSpec(partition=P, replicas=(Replica(node="a", placement=1), Replica(node="b", placement=2)))


def segment(partition: str = P, placement: int = 1) -> tuple[SegmentEntry, bytes]:
    """A real segment (2 rows) written by a store of ``partition`` at ``placement``."""
    store = PartitionStore.open(MemoryStorage(), partition, placement, StoreConfig())
    store.write(pa.table({"key": [1, 2], "v": ["x", "y"]}), 0.0)
    entry = store.flush()
    assert entry is not None
    return entry, store.storage.read(f"seg-{entry.segment_id}")


def follower(storage: Storage | None = None) -> ReplicationRole:
    disk = storage or MemoryStorage()
    role = ReplicationRole("b", Layout.of([SPEC]), lambda p: disk, ReplicationConfig())
    list(role.handle(PeerUp(peer="a"), 0.0))
    return role


def offer_of(entry: SegmentEntry, data: bytes, **change: Any) -> SegmentOffered:
    fields: dict[str, Any] = {
        "partition": P,
        "segment_id": entry.segment_id,
        "base_id": entry.base_id,
        "included": entry.included,
        "major": entry.major,
        "rows": entry.rows,
        "max_lsn": entry.max_lsn,
        "size": len(data),
        "checksum": entry.checksum,
        "sender": 1,
        "target": 2,
    }
    return SegmentOffered(**{**fields, **change})


def sent(actions: Any) -> list[Any]:
    return [a.message for a in actions if isinstance(a, Send)]


def answer(role: ReplicationRole, offer: SegmentOffered, peer: str = "a") -> Any:
    # The answer to the offer (a leader may offer its own segments in the same turn).
    messages = sent(role.handle(MessageReceived(peer=peer, message=offer), 1.0))
    (reply,) = [m for m in messages if not isinstance(m, SegmentOffered)]
    return reply


def transfer(role: ReplicationRole, offer: SegmentOffered, data: bytes, peer: str = "a") -> SegmentAcked:
    """Offer, send the bytes in one chunk and the summary; the receiver's ack."""
    accept = answer(role, offer, peer)
    assert isinstance(accept, SegmentAccepted), accept
    chunk = BatchReceived(
        peer=peer, stream=accept.stream, ordinal=0, last=True, data=data, size=len(data), remaining=0
    )
    actions = list(role.handle(chunk, 2.0))
    summary = SegmentTransited(partition=P, segment_id=offer.segment_id, size=len(data), chunks=1)
    actions += role.handle(MessageReceived(peer=peer, message=summary), 2.0)
    (ack,) = [m for m in sent(actions) if isinstance(m, SegmentAcked)]
    return ack


@pytest.mark.parametrize(
    "change",
    [
        {"segment_id": "1.99.tmp"},  # listed, then deleted by the next open as a leftover temporary
        {"segment_id": "1." + "9" * 254},  # a file name the file system refuses
        {"segment_id": "..1"},
        {"segment_id": "MANIFEST"},
        {"base_id": "x/../y", "major": True},
        {"included": ("1.1", "WAL")},
        {"max_lsn": MAX_LSN + 1},  # pushed the clock to where the next write overflows
        {"base_id": "1.1", "segment_id": "1.1"},  # based on itself: the chain would loop for ever
        {"included": "itself"},  # includes itself
    ],
)
def test_an_offer_the_store_could_not_keep_is_declined_invalid(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    entry, data = segment()
    if change.get("included") == "itself":
        change = {"included": (entry.segment_id,)}
    role = follower(DiskStorage(tmp_path))
    reply = answer(role, offer_of(entry, data, **change))
    assert isinstance(reply, SegmentDeclined) and reply.reason is DeclineReason.INVALID, reply
    assert not role.incoming
    # The store's own manifest (written when it opened, with its epoch) lists nothing.
    assert [p.name for p in tmp_path.iterdir()] == ["MANIFEST"], "nothing was written"
    assert read_manifest(DiskStorage(tmp_path))["entries"] == []
    assert role.counters["offers_refused"] == 1


def test_versions_beyond_int64_are_refused_at_decode() -> None:
    entry, data = segment()
    with pytest.raises(ValueError, match="max_lsn"):
        offer_of(entry, data, max_lsn=1 << 63)


@pytest.mark.parametrize(
    "change",
    [
        {"segment_id": "1.42"},
        {"rows": 999},
        {"max_lsn": 5},
        {"included": ("1.0",)},
    ],
)
def test_a_file_whose_header_is_not_the_offer_is_refused_before_it_is_listed(change: dict[str, Any]) -> None:
    entry, data = segment()
    role = follower()
    offer = offer_of(entry, data, **change)
    ack = transfer(role, offer, data)
    assert not ack.ok and "header says" in ack.error, ack
    store = role.local[P].store
    assert store.entries == [] and store.lamport == 0
    assert not any(n.startswith("seg-") for n in store.storage.names()), store.storage.names()
    assert role.counters["incoming_refused"] == 1
    # The same offer again does not travel: it is declined at once.
    again = answer(role, offer)
    assert isinstance(again, SegmentDeclined) and again.reason is DeclineReason.INVALID
    assert "refused before" in again.detail


def test_a_segment_of_another_partition_is_refused() -> None:
    entry, data = segment(partition="other/7")
    ack = transfer(follower(), offer_of(entry, data), data)
    assert not ack.ok and "other/7" in ack.error


def test_the_segment_offered_is_fast_forwarded() -> None:
    entry, data = segment()
    role = follower()
    ack = transfer(role, offer_of(entry, data), data)
    assert ack.ok, ack
    assert [e.segment_id for e in role.local[P].store.entries] == [entry.segment_id]


def test_an_offer_of_a_segment_already_listed_is_exists_even_based_on_the_root() -> None:
    """A peer offering our root again as based on our root (a loop once listed) got a fast-forward: the
    entry was replaced by one based on itself, and walking the chain hung the node's loop thread."""
    entry, data = segment()
    role = follower()
    assert transfer(role, offer_of(entry, data), data).ok
    again = offer_of(entry, data, base_id=entry.segment_id, segment_id=entry.segment_id)
    reply = answer(role, again)
    assert isinstance(reply, SegmentDeclined) and reply.reason is DeclineReason.INVALID
    store = role.local[P].store
    for base in (None, "2.5"):  # the receive procedure itself: EXISTS before anything else
        reply = answer(role, offer_of(entry, data, base_id=base))
        assert isinstance(reply, SegmentDeclined) and reply.reason is DeclineReason.SEGMENT_EXISTS
    assert [e.segment_id for e in store.entries] == [entry.segment_id]


def test_a_segment_list_that_loops_is_walked_once() -> None:
    looped = SegmentEntry(
        segment_id="1.1", base_id="1.1", included=(), major=False, rows=1, max_lsn=1, size=1, checksum=b""
    )
    assert chain([looped], "1.1") == [looped]


class _FailingDisk(MemoryStorage):
    """Refuses to create or to append: a full or failing disk."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def create_in_place(self, name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        if self.fail == "create":
            raise OSError(28, "No space left on device")
        writer = super().create_in_place(name, tap, size)
        if self.fail == "append":

            def append(data: bytes) -> None:
                raise OSError(5, "Input/output error")

            writer.append = append  # type: ignore[method-assign]
        return writer


def test_a_disk_error_on_accepting_an_offer_declines_it() -> None:
    entry, data = segment()
    role = follower(_FailingDisk("create"))
    reply = answer(role, offer_of(entry, data))
    assert isinstance(reply, SegmentDeclined) and reply.reason is DeclineReason.INVALID
    assert "No space left" in reply.detail and role.counters["offer_errors"] == 1
    assert not role.incoming


def test_a_disk_error_while_receiving_acks_with_the_error() -> None:
    entry, data = segment()
    role = follower(_FailingDisk("append"))
    accept = answer(role, offer_of(entry, data))
    chunk = BatchReceived(
        peer="a", stream=accept.stream, ordinal=0, last=True, data=data, size=len(data), remaining=0
    )
    (ack,) = [m for m in sent(role.handle(chunk, 2.0)) if isinstance(m, SegmentAcked)]
    assert not ack.ok and "Input/output error" in ack.error
    assert not role.incoming


def test_a_clock_at_its_limit_refuses_writes_with_an_answer() -> None:
    store = PartitionStore.open(MemoryStorage(), P, 1, StoreConfig())
    store.lamport = MAX_LSN
    with pytest.raises(StoreError, match="versions exhausted"):
        store.write(pa.table({"key": [1], "v": ["x"]}), 0.0)
    role = follower()
    list(role.handle(PeerLost(peer="a", reason="gone"), 1.0))  # b leads
    role.local[P].store.lamport = MAX_LSN
    batch = pa.RecordBatch.from_pydict({"key": [5], "v": ["z"]})
    call = LocalCall(call_id=1, name="write", args={"partition": P, "rows": bytes(encode_batch(batch))})
    (reply,) = [a for a in role.handle(call, 2.0) if isinstance(a, Reply)]
    assert reply.error is not None and "versions exhausted" in reply.error


def laid_out(table: pa.Table, **header: Any) -> tuple[SegmentEntry, bytes]:
    """A whole, checksummed segment of ``table`` as it is, whatever its columns (a peer's bytes)."""
    fields: dict[str, Any] = {"segment_id": "2.00000000000000aa.1", "base_id": None, "included": ()}
    fields.update(major=True, rows=table.num_rows, max_lsn=7, partition=P, **header)
    storage = MemoryStorage()
    size, checksum = write_segment(
        storage, "f", SegmentHeader(**fields), table.schema, iter(table.to_batches())
    )
    entry = SegmentEntry(
        **{k: v for k, v in fields.items() if k != "partition"}, size=size, checksum=checksum
    )
    return entry, storage.read("f")


LAYOUTS = {
    "version columns first": pa.table({"_sb_lsn": [7], "_sb_origin": [2], "key": [99], "v": ["b"]}),
    "user columns swapped": pa.table({"v": ["b"], "key": [99], "_sb_lsn": [7], "_sb_origin": [2]}),
    "version columns not null": pa.table(
        {"key": [99], "v": ["b"], "_sb_lsn": [7], "_sb_origin": [2]},
        schema=pa.schema(
            [
                ("key", pa.int64()),
                ("v", pa.string()),
                pa.field("_sb_lsn", pa.int64(), False),
                pa.field("_sb_origin", pa.int64(), False),
            ]
        ),
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_segment_laid_out_otherwise_is_refused_before_the_leader_merges_it(layout: str) -> None:
    """Merged, a segment whose version columns came first was logged and then failed to cast: the log
    held a record ``open`` could not replay, so the store, and the node's role, no longer started."""
    disk = MemoryStorage()
    a = ReplicationRole("a", Layout.of([SPEC]), lambda p: disk, ReplicationConfig())
    list(a.handle(PeerUp(peer="b"), 0.0))  # a leads
    store = a.local[P].store
    store.write(pa.table({"key": [1], "v": ["x"]}), 0.0)
    store.flush()  # b's major is not based on a's root: a merges it
    entry, data = laid_out(LAYOUTS[layout])
    offer = offer_of(entry, data, sender=2, target=1)
    ack = transfer(a, offer, data, peer="b")
    assert not ack.ok and "refused" in ack.error and "has columns" in ack.error, ack
    assert not disk.exists("WAL"), "nothing was logged"
    again = answer(a, offer, peer="b")
    assert isinstance(again, SegmentDeclined) and again.reason is DeclineReason.INVALID
    after = disk.crashed()
    restarted = ReplicationRole("a", Layout.of([SPEC]), lambda p: after, ReplicationConfig())
    list(restarted.handle(PeerUp(peer="b"), 10.0))
    assert restarted.local[P].store.rows().to_pydict() == {"key": [1], "v": ["x"]}


@pytest.mark.parametrize("layout", ["version columns first", "version columns not null"])
def test_a_segment_laid_out_otherwise_is_refused_before_a_follower_lists_it(layout: str) -> None:
    """A follower with no rows yet took the first segment's schema as the partition's: listed, it
    failed every read once a segment laid out as stores write them came."""
    role = follower()
    entry, data = laid_out(LAYOUTS[layout], segment_id="1.00000000000000aa.1")
    ack = transfer(role, offer_of(entry, data), data)
    assert not ack.ok and "has columns" in ack.error, ack
    assert role.local[P].store.entries == [] and role.local[P].store.schema is None
    good, data = segment()
    assert transfer(role, offer_of(good, data), data).ok
    assert role.local[P].store.rows().to_pydict() == {"key": [1, 2], "v": ["x", "y"]}


def test_merged_rows_that_do_not_fit_the_schema_are_refused_before_the_log() -> None:
    store = PartitionStore.open(MemoryStorage(), P, 1, StoreConfig())
    store.write(pa.table({"key": [1], "v": ["x"]}), 0.0)
    store.flush()
    with pytest.raises(StoreError, match="do not fit"):
        store.merge(LAYOUTS["version columns first"], 1.0)
    assert not store.storage.exists("WAL") and store.memtable_rows == 0


@pytest.mark.parametrize(
    "change",
    [
        {"rows": float("inf")},
        {"rows": 1.0},
        {"rows": True},
        {"major": 1},
        {"segment_id": 5},
        {"included": [1]},
    ],
)
def test_a_header_field_of_another_type_is_refused(change: dict[str, Any]) -> None:
    """``int(inf)`` raised OverflowError out of the header check: the transfer got no answer."""
    entry, good = segment()
    (hlen,) = struct.unpack(">I", good[8:12])
    plain = {**msgpack.unpackb(good[12 : 12 + hlen]), **change}
    head = msgpack.packb(plain, use_bin_type=True)
    before = good[:8] + struct.pack(">I", len(head)) + head + good[12 + hlen : len(good) - TRAILER_BYTES]
    digest = new_digest()
    digest.update(before)
    checksum = digest.digest()
    data = before + TRAILER_MAGIC + struct.pack(">Q", len(before)) + checksum
    with pytest.raises(SegmentCorrupt, match="bad header"):
        parse_header(data, "f")
    role = follower()
    ack = transfer(role, offer_of(entry, data, size=len(data), checksum=checksum), data)
    assert not ack.ok and "bad header" in ack.error, ack
    assert role.local[P].store.entries == []


def test_a_manifest_write_error_on_fast_forward_lists_nothing_and_the_offer_is_taken_later() -> None:
    entry, data = segment()
    role = follower()
    store = role.local[P].store
    create = store.storage.create

    def full(name: str) -> FileWriter:
        if name == MANIFEST:
            raise OSError(28, "No space left on device")
        return create(name)

    store.storage.create = full  # type: ignore[method-assign]
    ack = transfer(role, offer_of(entry, data), data)
    assert not ack.ok and "cannot write" in ack.error and "No space left" in ack.error, ack
    assert store.entries == [] and store.root is None and store.lamport == 0  # memory is the disk's
    assert not any(n.startswith("seg-") for n in store.storage.names()), store.storage.names()
    assert role.counters["incoming_write_errors"] == 1 and not role.refused
    del store.storage.create  # the disk has room again: the same offer travels and is listed
    assert transfer(role, offer_of(entry, data), data).ok
    assert [e.segment_id for e in store.entries] == [entry.segment_id]


def test_a_read_error_under_arrow_reading_a_received_segment_is_answered_cannot_read() -> None:
    """The storage fails (EIO) under Arrow reading the received file's schema. Taken for a bad body, the
    segment was refused and declined INVALID on every offer after; the same offer now travels again."""
    entry, data = segment()
    role = follower()
    store = role.local[P].store
    readable = store.storage.open
    store.storage.open = lambda n: Unreadable(readable(n), errno.EIO)  # type: ignore[method-assign]
    ack = transfer(role, offer_of(entry, data), data)
    assert not ack.ok and ack.error == f"cannot read: [Errno {errno.EIO}] {os.strerror(errno.EIO)}", ack
    assert role.counters["incoming_read_errors"] == 1 and not role.refused and store.entries == []
    assert not any(n.startswith("seg-") for n in store.storage.names()), store.storage.names()
    del store.storage.open  # read again: the same offer travels and is listed
    assert transfer(role, offer_of(entry, data), data).ok
    assert [e.segment_id for e in store.entries] == [entry.segment_id]


def test_a_received_body_arrow_cannot_read_is_refused_though_its_checksum_holds() -> None:
    entry, good = segment()
    (hlen,) = struct.unpack(">I", good[8:12])
    before = good[: 12 + hlen] + b"\xff" * 64  # a sender's bug: bad bytes, checksummed
    digest = new_digest()
    digest.update(before)
    data = before + TRAILER_MAGIC + struct.pack(">Q", len(before)) + digest.digest()
    role = follower()
    offer = offer_of(entry, data, checksum=data[-16:])
    ack = transfer(role, offer, data)
    assert not ack.ok and ack.error.startswith("refused: ") and "bad Arrow IPC body" in ack.error, ack
    assert role.counters["incoming_refused"] == 1 and role.local[P].store.entries == []
    again = answer(role, offer)
    assert isinstance(again, SegmentDeclined) and again.reason is DeclineReason.INVALID
    assert "refused before" in again.detail
