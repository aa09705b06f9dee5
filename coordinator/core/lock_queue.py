"""The FIFO lock queue's bookkeeping: each resource's waiters, in arrival order.

Owns: ``LockQueue``, which queues, renews and drops waiters (``ResourceState.waiters``, the
part a snapshot holds) and keeps what is derived from them -- the count across all resources
and the index of when each waiter's slot expires -- equal to what the resources hold; the
caps on how many may wait; the head a free lease goes to; and where one waiter stands.
Must never: decide a grant or a quota (the state machine issues the lease, checks the
waiter's quota, and keeps ``state.Usage``, whose ``remove``/``add`` bracket every change here),
read a clock (time arrives as the entry's ``now``), or do I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from coordinator.core import limits
from coordinator.core.commands import Op
from coordinator.core.expiry import WaiterExpiryIndex
from coordinator.core.outcomes import Reason, Rejected
from coordinator.core.results import LockState
from coordinator.core.state import NO_WAITERS, ResourceState, Waiter


def lock_state(res: ResourceState | None, waiter_id: bytes, now_ms: int) -> LockState:
    """Where ``waiter_id`` stands on ``res`` at ``now_ms``: granted (with token and expiry),
    queued (with its 0-based position), or neither."""
    if res is None:
        return LockState(granted=False, queued=False)
    lease = res.lease
    if lease is not None and lease.waiter_id == waiter_id and lease.expires_at_ms > now_ms:
        return LockState(
            granted=True, token=lease.token, expires_at_ms=lease.expires_at_ms, hwm=res.high_water_mark
        )
    if waiter_id in res.waiters:
        return LockState(granted=False, queued=True, position=list(res.waiters).index(waiter_id))
    return LockState(granted=False, queued=False)


class LockQueue:
    """The derived side of every resource's queue: ``total`` waiters, and their expiry index."""

    def __init__(self) -> None:
        self.total = 0  # queued lock waiters across all resources
        self._expiry = WaiterExpiryIndex()  # which queued waiters a TICK drops

    def recount(self, resources: Mapping[str, ResourceState]) -> None:
        """After the resources were replaced wholesale (a restore, a snapshot load)."""
        self.total = sum(len(res.waiters) for res in resources.values())

    def cap_refusal(
        self, resource: str, res: ResourceState | None, principal: str | None, principal_waiting: int
    ) -> Rejected | None:
        """Why one more waiter cannot be queued on ``resource``, or None (``principal_waiting``:
        how many waiters ``principal`` has queued already)."""
        queued = 0 if res is None else len(res.waiters)
        mine = 0 if principal is None else principal_waiting
        for limit, count, maximum, whose in (
            ("lock_waiters_per_resource", queued, limits.LOCK_WAITERS_PER_RESOURCE_MAX, f"{resource!r}"),
            ("lock_waiters_per_principal", mine, limits.LOCK_WAITERS_PER_PRINCIPAL_MAX, f"principal {principal!r}"),
            ("lock_waiters", self.total, limits.LOCK_WAITERS_MAX, "the cluster"),
        ):
            if count >= maximum:
                return Rejected(
                    op=Op.ENQUEUE,
                    reason=Reason.LIMIT_EXCEEDED,
                    message=f"{whose} already has {count} lock waiters queued (max {maximum})",
                    details={"limit": limit, "max": maximum},
                )
        return None

    def queue(
        self, resource: str, res: ResourceState, now: int, waiter_id: bytes, holder: str, ttl_ms: int,
        principal: str, quota: dict[str, int],
    ) -> None:
        """Queue ``waiter_id`` last on ``resource``, or renew its slot where it stands (the
        caller checked ``cap_refusal`` for a new one)."""
        expires_at_ms = now + limits.LOCK_WAITER_TTL_MS
        existing = res.waiters.get(waiter_id)
        if existing is not None:
            # Renewed in place: a dict keeps its insertion order, so the waiter keeps its turn.
            res.waiters[waiter_id] = dataclasses.replace(existing, expires_at_ms=expires_at_ms)
        else:
            if not res.waiters:
                res.waiters = {}  # the first waiter: the resource's own dict, not NO_WAITERS
            res.waiters[waiter_id] = Waiter(
                waiter_id=waiter_id, holder=holder, ttl_ms=ttl_ms,
                expires_at_ms=expires_at_ms, principal=principal, quota=quota,
            )
            self.total += 1
        self._expiry.add(expires_at_ms, resource, waiter_id)

    def drop(self, res: ResourceState, waiter_id: bytes) -> None:
        del res.waiters[waiter_id]
        if not res.waiters:
            res.waiters = NO_WAITERS
        self.total -= 1

    def clear(self, resources: Iterable[ResourceState]) -> None:
        """Drop every waiter of every resource."""
        for res in resources:
            res.waiters = NO_WAITERS
        self.total = 0

    def expired(self, resources: Mapping[str, ResourceState], now: int) -> list[tuple[str, bytes]]:
        """``(resource, waiter_id)`` of every waiter whose slot expired by ``now``, once each,
        in (expiry, resource, id) order. The caller drops them."""
        return self._expiry.expired(resources, now, self.total)

    def live_head(self, res: ResourceState, now: int) -> Waiter | None:
        """While ``res``'s lease is free (none, or expired by ``now``), its head waiter, still
        queued; head waiters whose slot expired are dropped on the way. None when the lease
        is held or nobody live waits."""
        while res.waiters and (res.lease is None or res.lease.expires_at_ms <= now):
            waiter = next(iter(res.waiters.values()))
            if waiter.expires_at_ms <= now:
                self.drop(res, waiter.waiter_id)
                continue
            return waiter
        return None
