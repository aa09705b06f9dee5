"""Admin backups of any size the limits allow: a snapshot handed out in chunks, a restore read
in chunks and proposed through the log in chunks.

Owns: how one consistent copy becomes ``SnapshotChunk`` messages, how a ``RestoreStream`` is
read (bounded by limits.BACKUP_BYTES_MAX), how many transfers a member runs at once
(limits.BACKUP_TRANSFERS_MAX: each holds a whole backup in memory), and the proposal sequence
of one restore: check the whole backup as the state machine will, then RESTORE_BEGIN,
RESTORE_CHUNK..., RESTORE_COMMIT, and RESTORE_ABORT after any failure once BEGIN was proposed.
Must never: authorize or audit (admin.py's Admin servicer does, before calling in), decide
what a backup may hold (the state machine's ``check_backup`` does), or propose a backup as one
entry (every entry stays within the Raft bounds, so none takes the split path).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import limits, ops, requests, validation
from coordinator.core.names import ErrorMeta
from coordinator.core.results import RestoreResult, Result, expect
from coordinator.core.state_machine import Reason
from coordinator.server import errors
from coordinator.server.errors import Failure, ServiceError

log = logging.getLogger(__name__)

# The COMMIT only decides and swaps (the backup was read as its chunks applied: ~0.1 s at the
# largest backup in tests/test_backup_size.py, seconds on a loaded machine), but a timeout there
# would leave a fully staged restore in doubt (OUTCOME_UNKNOWN): its proposal may wait this
# long when the RPC's own deadline allows, where an ordinary one waits propose_timeout_max_s.
RESTORE_COMMIT_TIMEOUT_S_MAX = 120.0
# An ABORT is retried for this long: a restore usually fails because the leader changed, and
# the ABORT then finds no leader until the election ends (1-2 s, or a few back to back under
# load). Given up, the staging blocks the next restore for RESTORE_STAGING_IDLE_MS instead.
RESTORE_ABORT_RETRY_S = 10.0
# Between two ABORT attempts: a fraction of an election, so the first leader elected is used.
RESTORE_ABORT_PAUSE_S = 0.2


class Transfers:
    """At most BACKUP_TRANSFERS_MAX backups in memory on this member at once."""

    def __init__(self, transfers_max: int = limits.BACKUP_TRANSFERS_MAX) -> None:
        self._slots = threading.BoundedSemaphore(transfers_max)
        self._max = transfers_max

    def enter(self) -> None:
        if not self._slots.acquire(blocking=False):
            raise ServiceError(
                Failure.OVERLOADED,
                f"this member already runs {self._max} backup transfers (snapshots or restores); retry later",
            )

    def leave(self) -> None:
        self._slots.release()


def unary_snapshot_refusal(size: int) -> ServiceError | None:
    """Why a snapshot of ``size`` bytes cannot go out as one Admin.Snapshot reply, or None."""
    if size <= limits.RESTORE_SNAPSHOT_BYTES_MAX:
        return None
    return ServiceError(
        Reason.LIMIT_EXCEEDED,
        f"the snapshot is {size} bytes, more than one Admin.Snapshot message carries"
        f" ({limits.RESTORE_SNAPSHOT_BYTES_MAX}); use Admin.SnapshotStream"
        " (FencingClient.snapshot, fencingctl admin snapshot)",
        {ErrorMeta.LIMIT: "unary_snapshot_bytes", ErrorMeta.MAX: limits.RESTORE_SNAPSHOT_BYTES_MAX},
    )


class SnapshotChunks:
    """The ``SnapshotChunk`` messages of one copy; ``header`` is the first one's (for the audit)."""

    def __init__(self, header: pb.ResponseHeader, data: bytes, epoch: int, index: int) -> None:
        self.header = header
        self._data = data
        self._epoch = epoch
        self._index = index
        self._offset = 0
        self._first = True

    def __iter__(self) -> Iterator[pb.SnapshotChunk]:
        return self

    def __next__(self) -> pb.SnapshotChunk:
        if not self._first and self._offset >= len(self._data):
            raise StopIteration
        piece = self._data[self._offset : self._offset + limits.BACKUP_CHUNK_BYTES]
        self._offset += len(piece)
        if not self._first:
            return pb.SnapshotChunk(data=piece)
        self._first = False
        return pb.SnapshotChunk(
            header=self.header, data=piece, epoch=self._epoch, index=self._index,
            size=len(self._data), sha256=hashlib.sha256(self._data).digest(),
        )


