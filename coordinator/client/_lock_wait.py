"""The bookkeeping of one ``lock()`` wait, shared by the sync and asyncio clients.

Owns: ``LockStep`` (what one Lock call answered) and ``LockWait`` (the waiter's id, the
deadline, which Lock call to make next, how long to pause after an answer, whether a failed
call ends the wait, and the budget of the CancelLock that leaves the queue).
Must never: block, sleep or do I/O (the client's loop does), or let a bounded wait run past
its timeout plus one attempt timeout.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import results
from coordinator.client._calls import Call
from coordinator.client._requests import default_holder, new_op_id
from coordinator.client.exceptions import FencingError, LockTimeout, NotApplied, OutcomeUnknown
from coordinator.client.results import AcquireResult
from coordinator.core import limits

if TYPE_CHECKING:
    from coordinator.client._base import _ClientBase


@dataclasses.dataclass(frozen=True)
class LockStep:
    """What one Lock call answered: the grant, or whether the waiter is still queued."""

    acquired: AcquireResult | None
    queued: bool
    position: int

    @classmethod
    def of(cls, r: pb.LockResponse, *, resource: str, holder: str, waiter_id: bytes) -> LockStep:
        acquired = None
        if r.granted:
            acquired = AcquireResult(
                resource=resource, holder=holder, token=r.token, lease_id=r.lease_id or r.token,
                expires_at_ms=r.expires_at_ms, op_id=waiter_id, header=results.header_from_pb(r.header),
                token_proof=r.token_proof,
            )
        return cls(acquired=acquired, queued=r.queued, position=r.position)


# A Lock call the server answered without waiting (its waiter gate was full) is repeated after
# this pause, not at once: each call is a Raft entry, and the gate frees as grants come.
LOCK_BUSY_PAUSE_S = 0.5


class LockWait:
    """The bookkeeping of one ``lock()``, shared by the sync and asyncio loops: the waiter's
    id, the deadline, which call to make next, how long to pause after an answer, and whether
    a failed call ends the wait.

    A bounded wait (``timeout_s``) ends within timeout_s plus one attempt timeout, whatever
    the cluster does: each Lock call gets only what is left of the wait plus one attempt
    timeout (not the client's whole-call timeout) and starts no retry once the wait is over;
    a call that fails for want of a cluster (unavailable, no leader, overloaded, outcome
    unknown: repeating a Lock is harmless) is made again while the wait lasts and ends it
    with LockTimeout once it is over; leaving the queue afterwards gets only what is left of
    that same bound, and is skipped when no call can have reached the queue."""

    def __init__(self, client: _ClientBase, resource: str, *, ttl_ms: int, holder: str | None,
                 timeout_s: float | None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive (or None: no deadline), got {timeout_s!r}")
        self.client = client
        self.resource = resource
        self.ttl_ms = ttl_ms
        self.holder = default_holder() if holder is None else holder
        self.timeout_s = timeout_s
        self.waiter_id = new_op_id()
        now = time.monotonic()
        self.started = now
        self.deadline = None if timeout_s is None else now + timeout_s
        # The whole lock() ends by here: the wait, then at most one attempt's time.
        self.end = None if self.deadline is None else self.deadline + client._attempt_timeout_s
        # Send time of the call before the last one: the grant applied after that call was
        # answered "queued", so this bounds the lease's start from below (LeaseBase._renewed_at).
        self.granted_after = now
        self._sent_at = now
        self._wait_s = 0.0
        self.calls = 0  # Lock calls made (each may have made several attempts)
        # Whether a Lock call may have put this waiter in the queue: only then is there
        # anything for CancelLock to take out. A call that failed NotApplied (every attempt
        # surely unapplied: no connection, no leader) did not.
        self.maybe_queued = False
        self._maybe_queued_before = False
        self.last_error: FencingError | None = None
        # Set by a client's close() that has taken (or tried to take) this waiter out of the
        # queue: the lock() loop makes no further call and ends with RuntimeError.
        self.abandoned = False

    def next_call(self) -> Call | None:
        """The next Lock call, or None once the deadline has passed."""
        now = time.monotonic()
        left_ms = limits.LOCK_WAIT_MS_MAX if self.deadline is None else int((self.deadline - now) * 1000)
        if left_ms <= 0:
            return None
        wait_ms = min(left_ms, limits.LOCK_WAIT_MS_MAX)
        budget_s = None
        if self.end is not None:
            # The call's own deadline (budget + its wait) falls at self.end, never later.
            budget_s = min(self.client._timeout_s, self.end - now - wait_ms / 1000)
        self.granted_after, self._sent_at, self._wait_s = self._sent_at, now, wait_ms / 1000
        self.calls += 1
        self._maybe_queued_before, self.maybe_queued = self.maybe_queued, True
        return self.client._lock_call(
            self.resource, ttl_ms=self.ttl_ms, holder=self.holder, waiter_id=self.waiter_id, wait_ms=wait_ms,
            timeout_s=budget_s, start_by=self.deadline,
        )

    def after_failure(self, error: BaseException) -> float:
        """A Lock call raised ``error``: the pause before the next call, or raises what ends
        lock() (``error`` itself, or LockTimeout once a bounded wait is over)."""
        if isinstance(error, NotApplied):
            self.maybe_queued = self._maybe_queued_before
        if not isinstance(error, (NotApplied, OutcomeUnknown)) or self.deadline is None:
            raise error  # a refusal, a bad argument, or an unbounded wait: as any call would
        self.last_error = error
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timed_out() from error
        # Each call already retried with backoff; a short pause keeps a dead cluster from
        # being asked in a tight loop for the rest of the wait.
        return min(LOCK_BUSY_PAUSE_S, left)

    def cancel_timeout_s(self) -> float | None:
        """The budget of the CancelLock that leaves the queue: an attempt timeout, cut to what
        is left of a bounded lock()'s end; None: no time is left (its slot expires by itself,
        within limits.LOCK_WAITER_TTL_MS), or no call ever reached the queue."""
        if not self.maybe_queued:
            return None
        if self.end is None:
            return self.client._attempt_timeout_s
        left = min(self.client._attempt_timeout_s, self.end - time.monotonic())
        return left if left > 0.05 else None

    def pause_s(self, step: LockStep) -> float:
        """After a call that was not granted: how long to pause before the next one."""
        if not step.queued:
            # Dropped (its slot expired while this client was away, or an admin fenced every
            # resource): queue again, at the tail, under a new id.
            self.client._log.info("lock waiter on %s left the queue; queueing again", self.resource)
            self.waiter_id = new_op_id()
            return 0.0
        if time.monotonic() - self._sent_at < self._wait_s / 2:
            left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            return LOCK_BUSY_PAUSE_S if left is None else min(LOCK_BUSY_PAUSE_S, left)
        return 0.0

    def timed_out(self) -> LockTimeout:
        elapsed_s = time.monotonic() - self.started
        message = (
            f"{self.resource} was not granted within {self.timeout_s:g} s "
            f"({self.calls} Lock call(s) in {elapsed_s:.1f} s"
        )
        if self.last_error is not None:
            message += f"; last: {type(self.last_error).__name__}: {self.last_error}"
        return LockTimeout(
            message + ")", request={"rpc": "lock", "resource": self.resource, "timeout_s": self.timeout_s}
        )
