"""The Raft journal's files: the record format, the meta file, and the I/O beneath them.

Owns: the journal file's format (a header, then CRC-checked records; ``encode_record``, the
structs ``journal.py`` parses with), the checked ``raft.meta`` format (``read_meta``,
``write_meta``), durable file writes (``write_file_durably``, ``fsync_directory``, OSErrors
``naming`` their file), whole reads and writes at an offset, the ``REAPER`` that frees
replaced lists and files off the Raft thread, and ``cut_to_synced_length`` (power-loss
simulation for tests). ``DurableJournal`` (journal.py) is built on it.
Must never: hold journal state (``DurableJournal`` does), or return a meta file's term or
vote without its checksum, version and range checked.

File format: a 24-byte header (magic, format version, the index through which
entries are known committed), then records ``u32 payload_len, u32 crc32(payload),
payload = u64 index, u64 term, command bytes``, little-endian.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import struct
import threading
import time
import zlib
from typing import Callable

import msgpack

log = logging.getLogger(__name__)

JOURNAL_NAME = "raft.journal"
META_NAME = "raft.meta"
# The compacted journal a snapshot writer prepares (prepare_compaction), renamed over the
# journal when the Raft thread compacts. Not the ".compact" file an inline compaction writes:
# both may be written at once, by different threads.
PREPARED_SUFFIX = ".prepared"
# Written only when power-loss tracking is on (tests): the journal length at the
# last completed sync, so a test can cut the file back to what a power cut would keep.
SYNCED_SIDECAR_SUFFIX = ".synced"

MAGIC = b"FNCJRNL\x00"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # magic, format version, reserved, committed_through
RECORD_HEAD = struct.Struct("<II")  # payload length, crc32
ENTRY_HEAD = struct.Struct("<QQ")  # index, term
META_FORMAT_VERSION = 1


class JournalCorrupt(RuntimeError):
    """The journal or meta file is damaged in a way that could hide acknowledged data."""


@contextlib.contextmanager
def naming(path: str):
    """Re-raise an OSError that names no file (pwrite, fsync, fdatasync) as one naming ``path``:
    the one line a member stops with (fatal.py) must say which file its disk refused."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from exc


def fsync_directory(path: str, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make renames and creations inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with naming(path):
            fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: str, data: bytes, fsync: Callable[[int], None] = os.fsync) -> None:
    """tmp + fsync + rename + fsync(dir): after return, ``path`` holds ``data`` across power loss.
    Any step that fails raises an OSError naming the file it was at."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with naming(tmp):
            write_all(fd, data, 0)
            fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)), fsync)


def read_meta(path: str) -> tuple[int, str | None] | None:
    """(term, vote) of a ``raft.meta`` file, checked; None if there is none. Raises
    ``JournalCorrupt`` naming the file for anything damaged. The one reader of the format:
    the journal at start, and the chaos faults that judge a member's saved term from outside."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) < 4:
        raise JournalCorrupt(f"{path}: truncated meta file ({len(raw)} bytes)")
    body, crc = raw[:-4], struct.unpack("<I", raw[-4:])[0]
    if zlib.crc32(body) != crc:
        raise JournalCorrupt(f"{path}: checksum mismatch in meta file")
    version, term, voted_for = msgpack.unpackb(body, raw=False)
    if version != META_FORMAT_VERSION:
        raise JournalCorrupt(f"{path}: unknown meta format version {version}")
    if type(term) is not int or not 0 <= term < 2**63:
        # pysyncobj persisted whatever term a peer sent (a float 1e300 stopped the cluster
        # for good); the typed wire refuses those now, and one on disk is refused here.
        raise JournalCorrupt(f"{path}: term {term!r} is not an integer in [0, 2^63)")
    return term, voted_for


def write_meta(path: str, term: int, voted_for, fsync: Callable[[int], None] = os.fsync) -> None:
    """Write (term, vote) as ``read_meta`` reads them, durably (``write_file_durably``)."""
    body = msgpack.packb([META_FORMAT_VERSION, term, voted_for], use_bin_type=True)
    write_file_durably(path, body + struct.pack("<I", zlib.crc32(body)), fsync)


def write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def read_exactly(fd: int, size: int, offset: int) -> bytes:
    parts = []
    while size:
        part = os.pread(fd, size, offset)
        if not part:
            raise OSError(f"journal: {size} bytes missing at offset {offset}")
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return b"".join(parts)


# The journal is read at start through a buffer of this many bytes: large enough that a
# journal of tens of MiB takes few reads, small against any journal worth streaming.
LOAD_READ_BYTES = 1024 * 1024


def rest_is_zero(f) -> bool:
    """Whether everything left in ``f`` is zero bytes (a zero-filled tail), read a buffer at a time."""
    while chunk := f.read(LOAD_READ_BYTES):
        if any(chunk):
            return False
    return True


def encode_record(command: bytes, index: int, term: int) -> bytes:
    payload = ENTRY_HEAD.pack(index, term) + command
    return RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


class Reaper:
    """Frees lists a slice at a time, and closes replaced files, on a thread of its own.

    A compaction drops the journal's in-memory entries up to the snapshot: after a busy
    interval tens of thousands of (command, index, term) tuples and their offsets, freed here
    ~1 ms worth at a time, yielding in between. It also replaces the journal file, and closing
    the last descriptor of the replaced one makes the kernel free its blocks and cached pages
    in that call: ~6 ms (2 ms CPU) for a 40 MiB file here. Both ran on the Raft thread, which
    stalled 22-67 ms (10-13 ms CPU) per snapshot at 1,000,000 resources (bench scale)."""

    SLICE = 4096

    def __init__(self) -> None:
        self._lists: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def free(self, *lists: list) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="journal-reaper", daemon=True)
                self._thread.start()
        for each in lists:
            self._lists.put(each)

    def close(self, fd: int) -> None:
        """Close ``fd``, which nothing uses any more, on the reaper's thread."""
        self.free()
        self._lists.put(fd)

    def _run(self) -> None:
        while True:
            doomed = self._lists.get()
            if isinstance(doomed, int):
                try:
                    os.close(doomed)
                except OSError:
                    log.exception("journal: closing a replaced file failed")
                continue
            while doomed:
                del doomed[-self.SLICE :]
                time.sleep(0)  # lets a thread waiting for the GIL have it
            del doomed


REAPER = Reaper()


def cut_to_synced_length(data_dir: str) -> tuple[int, int]:
    """Power-loss simulation for tests: drop what was written after the last sync.

    Returns (old_length, new_length). The node must already be dead (kill -9).
    """
    path = os.path.join(data_dir, JOURNAL_NAME)
    with open(path + SYNCED_SIDECAR_SUFFIX, "rb") as f:
        synced = struct.unpack("<Q", f.read(8))[0]
    old = os.path.getsize(path)
    if synced < old:
        os.truncate(path, synced)
    return old, min(old, synced)
