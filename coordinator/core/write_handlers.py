"""The data handlers: the fenced write and delete, and the read barrier.

Owns: ``WriteHandlers``, the state machine's handlers for WRITE, DELETE (DESIGN §3 I3, I4,
I7) and READ_BARRIER (I9), ``read``, and the limits a write is held to: keys per resource,
the cluster-wide keys and bytes (which bound the largest snapshot), the highest revision, and
the owner's stored-bytes quota (DESIGN §8).
Must never: apply a write or delete whose token is not the resource's hwm, let state grow past
a limit, or change anything, not even the revision, when it refuses.
"""

from __future__ import annotations

from coordinator.core import limits, listing, ops
from coordinator.core.changes import ChangeKind
from coordinator.core.commands import Op
from coordinator.core.machine_base import MachineBase
from coordinator.core.outcomes import Applied, Outcome, Reason, Rejected
from coordinator.core.results import DeleteResult, LeaseView, ReadResult, WriteResult
from coordinator.core.state import ResourceState, entry_bytes, shared


def _revision_refusal(op: Op, resource: str, res: ResourceState) -> Rejected | None:
    """Why ``res`` cannot take one more write or delete, or None. Only a restored backup can
    bring a revision this high; refusing here keeps live state within the bounds its own
    snapshot is read back with (``snapshot_format.parse_snapshot``)."""
    if res.revision < limits.REVISION_MAX:
        return None
    return Rejected(
        op=op,
        reason=Reason.LIMIT_EXCEEDED,
        message=f"{resource!r} is at revision {limits.REVISION_MAX}, the highest a version may have",
        details={"limit": "revision", "max": limits.REVISION_MAX},
    )


class WriteHandlers(MachineBase):
    """Handlers of the data ops; mixed into ``FencingStateMachine``."""

    def read(self, resource: str, key: str) -> tuple[bytes | None, int]:
        """``(value, version)`` of ``key``; ``(None, 0)`` if absent."""
        res = self._resources.peek(resource)
        if res is None or key not in res.data:
            return None, 0
        return res.data[key]

    def _write(self, now: int, body: ops.Write) -> Outcome:
        resource, key = body.resource, body.key
        res = self._fenced(Op.WRITE, resource, body.token)
        if isinstance(res, Rejected):
            return res
        current = res.data.get(key)
        current_version = 0 if current is None else current[1]
        expected = body.expected_version
        if expected is not None and expected != current_version:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.VERSION_MISMATCH,
                message=f"{key!r} is at version {current_version}, not {expected}",
                details={"version": current_version},
            )
        refusal = _revision_refusal(Op.WRITE, resource, res)
        if refusal is not None:
            return refusal
        if current is None and len(res.data) >= self._keys_per_resource_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=f"{resource!r} already holds {self._keys_per_resource_max} keys",
                details={"limit": "keys_per_resource", "max": self._keys_per_resource_max},
            )
        value = body.value
        grows_by = entry_bytes(key, value) - (0 if current is None else entry_bytes(key, current[0]))
        refusal = self._state_size_refusal(resource, current is None, grows_by)
        if refusal is not None:
            return refusal
        stored_bytes_max = None if body.quota is None else body.quota.get("stored_bytes")
        if stored_bytes_max is not None and res.owner and grows_by > 0:
            # The bytes are the owner's (the principal of the last acquire): a writer is
            # normally that owner, as only the last acquire's token writes.
            total = self._usage.stored_bytes.get(res.owner, 0) + grows_by
            if total > stored_bytes_max:
                return self._quota_rejected(Op.WRITE, res.owner, "stored_bytes", stored_bytes_max, total)
        self._usage.remove(resource, res)
        res.revision += 1
        res.data[shared(key)] = (value, res.revision)
        res.stored_bytes += grows_by
        self._keys_total += current is None
        self._stored_bytes_total += grows_by
        self._usage.add(resource, res)
        self._note(ChangeKind.WRITTEN, resource, key=key, value=value, version=res.revision, token=body.token)
        return Applied(op=Op.WRITE, result=WriteResult(version=res.revision, hwm=res.high_water_mark))

    def _delete(self, now: int, body: ops.Delete) -> Outcome:
        resource, key = body.resource, body.key
        res = self._fenced(Op.DELETE, resource, body.token)
        if isinstance(res, Rejected):
            return res
        expected = body.expected_version  # entry level 2: a conditional delete
        current_version = res.data[key][1] if key in res.data else 0
        if expected is not None and expected != current_version:
            return Rejected(
                op=Op.DELETE,
                reason=Reason.VERSION_MISMATCH,
                message=f"{key!r} is at version {current_version}, not {expected}",
                details={"version": current_version},
            )
        if key not in res.data:
            return Applied(op=Op.DELETE, result=DeleteResult(version=0, deleted=False))
        refusal = _revision_refusal(Op.DELETE, resource, res)
        if refusal is not None:
            return refusal
        self._usage.remove(resource, res)
        res.revision += 1
        freed = entry_bytes(key, res.data.pop(key)[0])
        res.stored_bytes -= freed
        self._keys_total -= 1
        self._stored_bytes_total -= freed
        self._note(ChangeKind.DELETED, resource, key=key, version=res.revision, token=body.token)
        self._settle(resource, res)  # the last key of a released resource: forgotten
        return Applied(op=Op.DELETE, result=DeleteResult(version=res.revision, deleted=True))

    def _read_barrier(self, now: int, body: ops.ReadBarrier) -> Outcome:
        if body.prefixes is not None and body.limit is not None:  # a List page (ops.ReadBarrier:
            # then no resource or key, and both or neither of prefixes and limit)
            return Applied(op=Op.READ_BARRIER, result=listing.page(
                self._resources, now, body.prefixes, body.limit, body.after))
        resource = body.resource
        if resource is None:
            return Applied(op=Op.READ_BARRIER, result=ReadResult(epoch=self._epoch, log_clock_ms=now))
        res = self._resources.get(resource)
        lease = None if res is None else res.lease
        key = body.key
        value, version = (None, None) if key is None else self.read(resource, key)
        return Applied(op=Op.READ_BARRIER, result=ReadResult(
            epoch=self._epoch,
            log_clock_ms=now,
            hwm=0 if res is None else res.high_water_mark,
            lease=(
                None
                if lease is None or lease.expires_at_ms <= now
                else LeaseView(holder=lease.holder, token=lease.token, expires_at_ms=lease.expires_at_ms)
            ),
            waiters=len(res.waiters) if res is not None and res.waiters else None,  # absent when none
            version=version,
            value=value,
        ))

    def _state_size_refusal(self, resource: str, new_key: bool, grows_by: int) -> Rejected | None:
        """Why a write adding ``grows_by`` bytes (and a key, if ``new_key``) would take the
        cluster past STATE_KEYS_MAX or STATE_STORED_BYTES_MAX, or None. These bound the
        largest state, and so the largest snapshot (limits.BACKUP_BYTES_MAX)."""
        if new_key and self._keys_total >= self._state_keys_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=f"the cluster already stores {self._state_keys_max} keys; {resource!r} cannot add one",
                details={"limit": "state_keys", "max": self._state_keys_max},
            )
        if grows_by > 0 and self._stored_bytes_total + grows_by > self._state_stored_bytes_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=(
                    f"the cluster stores {self._stored_bytes_total} bytes of keys and values; this"
                    f" write would take it past {self._state_stored_bytes_max}"
                ),
                details={"limit": "state_stored_bytes", "max": self._state_stored_bytes_max},
            )
        return None
