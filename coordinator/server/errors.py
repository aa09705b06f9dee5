"""Every failure the API can report, and the one table that maps it to a gRPC status.

Owns: ``STATUS_TABLE`` (DESIGN §4), the ``ServiceError`` value the service layer raises,
its construction from state-machine refusals and from ``propose()`` failures, and the rich
status (``google.rpc.Status`` with one ``google.rpc.ErrorInfo``) sent to clients.
Must never: decide whether something failed (the state machine and the Raft node do);
carry anything but strings in ErrorInfo metadata.

Layers (the etcd way: transport-free sentinels, then one table)::

    state_machine.Reason ─┐
    Failure (below)  ─────┼─> STATUS_TABLE ─> (grpc.StatusCode, ErrorInfo.reason)
                          ┘

| key | status | ErrorInfo.reason | metadata |
|---|---|---|---|
| Failure.INVALID_INPUT, Reason.MALFORMED | INVALID_ARGUMENT | INVALID_FIELD | field |
| Reason.STALE_TOKEN | FAILED_PRECONDITION | STALE_TOKEN | hwm |
| Reason.UNKNOWN_TOKEN | FAILED_PRECONDITION | UNKNOWN_TOKEN | hwm |
| Reason.LEASE_HELD | FAILED_PRECONDITION | LEASE_HELD | holder, expires_at_ms, token, remaining_ms |
| Reason.LEASE_EXPIRED | FAILED_PRECONDITION | LEASE_EXPIRED | |
| Reason.VERSION_MISMATCH | FAILED_PRECONDITION | VERSION_MISMATCH | version |
| Reason.EPOCH_FLOOR_TOO_LOW | FAILED_PRECONDITION | EPOCH_FLOOR_TOO_LOW | epoch |
| Reason.OP_ID_CONFLICT | ALREADY_EXISTS | OP_ID_CONFLICT | op, resource |
| Reason.LIMIT_EXCEEDED, Failure.COMMAND_TOO_LARGE | RESOURCE_EXHAUSTED | LIMIT_EXCEEDED | limit, max |
| Reason.QUOTA_EXCEEDED | RESOURCE_EXHAUSTED | QUOTA_EXCEEDED | quota, max, principal |
| Reason.EPOCH_EXHAUSTED | RESOURCE_EXHAUSTED | EPOCH_EXHAUSTED | |
| Failure.OVERLOADED, Failure.QUEUE_FULL | RESOURCE_EXHAUSTED | OVERLOADED | |
| Failure.NO_LEADER | UNAVAILABLE | NO_LEADER | leader, leader_api (may be "") |
| Failure.OUTCOME_UNKNOWN | ABORTED | OUTCOME_UNKNOWN | detail |
| Failure.UNAUTHENTICATED | UNAUTHENTICATED | UNAUTHENTICATED | |
| Failure.PERMISSION_DENIED | PERMISSION_DENIED | PERMISSION_DENIED | |
| Failure.MEMBER_CHANGE_REFUSED | FAILED_PRECONDITION | MEMBER_CHANGE_REFUSED | detail |
| Failure.UNKNOWN_MEMBER | NOT_FOUND | UNKNOWN_MEMBER | detail |
| Failure.CLUSTER_LEVEL_TOO_LOW | FAILED_PRECONDITION | CLUSTER_LEVEL_TOO_LOW | needed_level, cluster_level |
| Failure.COMPACTED | OUT_OF_RANGE | COMPACTED | current_revision, oldest_revision |

The reason strings, the metadata keys, the domain and the trailer names are declared once,
in ``coordinator/core/names.py``; the client reads them from there too.

NO_LEADER means definitely not applied: retry anywhere. OUTCOME_UNKNOWN means the entry may
still apply: retry with the same op_id (DESIGN I5); it is never reported as a failure.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from coordinator.core.names import DOMAIN, ErrorMeta, ErrorReason
from coordinator.core.state_machine import Reason, Rejected
from coordinator.raft.interface import MemberChangeResult, MemberRefusal, ProposeFailure, ProposeResult


class Failure(enum.Enum):
    """Failures that are not state-machine refusals."""

    INVALID_INPUT = "invalid_input"  # refused by validation before proposing
    NO_LEADER = "no_leader"  # propose: no leader / not leader / denied / discarded
    QUEUE_FULL = "queue_full"  # propose: the Raft node's command queue is full
    OVERLOADED = "overloaded"  # the in-flight proposal bound is reached
    COMMAND_TOO_LARGE = "command_too_large"  # propose: encoded command over its cap
    OUTCOME_UNKNOWN = "outcome_unknown"  # propose: may or may not have applied
    UNAUTHENTICATED = "unauthenticated"  # no (or an unknown) bearer credential where one is needed
    PERMISSION_DENIED = "permission_denied"  # a known caller, not allowed this resource or Admin
    MEMBER_CHANGE_REFUSED = "member_change_refused"  # a membership change's precondition failed
    UNKNOWN_MEMBER = "unknown_member"  # a membership change named no member of the configuration
    CLUSTER_LEVEL_TOO_LOW = "cluster_level_too_low"  # the request needs a later build on every member
    COMPACTED = "compacted"  # Watch: the start revision is older than the member's history


_C = grpc.StatusCode
_R = ErrorReason

# The one table. Keys: every state_machine.Reason and every Failure.
STATUS_TABLE: dict[Reason | Failure, tuple[grpc.StatusCode, ErrorReason]] = {
    Failure.INVALID_INPUT: (_C.INVALID_ARGUMENT, _R.INVALID_FIELD),
    Reason.MALFORMED: (_C.INVALID_ARGUMENT, _R.INVALID_FIELD),
    Reason.STALE_TOKEN: (_C.FAILED_PRECONDITION, _R.STALE_TOKEN),
    Reason.UNKNOWN_TOKEN: (_C.FAILED_PRECONDITION, _R.UNKNOWN_TOKEN),
    Reason.LEASE_HELD: (_C.FAILED_PRECONDITION, _R.LEASE_HELD),
    Reason.LEASE_EXPIRED: (_C.FAILED_PRECONDITION, _R.LEASE_EXPIRED),
    Reason.VERSION_MISMATCH: (_C.FAILED_PRECONDITION, _R.VERSION_MISMATCH),
    Reason.OP_ID_CONFLICT: (_C.ALREADY_EXISTS, _R.OP_ID_CONFLICT),
    Reason.LIMIT_EXCEEDED: (_C.RESOURCE_EXHAUSTED, _R.LIMIT_EXCEEDED),
    Failure.COMMAND_TOO_LARGE: (_C.RESOURCE_EXHAUSTED, _R.LIMIT_EXCEEDED),
    Reason.QUOTA_EXCEEDED: (_C.RESOURCE_EXHAUSTED, _R.QUOTA_EXCEEDED),
    Reason.EPOCH_EXHAUSTED: (_C.RESOURCE_EXHAUSTED, _R.EPOCH_EXHAUSTED),
    Failure.OVERLOADED: (_C.RESOURCE_EXHAUSTED, _R.OVERLOADED),
    Failure.QUEUE_FULL: (_C.RESOURCE_EXHAUSTED, _R.OVERLOADED),
    Failure.NO_LEADER: (_C.UNAVAILABLE, _R.NO_LEADER),
    Failure.OUTCOME_UNKNOWN: (_C.ABORTED, _R.OUTCOME_UNKNOWN),
    Failure.UNAUTHENTICATED: (_C.UNAUTHENTICATED, _R.UNAUTHENTICATED),
    Failure.PERMISSION_DENIED: (_C.PERMISSION_DENIED, _R.PERMISSION_DENIED),
    Reason.EPOCH_FLOOR_TOO_LOW: (_C.FAILED_PRECONDITION, _R.EPOCH_FLOOR_TOO_LOW),
    Failure.MEMBER_CHANGE_REFUSED: (_C.FAILED_PRECONDITION, _R.MEMBER_CHANGE_REFUSED),
    Failure.UNKNOWN_MEMBER: (_C.NOT_FOUND, _R.UNKNOWN_MEMBER),
    Failure.CLUSTER_LEVEL_TOO_LOW: (_C.FAILED_PRECONDITION, _R.CLUSTER_LEVEL_TOO_LOW),
    Failure.COMPACTED: (_C.OUT_OF_RANGE, _R.COMPACTED),
}
assert all(key in STATUS_TABLE for key in (*Reason, *Failure)), "every failure needs a status"

# Why propose() did not apply (or may not have applied) -> Failure. Every member is listed
# (checked below and by a test); the ErrorInfo "detail" metadata is the result's detail.
PROPOSE_FAILURES: dict[ProposeFailure, Failure] = {
    ProposeFailure.NO_LEADER: Failure.NO_LEADER,
    ProposeFailure.NOT_LEADER: Failure.NO_LEADER,
    ProposeFailure.REQUEST_DENIED: Failure.NO_LEADER,
    ProposeFailure.DISCARDED: Failure.NO_LEADER,
    ProposeFailure.QUEUE_FULL: Failure.QUEUE_FULL,
    ProposeFailure.COMMAND_TOO_LARGE: Failure.COMMAND_TOO_LARGE,
    ProposeFailure.LEADER_CHANGED: Failure.OUTCOME_UNKNOWN,
    ProposeFailure.UNKNOWN_OUTCOME: Failure.OUTCOME_UNKNOWN,
    ProposeFailure.DEADLINE_EXCEEDED: Failure.OUTCOME_UNKNOWN,
    ProposeFailure.UNRECOGNIZED: Failure.OUTCOME_UNKNOWN,
}
assert set(PROPOSE_FAILURES) == set(ProposeFailure), "every propose failure needs a Failure"


def _metadata_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


@dataclasses.dataclass
class ServiceError(Exception):
    """A failure on its way to the client: a table key, a message and string metadata."""

    key: Reason | Failure
    message: str
    metadata: dict[Any, Any] = dataclasses.field(default_factory=dict)  # str: str once constructed
    index: int = 0  # the Raft index of a refused entry (0: none)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        self.metadata = {str(k): _metadata_value(v) for k, v in self.metadata.items()}

    @property
    def code(self) -> grpc.StatusCode:
        return STATUS_TABLE[self.key][0]

    @property
    def reason(self) -> ErrorReason:
        return STATUS_TABLE[self.key][1]


# What counts one error sent to a client, by its reason (``Metrics.count_refusal``).
CountRefusal = Callable[[ErrorReason], None]


def uncounted(reason: ErrorReason) -> None:
    """Where a member exports no metrics: the refusals it sends are not counted (with
    metrics, ``Metrics.count_refusal`` counts each by reason instead)."""


def invalid(field: str, message: str) -> ServiceError:
    return ServiceError(Failure.INVALID_INPUT, message, {ErrorMeta.FIELD: field})


def from_refusal(refusal: Rejected, index: int = 0) -> ServiceError:
    """The error for a state-machine refusal; its details become metadata."""
    return ServiceError(refusal.reason, refusal.message, dict(refusal.details), index=index)


# What to do after an unknown outcome: an op_id makes a retry safe; a member change has none.
RETRY_SAME_OP_ID = "the entry may still apply; retry with the same op_id"
RETRY_AFTER_MEMBER_LIST = "the change may still apply; the member list says whether it did, check it before a retry"


def from_propose_failure(result: ProposeResult, leader: str = "", leader_api: str = "", *,
                         unknown_hint: str = RETRY_SAME_OP_ID) -> ServiceError:
    """The error for a NOT_APPLIED or UNKNOWN propose result."""
    assert result.failure is not None  # a NOT_APPLIED or UNKNOWN result says why
    failure, detail = PROPOSE_FAILURES[result.failure], result.detail
    if failure is Failure.OUTCOME_UNKNOWN:
        return ServiceError(failure, f"the outcome is unknown ({detail}): {unknown_hint}", {"detail": detail})
    if failure is Failure.NO_LEADER:
        return ServiceError(
            failure,
            f"not applied ({detail}): no leader reachable; safe to retry on any member",
            {"leader": leader, "leader_api": leader_api, "detail": detail},
        )
    if failure is Failure.QUEUE_FULL:
        return ServiceError(failure, "the Raft command queue is full; retry later", {"detail": detail})
    return ServiceError(failure, f"not applied ({detail})", {"detail": detail})


def cluster_level_too_low(needed: int, cluster_level: int) -> ServiceError:
    """A request that needs entry level ``needed`` while the cluster is at ``cluster_level``:
    proposing it would stop every member of an older build (DESIGN §8 "Rolling upgrades")."""
    return ServiceError(
        Failure.CLUSTER_LEVEL_TOO_LOW,
        f"not applied: this request needs entry level {needed}, and the cluster is at level {cluster_level}"
        " until every member runs a build of that level (a rolling upgrade in progress); retry after it",
        {ErrorMeta.NEEDED_LEVEL: needed, ErrorMeta.CLUSTER_LEVEL: cluster_level},
    )


def read_not_confirmed() -> ServiceError:
    """A read whose leadership confirmation missed the caller's deadline. The same status as
    an entry's unknown outcome (clients already retry it), but a read changes nothing."""
    detail = "read not confirmed by a majority before the deadline"
    return ServiceError(Failure.OUTCOME_UNKNOWN, f"{detail}; a read changes nothing: safe to retry", {"detail": detail})


