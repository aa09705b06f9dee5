"""The Raft journal: checksummed, group-committed, crash-atomic.

Owns: the on-disk Raft log (``raft.journal``) and Raft's persistent term/vote
(``raft.meta``) for one node. It implements pysyncobj's ``Journal`` interface, so
pysyncobj keeps calling ``add``/``deleteEntriesFrom``/``deleteEntriesTo`` as before,
but nothing here is durable until ``sync()`` returns: the Raft wrapper calls it once
per batch (group commit) before any acknowledgement or commit decision.

It closes these gaps of pysyncobj 0.3.17's ``FileJournal`` (RAFT.md "Durability"):
- no fsync ever (journal.py:117-126, 218-225, 261): ``sync()`` fdatasyncs;
- meta written by tmp+rename without fsync, corrupt meta silently ``{}``
  (journal.py:152-164): meta is fsynced with its directory and checksummed;
  corruption stops the node;
- records without checksums: every record carries a CRC32;
- compaction rewrites the file in place (journal.py:252-256): it writes a new file
  and renames it over the old one.

Must never: acknowledge anything itself, or silently drop a complete record. A
torn record at the very end of the file (a write that never completed, so it was
never synced nor acknowledged) is cut with a warning; any other damage raises
``JournalCorrupt`` naming the file and offset.

The file formats (journal and meta) and the I/O beneath them are in ``journal_file.py``.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import struct
import threading
import time
import zlib
from typing import Callable

from pysyncobj.journal import Journal

from coordinator.raft.journal_file import (
    ENTRY_HEAD,
    FORMAT_VERSION,
    HEADER,
    JOURNAL_NAME,
    LOAD_READ_BYTES,
    MAGIC,
    META_NAME,
    PREPARED_SUFFIX,
    REAPER,
    RECORD_HEAD,
    SYNCED_SIDECAR_SUFFIX,
    JournalCorrupt,
    cut_to_synced_length,
    encode_record,
    fsync_directory,
    naming,
    read_exactly,
    read_meta,
    rest_is_zero,
    write_all,
    write_meta,
)

log = logging.getLogger(__name__)

# The journal's own names, importable from here as before the file format moved out.
__all__ = [
    "JOURNAL_NAME", "META_NAME", "SYNCED_SIDECAR_SUFFIX", "DurableJournal", "JournalCorrupt", "cut_to_synced_length",
    "read_meta",
]


@dataclasses.dataclass
class _Prepared:
    """A compacted journal written ahead (``prepare_compaction``), not yet in place."""

    generation: int  # the journal's generation when it was read: any truncation or rewrite since voids it
    first_index: int  # the index of the first entry it keeps (the snapshot's last)
    source_end: int  # the offset in the current file through which records were copied
    fd: int  # the new file, fsynced through ``end``
    end: int
    offsets: list[int]  # of the copied records, in the new file
    committed_through: int


class DurableJournal(Journal):
    """pysyncobj ``Journal`` on a checksummed append-only file, durable at ``sync()``.

    ``fsync``/``fdatasync`` are injectable so the deterministic simulation can run on
    tmpfs without real syncs while still tracking what *would* survive a power cut.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        fsync: Callable[[int], None] = os.fsync,
        fdatasync: Callable[[int], None] = os.fdatasync,
        track_synced: bool = False,
    ) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self._dir = data_dir
        self._path = os.path.join(data_dir, JOURNAL_NAME)
        self._meta_path = os.path.join(data_dir, META_NAME)
        self._fsync = fsync
        self._fdatasync = fdatasync
        # Told how long each fdatasync took, in seconds (the server's fsync histogram); runs
        # under the journal's lock on the syncing thread, so it must be as cheap as a
        # histogram observe (~1 us against a sync's ~1 ms). None: nothing is timed.
        self.sync_seconds_observer: Callable[[float], None] | None = None
        self._track_synced = track_synced
        self._sidecar_fd: int | None = None  # the synced-length sidecar, kept open (below)
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []
        self._committed_through = 0
        self._end = HEADER.size
        self._synced_end = HEADER.size
        # The file's length when last rewritten (compacted): a loaded file counts whole.
        self._end_after_compaction = HEADER.size
        # sync() may run on another thread than the one that appends (the leader syncs in
        # the background): it holds this lock, and so does everything that replaces,
        # truncates or closes the file. Appends only ever extend it, from one thread.
        self._io_lock = threading.Lock()
        # Bumped by everything that truncates or replaces the file: a compaction prepared
        # before a bump no longer matches the records it copied.
        self._generation = 0
        self._prepared: _Prepared | None = None
        self.prepared_compactions = 0  # for tests and benchmarks: compactions that used one
        self.sync_count = 0  # for benchmarks and tests: how many group commits ran
        self._term, self._voted_for = self._load_meta()
        self._fd: int | None = self._open_and_load()

    # -- loading -------------------------------------------------------------

    def _load_meta(self) -> tuple[int, str | None]:
        meta = read_meta(self._meta_path)
        return (0, None) if meta is None else meta

    def _open_and_load(self) -> int:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size == 0:
            write_all(fd, HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0), 0)
            self._fsync(fd)
            fsync_directory(self._dir, self._fsync)
        else:
            self._parse(fd)
        self._synced_end = self._end
        self._write_synced_sidecar()
        return fd

    def _parse(self, fd: int) -> None:
        """Load the file record by record: memory is the entries kept, never the file on top.

        pysyncobj's FileJournal, and ours before, read the whole file into one buffer first,
        so a start needed the file's size again on top of its entries.
        """
        size = os.fstat(fd).st_size
        header = os.pread(fd, HEADER.size, 0)
        if len(header) < HEADER.size:
            raise JournalCorrupt(f"{self._path}: file shorter than its header ({len(header)} bytes)")
        magic, version, _reserved, committed = HEADER.unpack_from(header, 0)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise JournalCorrupt(f"{self._path}: not a journal of format {FORMAT_VERSION} (offset 0)")
        self._committed_through = committed
        offset = HEADER.size
        previous_index = None
        with os.fdopen(os.dup(fd), "rb", buffering=LOAD_READ_BYTES) as f:
            f.seek(offset)
            while offset < size:
                remaining = size - offset
                if remaining < RECORD_HEAD.size:
                    self._cut_torn_tail(fd, size, offset, "incomplete record header")
                    break
                head = f.read(RECORD_HEAD.size)
                length, crc = RECORD_HEAD.unpack(head)
                if length < ENTRY_HEAD.size:
                    if not any(head) and rest_is_zero(f):
                        self._cut_torn_tail(fd, size, offset, "zero-filled tail")
                        break
                    raise JournalCorrupt(f"{self._path}: invalid record length {length} at offset {offset}")
                if RECORD_HEAD.size + length > remaining:
                    self._cut_torn_tail(fd, size, offset, "record extends past end of file")
                    break
                payload = f.read(length)
                if zlib.crc32(payload) != crc:
                    raise JournalCorrupt(f"{self._path}: checksum mismatch in record at offset {offset}")
                index, term = ENTRY_HEAD.unpack_from(payload, 0)
                if previous_index is not None and index != previous_index + 1:
                    raise JournalCorrupt(
                        f"{self._path}: record at offset {offset} has index {index}, expected {previous_index + 1}"
                    )
                previous_index = index
                self._entries.append((payload[ENTRY_HEAD.size :], index, term))
                self._offsets.append(offset)
                offset += RECORD_HEAD.size + length
        self._end = offset

    def _cut_torn_tail(self, fd: int, size: int, offset: int, why: str) -> None:
        # Only the last record can be torn: a write that never completed was never
        # synced, hence never acknowledged. Anything before it passed its checksum.
        log.warning("%s: cutting torn tail at offset %d (%s, %d bytes)", self._path, offset, why, size - offset)
        os.ftruncate(fd, offset)
        self._fsync(fd)

    # -- durability ----------------------------------------------------------

    def sync(self) -> None:
        """Make every entry added before the call durable. Cheap when nothing changed.

        Thread-safe against the appending thread: it covers the entries whose records
        were complete when it started (``add`` writes the record, then moves the end).
        """
        with self._io_lock:
            end = self._end
            if end == self._synced_end:
                return
            observe = self.sync_seconds_observer
            with naming(self._path):
                if observe is None:
                    self._fdatasync(self._live_fd())
                else:
                    started = time.perf_counter()
                    self._fdatasync(self._live_fd())
                    observe(time.perf_counter() - started)
            self._synced_end = end
            self.sync_count += 1
            self._write_synced_sidecar()

    @property
    def synced_length(self) -> int:
        return self._synced_end

    @property
    def path(self) -> str:
        return self._path

    @property
    def bytes_since_compaction(self) -> int:
        """How much the file grew since it was last rewritten (compacted): what a
        compaction by bytes (RaftConfig.log_compaction_min_bytes) is measured on."""
        return max(0, self._end - self._end_after_compaction)

    def _write_synced_sidecar(self) -> None:
        if not self._track_synced:
            return
        # No fsync: this file only has to survive kill -9 (page cache), not power loss. Kept
        # open: a test-only file must not be what fails first when descriptors run out.
        if self._sidecar_fd is None:
            self._sidecar_fd = os.open(self._path + SYNCED_SIDECAR_SUFFIX, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._sidecar_fd, struct.pack("<Q", self._synced_end), 0)

    # -- pysyncobj Journal interface -------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = bytes(command)
        record = encode_record(command, idx, term)
        with naming(self._path):
            write_all(self._live_fd(), record, self._end)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)

    def clear(self) -> None:
        # Used by pysyncobj when it replaces the log by a snapshot's two boundary
        # entries. The header is rewritten with committed_through=0 (unknown).
        self._rewrite([], committed_through=0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        with self._io_lock:
            self._generation += 1
            new_end = self._offsets[entryFrom]
            del self._entries[entryFrom:]
            del self._offsets[entryFrom:]
            os.ftruncate(self._live_fd(), new_end)
            # Synced at once: a later append must never land on top of a truncation a
            # power cut could undo, or the "synced prefix" would mix old and new records.
            self._fsync(self._live_fd())
            self._end = new_end
            self._synced_end = new_end
            self._write_synced_sidecar()

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Compaction after a snapshot: keep entries[entryTo:], crash-atomically.

        The snapshot that covers the dropped entries was renamed into place just
        before; fsyncing the directory first makes that rename durable before the
        entries it replaces disappear. With a compaction prepared for this point
        (``prepare_compaction``, whose caller made that rename durable) only the records
        appended since it was written are copied here.
        """
        if entryTo <= 0:
            return
        first = self._entries[entryTo][1] if entryTo < len(self._entries) else None
        with self._io_lock:
            prepared = self._prepared
            if prepared is not None and prepared.generation == self._generation and prepared.first_index == first:
                self._prepared = None
                self._install_prepared_locked(prepared, entryTo)
                return
            self._drop_prepared_locked()
        fsync_directory(self._dir, self._fsync)
        kept = self._entries[entryTo:]
        committed = max(self._committed_through, kept[0][1] if kept else 0)
        with self._io_lock:
            if kept:
                # The kept records' bytes are copied, not encoded again: this runs on the Raft
                # thread when a snapshot is collected, and encoding every entry applied during
                # the snapshot's read took ~20-30 ms of it at 1,000,000 resources (bench scale).
                start = self._offsets[entryTo]
                records = read_exactly(self._live_fd(), self._end - start, start)
                shift = HEADER.size - start
                offsets = [offset + shift for offset in self._offsets[entryTo:]]
                self._rewrite_locked(kept, committed, tail=(records, offsets))
            else:
                self._rewrite_locked(kept, committed)

    def prepare_compaction(self, first_index: int) -> bool:
        """Write ahead the journal that compacting to ``first_index`` will leave: the records
        from that entry on, as far as the file holds them now, in a new fsynced file. Called by
        the snapshot writer thread once the snapshot ending at ``first_index`` is durable in
        place; ``deleteEntriesTo`` then only adds what was appended since, renames it in and
        syncs the directory, where it copied every kept record on the Raft thread (~13 ms of
        CPU and 25-33 ms in all per snapshot at 1,000,000 resources, bench scale).

        Anything that truncates or rewrites the file meanwhile voids it (the generation); so
        does a compaction to another point. False when there is nothing to prepare."""
        with self._io_lock:
            self._drop_prepared_locked()
            if self._fd is None or not self._entries:
                return False
            # Appends run meanwhile without this lock (add: the entry, then its offset, then the
            # end): every record before the end read here has its offset in the list already.
            end = self._end
            pos = first_index - self._entries[0][1]
            copied = bisect.bisect_left(self._offsets, end)
            if not 0 <= pos < copied:
                return False
            offsets = self._offsets[pos:copied]
            generation = self._generation
            committed = max(self._committed_through, first_index)
            # Read through a duplicate descriptor outside the lock, so a group commit does not
            # wait for the copy; a truncation or rewrite meanwhile changes the generation.
            source = os.dup(self._fd)
        start = offsets[0]
        try:
            records = read_exactly(source, end - start, start)
        except OSError:
            return False  # truncated meanwhile: the generation has moved on
        finally:
            os.close(source)
        fd = os.open(self._path + PREPARED_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            head = HEADER.pack(MAGIC, FORMAT_VERSION, 0, committed)
            write_all(fd, head + records, 0)
            self._fsync(fd)
        except BaseException:  # the descriptor goes on any failure, interrupts too; re-raised
            os.close(fd)
            raise
        shift = HEADER.size - start
        prepared = _Prepared(generation, first_index, end, fd, HEADER.size + len(records),
                             [offset + shift for offset in offsets], committed)
        with self._io_lock:
            if self._generation != generation or self._fd is None or self._prepared is not None:
                os.close(fd)
                return False
            self._prepared = prepared
        return True

    def _drop_prepared_locked(self) -> None:
        if self._prepared is not None:
            os.close(self._prepared.fd)
            self._prepared = None

    def _install_prepared_locked(self, prepared: _Prepared, entryTo: int) -> None:
        copied = len(prepared.offsets)
        # No truncation since it was read (same generation), so the entries it copied are
        # entries[entryTo:entryTo + copied], and the next record starts where it stopped.
        delta_offsets = self._offsets[entryTo + copied :]
        assert not delta_offsets or delta_offsets[0] == prepared.source_end, "prepared compaction out of step"
        end = prepared.end
        try:
            if self._end > prepared.source_end:
                tail = read_exactly(self._live_fd(), self._end - prepared.source_end, prepared.source_end)
                write_all(prepared.fd, tail, end)
                end += self._end - prepared.source_end
                self._fsync(prepared.fd)
            os.replace(self._path + PREPARED_SUFFIX, self._path)
        except BaseException:  # the descriptor goes on any failure, interrupts too; re-raised
            os.close(prepared.fd)
            raise
        fsync_directory(self._dir, self._fsync)
        shift = prepared.end - prepared.source_end
        REAPER.close(self._live_fd())  # the replaced file: its blocks are freed on close
        self._fd = prepared.fd
        dropped = (self._entries, self._offsets)
        self._entries = self._entries[entryTo:]
        self._offsets = prepared.offsets + [offset + shift for offset in delta_offsets]
        REAPER.free(*dropped)
        self._set_compacted_locked(end, prepared.committed_through)
        self.prepared_compactions += 1

    def _rewrite(self, entries: list[tuple[bytes, int, int]], committed_through: int) -> None:
        with self._io_lock:
            self._rewrite_locked(entries, committed_through)

    def _rewrite_locked(
        self, entries: list[tuple[bytes, int, int]], committed_through: int,
        tail: tuple[bytes, list[int]] | None = None,
    ) -> None:
        """A new file of ``entries``: encoded, or ``tail`` = (their records' bytes as this file
        holds them, their offsets in the new file)."""
        tmp = self._path + ".compact"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            chunks = [HEADER.pack(MAGIC, FORMAT_VERSION, 0, committed_through)]
            if tail is None:
                offsets = []
                end = HEADER.size
                for command, idx, term in entries:
                    record = encode_record(command, idx, term)
                    offsets.append(end)
                    chunks.append(record)
                    end += len(record)
            else:
                records, offsets = tail
                chunks.append(records)
                end = HEADER.size + len(records)
            write_all(fd, b"".join(chunks), 0)
            self._fsync(fd)
        except BaseException:  # the descriptor goes on any failure, interrupts too; re-raised
            os.close(fd)
            raise
        os.replace(tmp, self._path)
        fsync_directory(self._dir, self._fsync)
        REAPER.close(self._live_fd())  # the replaced file: its blocks are freed on close
        self._fd = fd
        dropped = (self._entries, self._offsets)  # lists no caller was handed (entries is a copy)
        self._entries = list(entries)
        self._offsets = offsets
        REAPER.free(*dropped)
        self._set_compacted_locked(end, committed_through)

    def _set_compacted_locked(self, end: int, committed_through: int) -> None:
        self._generation += 1
        self._drop_prepared_locked()  # written for the file just replaced
        self._end = end
        self._synced_end = end
        self._end_after_compaction = end
        self._committed_through = committed_through
        self._write_synced_sidecar()

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _live_fd(self) -> int:
        """The journal file's descriptor: there from the constructor until ``_destroy``."""
        fd = self._fd
        assert fd is not None, "the journal is destroyed"
        return fd

    def _destroy(self) -> None:
        if self._fd is None:
            return
        self.sync()
        with self._io_lock:
            self._generation += 1
            self._drop_prepared_locked()
            os.close(self._fd)
            self._fd = None
            if self._sidecar_fd is not None:
                os.close(self._sidecar_fd)
                self._sidecar_fd = None

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Raft's commit index is volatile state (Raft paper, Fig. 2). pysyncobj's
        # FileJournal persisted it lazily and then trusted it on restart beyond a
        # lost tail; we never persist it and restart from what a snapshot proves.
        pass

    def getRaftCommitIndex(self) -> int:
        # Entries up to the last compaction point were applied (so committed).
        return max(1, self._committed_through)

    @property
    def meta_path(self) -> str:
        return self._meta_path

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:
        # Raft: term and vote are durable before any message reflecting them leaves.
        # Log entries first, so a vote request never claims entries a power cut drops.
        # Raises on any failure; the caller (durable_term.py) stops the member then, before
        # its in-memory term changes.
        self.sync()
        write_meta(self._meta_path, term, votedForNodeId, self._fsync)
        self._term, self._voted_for = term, votedForNodeId

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self):
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        pass

