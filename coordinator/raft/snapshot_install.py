"""Snapshots on the Raft thread: installed, loaded and compacted without losing what the journal holds.

Owns: ``SnapshotInstall``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that
loads a snapshot at start (a damaged one stops the member) and installs a leader's (refusing
one older than what is applied, fsyncing the received file), trims the journal head to the
snapshot's boundary entries so its tail is kept (``_align_journal_head``), compacts by bytes as
well as by entries and time, holds applies while the snapshot writer captures the state, and
waits for that writer at shutdown (snapshot_writer.py). RAFT.md "Durability" and "Snapshots
written off the Raft thread" say why.
Must never: install a snapshot older than lastApplied, clear acknowledged entries the journal
holds after the snapshot point, replay a compacted journal onto empty state, or apply an entry
while the writer captures.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj

from coordinator.raft import snapshot_file
from coordinator.raft.fatal import EXIT_DISK_FAILED
from coordinator.raft.journal_file import fsync_directory

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object

log = logging.getLogger(__name__)

# How long closing a node waits for a snapshot write still running: the longest measured
# (1,000,000 resources, bench/README.md) takes a few seconds; a disk slower than this is
# reported and left behind.
_SNAPSHOT_WRITER_JOIN_S = 60.0


class SnapshotInstall(_Host):
    """Mixed into HardenedSyncObj; ``_init_snapshots`` runs before SyncObj.__init__ and
    ``_init_snapshot_writer`` after it. Needs ``self._journal``, ``self._replica``,
    ``self._on_fatal``, ``self._has`` and ``self._journal_obj``."""

    # pysyncobj's own state that this class sets (pysyncobj itself is untyped).
    _SyncObj__forceLogCompaction: bool

    def _init_snapshots(self, compaction_min_bytes: int) -> None:
        self._compaction_bytes = compaction_min_bytes
        self.refused_old_snapshots = 0

    def _init_snapshot_writer(self, journal, *, auto_tick: bool) -> None:
        writer = self._snapshot_writer()
        if writer is not None and not auto_tick:
            writer.inline = True  # ticked by hand (the simulation): stay deterministic
        if writer is not None and self._has("durable_journal") and hasattr(journal, "prepare_compaction"):
            writer.on_durable = journal.prepare_compaction  # the writer made the rename durable

    def _snapshot_writer(self):
        """The BackgroundSerializer, or None where pysyncobj's stock one is in place."""
        serializer = self._SyncObj__serializer
        return serializer if hasattr(serializer, "capturing") else None

    def _SyncObj__applyLogEntries(self):
        # From the moment the Raft thread starts a snapshot until the writer thread has read
        # its first piece (which fixes the state it holds; the state machine keeps what later
        # entries change as it was) nothing is applied: the pieces then describe the state at
        # the snapshot's last index exactly. Committed entries wait in the journal meanwhile;
        # elections, heartbeats, appends and commits go on.
        writer = self._snapshot_writer()
        if writer is not None and writer.capturing:
            return False
        return SyncObj._SyncObj__applyLogEntries(self)

    def _snapshot_blocks_sends(self) -> bool:
        """Whether a snapshot's result is still uncollected (and, while the writer thread still
        runs, a follower needs a snapshot sent): pysyncobj has nothing to send it then
        (getTransmissionData), and sending on every tick would spin (see _flush_tick). While a
        write runs (hundreds of ms), followers that need entries only are still sent them."""
        serializer = self._SyncObj__serializer
        if serializer._Serializer__pid == 0:
            return False
        writer = self._snapshot_writer()
        if writer is None or not writer.writing():
            return True  # a result waiting for the next check: one tick, as pysyncobj's inline path
        log_ = self._SyncObj__raftLog
        first = log_[0][1] if len(log_) else 0
        nxt = self._SyncObj__raftNextIndex
        return any(nxt.get(node, first + 1) <= first for node in self._SyncObj__otherNodes)

    def _doDestroy(self):
        writer = self._snapshot_writer()
        # A write still running would rename its file into a data dir the next process may
        # already use; a snapshot write takes seconds at most (RAFT.md), so this waits long.
        if writer is not None and not writer.wait(timeout_s=_SNAPSHOT_WRITER_JOIN_S):
            log.warning("raft: the snapshot writer is still running at shutdown")
        if writer is not None:
            writer.stop()
        SyncObj._doDestroy(self)

    def _SyncObj__tryLogCompaction(self):
        """Compact by bytes as well: stock pysyncobj compacts after logCompactionMinEntries
        entries or logCompactionMinTime seconds only (syncobj.py:1436-1439), so 64 KiB writes
        grew every member's journal, in memory and on disk, to 50,000 x 64 KiB. Once the
        journal has grown by ``log_compaction_min_bytes`` since its last compaction, the stock
        method is told to compact now (its force flag; it resets it when it starts).

        No compaction starts while the state machine says a snapshot would free nothing
        (``Replica.snapshot_deferred``: a restore staged in chunks, whose chunks a snapshot
        holds as the journal does); one already written is still collected."""
        if self._replica.snapshot_deferred() and self._SyncObj__serializer._Serializer__pid == 0:
            return None
        grown = getattr(self._journal, "bytes_since_compaction", 0)  # the stock journal: count only
        if self._compaction_bytes and grown > self._compaction_bytes and not self._SyncObj__forceLogCompaction:
            self._SyncObj__forceLogCompaction = True
        return SyncObj._SyncObj__tryLogCompaction(self)

    def _SyncObj__loadDumpFile(self, clearJournal):
        path = self.conf.fullDumpFile
        installing = clearJournal
        try:
            index, term = snapshot_file.verify(path)
        except (OSError, ValueError) as exc:
            if installing:
                log.warning("ignoring damaged snapshot from leader: %s", exc)
                return None
            # pysyncobj would log and carry on without the snapshot (syncobj.py:1510),
            # replaying a compacted journal onto empty state: a silent divergence.
            self._on_fatal(f"cannot load snapshot at startup: {exc}", EXIT_DISK_FAILED)
            return None
        if installing:
            if self._has("no_old_snapshot") and index <= self.raftLastApplied:
                # An old snapshot would move applied state backwards (RAFT.md "Durability":
                # measured 14972 -> 14772). Keep ours; the ack reports our log end.
                self.refused_old_snapshots += 1
                log.warning("refusing snapshot at %d: already applied %d", index, self.raftLastApplied)
                return None
            if self._has("durable_journal"):
                # pysyncobj renamed the received file into place without fsync
                # (serializer.py:198); make it durable before the journal is cleared.
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_directory(os.path.dirname(os.path.abspath(path)))
        if self._has("keep_tail") and self._align_journal_head(index, term):
            # The journal holds the snapshot point: keep everything after it.
            # Stock code clears the whole journal when its head is older than the
            # dump (syncobj.py:1489-1495), dropping acknowledged entries.
            clearJournal = False
        started = time.monotonic()
        loaded = SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        # One line per load (a start, or a snapshot the leader sent: bounded by the leader's
        # sends, which only a configured member makes): what a restart or catch-up spent here.
        # (A load that failed was reported where it failed: it applied nothing.)
        if self.raftLastApplied == index:
            log.info(
                "raft: loaded %s at index %d (%.1f MiB) in %.2f s",
                "the leader's snapshot" if installing else "the snapshot", index,
                _file_size(path) / 2**20, time.monotonic() - started,
            )
        # The election timer restarts once the state is loaded. Installing: it started when the
        # leader's message arrived (syncobj.py:952), and a follower that spent the restore on
        # the leader's own snapshot must not then depose it. Starting: pysyncobj set it in
        # __init__ (syncobj.py:162) and loads in the first tick; a load that outlasts it (~7 s
        # at a million resources, RAFT.md) would call an election the moment it ends and,
        # with no pre-vote, depose a healthy leader at every restart.
        self._SyncObj__raftElectionDeadline = _ps.monotonicTime() + self._SyncObj__generateRaftTimeout()
        return loaded

    def _align_journal_head(self, index: int, term: int) -> bool:
        log_ = self._journal_obj()
        if not len(log_):
            return False
        pos = index - log_[0][1]
        if pos < 1 or pos >= len(log_) or log_[pos][2] != term:
            return False
        if pos > 1:
            log_.deleteEntriesTo(pos - 1)  # head becomes [prev, last] of the snapshot
        return True


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
