"""Snapshots written on a thread of their own: the Raft thread only decides one and collects it.

Owns: ``BackgroundSerializer``, the pysyncobj ``Serializer`` that ``patches.install()`` puts in
place for a ``Replica``'s serializer hook (``serializer_for``), and the snapshot duration it
records. pysyncobj's own asynchronous protocol is kept: ``serialize`` starts the work and
returns, ``checkSerializing`` (called by every tick's compaction check) answers SERIALIZING
until the work is done, then SUCCESS or FAILED once; pysyncobj compacts the journal only on
SUCCESS (syncobj.py:1425-1428), so never before the file is durable and in place.
Must never: let the Raft thread apply an entry before the state a snapshot holds is fixed
(``capturing``: HardenedSyncObj skips applying while it is set; the state machine's first piece
fixes it, and it keeps what later entries change as it was: copy-on-write), rename a file that was not fully written and
fsynced, or rename its file over a snapshot installed from the leader meanwhile
(``setTransmissionData`` waits for a running write first).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from pysyncobj.atomic_replace import atomicReplace
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer

from coordinator.raft.replica import Replica, freeze_long_lived

log = logging.getLogger(__name__)

# pysyncobj reads ``_Serializer__pid != 0`` as "a snapshot's result is not collected yet"
# (getTransmissionData refuses to send a file then; so do syncobj.py's checks); the fork path
# stores a child's pid there, the inline path -1/-2. A running thread is this value.
_RUNNING = -3


def serializer_for(fileName, transmissionBatchSize, tryUseFork, serializer, deserializer, serializeChecker):
    """What syncobj.py constructs as ``Serializer``: ours for a Replica's hook, stock otherwise."""
    replica = getattr(serializer, "__self__", None)
    if isinstance(replica, Replica) and fileName is not None and serializeChecker is None:
        return BackgroundSerializer(replica, fileName, transmissionBatchSize, serializer, deserializer)
    return Serializer(fileName, transmissionBatchSize, tryUseFork, serializer, deserializer, serializeChecker)


