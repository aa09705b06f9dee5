"""The in-memory Raft node of the test cluster: RaftNode's facade over one shared log.

Owns: ``SharedLog`` (one ``FencingStateMachine`` every node sees at once, its applied index,
the stamp clock, which member the nodes name as leader, slow commits still to land),
``InMemoryNode`` (what ``coordinator/server/service.py`` and ``app.py`` use of
``coordinator.raft.node.RaftNode``: propose, read, status, term_and_applied, is_leader,
leader_address, next_stamp_ms, close), and the one place that builds ``ProposeResult``
values. Commands apply in one order under one lock; an injected fault, when there is one,
decides a proposal's fate instead (``inmemory_faults``).
Must never: import pysyncobj or gRPC, or elect anything: the leader is what a test sets, and
proposals apply whoever it is (a test that wants "no leader" to fail them injects that).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from coordinator.core import commands, limits
from coordinator.core.state_machine import FencingStateMachine, Rejected
from coordinator.raft.interface import ProposeFailure, ProposeOutcome, ProposeResult
from coordinator.raft.read_index import ReadIndexOutcome
from coordinator.raft.stamp_clock import StampClock

if TYPE_CHECKING:
    from testsupport.inmemory_faults import ProposeFault

# One Raft term for the whole life of the in-memory cluster: there are no elections.
TERM = 1


def member_id(index: int) -> str:
    """Member ids look like production's Raft addresses; nothing listens there."""
    return f"member-{index}.inmemory:7000"


# -- the node's answers: the one place that builds ProposeResult values ---------------------


def applied(value: Any, index: int) -> ProposeResult:
    """What the state machine said (Applied or Rejected) at ``index``, as RaftNode reports it."""
    # A retry answered from the dedup table reports where its op_id first applied.
    index = getattr(value, "first_applied_index", 0) or index
    refused = isinstance(value, Rejected)
    return ProposeResult(ProposeOutcome.REFUSED if refused else ProposeOutcome.APPLIED, value=value, index=index)


def failed(failure: ProposeFailure) -> ProposeResult:
    """NOT_APPLIED or UNKNOWN, as the failure kind says (the real node's rule)."""
    return ProposeResult.failed(failure)


def _op_of(command: bytes) -> commands.Op | None:
    try:
        return commands.decode(command).op
    except commands.MalformedCommand:  # a test may append bytes that are no command on purpose
        return None


# -- one log shared by every node ----------------------------------------------------------


