"""The segment store of one partition replica: write-ahead log, memtable, segment list, compaction.

Rows are Arrow tables with primary key columns. Two hidden columns version every row: ``_sb_lsn``, a
Lamport clock (a write gets one more than the highest version the replica has seen, in its own writes,
in segments it fast-forwarded, or in rows it merged), and ``_sb_origin``, the placement id of the
replica that accepted the write. An upsert keeps, per key, the row with the highest (lsn, origin).
So merging the same rows twice changes nothing, and every replica that holds the same rows resolves
them the same way, whatever order they arrived in. The spec says only that repeated identical writes
are idempotent; ordering conflicting versions is our choice, and what it guarantees is causal, not
wall-clock: a write made on a replica that had seen another version of its key (written there, merged
or fast-forwarded) wins over it. Two writes that did not see each other resolve by (lsn, origin), not
by which was acknowledged later: a leader that crashes with a write in its log (say at version 11) and
a new leader that then writes the same key at version 9, not having seen it, end with version 11 on
every replica once the first one is back. There is no consensus and no global epoch (EventQL has none).

Durability: ``write`` appends the rows to the log with fsync before it returns, so the caller may
acknowledge (an append that fails leaves none of its bytes before the next one: ``_log_and_apply``); ``write_flushed`` instead returns once they are in a segment the manifest lists. A flush writes a segment file, then the manifest (segment list, root id, the log
sequence it covers) atomically, then drops the log. A segment file counts only once the manifest lists
it. ``open`` recovers: it removes partial files, deletes files the manifest does not list (an incoming
segment is written in place under its final name, so an unlisted one may be partial), verifies every
listed segment's checksum, and replays log records the manifest does not cover (a torn last record is
discarded by its CRC). Additions to acked lists are saved lazily (``set_acked``, ``save_acked``).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from sparkbus.codecs import decode_batch, encode_batch
from sparkbus.roles.replication.segments import (
    SegmentCorrupt,
    SegmentEntry,
    SegmentHeader,
    chain,
    iter_batches,
    read_schema,
    read_table,
    verify_segment,
    write_segment,
)
from sparkbus.roles.replication.storage import Storage, TornAppend, write_whole
from sparkbus.roles.replication.upserts import HIDDEN, LSN, ORIGIN, overlay, upsert

#: The highest row version a replica takes (writes, merges, fast-forwards): far above any count of writes,
#: far enough below int64's limit that a replica at it can still version 2**62 writes.
MAX_LSN = 1 << 62
MANIFEST = "MANIFEST"
#: Prefix of a segment file an old placement carries over into a new one (``mark_carry``).
CARRY = "carry-"
WAL = "WAL"
_MANIFEST_MAGIC = b"SBMAN\x01\x00\x00"
_WAL_HEAD = struct.Struct(">II")


class StoreError(Exception):
    """A store operation was refused (bad rows from the caller, or corrupt files); names the partition."""


class ReadFailed(OSError):
    """The storage failed to read a segment file whose rows were being merged (``merge_segment_file``),
    told apart from an ``OSError`` writing them (the log): the file is not at fault, nor the disk's room."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    """Thresholds of one partition store.

    Attributes:
        key: primary key column names.
        flush_rows / flush_bytes / flush_age: flush the memtable when it holds this many rows, this many
            bytes, or its oldest row is this many seconds old (age is checked on ``tick``).
        max_segment_history: MAX_SEGMENT_HISTORY, the most ids a major segment lists as included.
        compact_minors: compact when the chain holds this many minor segments after its major.
        batch_rows: rows per record batch inside a segment file (the unit a reader holds in memory).
        verify_on_open: verify each listed segment's checksum when opening.
    """

    key: tuple[str, ...] = ("key",)
    flush_rows: int = 65_536
    flush_bytes: int = 64 << 20
    flush_age: float = 60.0
    max_segment_history: int = 64
    compact_minors: int = 8
    batch_rows: int = 65_536
    verify_on_open: bool = True

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("key must name at least one column")
        for name in ("flush_rows", "flush_bytes", "max_segment_history", "compact_minors", "batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.flush_age <= 0:
            raise ValueError(f"flush_age must be > 0, got {self.flush_age}")


#: A store's epoch (``PartitionStore.epoch``): random bytes drawn when the store is created.
EPOCH_BYTES = 8


def segment_file(segment_id: str) -> str:
    return f"seg-{segment_id}"


def read_manifest(storage: Storage, partition: str = "") -> dict[str, Any]:
    """The contents of ``storage``'s manifest, checked (magic, CRC32).

    Raises:
        StoreError: the manifest is damaged.
    """
    data = storage.read(MANIFEST)
    if data[:8] != _MANIFEST_MAGIC or len(data) < 12:
        raise StoreError(f"{partition}: manifest has a bad magic")
    (crc,) = struct.unpack(">I", data[8:12])
    if zlib.crc32(data[12:]) != crc:
        raise StoreError(f"{partition}: manifest checksum mismatch")
    plain: dict[str, Any] = msgpack.unpackb(data[12:], raw=False)
    return plain


def chain_ids(live: Sequence[SegmentEntry]) -> tuple[tuple[str, bytes], ...]:
    """What names chain ``live``'s rows: its segments' (id, checksum), old to new."""
    return tuple((e.segment_id, e.checksum) for e in live)


def covered(ids: tuple[tuple[str, bytes], ...], live: Sequence[SegmentEntry]) -> int:
    """How many of chain ``live``'s first segments the rows of the chain ``ids`` (``chain_ids``) stand for.

    Those segments themselves when ``live`` starts with them (a flush or a fast-forward added segments on
    top), or ``live``'s major when that major is the compaction of chain ``ids``: a major whose base is the
    chain's root was written by compacting the chain that ended there (a flush writes a major only on no
    base), here or on a peer, and holds exactly its rows. 0 when they stand for none of it.
    """
    if not ids or not live:
        return 0
    if chain_ids(live[: len(ids)]) == ids:
        return len(ids)
    return 1 if live[0].major and live[0].base_id == ids[-1][0] else 0


def listed_files(storage: Storage) -> set[str]:
    """The segment files ``storage``'s manifest lists; any other ``seg-`` file is not (yet) a segment."""
    if not storage.exists(MANIFEST):
        return set()
    return {segment_file(p["segment_id"]) for p in read_manifest(storage)["entries"]}