class BackgroundSerializer(Serializer):
    """pysyncobj's Serializer with ``serialize`` run by a thread (see the module docstring)."""

    _Serializer__pid: int  # pysyncobj's (untyped): the forked writer's pid, 0 when none runs

    def __init__(self, replica: Replica, fileName, transmissionBatchSize, serializer, deserializer):
        super().__init__(fileName, transmissionBatchSize, False, serializer, deserializer, None)
        self._replica = replica
        self._thread: threading.Thread | None = None  # started at the first snapshot
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()  # no write queued or running
        self._idle.set()
        self._outcome: Any = None  # SERIALIZER_STATE.SUCCESS / FAILED once the thread is done
        # Set by the Raft thread when it starts a snapshot, cleared by the writer thread once
        # the state the snapshot holds is fixed (its first piece read; the whole state for a
        # state machine without pieces): while set, HardenedSyncObj applies nothing.
        self.capturing = False
        self.last_duration_s: float | None = None  # of the last successful snapshot
        self.last_capture_s: float | None = None  # of its start until the state was fixed (applying paused)
        self.failures = 0  # writes that failed (each reported FAILED, retried later)
        # Run the job on the calling (Raft) thread instead: a node ticked by hand (the
        # simulation) must stay deterministic; its result is still collected at the next check.
        self.inline = False
        # Told the snapshot's last index once its file is durable in place, on the writer
        # thread (HardenedSyncObj: the journal's prepare_compaction, so the Raft thread does
        # not copy the journal's tail when it collects the snapshot). None: nothing is told.
        self.on_durable: Callable[[int], Any] | None = None

    def serialize(self, data, id):
        if self._Serializer__pid != 0:
            return
        self._Serializer__currentID = id
        try:
            job = self._replica.snapshot_job(data[1:])  # here, on the Raft thread
        # The state machine's code: it may fail in any way, and pysyncobj's inline path too
        # reports any failure as FAILED and tries again later.
        except Exception:  # as pysyncobj's inline path: FAILED, retried later
            log.exception("cannot start a snapshot")
            self._Serializer__pid = -2
            return
        self._outcome = None
        self._Serializer__pid = _RUNNING
        self.capturing = True
        if self.inline:
            self._write(job)
            return
        try:
            if self._thread is None:
                # One thread for the node's life: every snapshot's pieces come from the same
                # malloc arena, which the next snapshot reuses (a new thread per snapshot left
                # a member's RSS ~40 MiB higher in tests/test_raft_memory.py).
                self._thread = threading.Thread(target=self._serve, name="raft-snapshot-writer", daemon=True)
                self._thread.start()
        except RuntimeError:  # no thread to be had: reported FAILED by the next check, retried later
            log.exception("cannot start the snapshot writer thread")
            self.capturing = False
            self._thread = None
            self._Serializer__pid = -2
            return
        self._idle.clear()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._write(job)  # sets _idle, then publishes its outcome, as its last acts
            except BaseException:  # any exit at all must publish FAILED: the Raft thread waits on it
                log.exception("the snapshot writer failed")
                self.capturing = False
                self._finish(SERIALIZER_STATE.FAILED)

    def stop(self) -> None:
        """End the writer thread once a running write is done (closing the node)."""
        if self._thread is not None:
            self._jobs.put(None)

    def _write(self, job) -> None:
        path = self._Serializer__fileName
        tmp = path + ".tmp"
        started = time.monotonic()

        def captured() -> None:
            if self.capturing:  # the first call: the state is fixed (a later one changes nothing)
                self.last_capture_s = time.monotonic() - started
                self.capturing = False

        try:
            job(tmp, captured)  # the file is fsynced before this returns
            atomicReplace(tmp, path)
            _fsync_directory(path)
        except Exception:  # the job is state machine code, so any type: FAILED, tried again later
            log.exception("writing the snapshot failed; the previous one stays in place")
            self.capturing = False
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.failures += 1
            self._finish(SERIALIZER_STATE.FAILED)
            return
        finally:
            self.capturing = False
        seconds = time.monotonic() - started
        self.last_duration_s = seconds
        if self.on_durable is not None:
            try:
                self.on_durable(self._Serializer__currentID)
            except Exception:  # a callback, failing in any way: the snapshot stands all the same
                log.exception("preparing the journal's compaction failed")
        freeze_long_lived()
        self._finish(SERIALIZER_STATE.SUCCESS)

    def _finish(self, outcome) -> None:
        # Idle first: the Raft thread starts the next snapshot only after it has read the
        # outcome, so a later clear of _idle can never be undone by this write.
        self._idle.set()
        self._outcome = outcome

    def checkSerializing(self):
        pid = self._Serializer__pid
        if pid == 0:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        if pid == -2:  # the job or the thread could not be started
            self._Serializer__pid = 0
            return SERIALIZER_STATE.FAILED, self._Serializer__currentID
        outcome = self._outcome
        if outcome is None:
            return SERIALIZER_STATE.SERIALIZING, self._Serializer__currentID
        self._outcome = None
        self._Serializer__pid = 0
        if outcome == SERIALIZER_STATE.SUCCESS:
            self._Serializer__transmissions = {}
        return outcome, self._Serializer__currentID

    def writing(self) -> bool:
        """Whether a write is queued or running (not merely its result uncollected)."""
        return not self._idle.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for a running write to end (True when none runs any more)."""
        return self._idle.wait(timeout_s)

    def setTransmissionData(self, data):
        if data is not None and data[2]:
            # The last chunk of a snapshot from the leader renames it into place and loads
            # it: a write of ours still running would otherwise rename an older file over it,
            # or read state the install replaces. Rare (a lagging follower snapshotting), and
            # bounded by one snapshot's write.
            self.wait()
        return super().setTransmissionData(data)


def _fsync_directory(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
