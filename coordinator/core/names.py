"""The API's error vocabulary, declared once: ErrorInfo reasons, domain, metadata keys, trailers.

Owns: every string a failed call carries on the wire besides its status code and message --
the ``google.rpc.ErrorInfo`` reason and domain, the ErrorInfo metadata keys, and the names
of the trailing metadata that says who answered. The server (``coordinator.server.errors``,
``service``) writes them, the client (``coordinator.client.exceptions``) reads them, and
tests compare with them, instead of each typing the strings again.
Must never: decide which status or exception a reason maps to (``server/errors.py``'s
STATUS_TABLE and ``client/rpc_errors.py``'s table do), or import anything but ``enum``. It
sits in core because both the server and the client layer may import core
(``tests/test_layers.py``).

The members are ``StrEnum``s: each *is* its wire string, so it goes into a protobuf field,
a metadata tuple or a dict key as it is, and compares equal to the string a peer sent.
Renaming a value changes the wire contract (fencing.proto's header comment lists them).
"""

from __future__ import annotations

import enum

__all__ = ["DOMAIN", "ErrorMeta", "ErrorReason", "Trailer"]

# The ErrorInfo domain of this API (fencing.proto's package): a client ignores details
# from any other domain.
DOMAIN = "fencing.v1"


class ErrorReason(enum.StrEnum):
    """``ErrorInfo.reason`` of a failed call (DESIGN §4)."""

    INVALID_FIELD = "INVALID_FIELD"  # a malformed request field; metadata: field
    STALE_TOKEN = "STALE_TOKEN"  # token < hwm; metadata: hwm
    UNKNOWN_TOKEN = "UNKNOWN_TOKEN"  # token > hwm, never issued; metadata: hwm
    LEASE_HELD = "LEASE_HELD"  # metadata: holder, expires_at_ms, token, remaining_ms
    LEASE_EXPIRED = "LEASE_EXPIRED"
    VERSION_MISMATCH = "VERSION_MISMATCH"  # metadata: version
    EPOCH_FLOOR_TOO_LOW = "EPOCH_FLOOR_TOO_LOW"  # metadata: epoch
    OP_ID_CONFLICT = "OP_ID_CONFLICT"  # metadata: op, resource
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"  # metadata: limit, max
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"  # the caller's own quota; metadata: quota, max, principal
    EPOCH_EXHAUSTED = "EPOCH_EXHAUSTED"
    OVERLOADED = "OVERLOADED"  # shedding load: nothing applied, retry later
    NO_LEADER = "NO_LEADER"  # definitely not applied; metadata: leader, leader_api, detail
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # may still apply; metadata: detail
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # Admin membership changes: nothing was proposed. Metadata: detail (a MemberRefusal value).
    MEMBER_CHANGE_REFUSED = "MEMBER_CHANGE_REFUSED"  # a precondition (a change in progress, ...)
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"  # no member with that id in the configuration
    # Rolling upgrades: the request needs an entry level above the cluster's (some member still
    # runs an older build); nothing was proposed. Metadata: needed_level, cluster_level.
    CLUSTER_LEVEL_TOO_LOW = "CLUSTER_LEVEL_TOO_LOW"
    # Watch: the start revision is older than the member's watch history (or a snapshot
    # loaded there made a gap). Metadata: current_revision, oldest_revision.
    COMPACTED = "COMPACTED"
    # Never sent by this server; the client has read them as NO_LEADER since its first
    # version, so a peer that sends them keeps being retried the same way.
    NOT_LEADER = "NOT_LEADER"
    NO_QUORUM = "NO_QUORUM"


class ErrorMeta(enum.StrEnum):
    """Keys of ``ErrorInfo.metadata`` (values are always strings)."""

    FIELD = "field"  # the request field that failed validation
    HWM = "hwm"  # the resource's high-water mark
    HOLDER = "holder"  # the live lease's holder
    EXPIRES_AT_MS = "expires_at_ms"  # the live lease's expiry, on the log clock
    TOKEN = "token"  # the live lease's token
    REMAINING_MS = "remaining_ms"  # the live lease's TTL left, as of the refusal
    VERSION = "version"  # the key's current version (0: absent)
    EPOCH = "epoch"  # the current epoch
    OP = "op"  # the op an op_id was first used for
    RESOURCE = "resource"  # the resource an op_id was first used for
    CURRENT_REVISION = "current_revision"  # Watch: the member's last applied index
    OLDEST_REVISION = "oldest_revision"  # Watch: the oldest revision its history holds
    LIMIT = "limit"  # which limit was reached
    MAX = "max"  # that limit's (or quota's) value
    QUOTA = "quota"  # which quota of the principal was reached (resources, leases, ...)
    PRINCIPAL = "principal"  # whose quota it is
    LEADER = "leader"  # the leader's Raft address ("" when none is known)
    LEADER_API = "leader_api"  # the leader's API address ("" when none is known)
    DETAIL = "detail"  # why a proposal did not apply, or why its outcome is unknown
    NEEDED_LEVEL = "needed_level"  # the entry level a request needs
    CLUSTER_LEVEL = "cluster_level"  # the cluster's entry level, as this member applied it


class Trailer(enum.StrEnum):
    """Trailing metadata on every error: who answered, at which term and applied index
    (the ResponseHeader of a successful response, for a failed one)."""

    MEMBER_ID = "fencing-member-id"
    RAFT_TERM = "fencing-raft-term"
    APPLIED_INDEX = "fencing-applied-index"
