"""The gRPC servicers of ``fencing.v1``: validate, build a command, propose, map the result.

Owns: request validation (each RPC's row of ``validation.REQUESTS``), the ``Proposer`` (stamps commands, bounds
proposals in flight, derives each proposal's deadline from the RPC's), response headers,
Admin authorization and its audit log, charging each ACQUIRE and WRITE to its caller's
quotas (checked in the state machine), the per-principal count of open KeepAliveStreams, when
an Acquire may wait server-side (a slot of streams.py's waiter gate, else it answers at once), and
the translation of every outcome through ``errors.STATUS_TABLE``.
Must never: decide a domain rule (the state machine does), touch the Raft library (the Raft node
does), queue proposals without bound, or report an unknown outcome as a failure.

WriteMany, AcquireMany and ReleaseMany (the multiplexed client's batches) are many Writes,
Acquires or Releases in one call: each item goes through exactly its call's checks and
errors, and the items are proposed together (``Proposer.propose_many``), each answered on its
own; the fan-out, the limits and the per-item error are written once (``_serve_many``).

Every member serves every RPC. A follower proposes through its local Raft node, which
forwards the entry to the leader, and the follower answers after it has applied the entry
itself, so whatever it reads afterwards is at least that new. Reads (Describe, Read,
Status.epoch, Snapshot) go through the log as a READ_BARRIER entry (DESIGN I9); on the leader,
with ``read_index`` on, Read and Describe are answered by a read-index barrier instead, no entry
written (coordinator/raft/read_index.py), and fall back to the entry whenever it cannot answer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hmac
import json
import logging
import threading
import time
from typing import Any, Callable

import grpc

from coordinator.core import commands
from coordinator.server import backups
from coordinator.server import errors
from coordinator.server import log_limits
from coordinator.server import members as members_api
from coordinator.core import limits
from coordinator.core import validation
from coordinator.server.auth import Authenticator, Principal
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.metrics import Metrics
from coordinator.server.streams import SlotGate, caller_key
from coordinator.client.proof import ProofSigner
from coordinator.core.names import ErrorMeta, Trailer
from coordinator.raft.interface import ProposeFailure, ProposeOutcome, ProposeResult
from coordinator.raft.node import RaftNode
from coordinator.raft.read_index import ReadIndexOutcome
from coordinator.core.state_machine import Reason

log = logging.getLogger(__name__)

# A proposal is never given less than this, even when the RPC deadline is nearly spent:
# below it the answer would be OUTCOME_UNKNOWN almost surely.
PROPOSE_TIMEOUT_S_MIN = 0.05
# Worker threads that propose the items of one KeepAliveMany concurrently (shared by all
# calls); each item still takes an in-flight slot.
KEEP_ALIVE_MANY_WORKERS = 16


def _checked_request(rpc: str, request: Any) -> dict[str, Any]:
    """The fields ``validation.REQUESTS[rpc]`` names, read from ``request`` and checked; a
    bad one is INVALID_ARGUMENT naming it. An optional field the caller left unset is None:
    unset is ``not HasField`` for a field with presence and the zero value for the rest (an
    empty op_id, a ttl_ms of 0), except a bool, whose False is a choice, not an absence."""
    fields: dict[str, Any] = {}
    for name, required, has_presence, zero in _presence_plan(rpc, request.DESCRIPTOR):
        value = getattr(request, name)
        unset = (not request.HasField(name)) if has_presence else (zero is not _NEVER_UNSET and value == zero)
        fields[name] = None if unset and not required else value
    try:
        return validation.check_request(rpc, fields)
    except validation.InvalidField as exc:
        raise errors.invalid(exc.field, str(exc)) from None


_NEVER_UNSET = object()  # a bool's False is a value the caller chose


@functools.cache
def _presence_plan(rpc: str, descriptor: Any) -> tuple[tuple[str, bool, bool, Any], ...]:
    """Per RPC, once (not per request on the hot path): each field of its table row with
    whether it is required, whether the wire tracks its presence, and the zero value that
    means "unset" where it does not."""
    plan = []
    for name, spec in validation.REQUESTS[rpc].items():
        field = descriptor.fields_by_name[name]
        zero = _NEVER_UNSET if field.type == field.TYPE_BOOL else field.default_value
        plan.append((name, spec.required, field.has_presence, zero))
    return tuple(plan)


class Proposer:
    """Stamps and proposes commands with a deadline, at most ``inflight_max`` at a time."""

    def __init__(
        self,
        node: RaftNode,
        *,
        inflight_max: int,
        timeout_max_s: float,
        deadline_margin_s: float,
        members: dict[str, str],
        metrics: Metrics | None = None,
    ) -> None:
        self.node = node
        self.metrics = metrics
        self.timeout_max_s = timeout_max_s
        self.deadline_margin_s = deadline_margin_s
        self._members = members
        self._slots = threading.BoundedSemaphore(inflight_max)
        # Set once a READ_BARRIER applied on this node since start (health: SERVING needs it).
        self.barrier_applied = threading.Event()

    def timeout_s(self, context: grpc.ServicerContext | None) -> float:
        """min(RPC time left - margin, timeout_max_s): the server answers before the client gives up."""
        remaining = None if context is None else context.time_remaining()
        if remaining is None:
            return self.timeout_max_s
        return max(PROPOSE_TIMEOUT_S_MIN, min(self.timeout_max_s, remaining - self.deadline_margin_s))

    def leader_hint(self) -> tuple[str, str]:
        leader = self.node.leader_address() or ""
        return leader, self._members.get(leader, "")

    def propose(
        self, command: commands.Command, timeout_s: float, *, max_bytes: int | None = None,
        client_slot: bool = True,
    ) -> ProposeResult:
        """The APPLIED result of ``command``, or raise ServiceError for anything else.

        ``client_slot=False`` is for the member's own jobs (the leader's TICK), which bound
        themselves (one in flight): taking one of ``inflight_proposals_max``'s slots would
        refuse a client's call once a second where the bound is 1."""
        if not client_slot:
            return self._propose(command, timeout_s, max_bytes)
        if not self._slots.acquire(blocking=False):
            if self.metrics is not None:
                self.metrics.proposal_done("overloaded", None)
            raise ServiceError(
                Failure.OVERLOADED, "too many proposals in flight on this member; retry later"
            )
        try:
            return self._propose(command, timeout_s, max_bytes)
        finally:
            self._slots.release()

    def _propose(self, command: commands.Command, timeout_s: float, max_bytes: int | None) -> ProposeResult:
        started = time.perf_counter()
        stamped = dataclasses.replace(command, stamp_ms=self.node.next_stamp_ms())
        kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
        kwargs["batch_key"] = command.resource  # shared Raft entries only across resources
        result = self.node.propose(stamped.encode(), timeout_s, **kwargs)
        if self.metrics is not None:
            self.metrics.proposal_done(result.outcome.value, time.perf_counter() - started)
        if result.outcome is ProposeOutcome.APPLIED:
            if command.op is commands.Op.READ_BARRIER:
                self.barrier_applied.set()
            return result
        if result.outcome is ProposeOutcome.REFUSED:
            raise errors.from_refusal(result.value, result.index)
        leader, leader_api = self.leader_hint()
        raise errors.from_propose_failure(result, leader, leader_api)


    def propose_many(
        self, commands_: list[commands.Command], timeout_s: float
    ) -> list[ProposeResult | ServiceError]:
        """Propose every command at once through the node's async path and wait, at most
        ``timeout_s`` in all, for each one's fate: per command its APPLIED result or the
        ServiceError ``propose`` would have raised for it. Each takes an in-flight slot as a
        proposal of its own would (none left: that one is OVERLOADED, the others go on), and
        each is sized and stamped as ``propose`` does; concurrent ones may share an entry
        across resources (batch_key), never within one, and keep their order."""
        started = time.perf_counter()
        outcomes: list[ProposeResult | ServiceError | None] = [None] * len(commands_)
        settled_s = [0.0] * len(commands_)  # each proposal's time to its fate, for the metrics
        # Proposals not settled yet, plus one for the loop below while it still proposes: a
        # callback that runs before the last proposal is made (a fast commit, or QUEUE_FULL,
        # which calls back at once) must not end the wait for the ones after it.
        pending = 1
        lock = threading.Lock()
        all_done = threading.Event()
        slots = 0

        def settle(i: int, result: ProposeResult) -> None:
            nonlocal pending
            with lock:
                if outcomes[i] is None:
                    outcomes[i] = result
                    settled_s[i] = time.perf_counter() - started
                pending -= 1
                if pending == 0:
                    all_done.set()

        try:
            for i, command in enumerate(commands_):
                if not self._slots.acquire(blocking=False):
                    if self.metrics is not None:
                        self.metrics.proposal_done("overloaded", None)
                    outcomes[i] = ServiceError(
                        Failure.OVERLOADED, "too many proposals in flight on this member; retry later"
                    )
                    continue
                slots += 1
                encoded = dataclasses.replace(command, stamp_ms=self.node.next_stamp_ms()).encode()
                if len(encoded) > limits.COMMAND_BYTES_MAX:
                    outcomes[i] = ProposeResult.failed(ProposeFailure.COMMAND_TOO_LARGE)
                    continue
                with lock:
                    pending += 1
                self.node.propose_async_result(
                    encoded, lambda result, i=i: settle(i, result), batch_key=command.resource,
                )
            with lock:
                pending -= 1  # the loop's own count: every proposal is made
                if pending == 0:
                    all_done.set()
            all_done.wait(max(0.0, timeout_s))
        finally:
            for _ in range(slots):
                self._slots.release()
        with lock:
            # Still pending at the deadline: the entry may still commit (only its op_id can tell).
            late = ProposeResult.failed(ProposeFailure.DEADLINE_EXCEEDED)
            settled = [late if o is None else o for o in outcomes]
            for i in range(len(outcomes)):
                if outcomes[i] is None:
                    outcomes[i] = late  # a callback after this point changes nothing
                    settled_s[i] = time.perf_counter() - started
        if self.metrics is not None:
            for outcome, seconds in zip(settled, settled_s):
                if not isinstance(outcome, ServiceError):  # OVERLOADED was counted above
                    self.metrics.proposal_done(outcome.outcome.value, seconds)
        leader: tuple[str, str] | None = None
        answers: list[ProposeResult | ServiceError] = []
        for command, outcome in zip(commands_, settled):
            if isinstance(outcome, ServiceError) or outcome.outcome is ProposeOutcome.APPLIED:
                if not isinstance(outcome, ServiceError) and command.op is commands.Op.READ_BARRIER:
                    self.barrier_applied.set()
                answers.append(outcome)
            elif outcome.outcome is ProposeOutcome.REFUSED:
                answers.append(errors.from_refusal(outcome.value, outcome.index))
            else:
                leader = leader or self.leader_hint()
                answers.append(errors.from_propose_failure(outcome, *leader))
        return answers

    def read_index(self, command: commands.Command, timeout_s: float) -> tuple[dict, int] | None:
        """``command`` (a READ_BARRIER) answered by the read-index barrier: (result dict,
        index), None when the leader cannot answer that way (the caller uses the log), or
        ServiceError. Takes an in-flight slot like a proposal: a read waits like one."""
        if not self._slots.acquire(blocking=False):
            if self.metrics is not None:
                self.metrics.proposal_done("overloaded", None)
            raise ServiceError(Failure.OVERLOADED, "too many proposals in flight on this member; retry later")
        try:
            outcome, answer, index = self.node.read_index(lambda sm: sm.read_now(command), timeout_s)
        finally:
            self._slots.release()
        if outcome is None:
            # The status the entry path gives at its deadline, for the same call (no proposal
            # was made, so none is counted: fencing_raft_read_index_rounds_total counts rounds).
            raise errors.read_not_confirmed()
        if outcome is not ReadIndexOutcome.CONFIRMED:
            return None
        if getattr(answer, "reason", None) is not None:
            raise errors.from_refusal(answer, index)
        self.barrier_applied.set()  # as fresh as an applied barrier: health may say SERVING
        return answer.result, index


