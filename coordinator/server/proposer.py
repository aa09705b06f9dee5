"""The proposer: every command this member's servicers send to Raft goes through here.

Owns: ``Proposer``, which stamps commands (the log clock, DESIGN I6), bounds the proposals in
flight on this member (``inflight_proposals_max``: one slot each, none left is OVERLOADED),
derives each proposal's deadline from its RPC's, waits for each proposal's fate, counts it in
the metrics, and turns every fate other than APPLIED into the ``ServiceError`` of
``errors``; the read-index barrier's slot and answer; whether a barrier has applied here since
start (health). One code path for one command and for many: ``propose`` is
``propose_many([command])[0]`` (raised, when it is an error).
Must never: decide a domain rule (the state machine does), queue proposals without bound,
report an unknown outcome as a failure (a deadline passed is OUTCOME_UNKNOWN: the entry may
still commit), map a fate to a status anywhere but ``errors``, or propose a command the state
machine's checks would refuse (a body is checked as it is built, ``ops``) or one that needs an
entry level above the cluster's (``_gate``: such an entry would stop members, DESIGN §8).
"""

from __future__ import annotations

import functools
import threading
import time

import grpc

from coordinator.core import commands, limits, ops
from coordinator.core.results import Result
from coordinator.raft.interface import ProposeFailure, ProposeOutcome, ProposeResult
from coordinator.raft.node import RaftNode
from coordinator.raft.read_index import ReadIndexOutcome
from coordinator.server import errors
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.metrics import Metrics

# A proposal is never given less than this, even when the RPC deadline is nearly spent:
# below it the answer would be OUTCOME_UNKNOWN almost surely.
PROPOSE_TIMEOUT_S_MIN = 0.05

Fate = ProposeResult | ServiceError


