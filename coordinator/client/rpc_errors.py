"""From a failed gRPC call to the client's exception: the one table, and reading the call.

Owns: ``ERROR_CLASSES``, the single table from (status code, ErrorInfo reason) to an
exception class of exceptions.py; ``error_for_reason``, its lookup with the fallbacks (the
reason alone, the code alone, ServerError); ``from_rpc_error``, which reads a failed call's
status, its ``google.rpc.ErrorInfo`` and the server's trailers into that exception; and
``is_connect_failure``, the one failure that proves a mutation was never sent. Callers take
these names from ``coordinator.client.exceptions``, which re-exports them.
Must never: import the client, retry, or decide policy; it only reads what the server's own
table (``coordinator/server/errors.py``) sends, by the names both declare in
``coordinator/core/names.py`` (reasons, metadata keys, trailers).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, cast

import grpc

from coordinator.client.exceptions import (
    Compacted,
    EpochExhausted,
    EpochFloorTooLow,
    FencingError,
    Header,
    InvalidArgument,
    LeaseExpired,
    LeaseHeld,
    LimitExceeded,
    NoLeader,
    OpIdConflict,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    QuotaExceeded,
    Refused,
    ResourceExhausted,
    ServerError,
    StaleToken,
    Unauthenticated,
    Unavailable,
    UnknownMember,
    UnknownToken,
    VersionMismatch,
)
from coordinator.core.names import DOMAIN, ErrorReason, Trailer

# ---------------------------------------------------------------------------------------
# The one table. (status code, ErrorInfo reason) -> exception class; reason "" is the
# code's default (no ErrorInfo, or a reason this client does not know yet).

_C = grpc.StatusCode
_R = ErrorReason

ERROR_CLASSES: dict[tuple[grpc.StatusCode, str], type[FencingError]] = {
    (_C.INVALID_ARGUMENT, ""): InvalidArgument,
    (_C.INVALID_ARGUMENT, _R.INVALID_FIELD): InvalidArgument,
    (_C.OUT_OF_RANGE, _R.COMPACTED): Compacted,
    (_C.OUT_OF_RANGE, ""): InvalidArgument,
    (_C.FAILED_PRECONDITION, _R.STALE_TOKEN): StaleToken,
    (_C.FAILED_PRECONDITION, _R.UNKNOWN_TOKEN): UnknownToken,
    (_C.FAILED_PRECONDITION, _R.LEASE_HELD): LeaseHeld,
    (_C.FAILED_PRECONDITION, _R.LEASE_EXPIRED): LeaseExpired,
    (_C.FAILED_PRECONDITION, _R.VERSION_MISMATCH): VersionMismatch,
    (_C.FAILED_PRECONDITION, _R.EPOCH_FLOOR_TOO_LOW): EpochFloorTooLow,
    (_C.FAILED_PRECONDITION, _R.MEMBER_CHANGE_REFUSED): Refused,
    (_C.FAILED_PRECONDITION, _R.CLUSTER_LEVEL_TOO_LOW): Refused,
    (_C.FAILED_PRECONDITION, ""): Refused,
    (_C.NOT_FOUND, _R.UNKNOWN_MEMBER): UnknownMember,
    (_C.NOT_FOUND, ""): UnknownMember,
    (_C.ALREADY_EXISTS, _R.OP_ID_CONFLICT): OpIdConflict,
    (_C.ALREADY_EXISTS, ""): OpIdConflict,
    (_C.RESOURCE_EXHAUSTED, _R.LIMIT_EXCEEDED): LimitExceeded,
    (_C.RESOURCE_EXHAUSTED, _R.EPOCH_EXHAUSTED): EpochExhausted,
    (_C.RESOURCE_EXHAUSTED, _R.QUOTA_EXCEEDED): QuotaExceeded,
    (_C.RESOURCE_EXHAUSTED, _R.OVERLOADED): Overloaded,
    (_C.RESOURCE_EXHAUSTED, ""): ResourceExhausted,
    (_C.UNAVAILABLE, _R.NO_LEADER): NoLeader,
    (_C.UNAVAILABLE, _R.NOT_LEADER): NoLeader,
    (_C.UNAVAILABLE, _R.NO_QUORUM): NoLeader,
    (_C.UNAVAILABLE, _R.OVERLOADED): Overloaded,
    (_C.UNAVAILABLE, ""): Unavailable,
    (_C.ABORTED, _R.OUTCOME_UNKNOWN): OutcomeUnknown,
    (_C.ABORTED, ""): OutcomeUnknown,
    (_C.DEADLINE_EXCEEDED, ""): OutcomeUnknown,
    (_C.CANCELLED, ""): OutcomeUnknown,
    (_C.UNAUTHENTICATED, _R.UNAUTHENTICATED): Unauthenticated,
    (_C.UNAUTHENTICATED, ""): Unauthenticated,
    (_C.PERMISSION_DENIED, _R.PERMISSION_DENIED): PermissionDenied,
    (_C.PERMISSION_DENIED, ""): PermissionDenied,
}

# A reason alone decides the class when the status code is not in the table with it
# (KeepAliveMany reports per-item reasons without a status code).
_BY_REASON: dict[str, type[FencingError]] = {
    reason: cls for (_code, reason), cls in ERROR_CLASSES.items() if reason
}


def _parse_error_info(err: grpc.RpcError) -> tuple[str, dict[str, str]]:
    """(reason, metadata) of the fencing.v1 ErrorInfo in ``err``'s rich status, or ("", {})."""
    # Imported here so that importing the exceptions never needs the rich-status protos.
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    try:
        # from_call wants a grpc.Call; an RpcError raised by a call is one (it has the trailers).
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except (ValueError, AttributeError, TypeError):
        # ValueError: the rich status disagrees with the call's code/message; a server
        # that sends that is broken, and the plain status still tells us enough.
        return "", {}
    if status is None:
        return "", {}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN:
                return info.reason, dict(info.metadata)
    return "", {}