class ReceivedBackup:
    """A RestoreStream's messages read whole: the first one's epoch floor, every one's bytes.
    Stands in for the request in the audit line (``audit_args``)."""

    def __init__(self, messages: Iterable[pb.RestoreStreamRequest]) -> None:
        self._messages = messages
        self.epoch_floor: int | None = None
        self.data_bytes = 0

    def audit_args(self) -> dict[str, Any]:
        return {"epoch_floor": self.epoch_floor, "data_bytes": self.data_bytes}

    def read(self) -> tuple[bytes, int]:
        """(the backup, the epoch floor), each checked; INVALID_ARGUMENT naming the field."""
        data = bytearray()
        for number, message in enumerate(self._messages):
            if number == 0:
                self.epoch_floor = message.epoch_floor
            elif message.epoch_floor:
                raise errors.invalid("epoch_floor", "field 'epoch_floor': only the first message carries it")
            # Refused as soon as the stream passes the bound, before it is buffered further.
            if len(data) + len(message.data) > limits.BACKUP_BYTES_MAX:
                raise errors.invalid(
                    "data", f"field 'data': the backup is more than {limits.BACKUP_BYTES_MAX} bytes"
                )
            data += message.data
            self.data_bytes = len(data)
        try:
            floor = requests.check_request("RestoreStream", {"epoch_floor": self.epoch_floor})["epoch_floor"]
            return validation.check_backup_data(bytes(data)), floor
        except validation.InvalidField as exc:
            raise errors.invalid(exc.field, str(exc)) from None


Run = Callable[..., tuple[Result, int]]


def restore(run: Run, check_backup: Callable[[bytes], None], data: bytes, epoch_floor: int,
            commit_timeout_s: float) -> tuple[RestoreResult, int]:
    """Propose the restore of ``data`` in chunks through ``run`` (``Core.run`` bound to the
    call); (the COMMIT's result, its index) or ServiceError, with nothing restored (and the
    staging aborted, retried through an election)."""
    try:
        # The state machine's own checks, before anything is proposed: a backup that would
        # be refused never enters the log (DESIGN §8).
        check_backup(data)
    except ValueError as exc:
        raise errors.invalid("data", f"field 'data': {exc}") from None
    restore_id = os.urandom(limits.RESTORE_ID_BYTES)
    run(ops.RestoreBegin(
        restore_id=restore_id, size=len(data), digest=hashlib.sha256(data).digest(), epoch_floor=epoch_floor,
    ))
    try:
        view = memoryview(data)
        for seq, offset in enumerate(range(0, len(data), limits.BACKUP_CHUNK_BYTES)):
            chunk = bytes(view[offset : offset + limits.BACKUP_CHUNK_BYTES])
            run(ops.RestoreChunk(restore_id=restore_id, seq=seq, chunk=chunk),
                max_bytes=limits.RESTORE_CHUNK_COMMAND_BYTES_MAX)
        result, index = run(ops.RestoreCommit(restore_id=restore_id), timeout_s=commit_timeout_s)
        return expect(RestoreResult, result), index
    except ServiceError:
        _abort(run, restore_id)
        raise


def _abort(run: Run, restore_id: bytes, *, retry_s: float = RESTORE_ABORT_RETRY_S,
           pause_s: float = RESTORE_ABORT_PAUSE_S) -> None:
    """Drop what this restore staged, so the next one need not wait for it to go stale. An
    ABORT is never refused and changes nothing when repeated, so it is retried for
    ``retry_s``; given up, the staging goes stale (RESTORE_STAGING_IDLE_MS) on its own."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            run(ops.RestoreAbort(restore_id=restore_id))
            return
        except ServiceError as exc:
            if time.monotonic() + pause_s >= deadline:
                log.warning("could not abort restore %s: %s", restore_id.hex(), exc)
                return
        # Waits out the election that usually failed the restore; no leader to poll for here.
        time.sleep(pause_s)