class SharedLog:
    """The replicated state every node sees at once: a state machine, its applied index, the
    stamp clock and which member the nodes name as leader."""

    def __init__(self) -> None:
        self.state_machine = FencingStateMachine()
        self.lock = threading.RLock()  # apply vs readers; re-entered by read(fn) callbacks
        self.applied = threading.Condition(self.lock)  # notified after every entry (wait_applied)
        self.applied_index = 0
        # The op of every entry appended, in log order: a test that counts one call's entries
        # tells them from others' (a leader discovery's Status barriers may land meanwhile).
        # None: an entry that is no command (malformed bytes, or a refusal appended as such).
        self.ops: list[commands.Op | None] = []
        self.leader: str | None = None
        self._stamp_clock = StampClock()
        self._timers: list[threading.Timer] = []
        self._closed = False
        # Each member's Watch feed (RaftNode.watch_applied), called under ``lock`` per entry.
        self.appliers: dict[int, Callable[[int, Any], None]] = {}

    def next_stamp_ms(self) -> int:
        """DESIGN I6, as RaftNode's leader stamps (one log: one term, always led)."""
        with self.lock:
            return self._stamp_clock.stamp(term=0, leading=True, log_clock_ms=self.state_machine.log_clock_ms)

    def append(self, command: bytes) -> ProposeResult:
        """Commit and apply ``command`` as the next entry."""
        with self.lock:
            self.applied_index += 1
            self.ops.append(_op_of(command))
            value = self.state_machine.apply(command, self.applied_index)
            for on_applied in list(self.appliers.values()):
                on_applied(self.applied_index, value)
            self.applied.notify_all()
            return applied(value, self.applied_index)

    def append_refused(self, refusal: Rejected) -> ProposeResult:
        """An entry the state machine refuses with ``refusal`` (changing nothing, as refusals do)."""
        with self.lock:
            self.applied_index += 1
            self.ops.append(None)
            return applied(refusal, self.applied_index)

    def append_later(self, command: bytes, delay_s: float, done: Callable[[ProposeResult], None]) -> None:
        """Commit ``command`` after ``delay_s`` (a slow commit), unless the cluster closes first."""

        def commit() -> None:
            with self.lock:
                if self._closed:
                    return
            done(self.append(command))

        timer = threading.Timer(delay_s, commit)
        timer.daemon = True
        with self.lock:
            self._timers.append(timer)
        timer.start()

    def wait_slow_commits(self, timeout_s: float) -> bool:
        """Wait until every slow commit started so far has landed; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            timers = list(self._timers)
        for timer in timers:
            timer.join(max(0.0, deadline - time.monotonic()))
        return not any(timer.is_alive() for timer in timers)

    def close(self) -> None:
        with self.lock:
            self._closed = True
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()


@dataclasses.dataclass(frozen=True)
class _NodeConfig:
    self_address: str  # the member id (a Raft address in production)


class InMemoryNode:
    """One member's view of the shared log, with RaftNode's facade (no Raft, no pysyncobj)."""

    def __init__(self, log: SharedLog, index: int, next_fault: Callable[[], ProposeFault | None]) -> None:
        """``next_fault()``: the fault queued for the proposal being made now, if any."""
        self.config = _NodeConfig(self_address=member_id(index))
        self.index = index
        self.log = log
        self._next_fault = next_fault

    @property
    def state_machine(self) -> FencingStateMachine:
        return self.log.state_machine

    def next_stamp_ms(self) -> int:
        return self.log.next_stamp_ms()

    def propose(
        self, command: bytes, timeout_s: float, *, max_bytes: int = limits.COMMAND_BYTES_MAX, batch_key: Any = None
    ) -> ProposeResult:
        """Apply ``command`` now, or let an injected fault decide its fate."""
        if len(command) > max_bytes:
            return failed(ProposeFailure.COMMAND_TOO_LARGE)
        fault = self._next_fault()
        if fault is None:
            return self.log.append(command)
        return fault.decide(self, command, timeout_s)

    def read(self, fn: Callable[[FencingStateMachine], Any]) -> Any:
        with self.log.lock:
            return fn(self.log.state_machine)

    def read_index(self, fn: Callable[[FencingStateMachine], Any], timeout_s: float) -> tuple[Any, Any, int]:
        """RaftNode.read_index: no heartbeat rounds here, so always "use the log" (the READ_BARRIER
        entry, where a queued fault can decide the read's fate as it decides a write's)."""
        return ReadIndexOutcome.NOT_READY, None, 0

    def wait_applied(self, fn: Callable[[FencingStateMachine], Any], timeout_s: float) -> Any:
        """RaftNode.wait_applied: ``fn`` again after every entry, until truthy or timeout."""
        with self.log.applied:
            return self.log.applied.wait_for(lambda: fn(self.log.state_machine), max(0.0, timeout_s))

    def watch_applied(self, on_applied: Callable[[int, Any], None], on_loaded: Callable[[int], None]) -> int:
        """RaftNode.watch_applied (one log, never a snapshot: ``on_loaded`` is never called)."""
        with self.log.lock:
            self.log.appliers[self.index] = on_applied
            return self.log.applied_index

    def wake_waiters(self) -> None:
        """RaftNode.wake_waiters: every ``wait_applied`` checks its ``fn`` again now."""
        with self.log.applied:
            self.log.applied.notify_all()

    def status(self) -> dict[str, Any]:
        with self.log.lock:
            index, leader = self.log.applied_index, self.log.leader
        return {
            "self": self.config.self_address,
            "leader": leader,
            "is_leader": leader == self.config.self_address,
            "term": TERM,
            "commit_index": index,
            "last_applied": index,
            "has_quorum": leader is not None,
            "log_len": index,
            "ready": True,
        }

    def term_and_applied(self) -> tuple[int, int]:
        return TERM, self.log.applied_index

    def is_leader(self) -> bool:
        return self.log.leader == self.config.self_address

    def leader_address(self) -> str | None:
        return self.log.leader

    def close(self) -> None:
        """Nothing to release: the log belongs to the cluster."""
