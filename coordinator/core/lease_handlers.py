"""The lease handlers: acquire, keep-alive, release, expiry, and the lock wait queue.

Owns: ``LeaseHandlers``, the state machine's handlers for ACQUIRE, KEEP_ALIVE, RELEASE,
ENQUEUE, DEQUEUE and TICK (DESIGN §3 I1, I2, I6), and ``lock_state``, the local read a Lock
call polls for its grant. Each handler checks everything first, then changes state; the
lease grant and the quota checks they share with other families are ``machine_base``'s, the
queue's bookkeeping is ``lock_queue``'s and the expiry index is ``expiry``'s.
Must never: read a clock (``now`` is the entry's log time), let an ACQUIRE jump the lock
queue, extend a lease that has ended, or change anything when it refuses.
"""

from __future__ import annotations

import dataclasses

from coordinator.core import ops
from coordinator.core.changes import ChangeKind
from coordinator.core.commands import Op
from coordinator.core.lock_queue import lock_state
from coordinator.core.machine_base import MachineBase
from coordinator.core.outcomes import Applied, Outcome, Reason, Rejected
from coordinator.core.results import (
    AcquireResult,
    DequeueResult,
    KeepAliveResult,
    LockState,
    ReleaseResult,
    TickResult,
)
from coordinator.core.state import ResourceState


