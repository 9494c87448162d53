"""Where a partition replica keeps its bytes: a small Storage interface, on disk and in memory.

The store above it needs only a handful of operations: create a file by appending chunks and commit it
atomically (write to a temporary name, fsync, rename, fsync the directory), or write it in place under
its final name (fsync only: the caller makes sure a partial file is never taken for a whole one), append
durably to a log, read byte ranges, list and delete. ``DiskStorage`` does exactly that with real files. ``MemoryStorage``
keeps bytes in dictionaries for tests and the simulator and can simulate a crash: whatever was not
committed or synced is lost, and a crash can be armed to strike in the middle of the n-th mutation.

This module is the only one in the replication family that touches the file system.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

_TMP_SUFFIX = ".tmp"
_WRITEBACK_BYTES = 8 << 20


class SimulatedCrash(Exception):
    """Raised by ``MemoryStorage`` when an armed crash strikes; the process is considered dead."""


class TornAppend(OSError):
    """A durable append failed and its bytes could not be taken back: the file may end in part of them.

    Nothing may be appended to the file until it is written whole again (``write_whole``): a record
    appended after torn bytes is unreadable to whoever reads the file from its start.
    """


Tap = Callable[[bytes], None]


class FileWriter(Protocol):
    """A file being created: append chunks, then ``commit`` (atomic and durable) or ``abort``."""

    def append(self, data: bytes) -> None: ...

    def drain(self) -> None:
        """Wait until every appended chunk is written and passed to the tap (if any)."""
        ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class Storage(Protocol):
    """The operations a partition store performs on its files (names are flat, ``/``-free strings)."""

    def create(self, name: str) -> FileWriter:
        """Start a new file ``name``; it becomes visible, whole and durable only on ``commit``."""
        ...

    def create_in_place(self, name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        """Start a new file ``name`` under its final name (it must not exist yet).

        The file is visible, and after a crash may be found partial, from the start; ``commit`` makes its
        bytes durable (fsync) without a rename. Its directory entry becomes durable with the directory's
        next sync (every ``create`` commit and ``rename`` does one). ``abort`` removes it. The caller must
        be able to tell a partial file from a whole one without trusting the name (the segment store lists
        a file in its manifest only after ``commit``). ``tap`` sees every chunk, in order, once it is
        written (an implementation may write behind the caller: ``drain`` waits for it). ``size`` is how
        many bytes the caller means to append (0: unknown): an implementation may reserve them up front,
        so a partial file can even have its full length; ``commit`` leaves exactly the bytes appended.
        """
        ...

    def append_durable(self, name: str, data: bytes) -> None:
        """Append ``data`` to ``name`` (created if missing) and fsync before returning.

        All or nothing: an append that fails (a full disk after part of ``data``, a failed fsync) takes
        back what it wrote, durably, before it raises. When that fails too, it raises ``TornAppend``.
        """
        ...

    def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
        """``size`` bytes of ``name`` from ``offset`` (all remaining bytes for -1)."""
        ...

    def open(self, name: str) -> BinaryIO:
        """A readable binary file object (for streaming readers such as Arrow IPC)."""
        ...

    def view(self, name: str) -> memoryview:
        """The bytes of committed file ``name`` as a read-only view, without reading them up front.

        On disk a memory map: slices of it are sent without a copy (the bus hands frames of 64 KiB and
        more to ZeroMQ as they are). The file must not change while a view is alive (segments never do).
        """
        ...

    def size(self, name: str) -> int: ...

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str) -> None:
        """Remove ``name`` durably; a missing file is not an error."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically and durably give committed file ``src`` the name ``dst`` (replacing it)."""
        ...

    def names(self) -> list[str]:
        """Committed files, sorted. Leftover temporary files are removed by ``discard_partial``."""
        ...

    def discard_partial(self) -> int:
        """Remove files a crash left half-written (temporaries); returns how many were removed."""
        ...


# ---------------------------------------------------------------- disk


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _DiskWriter:
    """Writes ``name`` through a temporary, renamed over ``name`` on commit."""

    def __init__(self, root: Path, name: str) -> None:
        self._final = root / name
        self._tmp = root / (name + _TMP_SUFFIX)
        self._root = root
        self._file: BinaryIO | None = open(self._tmp, "wb")  # noqa: SIM115 (closed in commit/abort)
        self._written = 0
        self._unsynced = 0

    def append(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError(f"{self._final.name}: append after commit or abort")
        self._file.write(data)
        self._unsynced += len(data)
        if self._unsynced >= _WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            # Start the disk writing what we have now, without waiting for it, so the fsync at commit
            # finds little left to do (a large segment's fsync was the biggest cost of a transit).
            self._file.flush()
            os.posix_fadvise(self._file.fileno(), self._written, self._unsynced, os.POSIX_FADV_DONTNEED)
            self._written += self._unsynced
            self._unsynced = 0

    def drain(self) -> None:
        pass  # written as appended

    def commit(self) -> None:
        if self._file is None:
            raise ValueError(f"{self._final.name}: already committed or aborted")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._tmp, self._final)
        _fsync_dir(self._root)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