class StreamSlots:
    """Open KeepAliveStreams per principal on this member, against each one's ``streams_max``.

    A count of open RPCs, not replicated state: it never enters the log. No principal (no
    principals file) or no ``streams_max`` (admin): not counted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def open_count(self, name: str) -> int:
        with self._lock:
            return self._open.get(name, 0)

    def enter(self, caller: Principal | None) -> None:
        """Take a slot for ``caller``'s new stream; QUOTA_EXCEEDED when it holds all of its own."""
        maximum = None if caller is None else caller.quota.streams_max
        if maximum is None:
            return
        with self._lock:
            held = self._open.get(caller.name, 0)
            if held >= maximum:
                raise ServiceError(
                    Reason.QUOTA_EXCEEDED,
                    f"principal {caller.name!r} is at its streams quota ({held} open, max {maximum})",
                    {ErrorMeta.QUOTA: "streams", ErrorMeta.MAX: maximum, ErrorMeta.PRINCIPAL: caller.name},
                )
            self._open[caller.name] = held + 1

    def leave(self, caller: Principal | None) -> None:
        if caller is None or caller.quota.streams_max is None:
            return
        with self._lock:
            left = self._open.get(caller.name, 0) - 1
            if left > 0:
                self._open[caller.name] = left
            else:
                self._open.pop(caller.name, None)