class _Round:
    """The fates of one ``propose_many`` call's proposals as they settle.

    ``pending`` starts at one, the proposing loop's own count: a callback that runs before
    the last proposal is made (a fast commit, or QUEUE_FULL, which calls back at once in the
    proposing thread) must not end the wait for the ones proposed after it."""

    def __init__(self, count: int) -> None:
        self.started = time.perf_counter()
        self.fates: list[Fate | None] = [None] * count
        self.seconds = [0.0] * count  # each proposal's time to its fate, for the metrics
        self._pending = 1
        self._lock = threading.Lock()
        self._all_done = threading.Event()

    def expect(self) -> None:
        """One more proposal whose callback ``settle`` will run."""
        with self._lock:
            self._pending += 1

    def settle(self, i: int, fate: Fate) -> None:
        """Proposal ``i``'s fate (first one wins: a callback after the deadline changes nothing)."""
        with self._lock:
            self._record(i, fate)
            self._one_less()

    def refuse(self, i: int, fate: Fate) -> None:
        """Proposal ``i`` settled before it reached Raft (no callback will come)."""
        with self._lock:
            self._record(i, fate)

    def wait(self, timeout_s: float) -> list[Fate]:
        """Every proposal is made: wait at most ``timeout_s`` for the rest, then each one's fate."""
        with self._lock:
            self._one_less()  # the loop's own count
        self._all_done.wait(max(0.0, timeout_s))
        with self._lock:
            # Still pending at the deadline: the entry may still commit (only its op_id can tell).
            late = ProposeResult.failed(ProposeFailure.DEADLINE_EXCEEDED)
            for i in range(len(self.fates)):
                self._record(i, late)
            return list(self.fates)  # type: ignore[arg-type]  # none is None any more

    def _one_less(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._all_done.set()

    def _record(self, i: int, fate: Fate) -> None:
        if self.fates[i] is None:
            self.fates[i] = fate
            self.seconds[i] = time.perf_counter() - self.started


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
        self, command: ops.Body, timeout_s: float, *, max_bytes: int | None = None,
        client_slot: bool = True,
    ) -> ProposeResult:
        """The APPLIED result of ``command``, or raise ServiceError for anything else.

        ``client_slot=False`` is for the member's own jobs (the leader's TICK), which bound
        themselves (one in flight): taking one of ``inflight_proposals_max``'s slots would
        refuse a client's call once a second where the bound is 1."""
        fate = self.propose_many([command], timeout_s, max_bytes=max_bytes, client_slot=client_slot)[0]
        if isinstance(fate, ServiceError):
            raise fate
        return fate

    def propose_many(
        self, commands_: list[ops.Body], timeout_s: float, *, max_bytes: int | None = None,
        client_slot: bool = True,
    ) -> list[Fate]:
        """Propose every command at once and wait, at most ``timeout_s`` in all, for each
        one's fate: per command its APPLIED result or the ServiceError ``propose`` raises for
        it. Each takes an in-flight slot as a proposal of its own would (none left: that one is
        OVERLOADED, the others go on), and is stamped and sized (``max_bytes``, default
        COMMAND_BYTES_MAX; only a restore raises it); concurrent ones may share an entry
        across resources (batch_key), never within one, and keep their order."""
        round_ = _Round(len(commands_))
        slots = 0
        try:
            for i, command in enumerate(commands_):
                if client_slot:
                    if not self._slots.acquire(blocking=False):
                        round_.refuse(i, self._overloaded())
                        continue
                    slots += 1
                self._submit(round_, i, command, timeout_s, max_bytes, alone=len(commands_) == 1)
            fates = round_.wait(timeout_s)
        finally:
            for _ in range(slots):
                self._slots.release()
        if self.metrics is not None:
            for fate, seconds in zip(fates, round_.seconds, strict=True):
                if not isinstance(fate, ServiceError):  # OVERLOADED was counted when refused
                    self.metrics.proposal_done(fate.outcome.value, seconds)
        return self._answers(commands_, fates)

    def _submit(
        self, round_: _Round, i: int, command: ops.Body, timeout_s: float, max_bytes: int | None,
        *, alone: bool,
    ) -> None:
        """Stamp, size, check and send proposal ``i``; its fate reaches ``round_``. The size
        first: it bounds what the checks below read, and names the byte cap."""
        encoded = ops.encode(command, self.node.next_stamp_ms())
        if len(encoded) > (limits.COMMAND_BYTES_MAX if max_bytes is None else max_bytes):
            round_.refuse(i, ProposeResult.failed(ProposeFailure.COMMAND_TOO_LARGE))
            return
        refusal = self._gate(command)
        if refusal is not None:
            round_.refuse(i, refusal)
            return
        round_.expect()
        if alone:
            # One command: the node's blocking call, the one every node offers (the in-memory
            # test node and its injected faults implement only this one); on a RaftNode it is
            # the same asynchronous proposal and wait as below.
            kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
            round_.settle(i, self.node.propose(encoded, timeout_s, batch_key=command.resource, **kwargs))
        else:
            self.node.propose_async_result(
                encoded, functools.partial(round_.settle, i), batch_key=command.resource,
            )

    def _gate(self, command: ops.Body) -> ServiceError | None:
        """Why ``command`` must not reach the log, or None (DESIGN §8 "Rolling upgrades"): an
        entry level above the cluster's (every member of an older build would stop at it).
        Its fields need no second look: a body is checked as it is built (``ops``), by the
        rules ``apply`` reads it with. Reads the cluster level under the apply lock only for
        a command that needs more than level 1."""
        needed = ops.level_needed(command)
        # SET_CLUSTER_LEVEL needs level 2 to apply, but it is what raises the level: only the
        # leader's LevelPoller proposes it (no request builds one), once every member of the
        # configuration announced the level it sets.
        if needed > commands.LEVEL_BEFORE_LEVELS and command.op is not commands.Op.SET_CLUSTER_LEVEL:
            cluster_level = self.node.read(lambda sm: sm.cluster_level)
            if needed > cluster_level:
                return errors.cluster_level_too_low(needed, cluster_level)
        return None

    def _answers(self, commands_: list[ops.Body], fates: list[Fate]) -> list[Fate]:
        """Each fate as the caller sees it: APPLIED results as they are, anything else its
        ServiceError (the leader hint read once, for every failure that needs it)."""
        leader: tuple[str, str] | None = None
        answers: list[Fate] = []
        for command, fate in zip(commands_, fates, strict=True):
            if isinstance(fate, ServiceError) or fate.outcome is ProposeOutcome.APPLIED:
                if not isinstance(fate, ServiceError) and command.op is commands.Op.READ_BARRIER:
                    self.barrier_applied.set()
                answers.append(fate)
            elif fate.outcome is ProposeOutcome.REFUSED:
                answers.append(errors.from_refusal(fate.value, fate.index))
            else:
                leader = leader or self.leader_hint()
                answers.append(errors.from_propose_failure(fate, *leader))
        return answers

    def _overloaded(self) -> ServiceError:
        """No in-flight slot left: counted now (never timed: it did not reach Raft)."""
        if self.metrics is not None:
            self.metrics.proposal_done("overloaded", None)
        return ServiceError(Failure.OVERLOADED, "too many proposals in flight on this member; retry later")

    def read_index(self, command: ops.ReadBarrier, timeout_s: float) -> tuple[Result, int] | None:
        """``command`` (a READ_BARRIER) answered by the read-index barrier: (its result,
        index), None when the leader cannot answer that way (the caller uses the log), or
        ServiceError. Takes an in-flight slot like a proposal: a read waits like one."""
        if not self._slots.acquire(blocking=False):
            raise self._overloaded()
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
        result: Result = answer.result
        return result, index