class _InPlaceWriter:
    """Writes ``name`` under its final name as chunks are appended, handing each to the tap.

    Synchronous, on the caller's thread: roles run no threads (DESIGN.md section 3), and a writer
    thread measured no better on a busy 2-core machine (docs/REPLICATION_FIGURES.md). ``commit`` is fdatasync.
    With a ``size``, the file's blocks are allocated up front (``posix_fallocate``): appending 69 MiB then
    took 12.3 instead of 16.8 ms of CPU in a loop, and the receiving loop 48 instead of 54 ms per 72 MB
    segment (docs/REPLICATION_FIGURES.md).
    """

    def __init__(self, path: Path, tap: Tap | None, size: int = 0) -> None:
        self._path = path
        self._tap = tap
        # O_EXCL: never write over an existing file in place, it may be a listed segment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._fd: int | None = fd
        self._written = 0
        self._unsynced = 0
        self._reserved = 0
        if size > 0 and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
                self._reserved = size
            except OSError:
                # No room, or a file system that cannot: the file grows as it is written. A failure
                # may leave part of the space allocated; give it back.
                os.ftruncate(fd, 0)

    def append(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self._path.name}: append after commit or abort")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if self._tap is not None:
            self._tap(data)
        self._unsynced += len(data)
        if self._unsynced >= _WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            # Start writeback now so the fdatasync at commit finds little left to do.
            os.posix_fadvise(fd, self._written, self._unsynced, os.POSIX_FADV_DONTNEED)
            self._written += self._unsynced
            self._unsynced = 0

    def drain(self) -> None:
        pass  # written as appended

    def commit(self) -> None:
        if self._fd is None:
            raise ValueError(f"{self._path.name}: already committed or aborted")
        fd, self._fd = self._fd, None
        try:
            appended = self._written + self._unsynced
            if self._reserved and appended != self._reserved:
                os.ftruncate(fd, appended)  # fewer bytes came than were reserved: none of the zeros stay
            # The data and the size must be on disk before anyone lists the file; the directory entry is
            # synced with the directory's next sync (the manifest's rename).
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._path.unlink(missing_ok=True)


