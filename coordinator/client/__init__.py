"""The client layer: what a service embeds to take leases and make fenced writes.

Owns: ``FencingClient`` and ``Lease`` (``sync``), ``AsyncFencingClient`` and ``AsyncLease``
(``aio``), both on one base (``_base``) with one retry policy (``retry``); the result
dataclasses (``results``); the exception tree (``exceptions``); token proofs and external
guards (``proof``, ``guard``); and the ``fencingctl`` command.
Must never: import ``coordinator.raft`` or ``coordinator.server`` (a client runs without
them), or report an outcome it does not know: after an attempt that may have applied it
says OutcomeUnknown.

The public surface is re-exported here: ``from coordinator.client import FencingClient``.
"""

from coordinator.client.sync import (
    DEFAULT_ENDPOINTS,
    AcquireResult,
    AsyncFencingClient,
    AsyncLease,
    ClusterStatus,
    DeleteResult,
    Description,
    EpochResult,
    FencingClient,
    ForceReleaseResult,
    Header,
    KeepAliveItem,
    KeepAliveResult,
    Lease,
    Member,
    ReadResult,
    ReleaseResult,
    Snapshot,
    WriteResult,
    new_op_id,
    open_channel,
    tls_credentials,
)

__all__ = [
    "DEFAULT_ENDPOINTS",
    "AcquireResult",
    "AsyncFencingClient",
    "AsyncLease",
    "ClusterStatus",
    "DeleteResult",
    "Description",
    "EpochResult",
    "FencingClient",
    "ForceReleaseResult",
    "Header",
    "KeepAliveItem",
    "KeepAliveResult",
    "Lease",
    "Member",
    "ReadResult",
    "ReleaseResult",
    "Snapshot",
    "WriteResult",
    "new_op_id",
    "open_channel",
    "tls_credentials",
]
