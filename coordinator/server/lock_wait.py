"""Waiting for a lock: the Acquire that waits in line and the Lock call, server-side.

Owns: ``LockWaits``, the one wait workflow of both RPCs over a resource's FIFO lock queue
(the state machine's): the ENQUEUE that puts a waiter in line, the wait with no entry of its
own until the entry that grants it applies on this member (or its time, or the call, ends),
the DEQUEUE and last try of an Acquire that was not granted in time, how long each may wait
(``ACQUIRE_WAIT_MS_MAX``, ``LOCK_WAIT_MS_MAX``, the RPC's deadline less the proposer's
margin), and the waiter gate's slot each wait holds (streams.py: a waiting call holds a
worker thread, so the gate caps how many wait at once).
Must never: grant a lease itself (only an applied entry does), wait without a slot of the
waiter gate, outlive its call (a cancelled call frees its thread at once), or answer a
waiting Acquire otherwise than wait_ms 0 would have when it cannot wait (LEASE_HELD, saying
why it did not wait).
"""

from __future__ import annotations

import threading
import time

from coordinator.core import limits, ops
from coordinator.core.names import ErrorMeta
from coordinator.core.results import AcquireResult, LockState, expect
from coordinator.core.state_machine import Reason
from coordinator.server import request_core
from coordinator.server.auth import Principal
from coordinator.server.errors import ServiceError
from coordinator.server.proposer import PROPOSE_TIMEOUT_S_MIN
from coordinator.server.request_core import Core
from coordinator.server.streams import SlotGate, caller_key


def _acquired(state: LockState) -> AcquireResult:
    """A queue grant, answered as the Acquire it stands for: the lease it holds."""
    assert state.token is not None and state.expires_at_ms is not None and state.hwm is not None, state
    return AcquireResult(token=state.token, expires_at_ms=state.expires_at_ms, hwm=state.hwm)