def error_trailers(node: RaftNode, index: int = 0) -> tuple[tuple[str, str], ...]:
    """The trailers every error of this member carries: its id, term and applied index (or
    ``index``, the entry the error is about)."""
    term, applied = node.term_and_applied()
    return (
        (Trailer.MEMBER_ID, node.config.self_address),
        (Trailer.RAFT_TERM, str(term)),
        (Trailer.APPLIED_INDEX, str(index or applied)),
    )


class Core:
    """What every servicer shares: the node, the proposer, who may call, headers and error replies."""

    def __init__(
        self,
        node: RaftNode,
        proposer: Proposer,
        *,
        members: dict[str, str],
        authenticator: Authenticator | None = None,
        proof_signer: ProofSigner | None = None,
        read_index: bool = True,
    ) -> None:
        self.node = node
        self.read_index = read_index  # Read and Describe on the leader without a log entry
        self.proposer = proposer
        self.member_id = node.config.self_address
        self.members = members
        self.authenticator = authenticator  # None: open data plane (no principals file)
        self.proof_signer = proof_signer  # None: Acquire returns no token_proof
        self.streams = StreamSlots()

    def principal(self, context) -> Principal | None:
        """The authenticated caller (None when there is no principals file); raises
        UNAUTHENTICATED for a missing or unknown bearer token."""
        if self.authenticator is None:
            return None
        found = self.authenticator.principal(context.invocation_metadata() or ())
        if found is None:
            raise ServiceError(
                Failure.UNAUTHENTICATED, "this cluster needs 'authorization: Bearer TOKEN' of a known principal"
            )
        return found

    def authorize(self, caller: Principal | None, resource: str | None) -> None:
        """DESIGN I10: ``caller`` (what ``principal`` found) may act on ``resource`` (any
        resource: admin principals; anyone: no principals file)."""
        if caller is None:
            if self.authenticator is not None:  # only an open data plane has no caller
                raise ServiceError(Failure.UNAUTHENTICATED, "no authenticated caller for this call")
            return
        if resource is None or caller.admin or caller.may_use(resource):
            return
        raise ServiceError(
            Failure.PERMISSION_DENIED,
            f"principal {caller.name!r} may not use resource {resource!r}"
            f" (its prefixes: {', '.join(repr(p) for p in caller.prefixes) or 'none'})",
        )

    def header(self, index: int = 0) -> pb.ResponseHeader:
        term, applied = self.node.term_and_applied()
        return pb.ResponseHeader(member_id=self.member_id, raft_term=term, applied_index=index or applied)

    def trailing(self, index: int = 0) -> tuple[tuple[str, str], ...]:
        return error_trailers(self.node, index)

    def abort(self, context: grpc.ServicerContext, error: ServiceError):
        errors.abort(context, error, self.trailing(error.index))

    def run(
        self,
        command: commands.Command,
        context,
        caller: Principal | None,
        *,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> tuple[dict, int]:
        """Authorize, charge to the caller's quotas, then propose with the RPC's deadline
        (or ``timeout_s``); (result dict, Raft index) or ServiceError."""
        self.authorize(caller, command.resource)
        if caller is not None:
            command = commands.charged(command, principal=caller.name, quota=caller.quota.replicated())
        wait_s = self.proposer.timeout_s(context) if timeout_s is None else timeout_s
        result = self.proposer.propose(command, wait_s, max_bytes=max_bytes)
        return result.value.result, result.index

    def barrier(
        self, context, caller: Principal | None, resource: str | None = None, key: str | None = None,
        *, read_index: bool = False,
    ) -> tuple[dict, int]:
        """A READ_BARRIER's result (DESIGN I9). ``read_index``: on the leader, with the setting
        on, try the read-index barrier first (no log entry); the log whenever it cannot answer."""
        command = commands.read_barrier(stamp_ms=0, resource=resource, key=key)
        if read_index and self.read_index and self.node.is_leader():
            self.authorize(caller, resource)
            started = time.monotonic()
            wait_s = self.proposer.timeout_s(context)
            answered = self.proposer.read_index(command, wait_s)
            if answered is not None:
                return answered
            # Not the leader (any more), no entry of its term committed yet, or too many
            # waiting: the entry answers, within what is left of the deadline.
            left = wait_s - (time.monotonic() - started)
            return self.run(command, context, caller, timeout_s=max(PROPOSE_TIMEOUT_S_MIN, left))
        return self.run(command, context, caller)


def _unary(method):
    """Authenticate the caller once, pass it on as ``caller``, and turn a ServiceError raised
    by the handler into a rich status with header trailers."""

    @functools.wraps(method)
    def handler(self, request, context):
        try:
            caller = self.core.principal(context)  # who is calling comes first, before any input check
            return method(self, request, context, caller)
        except ServiceError as error:
            self.core.abort(context, error)

    return handler


# -- Lease ---------------------------------------------------------------------------------


class LeaseServicer(pb_grpc.LeaseServicer):
    def __init__(self, core: Core, *, waiters: SlotGate) -> None:
        self.core = core
        self.waiters = waiters  # caps Acquires and Lock calls waiting at once (each holds a worker thread)
        self._batch_pool = concurrent.futures.ThreadPoolExecutor(
            KEEP_ALIVE_MANY_WORKERS, thread_name_prefix="keepalive-many"
        )

    def close(self) -> None:
        self._batch_pool.shutdown(wait=False, cancel_futures=True)

    @_unary
    def Acquire(self, request: pb.AcquireRequest, context, caller: Principal | None) -> pb.AcquireResponse:
        started = time.monotonic()
        command = commands.acquire(**_checked_request("Acquire", request), stamp_ms=0)
        try:
            result, index = self.core.run(command, context, caller)
        except ServiceError as held:
            if held.key is not Reason.LEASE_HELD:
                raise
            result, index = self._acquire_in_line(command, held, request.wait_ms, started, context, caller)
        return self._acquire_response(command, result, index)

    def _acquire_response(self, command: commands.Command, result: dict, index: int) -> pb.AcquireResponse:
        return pb.AcquireResponse(
            header=self.core.header(index),
            token=result["token"],
            lease_id=result["token"],
            expires_at_ms=result["expires_at_ms"],
            token_proof=self._proof(command.resource, result["token"]),
        )

    @_unary
    def AcquireMany(self, request: pb.AcquireManyRequest, context, caller: Principal | None) -> pb.AcquireManyResponse:
        """Each item as the same Acquire alone with wait_ms 0 (``_serve_many``): an item that
        asks to wait is refused alone (INVALID_ARGUMENT, field wait_ms) -- a wait would hold
        every other item's answer and a worker thread for up to ACQUIRE_WAIT_MS_MAX, which is
        what a waiting Acquire of its own is for. A LEASE_HELD item is answered as Acquire
        answers one: its op_id's grant through the lock queue if that is what it had, else
        LEASE_HELD."""
        started = time.monotonic()

        def build(item: pb.AcquireRequest) -> commands.Command:
            command = commands.acquire(**_checked_request("Acquire", item), stamp_ms=0)
            if item.wait_ms:
                raise errors.invalid(
                    "wait_ms", f"must be 0 in AcquireMany (got {item.wait_ms}): an Acquire that waits goes on its own"
                )
            return command

        def answer(command: commands.Command, outcome: tuple[dict, int] | ServiceError) -> tuple[Any, int]:
            if isinstance(outcome, ServiceError) and outcome.key is Reason.LEASE_HELD:
                result, index = self._acquire_in_line(command, outcome, 0, started, context, caller)
            else:
                result, index = _applied(outcome)
            return self._acquire_response(command, result, index), index

        results, index = _serve_many(self.core, ACQUIRE_MANY, request.acquires, context, caller, build, answer)
        return pb.AcquireManyResponse(header=self.core.header(index), results=results)

    def _acquire_in_line(
        self, command: commands.Command, held: ServiceError, wait_ms: int, started: float, context,
        caller: Principal | None,
    ) -> tuple[dict, int]:
        """After a LEASE_HELD try: the grant this Acquire gets by waiting in the resource's
        FIFO queue (the same queue as Lock's) for up to min(wait_ms, ACQUIRE_WAIT_MS_MAX), or
        ``held`` -- or the refusal of one last try -- when it does not.

        Entries: one ENQUEUE (its op_id is its waiter id), then none while it waits -- the
        RELEASE, FORCE_RELEASE or TICK that grants it wakes it -- and, if the wait ends
        ungranted, one DEQUEUE and one last ACQUIRE: O(1) whatever wait_ms is. The wait needs
        a slot of the waiter gate (acquire_waiters_max and its per-caller cap); without one
        the answer is ``held``, as if wait_ms were 0, and nothing is queued.
        """
        resource, waiter_id = command.resource, command.body["op_id"]
        node = self.core.node
        # A retry of an Acquire that was granted through the queue but whose answer was lost:
        # the lease names its op_id. (The refused try applied on this member, so this local
        # read is at least as new as that entry.) A queue grant enters no dedup entry, so
        # once that lease has ended a retry is a new Acquire.
        mine = node.read(lambda sm: sm.lock_state(resource, waiter_id))
        if mine["granted"]:
            return mine, 0
        wait_s = self._acquire_wait_s(wait_ms, started, context)
        if wait_s <= 0:
            raise held
        who = caller_key(None if caller is None else caller.name, context.peer())
        self._take_waiter_slot(held, who)
        try:
            fields = {k: command.body[k] for k in ("resource", "holder", "ttl_ms")}
            try:
                state, index = self.core.run(
                    commands.enqueue(**fields, waiter_id=waiter_id, stamp_ms=0), context, caller
                )
            except ServiceError as refused:
                if not isinstance(refused.key, Reason):
                    raise  # no leader, overloaded, unknown outcome: the client retries with this op_id
                # A full queue or the caller's quota: waiting is a convenience, the answer is
                # the one wait_ms 0 would have had, saying why it did not wait.
                raise ServiceError(held.key, f"{held.message} (not waiting: {refused.message})",
                                   held.metadata, index=held.index) from None
            if state["queued"]:
                state = self._wait_for_grant(resource, waiter_id, self._acquire_wait_s(wait_ms, started, context),
                                             context)
                index = 0  # as of this member's applied index now
            if state["granted"]:
                return state, index
        finally:
            self.waiters.give_back(who)
        # Not granted in time (or the caller went away): leave the line. A grant that lands
        # between the look above and this DEQUEUE is ended by the DEQUEUE itself (its lease is
        # released and the next waiter granted in the same entry) rather than returned: its
        # token was never sent, and the last try below answers for the resource as it is now.
        self.core.run(commands.dequeue(resource=resource, waiter_id=waiter_id, stamp_ms=0), context, caller)
        if not context.is_active():
            raise held  # nobody to answer; the queue is left, which is what mattered
        # One last try, so the LEASE_HELD this answers with is the state's now (holder and
        # expiry), and a lease that came free as the wait ended is granted, as before.
        return self.core.run(command, context, caller)

    def _acquire_wait_s(self, wait_ms: int, started: float, context) -> float:
        """How long an Acquire that started at ``started`` may still wait: min(wait_ms,
        ACQUIRE_WAIT_MS_MAX) from its start, leaving the proposer's margin and room for the
        DEQUEUE and last try before the RPC's deadline."""
        left = started + min(wait_ms, limits.ACQUIRE_WAIT_MS_MAX) / 1000 - time.monotonic()
        rpc_left = context.time_remaining()
        if rpc_left is not None:
            left = min(left, rpc_left - self.core.proposer.deadline_margin_s - 2 * PROPOSE_TIMEOUT_S_MIN)
        return left if context.is_active() else 0.0

    def _wait_for_grant(self, resource: str, waiter_id: bytes, wait_s: float, context) -> dict[str, Any]:
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
                lambda sm: ended.is_set() or not sm.lock_state(resource, waiter_id).get("queued"), wait_s
            )
        return node.read(lambda sm: sm.lock_state(resource, waiter_id))

    def _take_waiter_slot(self, held: ServiceError, who: str) -> None:
        """Take a waiter slot for ``who``, or raise ``held`` (LEASE_HELD, as with wait_ms 0)
        saying which cap kept this Acquire from waiting."""
        try:
            self.waiters.take(who)
        except ServiceError as full:
            limit = full.metadata.get(ErrorMeta.LIMIT, "")
            raise ServiceError(held.key, f"{held.message} (not waiting: {full.message}, limit {limit})",
                               held.metadata, index=held.index) from None

    def _proof(self, resource: str, token: int) -> bytes:
        # Signed after the grant applied: only a token the log issued for this resource
        # ever gets a proof (a force-release's fence-only epoch never does).
        signer = self.core.proof_signer
        return b"" if signer is None else signer.sign(resource, token)

    @_unary
    def Lock(self, request: pb.LockRequest, context, caller: Principal | None) -> pb.LockResponse:
        # One ENQUEUE entry per call (it queues the waiter, or renews its slot), then a wait
        # for the entry that grants it -- a RELEASE, FORCE_RELEASE or TICK applied here wakes
        # it -- with no entry of its own. The wait takes a slot of the same gate as a waiting
        # Acquire (acquire_waiters_max and its per-caller cap: each holds a worker thread);
        # past a cap, or with wait_ms 0, the answer is the ENQUEUE's at once and the client
        # calls again. A cancelled call ends its wait at once but leaves the waiter queued:
        # the client's next Lock call (after a reconnect, say) keeps its place, and its
        # CancelLock or the waiter's slot expiry (LOCK_WAITER_TTL_MS) takes it out.
        fields = _checked_request("Lock", request)
        resource, waiter_id = fields["resource"], fields["waiter_id"]
        result, index = self.core.run(commands.enqueue(**fields, stamp_ms=0), context, caller)
        wait_s = self._lock_wait_s(request.wait_ms, context)
        if not result["granted"] and result["queued"] and wait_s > 0:
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
        granted = result["granted"]
        return pb.LockResponse(
            header=self.core.header(index),
            granted=granted,
            token=result.get("token", 0),
            lease_id=result.get("token", 0),
            expires_at_ms=result.get("expires_at_ms", 0),
            token_proof=self._proof(resource, result["token"]) if granted else b"",
            queued=bool(result.get("queued")),
            position=result.get("position", 0),
        )

    def _lock_wait_s(self, wait_ms: int, context) -> float:
        """How long a Lock call may wait for its grant: its wait_ms, at most LOCK_WAIT_MS_MAX,
        and leaving the proposer's margin before the RPC's deadline."""
        wait_s = min(wait_ms, limits.LOCK_WAIT_MS_MAX) / 1000
        rpc_left = context.time_remaining()
        if rpc_left is not None:
            wait_s = min(wait_s, rpc_left - self.core.proposer.deadline_margin_s)
        return wait_s if context.is_active() else 0.0

    @_unary
    def CancelLock(self, request: pb.CancelLockRequest, context, caller: Principal | None) -> pb.CancelLockResponse:
        command = commands.dequeue(**_checked_request("CancelLock", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.CancelLockResponse(
            header=self.core.header(index), cancelled=result["cancelled"], released=result["released"]
        )

    @staticmethod
    def _keep_alive_command(request: pb.KeepAliveRequest) -> commands.Command:
        fields = _checked_request("KeepAlive", request)
        if request.lease_id and request.lease_id != request.token:
            raise errors.invalid("lease_id", f"lease_id {request.lease_id} must equal token {request.token} (or be 0)")
        return commands.keep_alive(**fields, stamp_ms=0)

    def _keep_alive(self, request: pb.KeepAliveRequest, context, caller: Principal | None) -> pb.KeepAliveResponse:
        result, index = self.core.run(self._keep_alive_command(request), context, caller)
        return pb.KeepAliveResponse(
            header=self.core.header(index),
            resource=request.resource,
            token=result["token"],
            expires_at_ms=result["expires_at_ms"],
        )

    @_unary
    def KeepAlive(self, request: pb.KeepAliveRequest, context, caller: Principal | None) -> pb.KeepAliveResponse:
        return self._keep_alive(request, context, caller)

    @_unary
    def KeepAliveMany(
        self, request: pb.KeepAliveManyRequest, context, caller: Principal | None
    ) -> pb.KeepAliveManyResponse:
        if len(request.leases) > limits.KEEP_ALIVE_BATCH_ITEMS_MAX:
            raise errors.invalid(
                "leases", f"{len(request.leases)} items, more than {limits.KEEP_ALIVE_BATCH_ITEMS_MAX}"
            )

        def one(item: pb.KeepAliveRequest) -> tuple[pb.KeepAliveResult, int]:
            try:
                response = self._keep_alive(item, context, caller)
            except ServiceError as error:
                return (
                    pb.KeepAliveResult(
                        resource=item.resource, token=item.token, ok=False,
                        reason=error.reason, message=error.message,
                    ),
                    error.index,
                )
            return (
                pb.KeepAliveResult(
                    resource=item.resource, token=item.token, ok=True,
                    expires_at_ms=response.expires_at_ms,
                ),
                response.header.applied_index,
            )

        outcomes = list(self._batch_pool.map(one, request.leases))
        index = max((i for _, i in outcomes), default=0)
        return pb.KeepAliveManyResponse(header=self.core.header(index), results=[r for r, _ in outcomes])

    def KeepAliveStream(self, request_iterator, context):
        # One response per request, in order. The first refusal ends the stream with its
        # status (the failed request is the one after the last response). The member's caps
        # (streams_max, streams_per_principal_max) and idle timeout hold every streaming RPC
        # and are applied before this runs (stream_admission.py): a stream past them never
        # gets here, and ``request_iterator`` ends the stream once idle for the timeout.
        try:
            caller = self.core.principal(context)  # once per stream, before any request
            self.core.streams.enter(caller)  # the principal's streams quota (principals file)
        except ServiceError as error:
            self.core.abort(context, error)
        # The quota slot is given back when the RPC ends, however it ends (cancelled included).
        if not context.add_callback(functools.partial(self.core.streams.leave, caller)):
            self.core.streams.leave(caller)  # it has ended already
            return
        try:
            for request in request_iterator:
                yield self._keep_alive(request, context, caller)
        except ServiceError as error:
            self.core.abort(context, error)

    @_unary
    def Release(self, request: pb.ReleaseRequest, context, caller: Principal | None) -> pb.ReleaseResponse:
        command = commands.release(**_checked_request("Release", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.ReleaseResponse(header=self.core.header(index), released=result["released"], hwm=result["hwm"])

    @_unary
    def ReleaseMany(self, request: pb.ReleaseManyRequest, context, caller: Principal | None) -> pb.ReleaseManyResponse:
        """Each item as the same Release alone (``_serve_many``)."""

        def build(item: pb.ReleaseRequest) -> commands.Command:
            return commands.release(**_checked_request("Release", item), stamp_ms=0)

        def answer(command: commands.Command, outcome: tuple[dict, int] | ServiceError) -> tuple[Any, int]:
            result, index = _applied(outcome)
            response = pb.ReleaseResponse(header=self.core.header(index), released=result["released"], hwm=result["hwm"])
            return response, index

        results, index = _serve_many(self.core, RELEASE_MANY, request.releases, context, caller, build, answer)
        return pb.ReleaseManyResponse(header=self.core.header(index), results=results)

    @_unary
    def Describe(self, request: pb.DescribeRequest, context, caller: Principal | None) -> pb.DescribeResponse:
        resource = _checked_request("Describe", request)["resource"]
        result, index = self.core.barrier(context, caller, resource, read_index=True)
        lease = result.get("lease")
        return pb.DescribeResponse(
            header=self.core.header(index),
            resource=resource,
            held=lease is not None,
            holder="" if lease is None else lease["holder"],
            token=0 if lease is None else lease["token"],
            hwm=result["hwm"],
            expires_at_ms=0 if lease is None else lease["expires_at_ms"],
            log_clock_ms=result["log_clock_ms"],
            waiters=result.get("waiters", 0),
        )


# -- FencedStore -------------------------------------------------------------------------


class FencedStoreServicer(pb_grpc.FencedStoreServicer):
    def __init__(self, core: Core) -> None:
        self.core = core

    @_unary
    def Write(self, request: pb.WriteRequest, context, caller: Principal | None) -> pb.WriteResponse:
        command = commands.write(**_checked_request("Write", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.WriteResponse(header=self.core.header(index), version=result["version"], hwm=result["hwm"])

    @_unary
    def WriteMany(self, request: pb.WriteManyRequest, context, caller: Principal | None) -> pb.WriteManyResponse:
        """Each item as the same Write alone (``_serve_many``); per item its WriteResponse or
        the error that Write would have had."""

        def build(item: pb.WriteRequest) -> commands.Command:
            return commands.write(**_checked_request("Write", item), stamp_ms=0)

        def answer(command: commands.Command, outcome: tuple[dict, int] | ServiceError) -> tuple[pb.WriteResponse, int]:
            result, index = _applied(outcome)
            return pb.WriteResponse(header=self.core.header(index), version=result["version"], hwm=result["hwm"]), index

        results, index = _serve_many(self.core, WRITE_MANY, request.writes, context, caller, build, answer)
        return pb.WriteManyResponse(header=self.core.header(index), results=results)

    @_unary
    def Delete(self, request: pb.DeleteRequest, context, caller: Principal | None) -> pb.DeleteResponse:
        command = commands.delete(**_checked_request("Delete", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.DeleteResponse(header=self.core.header(index), version=result["version"], deleted=result["deleted"])

    @_unary
    def Read(self, request: pb.ReadRequest, context, caller: Principal | None) -> pb.ReadResponse:
        fields = _checked_request("Read", request)
        result, index = self.core.barrier(context, caller, fields["resource"], fields["key"], read_index=True)
        value = result.get("value")
        return pb.ReadResponse(
            header=self.core.header(index),
            found=value is not None,
            value=b"" if value is None else value,
            version=result.get("version", 0),
            hwm=result["hwm"],
        )


@dataclasses.dataclass(frozen=True)
class ManyRpc:
    """One of the batch RPCs (WriteMany, AcquireMany, ReleaseMany): its request's repeated
    field, its limits (named with their units, as the ErrorInfo ``limit`` says them) and
    the result message its items go into (``ok``: the oneof field of a success)."""

    name: str
    field: str
    items_max: int
    items_limit: str
    bytes_max: int | None
    bytes_limit: str
    result: Any
    ok: str


WRITE_MANY = ManyRpc("WriteMany", "writes", limits.WRITE_MANY_ITEMS_MAX, "write_many_items",
                     limits.WRITE_MANY_BYTES_MAX, "write_many_bytes", pb.WriteManyResult, "write")
ACQUIRE_MANY = ManyRpc("AcquireMany", "acquires", limits.ACQUIRE_MANY_ITEMS_MAX, "acquire_many_items",
                       None, "", pb.AcquireManyResult, "acquire")
RELEASE_MANY = ManyRpc("ReleaseMany", "releases", limits.RELEASE_MANY_ITEMS_MAX, "release_many_items",
                       None, "", pb.ReleaseManyResult, "release")


def _check_many_limits(rpc: ManyRpc, items: Any) -> None:
    """INVALID_ARGUMENT (field ``rpc.field``; metadata ``limit`` and ``max`` name the limit)
    for a batch past its items limit or its bytes limit (encoded items, summed): checked
    before any item, so nothing of such a call is applied."""
    count = len(items)
    checks = [(rpc.items_limit, count, rpc.items_max, rpc.field)]
    if rpc.bytes_max is not None:
        size = sum(item.ByteSize() for item in items) if count <= rpc.items_max else 0
        checks.append((rpc.bytes_limit, size, rpc.bytes_max, f"bytes of {rpc.field}"))
    for name, value, maximum, unit in checks:
        if value > maximum:
            raise ServiceError(
                Failure.INVALID_INPUT,
                f"{value} {unit} in one {rpc.name}, more than {name.upper()}_MAX ({maximum}); nothing was applied",
                {ErrorMeta.FIELD: rpc.field, ErrorMeta.LIMIT: name, ErrorMeta.MAX: maximum},
            )


def _applied(outcome: tuple[dict, int] | ServiceError) -> tuple[dict, int]:
    """An item's (result dict, index), or raise the ServiceError it ended with."""
    if isinstance(outcome, ServiceError):
        raise outcome
    return outcome


def _item_error(error: ServiceError) -> pb.WriteItemError:
    """One batch item's failure: the status and ErrorInfo the call alone would have had."""
    return pb.WriteItemError(
        code=error.code.name, reason=error.reason, message=error.message, metadata=error.metadata,
    )


def _serve_many(
    core: Core,
    rpc: ManyRpc,
    items: Any,
    context,
    caller: Principal | None,
    build: Callable[[Any], commands.Command],
    answer: Callable[[commands.Command, tuple[dict, int] | ServiceError], tuple[Any, int]],
) -> tuple[list[Any], int]:
    """The one fan-out of every batch RPC: each item judged as the same call alone.

    Past a limit the call is refused whole before any item (``_check_many_limits``). Each
    item is then built (``build``: its checks; a ServiceError refuses that item alone),
    authorized and charged to the caller's quotas as ``Core.run`` does, and every item that
    passed is proposed at once (``Proposer.propose_many``) within the call's deadline.
    ``answer(command, outcome)`` turns an item's outcome -- (result dict, index) or the
    ServiceError the call alone would have raised -- into (its success message, its index),
    or raises the ServiceError the call alone would have ended with. Returns (the result
    messages in request order, the highest index any item reached)."""
    _check_many_limits(rpc, items)
    answers: list[Any] = [None] * len(items)
    proposed: list[tuple[int, commands.Command]] = []
    for i, item in enumerate(items):
        try:
            command = build(item)
            core.authorize(caller, command.resource)
        except ServiceError as error:
            answers[i] = rpc.result(error=_item_error(error))
            continue
        if caller is not None:
            command = commands.charged(command, principal=caller.name, quota=caller.quota.replicated())
        proposed.append((i, command))
    index = 0
    if proposed:
        outcomes = core.proposer.propose_many([c for _, c in proposed], core.proposer.timeout_s(context))
        for (i, command), outcome in zip(proposed, outcomes):
            settled = outcome if isinstance(outcome, ServiceError) else (outcome.value.result, outcome.index)
            try:
                message, at = answer(command, settled)
            except ServiceError as error:
                answers[i] = rpc.result(error=_item_error(error))
                index = max(index, error.index)
                continue
            answers[i] = rpc.result(**{rpc.ok: message})
            index = max(index, at)
    return answers, index


# -- Cluster -----------------------------------------------------------------------------


class ClusterServicer(pb_grpc.ClusterServicer):
    def __init__(self, core: Core) -> None:
        self.core = core

    @_unary
    def Status(self, request: pb.StatusRequest, context, caller: Principal | None) -> pb.StatusResponse:
        # Linearizable like a read (I9): without a barrier through the log there is no answer.
        result, index = self.core.barrier(context, caller)
        status = self.core.node.status()
        leader = status["leader"] or ""
        # Every member of the replicated configuration (its id, incarnation, role, match index,
        # vote); before the cluster has one, the config file's members.
        listed = members_api.member_messages(status, self.core.members) or [
            pb.Member(id=raft, api_address=api, is_leader=raft == leader) for raft, api in self.core.members.items()
        ]
        return pb.StatusResponse(
            header=self.core.header(index),
            members=listed,
            leader=leader,
            leader_api_address=self.core.members.get(leader, ""),
            term=status["term"],
            commit_index=status["commit_index"],
            applied_index=max(index, status["last_applied"]),
            epoch=result["epoch"],
            has_quorum=bool(status["has_quorum"]),
        )


# -- Admin -------------------------------------------------------------------------------


def _audit_args(request) -> dict[str, Any]:
    """What an audit line records of a request: its fields by size beyond a short prefix
    (``log_limits.field_summary``), never a caller's value whole."""
    if isinstance(request, backups.ReceivedBackup):
        return request.audit_args()
    out: dict[str, Any] = {}
    for descriptor, value in request.ListFields():
        log_limits.field_summary(descriptor.name, value, out)
    return out


# Outcomes of a call refused for who called or what it sent: nothing changed, so their audit
# lines go through the per-caller limiter (a count stands for the rest). Every other outcome
# is an authorized admin's call that may have changed something: one line each.
_REFUSALS = frozenset({
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
})


def _admin(method):
    """Authorize, run, and account for the call in the audit log: one line for every call
    that may have changed something, and rate-limited lines (with a count of the rest) for
    calls refused for who called or what they sent."""

    # The RPC's name: a private helper (``_snapshot_stream``) audits as its RPC (SnapshotStream).
    name = method.__name__
    rpc = "".join(part.capitalize() for part in name.split("_")) if name.startswith("_") else name

    @functools.wraps(method)
    def handler(self, request, context):
        started = time.monotonic()
        # Who is calling, as far as is known when the line is written: "unauthenticated"
        # only until a credential is recognised, so a refused caller is named too.
        who = {"principal": "unauthenticated"}
        outcome, index, refused = "OK", 0, False
        if not hasattr(request, "ListFields"):
            # A request stream (RestoreStream): read whole by the handler, summed for this line.
            request = backups.ReceivedBackup(request)
        try:
            caller = self._authorize(context, who)
            response = method(self, request, context, caller)
            index = response.header.applied_index
            return response
        except ServiceError as error:
            outcome, index, refused = f"{error.code.name}/{error.reason}", error.index, error.code in _REFUSALS
            self.core.abort(context, error)
        except BaseException as exc:
            outcome = f"ERROR/{type(exc).__name__}"
            raise
        finally:
            self._audit(rpc, who, context.peer(), request, outcome, index, started, refused)

    return handler


class AdminServicer(pb_grpc.AdminServicer):
    """Admin calls: authorized by an optional bearer token, audited, fenced (I7)."""

    def __init__(self, core: Core, *, admin_token: str, audit: logging.Logger,
                 refused_lines: log_limits.RefusedLines | None = None) -> None:
        self.core = core
        self._token = admin_token
        self._audit_log = audit
        # Audit lines of refused calls, per caller (log_limits; the member's one limiter of them).
        self._refused_lines = refused_lines or log_limits.RefusedLines()
        self._transfers = backups.Transfers()

    def _authorize(self, context, who: dict[str, str]) -> Principal | None:
        """The caller the RPC passes on, or ServiceError; ``who["principal"]`` is set to the
        caller's name as soon as its credential is recognised, before it is authorized, and
        ``who["name"]`` too (what its refused calls are counted under; without it, its host)."""
        principal = self.core.principal(context)  # with a principals file (admin_token is one)
        if principal is not None:
            who["principal"] = who["name"] = principal.name
            if not principal.admin:
                raise ServiceError(Failure.PERMISSION_DENIED, f"principal {principal.name!r} is not an admin")
            return principal
        if not self._token:
            who["principal"] = "anonymous"
            return None  # no token configured: Admin is open (dev clusters)
        values = [v for k, v in context.invocation_metadata() if k == "authorization"]
        if not values:
            raise ServiceError(Failure.UNAUTHENTICATED, "Admin needs 'authorization: Bearer TOKEN'")
        scheme, _, presented = values[0].partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode(), self._token.encode()
        ):
            raise ServiceError(Failure.PERMISSION_DENIED, "the admin token is not valid")
        who["principal"] = who["name"] = "admin-token"
        return None  # no principals file: nothing narrower to check later

    def _audit(self, rpc: str, who: dict[str, str], peer: str, request: Any, outcome: str, index: int,
               started: float, refused: bool) -> None:
        """Write the call's audit line: at most AUDIT_LINE_BYTES_MAX bytes, its fields by size
        beyond a short prefix; a refused call's only if the limiter lets it through (per caller:
        its principal once a credential was recognised, else its client host)."""
        admitted = log_limits.Admitted()
        if refused:
            principal = who.get("name")  # set only for a recognised credential
            admitted = self._refused_lines.admit(caller_key(principal, peer))
            if admitted is None:
                return  # counted: the caller's next line that gets through reports it
        record = {
            "ts_ms": time.time_ns() // 1_000_000,
            "rpc": rpc,
            "principal": who["principal"],
            "peer": peer,
            "member": self.core.member_id,
            "args": _audit_args(request),
            "outcome": outcome,
            "index": index,
            "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
            **admitted.fields(),
        }
        line = json.dumps(record, default=str)
        if len(line.encode()) > log_limits.AUDIT_LINE_BYTES_MAX:
            record["args"] = {"args_json_bytes": len(json.dumps(record["args"], default=str).encode())}
            line = json.dumps(record, default=str)
        self._audit_log.info(line)

    @_admin
    def ForceRelease(
        self, request: pb.ForceReleaseRequest, context, caller: Principal | None
    ) -> pb.ForceReleaseResponse:
        command = commands.force_release(**_checked_request("ForceRelease", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.ForceReleaseResponse(header=self.core.header(index), hwm=result["hwm"])

    @_admin
    def SetEpochFloor(
        self, request: pb.SetEpochFloorRequest, context, caller: Principal | None
    ) -> pb.SetEpochFloorResponse:
        command = commands.set_epoch_floor(**_checked_request("SetEpochFloor", request), stamp_ms=0)
        result, index = self.core.run(command, context, caller)
        return pb.SetEpochFloorResponse(header=self.core.header(index), epoch=result["epoch"])

    def _copy(self, request: pb.SnapshotRequest, context, caller: Principal | None) -> tuple[bytes, int, int]:
        """(backup, epoch, applied index) of one consistent copy. The barrier makes it at least
        as new as every acknowledged write (I9); the copy itself is taken under the apply lock,
        so it is one consistent state."""
        if not request.local:
            self.core.barrier(context, caller)
        node = self.core.node
        return node.read(lambda sm: (sm.backup(), sm.epoch, node.term_and_applied()[1]))

    @_admin
    def Snapshot(self, request: pb.SnapshotRequest, context, caller: Principal | None) -> pb.SnapshotResponse:
        self._transfers.enter()
        try:
            data, epoch, index = self._copy(request, context, caller)
        finally:
            self._transfers.leave()
        refusal = backups.unary_snapshot_refusal(len(data))
        if refusal is not None:
            raise refusal
        return pb.SnapshotResponse(header=self.core.header(index), data=data, epoch=epoch, index=index)

    def SnapshotStream(self, request: pb.SnapshotRequest, context):
        # The chunks are sliced from one copy as they are sent; the transfer slot is held
        # until the stream ends, however it ends (the copy is in memory until then).
        yield from self._snapshot_stream(request, context)

    @_admin
    def _snapshot_stream(
        self, request: pb.SnapshotRequest, context, caller: Principal | None
    ) -> backups.SnapshotChunks:
        self._transfers.enter()
        if not context.add_callback(self._transfers.leave):
            self._transfers.leave()  # the RPC has ended already
        data, epoch, index = self._copy(request, context, caller)
        return backups.SnapshotChunks(self.core.header(index), data, epoch, index)

    @_admin
    def Restore(self, request: pb.RestoreRequest, context, caller: Principal | None) -> pb.RestoreResponse:
        fields = _checked_request("Restore", request)
        return self._restore(fields["data"], fields["epoch_floor"], context, caller)

    @_admin
    def RestoreStream(
        self, request: backups.ReceivedBackup, context, caller: Principal | None
    ) -> pb.RestoreResponse:
        self._transfers.enter()
        try:
            data, epoch_floor = request.read()
            return self._restore(data, epoch_floor, context, caller)
        finally:
            self._transfers.leave()

    # -- membership (coordinator/server/members.py; RAFT.md "Membership changes") ----------

    @_admin
    def MemberList(self, request: pb.MemberListRequest, context, caller: Principal | None) -> pb.MemberListResponse:
        response = members_api.listing(self.core.node, self.core.members)
        response.header.CopyFrom(self.core.header())
        return response

    def _member_change(self, change, context) -> pb.MemberListResponse:
        response, index = members_api.run_change(
            change, self.core.node, self.core.members, self.core.proposer.leader_hint
        )
        response.header.CopyFrom(self.core.header(index))
        return response

    @_admin
    def MemberAdd(self, request: pb.MemberAddRequest, context, caller: Principal | None) -> pb.MemberListResponse:
        member_id = members_api.checked_member_id(request.member_id)
        address = members_api.checked_raft_address(request.raft_address)
        timeout_s = self.core.proposer.timeout_s(context)
        return self._member_change(lambda: self.core.node.add_member(member_id, address, timeout_s), context)

    @_admin
    def MemberRemove(self, request: pb.MemberRemoveRequest, context, caller: Principal | None) -> pb.MemberListResponse:
        member_id = members_api.checked_member_id(request.member_id)
        timeout_s = self.core.proposer.timeout_s(context)
        return self._member_change(lambda: self.core.node.remove_member(member_id, timeout_s), context)

    @_admin
    def MemberReplace(
        self, request: pb.MemberReplaceRequest, context, caller: Principal | None
    ) -> pb.MemberListResponse:
        member_id = members_api.checked_member_id(request.member_id)
        address = members_api.checked_raft_address(request.raft_address) if request.raft_address else None
        timeout_s = self.core.proposer.timeout_s(context)
        return self._member_change(lambda: self.core.node.replace_member(member_id, address, timeout_s), context)

    def _restore(self, data: bytes, epoch_floor: int, context, caller: Principal | None) -> pb.RestoreResponse:
        """Restore ``data`` through the log in chunks (backups.restore)."""
        remaining = context.time_remaining()
        commit_timeout_s = backups.RESTORE_COMMIT_TIMEOUT_S_MAX if remaining is None else max(
            self.core.proposer.timeout_s(context),
            min(backups.RESTORE_COMMIT_TIMEOUT_S_MAX, remaining - self.core.proposer.deadline_margin_s),
        )
        run = functools.partial(self.core.run, context=context, caller=caller)
        result, index = backups.restore(
            run, self.core.node.state_machine.check_backup, data, epoch_floor, commit_timeout_s
        )
        return pb.RestoreResponse(header=self.core.header(index), epoch=result["epoch"])