def from_member_change(result: MemberChangeResult, leader: str = "", leader_api: str = "") -> ServiceError:
    """The error for a membership change that was refused, not applied or may still apply."""
    if result.refusal is None:
        assert result.failure is not None  # not refused: not applied, or unknown, and why
        return from_propose_failure(ProposeResult.failed(result.failure, result.detail), leader, leader_api,
                                    unknown_hint=RETRY_AFTER_MEMBER_LIST)
    if result.refusal is MemberRefusal.INVALID:
        return invalid("member", result.detail)
    failure = (
        Failure.UNKNOWN_MEMBER if result.refusal is MemberRefusal.UNKNOWN_MEMBER else Failure.MEMBER_CHANGE_REFUSED
    )
    return ServiceError(failure, f"nothing changed: {result.detail}", {"detail": result.refusal.value})


def rich_status(error: ServiceError, trailing: Iterable[tuple[str, str]] = ()) -> grpc.Status:
    """A grpc.Status carrying google.rpc.Status + ErrorInfo, plus extra trailing metadata."""
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=error.code.value[0], message=error.message, details=[detail])
    base = rpc_status.to_status(status)
    return _Status(base.code, base.details, tuple(base.trailing_metadata) + tuple(trailing))


@dataclasses.dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple


def abort(context: grpc.ServicerContext, error: ServiceError, trailing: Iterable[tuple[str, str]] = ()) -> NoReturn:
    """End the RPC with ``error`` (raises, like ``context.abort``)."""
    context.abort_with_status(rich_status(error, trailing))
    raise AssertionError("abort_with_status returned")  # pragma: no cover