def _header_from_trailers(trailers: Mapping[str, str]) -> Header | None:
    """The Header from the trailing metadata the server puts on every error, or None."""
    member = trailers.get(Trailer.MEMBER_ID)
    if not member:
        return None
    try:
        return Header(
            member_id=member,
            raft_term=int(trailers.get(Trailer.RAFT_TERM) or 0),
            applied_index=int(trailers.get(Trailer.APPLIED_INDEX) or 0),
        )
    except ValueError:
        return None


def error_for_reason(
    reason: str,
    message: str = "",
    *,
    code: grpc.StatusCode | None = None,
    metadata: Mapping[str, str] | None = None,
    endpoint: str | None = None,
    header: Header | None = None,
    request: Mapping[str, Any] | None = None,
) -> FencingError:
    """The exception for ``(code, reason)`` from the table, falling back to the reason alone,
    then to the code alone, then to ServerError."""
    cls = ERROR_CLASSES.get((code, reason)) if code is not None else None
    if cls is None and reason:
        cls = _BY_REASON.get(reason)  # a known reason under an unexpected code
    if cls is None and code is not None:
        cls = ERROR_CLASSES.get((code, ""))
    if cls is None:
        cls = ServerError
    meta = dict(metadata or {})
    return cls(
        code=code,
        reason=reason,
        metadata=meta,
        server_message=message,
        endpoint=endpoint,
        header=header,
        request=request,
    )


def from_rpc_error(
    err: grpc.RpcError,
    *,
    endpoint: str | None = None,
    request: Mapping[str, Any] | None = None,
) -> FencingError:
    """Translate one failed gRPC call into the typed exception (the one table above).

    ``request`` is what the caller asked (resource, key, token, op_id, rpc name); it is
    kept on the exception and used in its message. The caller raises the result
    ``from err``.
    """
    code = err.code() if callable(getattr(err, "code", None)) else None
    message = err.details() if callable(getattr(err, "details", None)) else ""
    reason, metadata = _parse_error_info(err)
    trailers: dict[str, str] = {}
    if callable(getattr(err, "trailing_metadata", None)):
        # (key, value) pairs, from a sync call (its _Metadatum tuples) and an asyncio one
        # (grpc.aio.Metadata) alike; the stubs know only the sync kind, and not as tuples.
        pairs = cast("Iterable[tuple[str, str | bytes]]", err.trailing_metadata() or ())
        for key, value in pairs:
            if isinstance(value, str):
                trailers[key] = value
    return error_for_reason(
        reason,
        message or "",
        code=code,
        metadata=metadata,
        endpoint=endpoint,
        header=_header_from_trailers(trailers),
        request=request,
    )


# grpc-core's message when a channel never got a connection: nothing was sent, so even a
# mutation is definitely not applied. Every other plain UNAVAILABLE on a mutation (a reset
# or GOAWAY after the request went out) may have reached the server.
_CONNECT_FAILURE_MARKERS = (
    "failed to connect to all addresses",
    "DNS resolution failed",
    "Connection refused",
    "Name resolution failure",
)


def is_connect_failure(err: FencingError) -> bool:
    """True if ``err`` is a plain UNAVAILABLE from the transport that never connected."""
    if type(err) is not Unavailable or err.reason:
        return False
    return any(marker in err.server_message for marker in _CONNECT_FAILURE_MARKERS)
