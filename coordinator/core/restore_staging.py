"""The backup being restored in chunks: RESTORE_BEGIN, RESTORE_CHUNK..., then COMMIT or ABORT.

Owns: ``RestoreStaging``, which holds the one ``state.StagedRestore`` at a time (or none) and
decides what staging alone can: whether a BEGIN may replace it (one at a time; an abandoned
one goes RESTORE_STAGING_IDLE_MS after its last chunk), whether a CHUNK is the next in order
and fits the declared size, whether a COMMIT's staged bytes are all there with the declared
sha256, and whether an ABORT names it. The backup is read and hashed as its chunks arrive.
Must never: read a clock (time arrives as the entry's ``now``), do I/O, or touch the rest of the
state: the epoch floor check, the fencing and the swap of the whole state on COMMIT are the
state machine's (``admin_handlers._swap_in``). A refusal changes nothing here either.
"""

from __future__ import annotations

from coordinator.core import limits
from coordinator.core.commands import Op
from coordinator.core.outcomes import Applied, Outcome, Reason, Rejected
from coordinator.core.results import RestoreChunkResult
from coordinator.core.snapshot_format import SnapshotReader
from coordinator.core.state import StagedRestore


def _reader(size: int) -> SnapshotReader:
    # The backup's dedup entries are checked, not kept: the COMMIT keeps the live table or
    # empties it (_swap_in), never loads the backup's.
    return SnapshotReader(size, keep_dedup=False)


class RestoreStaging:
    """The staged restore, if any (``staged``: part of the snapshot, so every replica and every
    member that loads a snapshot mid-restore stages the same bytes)."""

    def __init__(self) -> None:
        self.staged: StagedRestore | None = None

    def load(self, staged: StagedRestore | None) -> None:
        """Hold ``staged`` (from a snapshot, or None): its chunks are read again, as when staged."""
        self.staged = staged
        if staged is not None:
            staged.start_reading(_reader(staged.size))

    def is_stale(self, now: int) -> bool:
        staged = self.staged
        return staged is not None and now - staged.touched_at_ms >= limits.RESTORE_STAGING_IDLE_MS

    def drop_if_stale(self, now: int) -> None:
        if self.is_stale(now):
            self.staged = None  # an abandoned restore's chunks: memory back

    def busy_refusal(self, now: int) -> Rejected | None:
        """Why a RESTORE_BEGIN cannot start a restore now, or None."""
        if self.staged is None or self.is_stale(now):
            return None
        return Rejected(
            op=Op.RESTORE_BEGIN,
            reason=Reason.LIMIT_EXCEEDED,
            message=(
                f"restore {self.staged.restore_id.hex()} is being staged; one restore at a time"
                f" (an abandoned one is replaced {limits.RESTORE_STAGING_IDLE_MS} ms after its last chunk)"
            ),
            details={"limit": "restores_staged", "max": 1},
        )

    def begin(self, now: int, restore_id: bytes, size: int, digest: bytes, epoch_floor: int) -> None:
        """Stage a new restore (the caller checked ``busy_refusal`` and the epoch floor)."""
        self.staged = StagedRestore(
            restore_id=restore_id, size=size, digest=digest, epoch_floor=epoch_floor, touched_at_ms=now
        )
        self.staged.start_reading(_reader(size))

    def _refusal(self, op: Op, restore_id: bytes) -> Rejected | None:
        if self.staged is not None and self.staged.restore_id == restore_id:
            return None
        return Rejected(
            op=op,
            reason=Reason.MALFORMED,
            message=(
                f"field 'restore_id': restore {restore_id.hex()} is not the one staged"
                " (no RESTORE_BEGIN, or replaced)"
            ),
            details={"field": "restore_id"},
        )

    def chunk(self, now: int, restore_id: bytes, seq: int, chunk: bytes) -> Outcome:
        """Stage chunk ``seq`` of ``restore_id``, or refuse it changing nothing."""
        refusal = self._refusal(Op.RESTORE_CHUNK, restore_id)
        if refusal is not None:
            return refusal
        staged = self.staged
        assert staged is not None
        if seq != len(staged.chunks):
            return Rejected(
                op=Op.RESTORE_CHUNK,
                reason=Reason.MALFORMED,
                message=f"field 'seq': chunk {seq} is out of order (chunk {len(staged.chunks)} is next)",
                details={"field": "seq"},
            )
        if staged.staged_bytes + len(chunk) > staged.size:
            return Rejected(
                op=Op.RESTORE_CHUNK,
                reason=Reason.MALFORMED,
                message=(
                    f"field 'chunk': {staged.staged_bytes} + {len(chunk)} bytes staged would exceed"
                    f" the declared size {staged.size}"
                ),
                details={"field": "chunk"},
            )
        staged.stage(chunk)  # read and hashed as it is staged: the COMMIT does neither
        staged.touched_at_ms = now
        return Applied(op=Op.RESTORE_CHUNK, result=RestoreChunkResult(staged_bytes=staged.staged_bytes))

    def complete(self, restore_id: bytes) -> StagedRestore | Rejected:
        """The staged restore ``restore_id`` if all its bytes are staged with the declared
        sha256 (for the COMMIT to swap in), else the refusal. Changes nothing either way."""
        refusal = self._refusal(Op.RESTORE_COMMIT, restore_id)
        if refusal is not None:
            return refusal
        staged = self.staged
        assert staged is not None
        if staged.staged_bytes != staged.size:
            return Rejected(
                op=Op.RESTORE_COMMIT,
                reason=Reason.MALFORMED,
                message=f"field 'size': {staged.staged_bytes} bytes staged, {staged.size} declared",
                details={"field": "size"},
            )
        if staged.hasher.digest() != staged.digest:
            return Rejected(
                op=Op.RESTORE_COMMIT,
                reason=Reason.MALFORMED,
                message="field 'digest': the staged bytes do not have the declared sha256",
                details={"field": "digest"},
            )
        return staged

    def abort(self, restore_id: bytes) -> bool:
        """Drop the staged restore if it is ``restore_id``; whether it was. Never refused: a
        proposer aborts after any failure, not knowing how far it got."""
        aborted = self.staged is not None and self.staged.restore_id == restore_id
        if aborted:
            self.staged = None
        return aborted