class DiskStorage:
    """Files in one directory; commits are write-temp, fsync, rename, fsync-directory.

    Args:
        root: the replica's directory (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"bad file name {name!r}")
        return self.root / name

    def create(self, name: str) -> FileWriter:
        self._path(name)
        return _DiskWriter(self.root, name)

    def create_in_place(self, name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        return _InPlaceWriter(self._path(name), tap, size)

    def append_durable(self, name: str, data: bytes) -> None:
        path = self._path(name)
        fresh = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            before = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                if fresh:
                    _fsync_dir(self.root)
            except BaseException as exc:
                # A full disk writes part of the record and then fails (ENOSPC, EFBIG). Left in the file,
                # those bytes would sit between the acknowledged records before them and the next ones,
                # and a reader stops at the first record it cannot read.
                try:
                    os.ftruncate(fd, before)
                    os.fsync(fd)
                except OSError as undo:
                    raise TornAppend(
                        f"{name}: an append failed ({exc}) and was not taken back ({undo})"
                    ) from exc
                raise
        finally:
            os.close(fd)

    def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
        with open(self._path(name), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def open(self, name: str) -> BinaryIO:
        return open(self._path(name), "rb")

    def view(self, name: str) -> memoryview:
        with open(self._path(name), "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return memoryview(b"")
            # The map outlives the descriptor; it is unmapped when the last view of it (one held by
            # ZeroMQ until a frame is sent, say) goes away.
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mapped, "madvise"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        return memoryview(mapped)

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def delete(self, name: str) -> None:
        path = self._path(name)
        if path.exists():
            path.unlink()
            _fsync_dir(self.root)

    def rename(self, src: str, dst: str) -> None:
        os.replace(self._path(src), self._path(dst))
        _fsync_dir(self.root)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_file() and not p.name.endswith(_TMP_SUFFIX))

    def discard_partial(self) -> int:
        partial = [p for p in self.root.iterdir() if p.name.endswith(_TMP_SUFFIX)]
        for p in partial:
            p.unlink()
        if partial:
            _fsync_dir(self.root)
        return len(partial)


# ---------------------------------------------------------------- memory


class _MemoryWriter:
    def __init__(
        self, storage: MemoryStorage, name: str, in_place: bool = False, tap: Tap | None = None
    ) -> None:
        self._storage = storage
        self._tap = tap
        self._name = name
        self._buf = io.BytesIO()
        self._open = True
        self._pending = storage._in_place if in_place else storage._temps
        self._pending[name] = self._buf

    def append(self, data: bytes) -> None:
        if not self._open:
            raise ValueError(f"{self._name}: append after commit or abort")
        self._storage._tick()
        self._buf.write(data)
        if self._tap is not None:
            self._tap(data)

    def drain(self) -> None:
        pass  # written as appended

    def commit(self) -> None:
        if not self._open:
            raise ValueError(f"{self._name}: already committed or aborted")
        self._storage._tick()
        self._open = False
        if self._pending.pop(self._name, None) is self._buf:  # an in-place file deleted meanwhile stays gone
            self._storage._files[self._name] = self._buf.getvalue()

    def abort(self) -> None:
        self._open = False
        if self._pending.get(self._name) is self._buf:
            del self._pending[self._name]


class MemoryStorage:
    """Files in memory, with crash simulation.

    A crash keeps what was committed or durably appended and loses the rest; temporary files survive as
    partial files, as they would on disk, until ``discard_partial``; a file written in place survives under
    its final name with every byte appended so far (the worst case for a reader: it may even look whole). ``arm_crash(n)`` makes the n-th
    following mutation raise ``SimulatedCrash``; a durable append struck this way leaves half its bytes
    (a torn write), everything else leaves the state as it was before the mutation. After the strike
    (``struck``) every mutation raises too: a dead process writes nothing more, even if its caller (a
    node core that survives a failing role) carries on until the test kills it.
    """

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}
        self._temps: dict[str, io.BytesIO] = {}
        self._in_place: dict[str, io.BytesIO] = {}
        self._countdown: int | None = None
        self.mutations = 0
        self.struck = False

    def arm_crash(self, after: int) -> None:
        """Crash on the ``after``-th mutation from now (1 = the next one)."""
        if after < 1:
            raise ValueError(f"after must be >= 1, got {after}")
        self._countdown = after

    def disarm(self) -> None:
        self._countdown = None

    def _tick(self, torn: tuple[str, bytes] | None = None) -> None:
        if self.struck:
            raise SimulatedCrash("the process died in an earlier mutation")
        self.mutations += 1
        if self._countdown is None:
            return
        self._countdown -= 1
        if self._countdown == 0:
            self._countdown = None
            self.struck = True
            if torn is not None:
                name, data = torn
                self._files[name] = self._files.get(name, b"") + data[: len(data) // 2]
            raise SimulatedCrash(f"simulated crash at mutation {self.mutations}")

    def crashed(self) -> MemoryStorage:
        """The storage as a restarted process finds it: committed files and partial temporaries."""
        after = MemoryStorage()
        after._files = dict(self._files)
        after._temps = {n: io.BytesIO(b.getvalue()) for n, b in self._temps.items()}
        after._files.update((n, b.getvalue()) for n, b in self._in_place.items())
        after.mutations = self.mutations
        return after

    def create(self, name: str) -> FileWriter:
        return _MemoryWriter(self, name)

    def create_in_place(self, name: str, tap: Tap | None = None, size: int = 0) -> FileWriter:
        # ``size`` reserves nothing here: a crash keeps the bytes appended so far, the harder case for a
        # reader than a file of full length with zeros at its end.
        if self.exists(name):
            raise FileExistsError(name)
        return _MemoryWriter(self, name, in_place=True, tap=tap)

    def append_durable(self, name: str, data: bytes) -> None:
        self._tick(torn=(name, data))
        self._files[name] = self._files.get(name, b"") + data

    def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
        data = self._files[name]
        return data[offset:] if size < 0 else data[offset : offset + size]

    def open(self, name: str) -> BinaryIO:
        return io.BytesIO(self._files[name])

    def view(self, name: str) -> memoryview:
        return memoryview(self._files[name])

    def size(self, name: str) -> int:
        return len(self._files[name])

    def exists(self, name: str) -> bool:
        return name in self._files or name in self._in_place

    def delete(self, name: str) -> None:
        if name in self._files or name in self._in_place:
            self._tick()
            self._files.pop(name, None)
            self._in_place.pop(name, None)

    def rename(self, src: str, dst: str) -> None:
        self._tick()
        self._files[dst] = self._files.pop(src)

    def names(self) -> list[str]:
        return sorted({*self._files, *self._in_place})

    def discard_partial(self) -> int:
        n = len(self._temps)
        self._temps.clear()
        return n

    def total_bytes(self) -> int:
        return sum(len(b) for b in self._files.values())


def write_whole(storage: Storage, name: str, chunks: Iterable[bytes]) -> None:
    """Create ``name`` from ``chunks`` and commit it atomically."""
    writer = storage.create(name)
    try:
        for chunk in chunks:
            writer.append(chunk)
    except SimulatedCrash:
        raise  # a dead process aborts nothing: the temporary stays behind, as on disk
    except BaseException:
        writer.abort()
        raise
    writer.commit()
