"""The exceptions the fencing client raises, and the one table that maps gRPC errors to them.

Owns: the client's exception tree, each class's fields and friendly line, and the public
home of everything a caller catches or translates with: ``from_rpc_error``, the single
translation from a ``grpc.RpcError`` (status code + ``google.rpc.ErrorInfo`` in the rich
status) to a typed exception, and its table ``ERROR_CLASSES`` live in rpc_errors.py and are
re-exported here. Must never: import the client, retry, or decide policy; the server's own
error table lives in ``coordinator/server/errors.py``.

The tree answers the first question a caller has after a failed mutation, "did it apply?"::

    FencingError                     anything this package raises
    ├── OutcomeUnknown               MAY have applied: retry with the same op_id to learn
    │                                (OUTCOME_UNKNOWN, DEADLINE_EXCEEDED, a connection lost
    │                                after the request may have been sent)
    ├── NotApplied                   definitely changed nothing
    │   ├── Unavailable              no node could take the call in time (safe to retry)
    │   │   └── NoLeader             the cluster has no leader / no quorum right now
    │   ├── Refused                  the state machine said no; retrying will not help
    │   │   ├── StaleToken           token < hwm: a newer owner exists       .hwm .token
    │   │   │                        (an external guard raises it too)
    │   │   ├── InvalidProof         a guard: no valid proof that this token was issued
    │   │   │                        for this resource (also a ValueError)   .reason
    │   │   ├── UnknownToken         token > hwm: never issued for resource  .hwm
    │   │   ├── LeaseHeld            another live lease holds the resource
    │   │   │                        .holder .expires_at_ms .token
    │   │   ├── LeaseExpired         the lease ended; acquire a new token
    │   │   ├── VersionMismatch      expected_version did not match          .version
    │   │   ├── OpIdConflict         op_id reused for a different request
    │   │   ├── EpochFloorTooLow     restore floor not above every issued token .epoch
    │   │   └── UnknownMember        a membership change named an id the configuration lacks
    │   ├── ResourceExhausted        a limit of the cluster (RESOURCE_EXHAUSTED)
    │   │   ├── LimitExceeded        too many resources / keys / bytes
    │   │   ├── QuotaExceeded        the caller's own quota (resources, leases,
    │   │   │                        stored_bytes, streams)              .quota .max
    │   │   ├── EpochExhausted       every token up to 2**64-1 was issued
    │   │   └── Overloaded           the server is shedding load (the client backs off
    │   │                            and retries it; raised when the retries run out)
    │   ├── InvalidArgument          malformed request                       .field
    │   ├── Compacted                Watch: the start revision is older than the member's
    │   │                            history               .current_revision .oldest_revision
    │   └── AuthError
    │       ├── Unauthenticated      no credential where one is needed
    │       └── PermissionDenied     the principal may not do this
    ├── LockTimeout                  client-side: lock()'s deadline passed before the grant
    │                                (its waiter left the queue)
    ├── ServerError                  any other status (INTERNAL, UNIMPLEMENTED, ...);
    │                                for a mutation treat it like OutcomeUnknown
    └── LeaseLost                    client-side, advisory: a Lease could not be renewed
                                     or was fenced. The server's fence is the guarantee:
                                     a write with a fenced token still gets StaleToken.

Every exception raised from a server answer carries ``code`` (``grpc.StatusCode`` or None),
``reason`` (the ErrorInfo reason, "" if none), ``metadata`` (ErrorInfo metadata, strings),
``server_message`` (the status message), ``endpoint`` (who answered) and ``header``
(``Header`` from the server's ``fencing-member-id``/``-raft-term``/``-applied-index`` trailing
metadata, else None).
``str(exc)`` is one friendly line, e.g. ``token 1 is stale for orders/7 (high-water mark is 2)``;
``exc.category`` is its one-word class (``refused``, ``unavailable``, ...), which fencingctl
prints in front of it.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Mapping

import grpc

from coordinator.client import durations
from coordinator.core.names import DOMAIN, ErrorMeta, ErrorReason

__all__ = [
    "ERROR_CLASSES",
    "ERROR_DOMAIN",
    "AuthError",
    "Compacted",
    "EpochExhausted",
    "EpochFloorTooLow",
    "FencingError",
    "Header",
    "InvalidArgument",
    "InvalidProof",
    "LeaseExpired",
    "LeaseHeld",
    "LeaseLost",
    "LimitExceeded",
    "LockTimeout",
    "NoLeader",
    "NotApplied",
    "OpIdConflict",
    "OutcomeUnknown",
    "Overloaded",
    "PermissionDenied",
    "QuotaExceeded",
    "Refused",
    "ResourceExhausted",
    "ServerError",
    "StaleToken",
    "Unauthenticated",
    "Unavailable",
    "UnknownMember",
    "UnknownToken",
    "VersionMismatch",
    "error_for_reason",
    "from_rpc_error",
    "is_connect_failure",
]

# The ErrorInfo domain of this API (coordinator/core/names.py): details from other domains
# are ignored. Kept under this name because it has been part of the client's surface.
ERROR_DOMAIN = DOMAIN


@dataclasses.dataclass(frozen=True)
class Header:
    """Who answered: the ResponseHeader of every response (DESIGN §4)."""

    member_id: str
    raft_term: int
    applied_index: int


class FencingError(Exception):
    """Root of every exception the fencing client raises."""

    category = "error"

    def __init__(
        self,
        message: str = "",
        *,
        code: grpc.StatusCode | None = None,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        server_message: str = "",
        endpoint: str | None = None,
        header: Header | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.reason = str(reason)  # a plain str, also when given an ErrorReason
        self.metadata: dict[str, str] = {str(k): v for k, v in (metadata or {}).items()}
        self.server_message = server_message
        self.endpoint = endpoint
        self.header = header
        # What the caller asked (resource, key, token, op_id, ...): used in messages.
        self.request: dict[str, Any] = dict(request or {})
        super().__init__(message or self._describe())

    # Subclasses build their friendly line from their fields.
    def _describe(self) -> str:
        return self.server_message or self.reason or type(self).__name__

    @property
    def resource(self) -> str | None:
        return self.request.get("resource")

    def _int_meta(self, name: ErrorMeta) -> int | None:
        raw = self.metadata.get(name, "")
        try:
            return int(raw)
        except ValueError:
            return None


class OutcomeUnknown(FencingError):
    """The mutation may or may not have been applied (DESIGN §4).

    Retrying with the same ``op_id`` (``exc.op_id``) returns the first outcome if it did
    apply and applies it if it did not, within the dedup window (limits.DEDUP_RETENTION_MS).
    Never read this as "failed".
    """

    category = "outcome unknown"

    @property
    def op_id(self) -> bytes | None:
        return self.request.get("op_id")

    def _describe(self) -> str:
        what = self.request.get("rpc", "the request")
        text = f"{what} may or may not have been applied"
        if self.op_id:
            text += f"; retry with op id {self.op_id.hex()} to find out"
        detail = self.metadata.get(ErrorMeta.DETAIL) or self.server_message
        return f"{text} ({detail})" if detail else text


class NotApplied(FencingError):
    """Definitely nothing changed: not the data, not the hwm, not the dedup table."""


class Unavailable(NotApplied):
    """No node could take the call before the deadline; nothing was applied. Safe to retry."""

    category = "unavailable"

    @property
    def leader_hint(self) -> str:
        return self.metadata.get(ErrorMeta.LEADER_API, "")

    def _describe(self) -> str:
        return self.server_message or "no node of the cluster could take the request"


class NoLeader(Unavailable):
    """The cluster has no leader or no quorum right now (an election is likely running)."""

    def _describe(self) -> str:
        hint = self.leader_hint
        text = "the cluster has no leader right now"
        return f"{text} (last hint: {hint})" if hint else text


class Refused(NotApplied):
    """The state machine refused the request and changed nothing. Retrying will not help."""

    category = "refused"


class StaleToken(Refused):
    """token < hwm(resource): a newer owner exists. ``hwm`` is the resource's current mark.

    Raised by the cluster's fenced store, and by a guard at an external resource
    (``coordinator.client.guard``, built with ``at_guard``): one class for both fences.
    """

    @classmethod
    def at_guard(cls, resource: str, token: int, hwm: int) -> StaleToken:
        """The refusal of an external guard, which has no gRPC status (``code`` is None)."""
        return cls(
            f"token {token} for {resource!r} is stale: the resource has already accepted token {hwm}",
            reason=ErrorReason.STALE_TOKEN,
            metadata={ErrorMeta.HWM: str(hwm)},
            request={"resource": resource, "token": token},
        )

    @property
    def token(self) -> int | None:
        """The refused token (None if the caller's request did not say)."""
        return self.request.get("token")

    @property
    def hwm(self) -> int | None:
        return self._int_meta(ErrorMeta.HWM)

    def _describe(self) -> str:
        token = self.request.get("token", "?")
        return f"token {token} is stale for {self.resource or '?'} (high-water mark is {self.hwm})"


class InvalidProof(Refused, ValueError):
    """The proof does not show that the coordinator issued this token for this resource.

    Raised by ``ProofVerifier.verify`` and so by every guard, before anything is changed.
    ``reason`` is one of ``malformed``, ``unknown_key``, ``bad_signature``, ``wrong_resource``
    (the verifier's, not ErrorInfo reasons: no server sends them). Also a ValueError, as it was
    before it joined this tree.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)


class UnknownToken(Refused):
    """token > hwm(resource): that token was never issued for this resource."""

    @property
    def hwm(self) -> int | None:
        return self._int_meta(ErrorMeta.HWM)

    def _describe(self) -> str:
        token = self.request.get("token", "?")
        text = f"token {token} was never issued for {self.resource or '?'}"
        return f"{text} (high-water mark is {self.hwm})" if self.hwm is not None else text


def _log_clock_text(ms: int | None) -> str:
    if ms is None:
        return "?"
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (log clock)"
    return f"{when.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z (log clock)"


class LeaseHeld(Refused):
    """Another live lease holds the resource; Acquire again after ``expires_at_ms``."""

    @property
    def holder(self) -> str:
        return self.metadata.get(ErrorMeta.HOLDER, "")

    @property
    def expires_at_ms(self) -> int | None:
        return self._int_meta(ErrorMeta.EXPIRES_AT_MS)

    @property
    def token(self) -> int | None:
        return self._int_meta(ErrorMeta.TOKEN)

    @property
    def remaining_ms(self) -> int | None:
        """The holder's TTL left when the cluster refused (None from a member too old to say)."""
        return self._int_meta(ErrorMeta.REMAINING_MS)

    def _describe(self) -> str:
        if self.token == 0:  # no live lease, but lock waiters queued: the queue goes first
            return f"{self.resource or '?'} has lock waiters queued; {self.holder!r} is next"
        held = f"{self.resource or '?'} is held by {self.holder!r} (token {self.token})"
        if self.remaining_ms is not None:
            return f"{held}, {durations.text_ms(self.remaining_ms)} of its TTL left"
        return f"{held} until {_log_clock_text(self.expires_at_ms)}"


class LeaseExpired(Refused):
    """The lease for this token has ended (expired or released): acquire a new token."""

    def _describe(self) -> str:
        token = self.request.get("token", "?")
        return (
            f"the lease with token {token} on {self.resource or '?'} has ended; "
            "acquire a new one"
        )


class VersionMismatch(Refused):
    """expected_version did not match; ``version`` is the key's current version (0: absent)."""

    @property
    def version(self) -> int | None:
        return self._int_meta(ErrorMeta.VERSION)

    def _describe(self) -> str:
        key = self.request.get("key", "?")
        expected = self.request.get("expected_version", "?")
        return f"key {key!r} in {self.resource or '?'} is at version {self.version}, not {expected}"


class OpIdConflict(Refused):
    """The op_id was already used for a different request inside the dedup window."""

    def _describe(self) -> str:
        op_id = self.request.get("op_id")
        shown = op_id.hex() if isinstance(op_id, bytes) else "?"
        return f"op id {shown} was already used for a different request"


class EpochFloorTooLow(Refused):
    """Restore/SetEpochFloor: the floor is not above every token ever issued (I11);
    ``epoch`` is the current epoch, so a floor above it is needed."""

    @property
    def epoch(self) -> int | None:
        return self._int_meta(ErrorMeta.EPOCH)

    def _describe(self) -> str:
        floor = self.request.get("epoch_floor", self.request.get("floor", "?"))
        return f"epoch floor {floor} is too low: the epoch is already {self.epoch}; choose a higher floor"


class UnknownMember(Refused):
    """A membership change named a member id the cluster configuration does not have."""


class ResourceExhausted(NotApplied):
    """A limit of the cluster (RESOURCE_EXHAUSTED); nothing was applied."""

    category = "limit"

    def _describe(self) -> str:
        return self.server_message or "a limit of the cluster was reached"


class LimitExceeded(ResourceExhausted):
    """Too many resources, keys per resource, or bytes (coordinator/core/limits.py)."""

    def _describe(self) -> str:
        text = self.server_message or "a limit of the cluster was reached"
        limit = self.metadata.get(ErrorMeta.LIMIT)
        return f"{text} (limit: {limit})" if limit and limit not in text else text


class QuotaExceeded(ResourceExhausted):
    """The calling principal is at one of its quotas (the principals file): ``quota`` names it
    (resources, leases, stored_bytes, streams), ``max`` is its value. Others are unaffected;
    releasing leases or deleting data frees room."""

    @property
    def quota(self) -> str:
        return self.metadata.get(ErrorMeta.QUOTA, "")

    @property
    def max(self) -> int | None:
        return self._int_meta(ErrorMeta.MAX)

    def _describe(self) -> str:
        principal = self.metadata.get(ErrorMeta.PRINCIPAL, "")
        who = f"principal {principal!r}" if principal else "the caller"
        return f"{who} is at its {self.quota or '?'} quota (max {self.max if self.max is not None else '?'})"


class EpochExhausted(ResourceExhausted):
    """Every token up to 2**64-1 has been issued; no new epoch can exist."""

    def _describe(self) -> str:
        return "every fencing token has been issued (epoch exhausted)"


class Overloaded(ResourceExhausted):
    """The server is shedding load (back-pressure, not a refusal: nothing was applied).
    The client retries it with backoff; this is raised when those retries run out."""

    category = "overloaded"

    def _describe(self) -> str:
        text = "the cluster is overloaded; retry later"
        return f"{text} ({self.server_message})" if self.server_message else text


class InvalidArgument(NotApplied):
    """The request was malformed; ``field`` names the offending field when known."""

    category = "invalid argument"

    @property
    def field(self) -> str:
        return self.metadata.get(ErrorMeta.FIELD, "")

    def _describe(self) -> str:
        text = self.server_message or "malformed request"
        if self.field and f"'{self.field}'" not in text:
            return f"field {self.field!r}: {text}"
        return text


class Compacted(NotApplied):
    """Watch: the events from the revision asked for are no longer known to the member
    (older than its watch history, or before a snapshot it installed). Read the state again
    and watch from ``current_revision + 1``."""

    category = "compacted"

    @property
    def current_revision(self) -> int | None:
        return self._int_meta(ErrorMeta.CURRENT_REVISION)

    @property
    def oldest_revision(self) -> int | None:
        return self._int_meta(ErrorMeta.OLDEST_REVISION)

    def _describe(self) -> str:
        return self.server_message or f"compacted, current revision {self.current_revision}"


class AuthError(NotApplied):
    """Authentication or authorization failed (DESIGN I10)."""

    category = "permission"


class Unauthenticated(AuthError):
    """No credential where the server needs one (a wrong one is PermissionDenied)."""

    category = "unauthenticated"

    def _describe(self) -> str:
        return self.server_message or "no valid credential"


class PermissionDenied(AuthError):
    """The authenticated principal may not do this."""

    category = "permission denied"

    def _describe(self) -> str:
        return self.server_message or "the principal may not do this"


class ServerError(FencingError):
    """Any other status (INTERNAL, UNIMPLEMENTED, UNKNOWN, ...).

    For a mutation the outcome is not known; the client treats it like OutcomeUnknown
    when it decides whether to retry, but raises it as it is when it has no other answer.
    """

    category = "server error"

    def _describe(self) -> str:
        code = self.code.name if self.code is not None else "?"
        return f"{code}: {self.server_message or 'no detail'}"


class LockTimeout(FencingError):
    """Client-side: ``lock()`` gave up at its ``timeout_s`` before the lease was granted. Its
    waiter was taken out of the queue (or, if that failed, its slot expires within
    limits.LOCK_WAITER_TTL_MS; a grant that crossed the cancel is released by it)."""

    category = "timeout"

    def _describe(self) -> str:
        waited = self.request.get("timeout_s", "?")
        return f"{self.resource or '?'} was not granted within {waited} s"


class LeaseLost(FencingError):
    """Client-side and advisory: a ``Lease`` could not be renewed, or was fenced.

    ``cause`` is the exception that made the lease count as lost (a Refused subclass, or
    the last renewal failure when renewals failed past the expiry). The fence at the
    server is the guarantee: writes carrying this token are refused there with
    StaleToken once a newer token exists.
    """

    category = "lease lost"

    def __init__(self, message: str = "", *, cause: BaseException | None = None, **kwargs: Any):
        self.cause = cause
        super().__init__(message, **kwargs)

    def _describe(self) -> str:
        token = self.request.get("token", "?")
        text = f"the lease with token {token} on {self.resource or '?'} is lost"
        return f"{text}: {self.cause}" if self.cause is not None else text


# The one table and the translation of a failed call (rpc_errors.py) need the classes above,
# so they come in last: ``coordinator.client.exceptions`` stays the one place callers take
# every name of the error surface from.
from coordinator.client.rpc_errors import (  # noqa: E402 - after the classes it maps to
    ERROR_CLASSES,
    error_for_reason,
    from_rpc_error,
    is_connect_failure,
)