def _columns(schema: pa.Schema) -> str:
    """``schema`` on one line, for messages: ``(key int64, v string)``."""
    return "(" + ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in schema) + ")"


class PartitionStore:
    """Segments, memtable and log of one partition replica. No networking; file I/O only via ``Storage``.

    Use ``PartitionStore.open`` (it recovers whatever a crash left behind).
    """

    def __init__(self, storage: Storage, partition: str, placement: int, config: StoreConfig) -> None:
        self.storage = storage
        self.partition = partition
        self.placement = placement
        self.config = config
        self.entries: list[SegmentEntry] = []
        self.root: str | None = None
        self.lamport = 0
        self.meta: dict[str, Any] = {}
        self._schema: pa.Schema | None = None
        self._memtable: list[pa.Table] = []
        self._mem_rows = 0
        self._mem_bytes = 0
        self._mem_since: float | None = None
        self._wal_seq = 0
        self._wal_flushed = 0
        #: Bytes of whole records in the log (what the next record goes after), and whether the log may
        #: end in part of a record whose append failed (``TornAppend``): then it is written whole first.
        self._wal_size = 0
        self._wal_torn = False
        self._next_segment = 0
        self.recovered_partial = 0
        self.recovered_files: list[str] = []
        self._acked_unsaved = False
        self.recovered_log_records = 0
        self.recovered_torn_tail = False
        self._carried: list[str] = []
        #: The upserted rows of the chain ``versioned_rows`` last read, by the (id, checksum) of its
        #: segments: read from the files again only when the chain is not that one or that one with
        #: segments added on top (a flush, a fast-forward), whose rows are laid over it.
        self._chain_rows: tuple[tuple[tuple[str, bytes], ...], pa.Table] | None = None

    @property
    def schema(self) -> pa.Schema | None:
        """The partition's Arrow schema, version columns included; None while it holds no rows.

        Read from the newest listed segment the first time it is needed, not when a segment is added: a
        fast-forward is then the manifest write alone, and a follower that only receives never reads its
        segments back.
        """
        if self._schema is None and self.entries:
            self._schema = read_schema(self.storage, segment_file(self.entries[-1].segment_id))
        return self._schema

    @schema.setter
    def schema(self, value: pa.Schema | None) -> None:
        self._schema = value

    # ------------------------------------------------------------ open / recovery

    @classmethod
    def open(
        cls, storage: Storage, partition: str, placement: int, config: StoreConfig, now: float = 0.0
    ) -> PartitionStore:
        """Open (and recover) the store in ``storage``.

        Raises:
            SegmentCorrupt: a segment the manifest lists fails its checksum (the disk lost data), or
                its body is not Arrow's.
            OSError: the storage failed to read a file (with an errno, even under Arrow): not damage.
        """
        store = cls(storage, partition, placement, config)
        temporaries = storage.discard_partial()
        if storage.exists(MANIFEST):
            store._load_manifest()
        store._carry_files()
        # A segment file counts only once the manifest lists it: an incoming transfer is written in
        # place under its segment name, so an unlisted one may be partial (or whole but never acked).
        listed = {segment_file(e.segment_id) for e in store.entries}
        for name in storage.names():
            if name.startswith(("seg-", "in-", "split-")) and name not in listed:
                storage.delete(name)
                store.recovered_files.append(name)
        store.recovered_partial = temporaries + len(store.recovered_files)
        if config.verify_on_open:
            for entry in store.entries:
                if verify_segment(storage, segment_file(entry.segment_id)) != entry.checksum:
                    raise SegmentCorrupt(segment_file(entry.segment_id), "checksum differs from the manifest")
        # Read now, not when first needed: a listed segment that cannot be read fails the open.
        _ = store.schema
        if "epoch" not in store.meta:
            # A store that starts empty is a new store, whatever its placement (``epochs.py``).
            store.meta["epoch"] = os.urandom(EPOCH_BYTES)
            store.save_manifest()
        if store._wal_flushed == 1 << 62:
            store._wal_flushed = store._wal_seq = 0
            store._drop_log()
            store.save_manifest()
        store._replay_log(now)
        return store

    def _load_manifest(self) -> None:
        plain = read_manifest(self.storage, self.partition)
        self.entries = [SegmentEntry.from_plain(p) for p in plain["entries"]]
        self.root = plain["root"]
        self.lamport = plain["lamport"]
        self._wal_flushed = plain["wal_flushed"]
        self._wal_seq = self._wal_flushed
        self._next_segment = plain["next_segment"]
        self.meta = plain["meta"]
        if plain["placement"] != self.placement:
            # A new placement starts empty (spec 3.6): the old placement's files are not ours any more,
            # except the segments it set aside to carry over (``mark_carry``).
            self._carried = [str(i) for i in self.meta.get("carry", ())]
            self.entries, self.root, self.meta = [], None, {}
            self._wal_flushed = self._wal_seq = 1 << 62

    def _carry_files(self) -> None:
        """Set the carried segments of an old placement aside as ``carry-<id>``, or take them back.

        Opened under a new placement, the segments the old one marked (``mark_carry``) are renamed to
        ``carry-<id>``, which recovery does not delete; the caller merges and deletes them
        (``carried``). Opened under the old placement again (a crash between the renames and the new
        manifest, then a restart with the old placement), the renamed ones are renamed back.
        """
        if self._carried:
            for segment_id in self._carried:
                if self.storage.exists(segment_file(segment_id)):
                    self.storage.rename(segment_file(segment_id), CARRY + segment_id)
            return
        marked = self.meta.pop("carry", None)
        if marked is None:
            return
        for segment_id in marked:
            if not self.storage.exists(segment_file(segment_id)) and self.storage.exists(CARRY + segment_id):
                self.storage.rename(CARRY + segment_id, segment_file(segment_id))
        self.save_manifest()

    def mark_carry(self, segment_ids: Sequence[str]) -> None:
        """Mark segments to carry over into the next placement opened on this storage (saved at once).

        The replica is re-placed, and a new placement starts empty: the caller marks its chain, every
        live row (``Placement._set_aside``).
        """
        self.meta["carry"] = list(segment_ids)
        self.save_manifest()

    def carried(self) -> list[str]:
        """The ``carry-<id>`` files an old placement left in this storage, to merge and then delete."""
        return [n for n in self.storage.names() if n.startswith(CARRY)]

    def _replay_log(self, now: float) -> None:
        if not self.storage.exists(WAL):
            return
        data = self.storage.read(WAL)
        pos = 0
        while pos + _WAL_HEAD.size <= len(data):
            length, crc = _WAL_HEAD.unpack_from(data, pos)
            body = data[pos + _WAL_HEAD.size : pos + _WAL_HEAD.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break  # a torn last record: the write was never acknowledged
            pos += _WAL_HEAD.size + length
            record = msgpack.unpackb(body, raw=False)
            self._wal_seq = max(self._wal_seq, record["seq"])
            if record["seq"] <= self._wal_flushed:
                continue
            table = pa.Table.from_batches([decode_batch(record["rows"])])
            self._to_memtable(table, now)
            self.recovered_log_records += 1
        if pos < len(data):
            # Cut the torn tail off (atomically), or every later append would sit behind it, unreadable.
            write_whole(self.storage, WAL, [data[:pos]])
            self.recovered_torn_tail = True
        self._wal_size = pos

    def _drop_log(self) -> None:
        """Delete the log (the manifest says the segments cover every record of it)."""
        self.storage.delete(WAL)
        self._wal_size = 0
        self._wal_torn = False

    def save_manifest(self) -> None:
        """Persist the segment list, root id, clock and role metadata atomically."""
        body = msgpack.packb(
            {
                "partition": self.partition,
                "placement": self.placement,
                "root": self.root,
                "entries": [e.to_plain() for e in self.entries],
                "lamport": self.lamport,
                "wal_flushed": self._wal_flushed,
                "next_segment": self._next_segment,
                "meta": self.meta,
            },
            use_bin_type=True,
        )
        write_whole(self.storage, MANIFEST, [_MANIFEST_MAGIC + struct.pack(">I", zlib.crc32(body)), body])
        self._acked_unsaved = False

    @contextmanager
    def _undone_on_error(self) -> Iterator[None]:
        """Changes of the segment list, root, clock and covered log sequence inside are undone in memory
        if the manifest write that saves them fails (``OSError``: a full or failing disk). Kept, the
        memory listed what the disk did not (a segment the manifest does not list, whose file the next
        open deletes, offered to peers and used as a base)."""
        saved = (list(self.entries), self.root, self.lamport, self._wal_flushed)
        try:
            yield
        except OSError:
            self.entries, self.root, self.lamport, self._wal_flushed = saved
            raise

    # ------------------------------------------------------------ writes

    def _check_schema(self, table: pa.Table) -> pa.Table:
        user = pa.schema([f for f in table.schema if f.name not in HIDDEN])
        missing = [k for k in self.config.key if k not in user.names]
        if missing:
            raise StoreError(f"{self.partition}: rows lack key column(s) {missing}")
        if self.schema is not None and not user.equals(self._user_schema()):
            raise StoreError(
                f"{self.partition}: rows have schema {user}, the partition has {self._user_schema()}"
            )
        for k in self.config.key:
            if table.column(k).null_count:
                raise StoreError(f"{self.partition}: key column {k!r} has nulls")
        return table

    def check_segment_schema(self, schema: pa.Schema, name: str) -> None:
        """Refuse a segment from another replica whose rows could not join this partition's.

        Its schema must be exactly the one a store writes: the partition's when it has one (columns,
        order and nullability), else the user columns and then the two nullable int64 version columns.
        A peer can send any bytes, and a segment laid out otherwise was listed, or merged through a log
        record the store could not replay, after which it did not open.

        Raises:
            StoreError: no version columns, a key column missing, or another schema than ours.
        """
        for column in HIDDEN:
            if schema.get_field_index(column) < 0 or schema.field(column).type != pa.int64():
                raise StoreError(f"{self.partition}: segment {name} lacks the int64 version column {column}")
        user = [f for f in schema if f.name not in HIDDEN]
        missing = [k for k in self.config.key if k not in schema.names]
        if missing:
            raise StoreError(f"{self.partition}: segment {name} lacks key column(s) {missing}")
        expected = self.schema
        if expected is None:
            expected = pa.schema([*user, pa.field(LSN, pa.int64()), pa.field(ORIGIN, pa.int64())])
        if not schema.equals(expected):
            raise StoreError(
                f"{self.partition}: segment {name} has columns {_columns(schema)}, "
                f"the partition has {_columns(expected)}"
            )

    def _user_schema(self) -> pa.Schema:
        assert self.schema is not None
        return pa.schema([f for f in self.schema if f.name not in HIDDEN])

    def write(self, rows: pa.Table, now: float) -> int:
        """Version ``rows``, log them durably and add them to the memtable. Returns the log sequence.

        Raises:
            StoreError: wrong schema, missing key columns, or null keys.
        """
        return self._log_and_apply(self._versioned(rows), now)

    def write_flushed(self, rows: pa.Table, now: float) -> SegmentEntry | None:
        """Version ``rows`` and make them durable in a new segment at once, with whatever the memtable
        holds: ``write`` then ``flush`` without the log record, one fsync'd write of the rows fewer. For
        rows written once and flushed at once (a bulk load); None when there is nothing to flush.

        Raises:
            StoreError: as ``write``.
        """
        rows = self._versioned(rows)
        if rows.num_rows:
            self._to_memtable(rows.combine_chunks(), now)
        return self.flush()

    def _versioned(self, rows: pa.Table) -> pa.Table:
        """``rows`` checked, with the hidden version columns of a new write."""
        self._check_schema(rows)
        rows = rows.select([f.name for f in rows.schema if f.name not in HIDDEN])
        n = rows.num_rows
        if self.lamport >= MAX_LSN:
            raise StoreError(f"{self.partition}: row versions exhausted (clock at {self.lamport})")
        self.lamport += 1
        rows = rows.append_column(LSN, pa.repeat(pa.scalar(self.lamport, pa.int64()), n))
        return rows.append_column(ORIGIN, pa.repeat(pa.scalar(self.placement, pa.int64()), n))

    def merge(self, rows: pa.Table, now: float) -> int:
        """Insert versioned rows (from another replica's segment) like new writes, keeping versions.

        Raises:
            StoreError: as ``write``, no version columns, or rows that do not cast to the partition's
                schema; checked before the log record, which ``open`` must be able to replay.
        """
        self._check_schema(rows)
        if LSN not in rows.schema.names or ORIGIN not in rows.schema.names:
            raise StoreError(f"{self.partition}: merged rows lack the version columns")
        if self.schema is not None:
            try:
                rows = rows.cast(self.schema)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise StoreError(
                    f"{self.partition}: merged rows do not fit the partition's schema: {exc}"
                ) from None
        if rows.num_rows:
            top = int(pc.max(rows.column(LSN)).as_py())
            if top > MAX_LSN:
                raise StoreError(f"{self.partition}: merged rows have version {top}, above {MAX_LSN}")
            self.lamport = max(self.lamport, top)
        return self._log_and_apply(rows, now)

    def raise_clock(self, at_least: int) -> None:
        """Raise the clock to ``at_least`` if it is below (saved at once): the next write is versioned
        above every row a split source acknowledged (``SplitFinalized.lamport``)."""
        if at_least > self.lamport:
            self.lamport = at_least
            self.save_manifest()

    def merge_segment_file(self, name: str, now: float) -> int:
        """Merge every row of a stored segment file, one record batch at a time.

        Raises:
            ReadFailed: the storage failed to read the file (its header, its opening); any other
                ``OSError`` is one writing the rows.
        """
        rows = 0
        batches = iter_batches(self.storage, name)
        while True:
            try:
                batch = next(batches, None)
            except OSError as exc:
                raise ReadFailed(*exc.args) from exc
            if batch is None:
                return rows
            self.merge(pa.Table.from_batches([batch]), now)
            rows += batch.num_rows

    def _log_and_apply(self, rows: pa.Table, now: float) -> int:
        if rows.num_rows == 0:
            return self._wal_seq
        if self._wal_torn:
            self._rewrite_log()
        self._wal_seq += 1
        combined = rows.combine_chunks()
        body = msgpack.packb(
            {"seq": self._wal_seq, "rows": bytes(encode_batch(combined.to_batches()[0]))}, use_bin_type=True
        )
        record = _WAL_HEAD.pack(len(body), zlib.crc32(body)) + body
        try:
            self.storage.append_durable(WAL, record)
        except TornAppend:
            self._wal_torn = True
            raise
        self._wal_size += len(record)
        self._to_memtable(combined, now)
        return self._wal_seq

    def _rewrite_log(self) -> None:
        """Write the log whole with its acknowledged records only, dropping what a failed append left
        after them. Until this succeeds, nothing is appended: ``open`` stops reading the log at the first
        record it cannot read, and would drop every acknowledged record behind torn bytes."""
        whole = self.storage.read(WAL, 0, self._wal_size) if self.storage.exists(WAL) else b""
        write_whole(self.storage, WAL, [whole])
        self._wal_size = len(whole)
        self._wal_torn = False

    def _to_memtable(self, rows: pa.Table, now: float) -> None:
        if self.schema is None:
            self.schema = rows.schema
        self.lamport = max(self.lamport, int(pc.max(rows.column(LSN)).as_py()) if rows.num_rows else 0)
        self._memtable.append(rows.cast(self.schema))
        self._mem_rows += rows.num_rows
        self._mem_bytes += rows.nbytes
        if self._mem_since is None:
            self._mem_since = now

    @property
    def memtable_rows(self) -> int:
        return self._mem_rows

    def should_flush(self, now: float) -> bool:
        """True when a threshold is reached: rows, bytes, or age (measured with ``now``)."""
        if not self._mem_rows:
            return False
        if self._mem_rows >= self.config.flush_rows or self._mem_bytes >= self.config.flush_bytes:
            return True
        return self._mem_since is not None and now - self._mem_since >= self.config.flush_age

    # ------------------------------------------------------------ segments

    def _new_id(self) -> str:
        """``<placement>.<epoch>.<n>``: a store that starts empty under an old placement (its disk lost)
        counts from 1 again, and its ids must not name the old store's segments its peers still hold."""
        self._next_segment += 1
        return f"{self.placement:x}.{self.epoch.hex()}.{self._next_segment}"

    def _header(
        self, segment_id: str, base: str | None, included: tuple[str, ...], major: bool, table: pa.Table
    ) -> SegmentHeader:
        max_lsn = int(pc.max(table.column(LSN)).as_py()) if table.num_rows else 0
        return SegmentHeader(
            segment_id=segment_id,
            base_id=base,
            included=included,
            major=major,
            rows=table.num_rows,
            max_lsn=max_lsn,
            partition=self.partition,
        )

    def _write(self, header: SegmentHeader, table: pa.Table) -> SegmentEntry:
        assert self.schema is not None
        batches = iter(table.to_batches(max_chunksize=self.config.batch_rows))
        name = segment_file(header.segment_id)
        return header.entry(*write_segment(self.storage, name, header, self.schema, batches))

    def flush(self) -> SegmentEntry | None:
        """Write the memtable out as a new segment based on the root; the first one is major."""
        if not self._mem_rows:
            return None
        table = upsert(pa.concat_tables(self._memtable), self.config.key)
        entry = self._write(self._header(self._new_id(), self.root, (), self.root is None, table), table)
        with self._undone_on_error():
            self.entries.append(entry)
            self.root = entry.segment_id
            self._wal_flushed = self._wal_seq
            self.save_manifest()
        self._drop_log()
        self._memtable, self._mem_rows, self._mem_bytes, self._mem_since = [], 0, 0, None
        return entry

    def minors_since_major(self) -> int:
        return sum(1 for e in chain(self.entries, self.root) if not e.major)

    def compact(self) -> SegmentEntry | None:
        """Fold the chain (latest major and the minors after it) into a new major segment (spec 3.1), in
        one call. The leader's automatic compaction does it in steps (``compacting.Compaction``)."""
        live = chain(self.entries, self.root)
        if not any(not e.major for e in live):
            return None
        table = self._live_table(live, keep=False)
        entry = self._write(self.major_header(live, table), table)
        self.install_major(entry, table)
        return entry

    def major_header(self, live: Sequence[SegmentEntry], table: pa.Table) -> SegmentHeader:
        """The header, under a new id, of the major segment that compacts chain ``live`` (the store's
        chain, its upserted rows ``table``): based on its root, listing the ids it folds."""
        history: list[str] = []
        for e in reversed(live):
            history.append(e.segment_id)
            history.extend(e.included)
        included = tuple(dict.fromkeys(history))[: self.config.max_segment_history]
        return self._header(self._new_id(), self.root, included, True, table)

    def install_major(self, entry: SegmentEntry, table: pa.Table) -> None:
        """List ``entry``, the written compaction of the store's chain (rows ``table``), as the root."""
        with self._undone_on_error():
            self.entries.append(entry)
            self.root = entry.segment_id
            self.save_manifest()
        if self._chain_rows is not None:  # the new major holds exactly these rows
            self._chain_rows = ((entry.segment_id, entry.checksum),), table

    def _chain_table(self, live: Sequence[SegmentEntry]) -> pa.Table:
        assert self.schema is not None
        if not live:
            return self.schema.empty_table()
        tables = [read_table(self.storage, segment_file(e.segment_id)) for e in live]
        return upsert(pa.concat_tables(tables), self.config.key).cast(self.schema)

    def _live_table(self, live: Sequence[SegmentEntry], keep: bool) -> pa.Table:
        """The upserted rows of chain ``live``, from the kept ones when they stand for the start of it
        (``kept_for``); kept for the next call when ``keep``, or when rows were kept already."""
        ids = chain_ids(live)
        kept = self._chain_rows
        if kept is not None and kept[0] == ids:
            return kept[1]
        start = self.kept_for(live)
        if start is not None:
            table = overlay(start[1], self._chain_table(live[start[0] :]), self.config.key)
        else:
            table = self._chain_table(live)
        if keep or kept is not None:
            self._chain_rows = ids, table
        return table

    def kept_for(self, live: Sequence[SegmentEntry]) -> tuple[int, pa.Table] | None:
        """How many of chain ``live``'s first segments the kept rows (``versioned_rows``) stand for, and
        those rows; None when they stand for none.

        See ``covered``.
        """
        kept = self._chain_rows
        n = covered(kept[0], live) if kept is not None else 0
        return (n, kept[1]) if kept is not None and n else None

    def pending_rows(self) -> int:
        """Rows ``versioned_rows`` would read from segment files (those the kept rows do not stand for)."""
        live = chain(self.entries, self.root)
        start = self.kept_for(live)
        return sum(e.rows for e in live[start[0] if start is not None else 0 :])

    def keep_chain_rows(self, ids: tuple[tuple[str, bytes], ...], rows: pa.Table) -> bool:
        """Keep ``rows``, the upserted rows of the chain of segments ``ids`` read elsewhere (in steps, over
        loop turns), if they stand for more of the current chain than the kept ones; True if kept.

        Rows of a chain that is no longer the start of this store's chain (nor compacted into its major)
        are not kept: the store moved on while they were read.
        """
        live = chain(self.entries, self.root)
        before = self.kept_for(live)
        old, self._chain_rows = self._chain_rows, (ids, rows)
        after = self.kept_for(live)
        if after is None or (before is not None and before[0] > after[0]):
            self._chain_rows = old
            return False
        return True

    def add_segment(self, entry: SegmentEntry) -> None:
        """Fast-forward: the file ``segment_file(entry.segment_id)`` is stored; make it the root.

        One manifest write; the file is not read (its schema is read when first needed, ``schema``).
        Nothing changes in memory if the write fails.
        """
        with self._undone_on_error():
            self.entries.append(entry)
            self.root = entry.segment_id
            self.lamport = max(self.lamport, entry.max_lsn)
            self.save_manifest()
        if entry.major:
            self._chain_rows = None  # a chain of its own: rows kept of the old one would only take memory

    def delete_segment(self, segment_id: str) -> None:
        """Drop a segment from the list (persisted first) and then its file."""
        with self._undone_on_error():
            self.entries = [e for e in self.entries if e.segment_id != segment_id]
            self.save_manifest()
        self.storage.delete(segment_file(segment_id))

    def rewrite_for_range(
        self,
        entry: SegmentEntry,
        target: str,
        low: int | str | None,
        high: int | str | None,
        *,
        receiver: int,
    ) -> tuple[str, int, bytes, int]:
        """Write segment ``entry`` restricted to ``low <= key < high`` for split target ``target``.

        The copy keeps the segment id, base id, included ids and major flag (spec 3.8). Returns
        (file name, size, checksum, rows); the caller deletes the file when the transfer ends. Each
        receiving replica (``receiver``, its placement) gets a file of its own: transfers of one split
        segment to two replicas end at different times, and the first to end deletes its file.
        """
        table = read_table(self.storage, segment_file(entry.segment_id))
        column = table.column(self.config.key[0])
        mask = pc.is_valid(column)  # keys are never null: an all-true mask of the right shape
        # A NaN key sorts above every number, as Spark orders it: it goes to the range with no upper bound.
        # Compared as IEEE values it was in no range, and the split dropped its row.
        nan = pc.is_nan(column) if pa.types.is_floating(column.type) else None
        # Compared as values of the key's type: a timestamp or date key has no kernel for a plain int.
        if low is not None:
            above = pc.greater_equal(column, pa.scalar(low, type=column.type))
            mask = pc.and_(mask, above if nan is None else pc.or_(above, nan))
        if high is not None:
            below = pc.less(column, pa.scalar(high, type=column.type))
            mask = pc.and_(mask, below if nan is None else pc.and_(below, pc.invert(nan)))
        part = table.filter(mask)
        name = f"split-{target.replace('/', '~')}-r{receiver}-{entry.segment_id}"
        header = SegmentHeader(
            segment_id=entry.segment_id,
            base_id=entry.base_id,
            included=entry.included,
            major=entry.major,
            rows=part.num_rows,
            max_lsn=entry.max_lsn,
            partition=target,
        )
        batches = iter(part.to_batches(max_chunksize=self.config.batch_rows))
        size, checksum = write_segment(self.storage, name, header, table.schema, batches)
        return name, size, checksum, part.num_rows

    def set_acked(self, segment_id: str, acked: frozenset[int]) -> None:
        """Record who holds a segment. Removals are persisted at once; additions lazily.

        An addition lost in a crash only makes the replica offer the segment again, which the holder
        answers with SEGMENT_EXISTS (or, for a fork it merged, merges again: upserts are idempotent).
        A removal (OUT_OF_ORDER restarts from the major) is rare and is saved before anything relies on it.
        """
        old = self.entry(segment_id)
        self.entries = [e.with_acked(acked) if e.segment_id == segment_id else e for e in self.entries]
        if old is not None and not old.acked <= acked:
            self.save_manifest()
        elif old is not None and acked != old.acked:
            self._acked_unsaved = True

    def forget_acked(self, placements: Collection[int] | None = None) -> None:
        """Strike ``placements`` (None: every placement) from every acked list, saved at once.

        For a placement whose store is new (it started empty): what it acked is gone with the old store.
        """
        gone = frozenset({p for e in self.entries for p in e.acked} if placements is None else placements)
        if any(e.acked & gone for e in self.entries):
            self.entries = [e.with_acked(e.acked - gone) for e in self.entries]
            self.save_manifest()

    @property
    def epoch(self) -> bytes:
        """Random bytes drawn when this store was created: a store that starts empty gets new ones."""
        return bytes(self.meta["epoch"])

    @property
    def acked_unsaved(self) -> bool:
        """Acked lists were recorded lazily and are not saved yet (``save_acked``)."""
        return self._acked_unsaved

    def save_acked(self) -> bool:
        """Persist acked lists recorded lazily (the role calls it on its tick); True if it wrote."""
        if not self._acked_unsaved:
            return False
        self.save_manifest()
        return True

    def entry(self, segment_id: str) -> SegmentEntry | None:
        for e in self.entries:
            if e.segment_id == segment_id:
                return e
        return None

    def reset(self) -> None:
        """Forget every segment, the memtable and the log (a new, empty placement).

        The manifest that lists nothing is saved before any file goes (a listed file is a whole file): a
        crash in between leaves unlisted segment files, which the next ``open`` deletes.
        """
        gone = [segment_file(e.segment_id) for e in self.entries]
        self.entries, self.root, self._chain_rows = [], None, None
        self.meta["epoch"] = os.urandom(EPOCH_BYTES)  # empty again: a new store to its peers (epochs.py)
        self._memtable, self._mem_rows, self._mem_bytes, self._mem_since = [], 0, 0, None
        self._wal_flushed = self._wal_seq
        self.save_manifest()
        for name in gone:
            self.storage.delete(name)
        self._drop_log()

    # ------------------------------------------------------------ reads

    def versioned_rows(self) -> pa.Table:
        """The live rows with their version columns (chain plus memtable, upserted).

        The chain's rows are kept in memory from one call to the next (one table of at most the
        partition's live rows, what the call returns anyway): the segments are read again only for a
        chain that is not the one read last nor that one grown by a flush or a fast-forward.
        """
        if self.schema is None:
            return pa.table({})
        table = self._live_table(chain(self.entries, self.root), keep=True)
        if not self._memtable:
            return table
        return overlay(table, upsert(pa.concat_tables(self._memtable), self.config.key), self.config.key)

    def rows(self) -> pa.Table:
        """The live rows, sorted by key, without version columns."""
        table = self.versioned_rows()
        if self.schema is None:
            return table
        return table.drop_columns(list(HIDDEN)).sort_by([(k, "ascending") for k in self.config.key])

    def segment_table(self, segment_id: str) -> pa.Table:
        return read_table(self.storage, segment_file(segment_id))

    def iter_segment(self, segment_id: str) -> Iterator[pa.RecordBatch]:
        return iter_batches(self.storage, segment_file(segment_id))
