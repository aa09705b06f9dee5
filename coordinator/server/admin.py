"""The Admin service: fenced operator calls, who may make them, and the audit log of each.

Owns: ``AdminServicer`` (ForceRelease and SetEpochFloor, which fence, DESIGN I7; snapshots
and restores, unary and streamed, bounded by ``backups.Transfers``; membership changes,
members.py), Admin authorization (a principal marked admin, or the bearer admin token, or
nobody at all on a dev cluster with neither), and the audit log: one JSON line per call
that may have changed something, and lines of calls refused for who called or what they
sent through the per-caller limiter (log_limits.py), each at most AUDIT_LINE_BYTES_MAX.
Must never: write a caller's field value whole into the log (``audit_args`` records sizes
beyond a short prefix), let a refused caller flood the log, compare the admin token other
than in constant time, or change anything but through the log (restores included).
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import time
from typing import TYPE_CHECKING, Any, cast

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core import ops
from coordinator.core.results import EpochResult, ForceReleaseResult, expect
from coordinator.server import backups, log_limits
from coordinator.server import members as members_api
from coordinator.server.auth import Principal
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.request_core import Core, build, checked_request
from coordinator.server.streams import caller_key

if TYPE_CHECKING:
    from coordinator.core.state_machine import FencingStateMachine


def audit_args(request) -> dict[str, Any]:
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
        except BaseException as exc:  # any other exit, aborts and interrupts too, is audited; re-raised
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
            let_through = self._refused_lines.admit(caller_key(principal, peer))
            if let_through is None:
                return  # counted: the caller's next line that gets through reports it
            admitted = let_through
        record = {
            "ts_ms": time.time_ns() // 1_000_000,
            "rpc": rpc,
            "principal": who["principal"],
            "peer": peer,
            "member": self.core.member_id,
            "args": audit_args(request),
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
    def ForceRelease(self, request: pb.ForceReleaseRequest, context,
                     caller: Principal | None) -> pb.ForceReleaseResponse:
        result, index = self.core.run(build(ops.ForceRelease, request, caller), context, caller)
        return pb.ForceReleaseResponse(header=self.core.header(index), hwm=expect(ForceReleaseResult, result).hwm)

    @_admin
    def SetEpochFloor(self, request: pb.SetEpochFloorRequest, context,
                      caller: Principal | None) -> pb.SetEpochFloorResponse:
        result, index = self.core.run(build(ops.SetEpochFloor, request, caller), context, caller)
        return pb.SetEpochFloorResponse(header=self.core.header(index), epoch=expect(EpochResult, result).epoch)

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
        fields = checked_request("Restore", request)
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
        # The node replicates the FencingStateMachine app.py gives it; RaftNode types it by the
        # protocol it needs, which has no backup check.
        state_machine = cast("FencingStateMachine", self.core.node.state_machine)
        result, index = backups.restore(run, state_machine.check_backup, data, epoch_floor, commit_timeout_s)
        return pb.RestoreResponse(header=self.core.header(index), epoch=result.epoch)