class LockWaits:
    """Acquires and Lock calls that wait for a grant on this member."""

    def __init__(self, core: Core, waiters: SlotGate) -> None:
        self.core = core
        self.waiters = waiters  # caps Acquires and Lock calls waiting at once (each holds a worker thread)

    def acquire_in_line(
        self, command: ops.Acquire, held: ServiceError, wait_ms: int, started: float, context,
        caller: Principal | None,
    ) -> tuple[AcquireResult, int]:
        """After a LEASE_HELD try: the grant this Acquire gets by waiting in the resource's
        FIFO queue (the same queue as Lock's) for up to min(wait_ms, ACQUIRE_WAIT_MS_MAX), or
        ``held`` -- or the refusal of one last try -- when it does not.

        Entries: one ENQUEUE (its op_id is its waiter id), then none while it waits -- the
        RELEASE, FORCE_RELEASE or TICK that grants it wakes it -- and, if the wait ends
        ungranted, one DEQUEUE and one last ACQUIRE: O(1) whatever wait_ms is. The wait needs
        a slot of the waiter gate (acquire_waiters_max and its per-caller cap); without one
        the answer is ``held``, as if wait_ms were 0, and nothing is queued.
        """
        resource, waiter_id = command.resource, command.op_id
        node = self.core.node
        # A retry of an Acquire that was granted through the queue but whose answer was lost:
        # the lease names its op_id. (The refused try applied on this member, so this local
        # read is at least as new as that entry.) A queue grant enters no dedup entry, so
        # once that lease has ended a retry is a new Acquire.
        mine: LockState = node.read(lambda sm: sm.lock_state(resource, waiter_id))
        if mine.granted:
            return _acquired(mine), 0
        wait_s = self._acquire_wait_s(wait_ms, started, context)
        if wait_s <= 0:
            raise held
        who = caller_key(None if caller is None else caller.name, context.peer())
        self._take_waiter_slot(held, who)
        try:
            fields = {"resource": resource, "holder": command.holder, "ttl_ms": command.ttl_ms, "waiter_id": waiter_id}
            try:
                result, index = self.core.run(request_core.body(ops.Enqueue, fields, caller), context, caller)
            except ServiceError as refused:
                if not isinstance(refused.key, Reason):
                    raise  # no leader, overloaded, unknown outcome: the client retries with this op_id
                # A full queue or the caller's quota: waiting is a convenience, the answer is
                # the one wait_ms 0 would have had, saying why it did not wait.
                raise ServiceError(held.key, f"{held.message} (not waiting: {refused.message})",
                                   held.metadata, index=held.index) from None
            state = expect(LockState, result)
            if state.queued:
                state = self._wait_for_grant(resource, waiter_id, self._acquire_wait_s(wait_ms, started, context),
                                             context)
                index = 0  # as of this member's applied index now
            if state.granted:
                return _acquired(state), index
        finally:
            self.waiters.give_back(who)
        # Not granted in time (or the caller went away): leave the line. A grant that lands
        # between the look above and this DEQUEUE is ended by the DEQUEUE itself (its lease is
        # released and the next waiter granted in the same entry) rather than returned: its
        # token was never sent, and the last try below answers for the resource as it is now.
        self.core.run(ops.Dequeue(resource=resource, waiter_id=waiter_id), context, caller)
        if not context.is_active():
            raise held  # nobody to answer; the queue is left, which is what mattered
        # One last try, so the LEASE_HELD this answers with is the state's now (holder and
        # expiry), and a lease that came free as the wait ended is granted, as before.
        result, index = self.core.run(command, context, caller)
        return expect(AcquireResult, result), index

    def _acquire_wait_s(self, wait_ms: int, started: float, context) -> float:
        """How long an Acquire that started at ``started`` may still wait: min(wait_ms,
        ACQUIRE_WAIT_MS_MAX) from its start, leaving the proposer's margin and room for the
        DEQUEUE and last try before the RPC's deadline."""
        left = started + min(wait_ms, limits.ACQUIRE_WAIT_MS_MAX) / 1000 - time.monotonic()
        rpc_left = context.time_remaining()
        if rpc_left is not None:
            left = min(left, rpc_left - self.core.proposer.deadline_margin_s - 2 * PROPOSE_TIMEOUT_S_MIN)
        return left if context.is_active() else 0.0

    def _wait_for_grant(self, resource: str, waiter_id: bytes, wait_s: float, context) -> LockState:
        """Wait, with no entry of its own, until ``waiter_id`` is no longer queued on
        ``resource`` (granted, cancelled or dropped), ``wait_s`` passes or the call ends (the
        client cancelled it or went away: the thread and waiter slot are freed at once, not
        after the rest of the wait); then its ``lock_state``."""
        node = self.core.node
        ended = threading.Event()

        def on_end() -> None:
            ended.set()
            node.wake_waiters()

        if context.add_callback(on_end):  # False: the call has ended already
            node.wait_applied(
                lambda sm: ended.is_set() or not sm.lock_state(resource, waiter_id).queued, wait_s
            )
        state: LockState = node.read(lambda sm: sm.lock_state(resource, waiter_id))
        return state

    def _take_waiter_slot(self, held: ServiceError, who: str) -> None:
        """Take a waiter slot for ``who``, or raise ``held`` (LEASE_HELD, as with wait_ms 0)
        saying which cap kept this Acquire from waiting."""
        try:
            self.waiters.take(who)
        except ServiceError as full:
            limit = full.metadata.get(ErrorMeta.LIMIT, "")
            raise ServiceError(held.key, f"{held.message} (not waiting: {full.message}, limit {limit})",
                               held.metadata, index=held.index) from None

    def lock(self, command: ops.Enqueue, wait_ms: int, context, caller: Principal | None) -> tuple[LockState, int]:
        """A Lock call's answer: the state of its waiter (granted, or queued and where), and
        the index it is as of (0: this member's applied index now).

        One ENQUEUE entry per call (it queues the waiter, or renews its slot), then a wait
        for the entry that grants it -- a RELEASE, FORCE_RELEASE or TICK applied here wakes
        it -- with no entry of its own. The wait takes a slot of the same gate as a waiting
        Acquire (acquire_waiters_max and its per-caller cap: each holds a worker thread);
        past a cap, or with wait_ms 0, the answer is the ENQUEUE's at once and the client
        calls again. A cancelled call ends its wait at once but leaves the waiter queued:
        the client's next Lock call (after a reconnect, say) keeps its place, and its
        CancelLock or the waiter's slot expiry (LOCK_WAITER_TTL_MS) takes it out."""
        resource, waiter_id = command.resource, command.waiter_id
        enqueued, index = self.core.run(command, context, caller)
        result = expect(LockState, enqueued)
        wait_s = self._lock_wait_s(wait_ms, context)
        if not result.granted and result.queued and wait_s > 0:
            who = caller_key(None if caller is None else caller.name, context.peer())
            try:
                self.waiters.take(who)
            except ServiceError:
                pass  # not waiting: the client's next call renews the slot and tries again
            else:
                try:
                    result = self._wait_for_grant(resource, waiter_id, wait_s, context)
                    index = 0  # the answer is as of this member's applied index now
                finally:
                    self.waiters.give_back(who)
        return result, index

    def _lock_wait_s(self, wait_ms: int, context) -> float:
        """How long a Lock call may wait for its grant: its wait_ms, at most LOCK_WAIT_MS_MAX,
        and leaving the proposer's margin before the RPC's deadline."""
        wait_s = min(wait_ms, limits.LOCK_WAIT_MS_MAX) / 1000
        rpc_left = context.time_remaining()
        if rpc_left is not None:
            wait_s = min(wait_s, rpc_left - self.core.proposer.deadline_margin_s)
        return wait_s if context.is_active() else 0.0
