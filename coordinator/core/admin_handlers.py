"""The admin handlers: force-release, the epoch floor, and restoring a backup in chunks.

Owns: ``AdminHandlers``, the state machine's handlers for FORCE_RELEASE (DESIGN §3 I7),
SET_EPOCH_FLOOR, SET_CLUSTER_LEVEL (commands.py "Entry levels") and the chunked restore
RESTORE_BEGIN, RESTORE_CHUNK, RESTORE_COMMIT, RESTORE_ABORT (I11),
and the swap that replaces the whole state by a backup or a snapshot
(``_install``, which ``FencingStateMachine.restore`` uses too). The staging of the chunks
is ``restore_staging``'s, the reading of a backup ``snapshot_format``'s.
Must never: issue again a token issued before (every admin path fences above the current
epoch), keep a lease or a waiter across a restore, or change anything when it refuses.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from coordinator.core import commands, limits, ops
from coordinator.core.changes import ChangeKind
from coordinator.core.commands import Op
from coordinator.core.machine_base import MachineBase
from coordinator.core.outcomes import Applied, Outcome, Reason, Rejected
from coordinator.core.results import (
    EpochResult,
    ForceReleaseResult,
    LevelResult,
    RestoreAbortResult,
    RestoreBeginResult,
    RestoreResult,
)
from coordinator.core.snapshot_format import Parts
from coordinator.core.state import NO_WAITERS, ResourceState, ResourceTable, Usage


class AdminHandlers(MachineBase):
    """Handlers of the admin ops; mixed into ``FencingStateMachine``."""

    def _force_release(self, now: int, body: ops.ForceRelease) -> Outcome:
        resource = body.resource
        refusal = self._new_epoch_refusal(Op.FORCE_RELEASE, resource)
        if refusal is not None:
            return refusal
        res = self._resources.get(resource)
        if res is None:
            res = self._resources[resource] = ResourceState()
        self._usage.remove(resource, res)
        self._epoch += 1
        res.high_water_mark = self._epoch  # the old holder's token is now stale (I7)
        if res.lease is None:
            self._note(ChangeKind.FORCE_RELEASED, resource)
        else:
            self._note_lease_end(ChangeKind.FORCE_RELEASED, resource, res.lease)
        res.lease = None
        res.fenced = True  # issued to nobody (I3), unless the next waiter is granted it below
        self._advance(resource, res, now)  # the next waiter gets it, above the fence
        # Kept even when empty: an admin's fence stays visible, and its owner's quota scan
        # forgets it once that owner needs the slot.
        self._usage.add(resource, res)
        return Applied(op=Op.FORCE_RELEASE, result=ForceReleaseResult(hwm=res.high_water_mark))

    def _set_epoch_floor(self, now: int, body: ops.SetEpochFloor) -> Outcome:
        fence_all = True if body.fence_all is None else body.fence_all
        new_epoch = max(self._epoch, body.floor)
        if fence_all:
            if new_epoch < limits.TOKEN_MAX:
                new_epoch += 1
            if new_epoch <= self._epoch:
                # The last token issued is TOKEN_MAX: no higher hwm can fence its holder.
                return Rejected(
                    op=Op.SET_EPOCH_FLOOR,
                    reason=Reason.EPOCH_EXHAUSTED,
                    message=f"cannot fence above the last token {limits.TOKEN_MAX}",
                )
        self._epoch = new_epoch
        if fence_all:
            self._resources.preserve_all()  # a snapshot being read keeps them as they were
            for name, res in self._resources.items():
                res.high_water_mark = new_epoch  # every token issued before is stale (I11)
                if res.lease is not None:
                    self._note_lease_end(ChangeKind.FORCE_RELEASED, name, res.lease)
                res.lease = None
                res.fenced = True  # issued to nobody (I3)
            # Queued waiters go too: fencing everything is a stop for every holder, and a
            # waiter granted now would hold a lease the admin meant to clear.
            self._queue.clear(self._resources.values())
            self._usage = Usage.of(self._resources)  # no leases left
        return Applied(op=Op.SET_EPOCH_FLOOR, result=EpochResult(epoch=new_epoch))

    def _floor_refusal(self, op: Op, floor: int) -> Rejected | None:
        if floor > self._epoch:
            return None
        return Rejected(
            op=op,
            reason=Reason.EPOCH_FLOOR_TOO_LOW,
            message=f"epoch_floor {floor} must exceed the current epoch {self._epoch}",
            details={"epoch": self._epoch},
        )

    def _swap_in(self, op: Op, floor: int, read: Callable[[], Parts]) -> Outcome:
        """Replace the state by the backup ``read`` returns (or refuses with ValueError),
        fenced above every token (I11).

        The floor must exceed the current epoch, so no token issued before the restore, by
        this cluster or the backup's, is ever issued again. Every restored resource gets
        hwm = the new epoch and no lease; resources absent from the backup are gone (their
        old tokens are then refused as UNKNOWN_TOKEN). The dedup table is the one before the
        restore from cluster level 4 (commands.py "Entry levels"): an op applied before the
        restore and retried after it gets its first outcome, as I5 promises, never a refusal
        of the restored state for a write that did apply (the soak's 51 FAILED_WRITE_VISIBLE).
        Below level 4 it is emptied, as every build before level 4 does, so replicas of
        different builds decide alike. The backup's own dedup entries are checked, never
        kept: they describe the history the backup came from. The log clock keeps going
        forward. A staged restore is dropped with the rest. The backup is held to the bounds
        live state keeps; anything else is a refusal.
        """
        refusal = self._floor_refusal(op, floor)
        if refusal is not None:
            return refusal
        try:
            parts = read()
        except ValueError as exc:
            return Rejected(
                op=op, reason=Reason.MALFORMED, message=f"field 'data': {exc}", details={"field": "data"}
            )
        new_epoch = max(floor, parts.epoch + 1)
        if new_epoch > limits.TOKEN_MAX:
            return Rejected(
                op=op,
                reason=Reason.EPOCH_EXHAUSTED,
                message=f"the backup's epoch {parts.epoch} leaves no token to fence it with",
            )
        for res in parts.resources.values():
            res.high_water_mark = new_epoch  # every token issued before is stale (I11)
            res.lease = None
            res.fenced = True  # issued to nobody (I3)
            res.waiters = NO_WAITERS  # waiters belong to clients of the state being replaced
        parts.epoch, parts.log_clock_ms = new_epoch, self._log_clock_ms
        parts.staged = None
        parts.cluster_level = self._cluster_level  # the members' builds did not change
        # From level 4 the dedup table stays as it is (I11, DESIGN §8); below it, it is emptied
        # as older builds do, so replicas of mixed builds apply this COMMIT alike. The backup's
        # own entries are never loaded.
        keep = self._cluster_level >= commands.LEVEL_RESTORE_KEEPS_DEDUP
        parts.dedup = collections.OrderedDict()
        self._install(parts, keep_dedup=keep)
        self._note(ChangeKind.RESET, "")
        return Applied(op=op, result=RestoreResult(epoch=new_epoch, resources=len(parts.resources)))

    def _install(self, parts: Parts, keep_dedup: bool = False) -> None:
        """Make ``parts`` the whole state, with everything derived from it recounted; with
        ``keep_dedup``, all of it but the dedup table, which stays as it is."""
        self._epoch = parts.epoch
        self._log_clock_ms = parts.log_clock_ms
        # A ResourceTable from snapshot_format; the table it replaces is no longer changed, so
        # a snapshot still reading it reads it as it started.
        self._resources = (
            parts.resources if isinstance(parts.resources, ResourceTable) else ResourceTable(parts.resources)
        )
        self._queue.recount(parts.resources)
        self._usage = Usage.of(parts.resources)
        if not keep_dedup:
            self._dedup.load(parts.dedup)
        self._staging.load(parts.staged)  # mid-restore: its chunks are read again
        self._cluster_level = parts.cluster_level
        self._keys_total = sum(len(res.data) for res in parts.resources.values())
        self._stored_bytes_total = sum(res.stored_bytes for res in parts.resources.values())

    def _set_cluster_level(self, now: int, body: ops.SetClusterLevel) -> Outcome:
        # Never lowers it: a level once reached may have been used by entries after it.
        self._cluster_level = max(self._cluster_level, body.level)
        return Applied(op=Op.SET_CLUSTER_LEVEL, result=LevelResult(level=self._cluster_level))

    # -- a backup restored in chunks ---------------------------------------------------------
    # BEGIN, CHUNK..., COMMIT are separate entries, each within the Raft entry bounds; the
    # staging itself is ``restore_staging``'s. Only one restore is staged at a time; a refusal
    # at any step changes nothing (the proposer then ABORTs). Every check depends on the
    # entries alone, so every replica stages and decides alike.

    def _restore_begin(self, now: int, body: ops.RestoreBegin) -> Outcome:
        refusal = self._staging.busy_refusal(now) or self._floor_refusal(Op.RESTORE_BEGIN, body.epoch_floor)
        if refusal is not None:
            return refusal
        self._staging.begin(now, body.restore_id, body.size, body.digest, body.epoch_floor)
        return Applied(op=Op.RESTORE_BEGIN, result=RestoreBeginResult(size=body.size))

    def _restore_chunk(self, now: int, body: ops.RestoreChunk) -> Outcome:
        return self._staging.chunk(now, body.restore_id, body.seq, body.chunk)

    def _restore_commit(self, now: int, body: ops.RestoreCommit) -> Outcome:
        staged = self._staging.complete(body.restore_id)
        if isinstance(staged, Rejected):
            return staged
        # The backup was read as its chunks were staged: what is left is the verdict, the
        # counts against this machine's limits, the fencing and the swap.
        return self._swap_in(
            Op.RESTORE_COMMIT, staged.epoch_floor, lambda: staged.reader.finish(self._bounds)
        )  # drops the staging

    def _restore_abort(self, now: int, body: ops.RestoreAbort) -> Outcome:
        return Applied(op=Op.RESTORE_ABORT, result=RestoreAbortResult(aborted=self._staging.abort(body.restore_id)))