class LeaseHandlers(MachineBase):
    """Handlers of the lease ops; mixed into ``FencingStateMachine``."""

    def _acquire(self, now: int, body: ops.Acquire) -> Outcome:
        resource = body.resource
        res = self._resources.get(resource)
        lease = None if res is None else res.lease
        if res is not None and res.waiters:
            # The queue goes first (FIFO): an ACQUIRE never jumps it, not even in the moment
            # between a lease's expiry and the TICK that grants the head waiter.
            head = next(iter(res.waiters.values()))
            return Rejected(
                op=Op.ACQUIRE,
                reason=Reason.LEASE_HELD,
                message=f"{resource!r} has {len(res.waiters)} lock waiter(s) queued; {head.holder!r} is next",
                details={
                    "holder": head.holder if lease is None else lease.holder,
                    "expires_at_ms": 0 if lease is None else lease.expires_at_ms,
                    "token": 0 if lease is None else lease.token,
                    "remaining_ms": 0 if lease is None else max(0, lease.expires_at_ms - now),
                },
            )
        if lease is not None and lease.expires_at_ms > now:
            return Rejected(
                op=Op.ACQUIRE,
                reason=Reason.LEASE_HELD,
                message=(f"{resource!r} is leased to {lease.holder!r} until {lease.expires_at_ms}"),
                details={
                    "holder": lease.holder,
                    "expires_at_ms": lease.expires_at_ms,
                    "token": lease.token,
                    "remaining_ms": lease.expires_at_ms - now,
                },
            )
        principal = body.principal
        idle: list[str] = []
        if principal is not None and body.quota:
            refusal, idle = self._quota_refusal(resource, res, now, principal, body.quota)
            if refusal is not None:
                return refusal
        refusal = self._new_epoch_refusal(Op.ACQUIRE, resource, freed=len(idle))
        if refusal is not None:
            return refusal
        for name in idle:
            forgotten = self._resources.pop(name)
            if forgotten.lease is not None:  # expired by the log clock, not yet by a TICK
                self._note_lease_end(ChangeKind.EXPIRED, name, forgotten.lease)
            self._usage.remove(name, forgotten)
        if res is None:
            res = self._resources[resource] = ResourceState()
        else:
            self._usage.remove(resource, res)
        self._issue(resource, res, now, body.holder, body.ttl_ms, principal or "")
        self._usage.add(resource, res)
        return Applied(
            op=Op.ACQUIRE,
            result=AcquireResult(token=self._epoch, expires_at_ms=res.lease.expires_at_ms, hwm=res.high_water_mark),
        )

    def lock_state(self, resource: str, waiter_id: bytes, *, now_ms: int | None = None) -> LockState:
        """Where ``waiter_id`` stands on ``resource`` at ``now_ms`` (default: the log clock;
        a local read, for a Lock call waiting for its grant): granted (with token and
        expiry), queued (with its 0-based position), or neither (never queued, cancelled,
        dropped, or its lease has ended since)."""
        now_ms = self._log_clock_ms if now_ms is None else now_ms
        return lock_state(self._resources.get(resource), waiter_id, now_ms)

    def _enqueue(self, now: int, body: ops.Enqueue) -> Outcome:
        resource, waiter_id = body.resource, body.waiter_id
        res = self._resources.get(resource)
        if res is not None and res.lease is not None and res.lease.waiter_id == waiter_id:
            # Granted already (a renewal that crossed its grant, or a retry): nothing to queue.
            return Applied(op=Op.ENQUEUE, result=self.lock_state(resource, waiter_id, now_ms=now))
        existing = None if res is None else res.waiters.get(waiter_id)
        principal = body.principal
        if existing is None:
            waiting = 0 if principal is None else self._usage.waiting.get(principal, 0)
            refusal = self._queue.cap_refusal(resource, res, principal, waiting)
            if refusal is not None:
                return refusal
            if principal is not None and body.quota:
                refusal, _idle = self._quota_refusal(resource, res, now, principal, body.quota)
                if refusal is not None:
                    return dataclasses.replace(refusal, op=Op.ENQUEUE)
            refusal = self._new_epoch_refusal(Op.ENQUEUE, resource)
            if refusal is not None:
                return refusal
        if res is None:
            res = self._resources[resource] = ResourceState()
        else:
            self._usage.remove(resource, res)
        self._queue.queue(
            resource, res, now, waiter_id, body.holder, body.ttl_ms, principal or "", dict(body.quota or {})
        )
        self._advance(resource, res, now)
        self._settle(resource, res)
        return Applied(op=Op.ENQUEUE, result=self.lock_state(resource, waiter_id, now_ms=now))

    def _dequeue(self, now: int, body: ops.Dequeue) -> Outcome:
        resource, waiter_id = body.resource, body.waiter_id
        res = self._resources.get(resource)
        cancelled = released = False
        if res is not None and waiter_id in res.waiters:
            self._usage.remove(resource, res)
            self._queue.drop(res, waiter_id)
            cancelled = True
        elif res is not None and res.lease is not None and res.lease.waiter_id == waiter_id:
            # Granted while its client gave up: the client never learnt the token, so the
            # lease is ended here rather than left to block the queue for its ttl.
            self._usage.remove(resource, res)
            released = res.lease.expires_at_ms > now
            self._note_lease_end(ChangeKind.RELEASED if released else ChangeKind.EXPIRED, resource, res.lease)
            res.lease = None
        else:
            return Applied(op=Op.DEQUEUE, result=DequeueResult(cancelled=False, released=False))
        self._advance(resource, res, now)
        self._settle(resource, res)
        return Applied(op=Op.DEQUEUE, result=DequeueResult(cancelled=cancelled, released=released))

    def _keep_alive(self, now: int, body: ops.KeepAlive) -> Outcome:
        resource, token = body.resource, body.token
        res = self._fenced(Op.KEEP_ALIVE, resource, token)
        if isinstance(res, Rejected):
            return res
        lease = res.lease
        if lease is None or lease.token != token or lease.expires_at_ms <= now:
            return Rejected(
                op=Op.KEEP_ALIVE,
                reason=Reason.LEASE_EXPIRED,
                message=f"the lease with token {token} on {resource!r} has ended",
            )
        ttl_ms = lease.ttl_ms if body.ttl_ms is None else body.ttl_ms
        res.lease = dataclasses.replace(lease, ttl_ms=ttl_ms, expires_at_ms=now + ttl_ms)
        self._expiry.add(now + ttl_ms, resource)
        return Applied(op=Op.KEEP_ALIVE, result=KeepAliveResult(token=token, expires_at_ms=now + ttl_ms))

    def _release(self, now: int, body: ops.Release) -> Outcome:
        resource, token = body.resource, body.token
        res = self._fenced(Op.RELEASE, resource, token)
        if isinstance(res, Rejected):
            return res
        self._usage.remove(resource, res)  # the counts only: res itself is unchanged
        lease = res.lease
        released = False
        if lease is not None and lease.token == token:
            released = lease.expires_at_ms > now  # an expired lease had already ended
            self._note_lease_end(ChangeKind.RELEASED if released else ChangeKind.EXPIRED, resource, lease)
            res.lease = None
        self._advance(resource, res, now)  # the next waiter gets it in this entry
        self._settle(resource, res)  # no data: forgotten; the epoch fences its tokens
        return Applied(op=Op.RELEASE, result=ReleaseResult(hwm=res.high_water_mark, released=released))

    def _tick(self, now: int, body: ops.Tick) -> Outcome:
        # The index, not a scan: the leader TICKs every second, and a pass over 100,000
        # resources held the Raft thread for ~100 ms each time.
        for name, waiter_id in self._queue.expired(self._resources, now):
            res = self._resources[name]  # a queued waiter keeps its resource (_settle)
            self._usage.remove(name, res)
            self._queue.drop(res, waiter_id)  # its client stopped renewing its slot
            self._advance(name, res, now)
            self._settle(name, res)
        expired = self._expiry.expired(self._resources, now)
        for name in expired:
            res = self._resources.get(name)
            if res is None or res.lease is None or res.lease.expires_at_ms > now:
                continue  # granted anew to a waiter above
            self._usage.remove(name, res)
            self._note_lease_end(ChangeKind.EXPIRED, name, res.lease)
            res.lease = None
            self._advance(name, res, now)  # the head waiter, in this TICK
            self._settle(name, res)  # an expired lease on no data: forgotten
        self._staging.drop_if_stale(now)  # an abandoned restore's chunks: memory back
        return Applied(op=Op.TICK, result=TickResult(expired=len(expired)))
