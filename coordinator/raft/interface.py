"""What callers of the Raft layer see: the state machine they hand in, the answer they get back.

Owns: the ``StateMachine`` protocol ``RaftNode`` replicates, and ``propose()``'s answer:
``ProposeOutcome`` (applied, refused, not applied, unknown), ``ProposeFailure`` (why not
applied or why unknown, typed) and ``ProposeResult``.
Must never: import pysyncobj (the server's error table imports this module; translating
pysyncobj's fail codes is ``node.py``'s job), or interpret a command.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol


class StateMachine(Protocol):
    """What ``RaftNode`` needs from the state machine it replicates.

    ``apply`` and ``restore`` run on the Raft thread under the node's apply lock, the same
    commands in the same order on every member; an exception escaping either stops the
    process (it would otherwise be re-applied forever). Refusals are values, not exceptions.
    """

    def apply(self, command: bytes, index: int) -> Any:
        """Apply one committed command at Raft ``index``; return its result (a value)."""

    def snapshot(self) -> Any:
        """The whole state as msgpack-able data (written into the snapshot file)."""

    def restore(self, state: Any) -> None:
        """Replace the whole state with what ``snapshot`` returned."""

    def digest(self) -> str:
        """A hash of the state: equal on members that applied the same commands."""

    @property
    def log_clock_ms(self) -> int:
        """The newest command stamp applied; ``RaftNode.next_stamp_ms`` never goes below it."""

    # Optional: a ``snapshot_deferred`` property, True while a snapshot would free nothing
    # (it would hold what the journal entries it replaces hold): no compaction starts then.
    # Optional: ``snapshot_pieces()``, an iterator of bytes whose concatenation is ``snapshot()``
    # as it was when the first non-empty piece was read (which must then return bytes). The
    # snapshot writer thread takes the apply lock for each piece; nothing is applied until the
    # first non-empty one is read, and entries are applied between the later ones, so the state machine must keep
    # what they change as it was (copy-on-write; replica.py). A snapshot then holds neither
    # the Raft thread nor applying for the whole state.


class ProposeOutcome(enum.Enum):
    APPLIED = "applied"  # committed and applied; the state machine accepted it
    REFUSED = "refused"  # committed and applied; the state machine refused it (a value)
    NOT_APPLIED = "not_applied"  # definitely never applied: safe to retry anywhere
    UNKNOWN = "unknown"  # may or may not apply: retry with the same op_id


class ProposeFailure(enum.Enum):
    """Why a command was not applied (NOT_APPLIED) or may not have been (UNKNOWN).

    Values are the ``detail`` strings clients have always seen in ErrorInfo metadata.
    """

    # Definite: the entry was never appended by a leader, or was overwritten (RAFT.md
    # "Call semantics"), or never left this member.
    QUEUE_FULL = "queue_full"
    NO_LEADER = "no_leader"
    NOT_LEADER = "not_leader"
    REQUEST_DENIED = "request_denied"
    DISCARDED = "discarded"
    COMMAND_TOO_LARGE = "command_too_large"
    # Ambiguous: it may still commit and apply.
    LEADER_CHANGED = "leader_changed"
    UNKNOWN_OUTCOME = "unknown_outcome"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    UNRECOGNIZED = "fail_reason"  # a pysyncobj fail code we do not know: never guess

    @property
    def outcome(self) -> ProposeOutcome:
        return ProposeOutcome.NOT_APPLIED if self in _DEFINITE else ProposeOutcome.UNKNOWN


_DEFINITE = frozenset(
    {
        ProposeFailure.QUEUE_FULL,
        ProposeFailure.NO_LEADER,
        ProposeFailure.NOT_LEADER,
        ProposeFailure.REQUEST_DENIED,
        ProposeFailure.DISCARDED,
        ProposeFailure.COMMAND_TOO_LARGE,
    }
)


@dataclasses.dataclass(frozen=True)
class ProposeResult:
    outcome: ProposeOutcome
    value: Any = None  # the state machine's result (APPLIED / REFUSED)
    index: int = 0  # the Raft index it was applied at (APPLIED / REFUSED)
    failure: ProposeFailure | None = None  # why, for NOT_APPLIED / UNKNOWN
    detail: str = ""  # the failure for humans and ErrorInfo metadata ("fail_reason_9")

    def __post_init__(self) -> None:
        if self.failure is None:
            consistent = self.outcome in (ProposeOutcome.APPLIED, ProposeOutcome.REFUSED)
        else:
            consistent = self.failure.outcome is self.outcome
        if not consistent:
            raise ValueError(f"{self.outcome} cannot carry failure {self.failure}")

    @classmethod
    def failed(cls, failure: ProposeFailure, detail: str = "") -> ProposeResult:
        """NOT_APPLIED or UNKNOWN, as ``failure`` says; ``detail`` defaults to its value."""
        return cls(failure.outcome, failure=failure, detail=detail or failure.value)


class MemberRefusal(enum.Enum):
    """Why a membership change was refused before anything was proposed (nothing changed)."""

    CHANGE_IN_PROGRESS = "change_in_progress"  # the last CONFIG is uncommitted, or a learner is catching up
    UNKNOWN_MEMBER = "unknown_member"  # no member with that id
    MEMBER_EXISTS = "member_exists"  # the id or the address is in the configuration already
    TOO_FEW_VOTERS = "too_few_voters"  # it would remove the last voter
    INVALID = "invalid"  # an id or address the configuration cannot hold
    NO_CONFIGURATION = "no_configuration"  # the cluster has not bootstrapped yet


@dataclasses.dataclass(frozen=True)
class MemberChangeResult:
    """What happened to one membership change (``RaftNode.add_member`` and friends).

    ``APPLIED``: its CONFIG entry committed at ``index``. ``NOT_APPLIED``: nothing was proposed,
    because of ``refusal`` (a precondition; ``detail`` says which) or ``failure`` (no leader
    here: retry at the leader). ``UNKNOWN``: the entry may still commit (``failure`` says why).
    """

    outcome: ProposeOutcome
    index: int = 0
    failure: ProposeFailure | None = None
    refusal: MemberRefusal | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.outcome is ProposeOutcome.APPLIED:
            consistent = self.failure is None and self.refusal is None
        elif self.refusal is not None:
            consistent = self.failure is None and self.outcome is ProposeOutcome.NOT_APPLIED
        else:
            consistent = self.failure is not None and self.failure.outcome is self.outcome
        if not consistent:
            raise ValueError(f"{self.outcome} cannot carry failure {self.failure} / refusal {self.refusal}")

    @classmethod
    def refused(cls, refusal: MemberRefusal, detail: str) -> MemberChangeResult:
        return cls(ProposeOutcome.NOT_APPLIED, refusal=refusal, detail=detail)

    @classmethod
    def failed(cls, failure: ProposeFailure, detail: str = "") -> MemberChangeResult:
        return cls(failure.outcome, failure=failure, detail=detail or failure.value)
