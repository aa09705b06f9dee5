"""The gRPC servicers of ``fencing.v1`` Lease, FencedStore and Cluster: pb in, pb out.

Owns: each RPC's translation, and nothing more: read and check its request
into its op's typed body (``Core.build``, ``core/ops.py``), hand it to the shared core (propose,
read barrier), the lock waits (lock_wait.py) or the batch fan-out (batches.py), and build its
response from the result. The Admin service is admin.py's.
Must never: decide a domain rule (the state machine does), wait, propose or fan out itself
(the modules above do), or map an error to a status anywhere but ``errors`` (``unary`` does it
once for every call).

Every member serves every RPC. A follower proposes through its local Raft node, which
forwards the entry to the leader, and the follower answers after it has applied the entry
itself, so whatever it reads afterwards is at least that new. Reads (Describe, List, Read,
Status.epoch, Snapshot) go through the log as a READ_BARRIER entry (DESIGN I9); on the leader,
with ``read_index`` on, Read, Describe and List are answered by a read-index barrier instead, no entry
written (coordinator/raft/read_index.py), and fall back to the entry whenever it cannot answer.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client.version import distribution_version
from coordinator.core import commands, limits, ops, validation
from coordinator.core.results import (
    AcquireResult,
    DeleteResult,
    DequeueResult,
    KeepAliveResult,
    ListResult,
    ReleaseResult,
    Result,
    WriteResult,
    expect,
)
from coordinator.core.state_machine import Reason
from coordinator.server import errors
from coordinator.server import members as members_api
from coordinator.server.auth import Principal
from coordinator.server.batches import ACQUIRE_MANY, RELEASE_MANY, WRITE_MANY, KeepAlivePool, applied, serve_many
from coordinator.server.errors import ServiceError
from coordinator.server.lock_wait import LockWaits
from coordinator.server.request_core import Core, build, checked_request, unary
from coordinator.server.streams import SlotGate

# -- Lease ---------------------------------------------------------------------------------


class LeaseServicer(pb_grpc.LeaseServicer):
    def __init__(self, core: Core, *, waiters: SlotGate) -> None:
        self.core = core
        self.waits = LockWaits(core, waiters)  # Acquires and Lock calls that wait for a grant
        self._keep_alive_many = KeepAlivePool()

    def close(self) -> None:
        self._keep_alive_many.close()

    @unary
    def Acquire(self, request: pb.AcquireRequest, context, caller: Principal | None) -> pb.AcquireResponse:
        started = time.monotonic()
        command = build(ops.Acquire, request, caller)
        try:
            result, index = self.core.run(command, context, caller)
            acquired = expect(AcquireResult, result)
        except ServiceError as held:
            if held.key is not Reason.LEASE_HELD:
                raise
            acquired, index = self.waits.acquire_in_line(command, held, request.wait_ms, started, context, caller)
        return self._acquire_response(command, acquired, index)

    def _acquire_response(self, command: ops.Acquire, result: AcquireResult, index: int) -> pb.AcquireResponse:
        resource = command.resource
        return pb.AcquireResponse(
            header=self.core.header(index),
            token=result.token,
            lease_id=result.token,
            expires_at_ms=result.expires_at_ms,
            token_proof=self._proof(resource, result.token),
        )

    @unary
    def AcquireMany(self, request: pb.AcquireManyRequest, context, caller: Principal | None) -> pb.AcquireManyResponse:
        """Each item as the same Acquire alone with wait_ms 0 (``serve_many``): an item that
        asks to wait is refused alone (INVALID_ARGUMENT, field wait_ms) -- a wait would hold
        every other item's answer and a worker thread for up to ACQUIRE_WAIT_MS_MAX, which is
        what a waiting Acquire of its own is for. A LEASE_HELD item is answered as Acquire
        answers one: its op_id's grant through the lock queue if that is what it had, else
        LEASE_HELD."""
        started = time.monotonic()

        def item_body(item: pb.AcquireRequest) -> ops.Acquire:
            command = build(ops.Acquire, item, caller)
            if item.wait_ms:
                raise errors.invalid(
                    "wait_ms", f"must be 0 in AcquireMany (got {item.wait_ms}): an Acquire that waits goes on its own"
                )
            return command

        def answer(command: ops.Acquire, outcome: tuple[Result, int] | ServiceError) -> tuple[Any, int]:
            if isinstance(outcome, ServiceError) and outcome.key is Reason.LEASE_HELD:
                result, index = self.waits.acquire_in_line(command, outcome, 0, started, context, caller)
            else:
                result, index = applied(outcome, AcquireResult)
            return self._acquire_response(command, result, index), index

        results, index = serve_many(self.core, ACQUIRE_MANY, request.acquires, context, caller, item_body, answer)
        return pb.AcquireManyResponse(header=self.core.header(index), results=results)

    def _proof(self, resource: str, token: int) -> bytes:
        # Signed after the grant applied: only a token the log issued for this resource
        # ever gets a proof (a force-release's fence-only epoch never does).
        signer = self.core.proof_signer
        return b"" if signer is None else signer.sign(resource, token)

    @unary
    def Lock(self, request: pb.LockRequest, context, caller: Principal | None) -> pb.LockResponse:
        # The wait for its grant, and why it is shaped so: lock_wait.py.
        command = build(ops.Enqueue, request, caller)
        result, index = self.waits.lock(command, request.wait_ms, context, caller)
        token = result.token or 0  # None: not granted
        return pb.LockResponse(
            header=self.core.header(index),
            granted=result.granted,
            token=token,
            lease_id=token,
            expires_at_ms=result.expires_at_ms or 0,
            token_proof=self._proof(command.resource, token) if result.granted else b"",
            queued=bool(result.queued),
            position=result.position or 0,
        )

    @unary
    def CancelLock(self, request: pb.CancelLockRequest, context, caller: Principal | None) -> pb.CancelLockResponse:
        command = build(ops.Dequeue, request, caller)
        result, index = self.core.run(command, context, caller)
        dequeued = expect(DequeueResult, result)
        return pb.CancelLockResponse(
            header=self.core.header(index), cancelled=dequeued.cancelled, released=dequeued.released
        )

    def _keep_alive_command(self, request: pb.KeepAliveRequest, caller: Principal | None) -> ops.KeepAlive:
        command = build(ops.KeepAlive, request, caller)
        if request.lease_id and request.lease_id != request.token:
            raise errors.invalid("lease_id", f"lease_id {request.lease_id} must equal token {request.token} (or be 0)")
        return command

    def _keep_alive(self, request: pb.KeepAliveRequest, context, caller: Principal | None) -> pb.KeepAliveResponse:
        result, index = self.core.run(self._keep_alive_command(request, caller), context, caller)
        kept = expect(KeepAliveResult, result)
        return pb.KeepAliveResponse(
            header=self.core.header(index),
            resource=request.resource,
            token=kept.token,
            expires_at_ms=kept.expires_at_ms,
        )

    @unary
    def KeepAlive(self, request: pb.KeepAliveRequest, context, caller: Principal | None) -> pb.KeepAliveResponse:
        return self._keep_alive(request, context, caller)

    @unary
    def KeepAliveMany(
        self, request: pb.KeepAliveManyRequest, context, caller: Principal | None
    ) -> pb.KeepAliveManyResponse:
        results, index = self._keep_alive_many.serve(
            request.leases, lambda item: self._keep_alive(item, context, caller), self.core.count_refusal
        )
        return pb.KeepAliveManyResponse(header=self.core.header(index), results=results)

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

    @unary
    def Release(self, request: pb.ReleaseRequest, context, caller: Principal | None) -> pb.ReleaseResponse:
        command = build(ops.Release, request, caller)
        result, index = self.core.run(command, context, caller)
        released = expect(ReleaseResult, result)
        return pb.ReleaseResponse(header=self.core.header(index), released=released.released, hwm=released.hwm)

    @unary
    def ReleaseMany(self, request: pb.ReleaseManyRequest, context, caller: Principal | None) -> pb.ReleaseManyResponse:
        """Each item as the same Release alone (``serve_many``)."""

        def item_body(item: pb.ReleaseRequest) -> ops.Release:
            return build(ops.Release, item, caller)

        def answer(command: ops.Release, outcome: tuple[Result, int] | ServiceError) -> tuple[Any, int]:
            result, index = applied(outcome, ReleaseResult)
            response = pb.ReleaseResponse(
                header=self.core.header(index), released=result.released, hwm=result.hwm)
            return response, index

        results, index = serve_many(self.core, RELEASE_MANY, request.releases, context, caller, item_body, answer)
        return pb.ReleaseManyResponse(header=self.core.header(index), results=results)

    @unary
    def Describe(self, request: pb.DescribeRequest, context, caller: Principal | None) -> pb.DescribeResponse:
        resource = checked_request("Describe", request)["resource"]
        result, index = self.core.barrier(context, caller, resource, read_index=True)
        lease = result.lease
        return pb.DescribeResponse(
            header=self.core.header(index),
            resource=resource,
            held=lease is not None,
            holder="" if lease is None else lease.holder,
            token=0 if lease is None else lease.token,
            hwm=result.hwm,
            expires_at_ms=0 if lease is None else lease.expires_at_ms,
            log_clock_ms=result.log_clock_ms,
            waiters=result.waiters or 0,
        )

    # ---- List (issue 29 point 4)
    @unary
    def List(self, request: pb.ListRequest, context, caller: Principal | None) -> pb.ListResponse:
        fields = checked_request("List", request)
        prefix = fields["prefix"] or ""
        limit = limits.LIST_LIMIT_DEFAULT if fields["limit"] is None else fields["limit"]
        after = None
        if fields["page_token"] is not None:
            token_prefix, after = fields["page_token"]
            if token_prefix != prefix:
                raise errors.invalid(
                    "page_token", f"continues a listing of prefix {token_prefix!r}, not {prefix!r}"
                )
        covered = self.core.list_prefixes(caller, prefix)
        command = ops.ReadBarrier(prefixes=covered, limit=limit, after=after)
        result, index = self.core.read(command, context, caller, read_index=True)
        page = expect(ListResult, result)
        items = [pb.ListedResource(**dataclasses.asdict(item)) for item in page.resources]
        more = page.more and bool(items)
        return pb.ListResponse(
            header=self.core.header(index),
            resources=items,
            next_page_token=validation.page_token(prefix, items[-1].resource) if more else "",
            log_clock_ms=page.log_clock_ms,
        )
    # ---- end List


# -- FencedStore -------------------------------------------------------------------------


class FencedStoreServicer(pb_grpc.FencedStoreServicer):
    def __init__(self, core: Core) -> None:
        self.core = core

    @unary
    def Write(self, request: pb.WriteRequest, context, caller: Principal | None) -> pb.WriteResponse:
        command = build(ops.Write, request, caller)
        result, index = self.core.run(command, context, caller)
        written = expect(WriteResult, result)
        return pb.WriteResponse(header=self.core.header(index), version=written.version, hwm=written.hwm)

    @unary
    def WriteMany(self, request: pb.WriteManyRequest, context, caller: Principal | None) -> pb.WriteManyResponse:
        """Each item as the same Write alone (``serve_many``); per item its WriteResponse or
        the error that Write would have had."""

        def item_body(item: pb.WriteRequest) -> ops.Write:
            return build(ops.Write, item, caller)

        def answer(command: ops.Write, outcome: tuple[Result, int] | ServiceError) -> tuple[pb.WriteResponse, int]:
            result, index = applied(outcome, WriteResult)
            return pb.WriteResponse(header=self.core.header(index), version=result.version, hwm=result.hwm), index

        results, index = serve_many(self.core, WRITE_MANY, request.writes, context, caller, item_body, answer)
        return pb.WriteManyResponse(header=self.core.header(index), results=results)

    @unary
    def Delete(self, request: pb.DeleteRequest, context, caller: Principal | None) -> pb.DeleteResponse:
        command = build(ops.Delete, request, caller)
        result, index = self.core.run(command, context, caller)
        deleted = expect(DeleteResult, result)
        return pb.DeleteResponse(header=self.core.header(index), version=deleted.version, deleted=deleted.deleted)

    @unary
    def Read(self, request: pb.ReadRequest, context, caller: Principal | None) -> pb.ReadResponse:
        fields = checked_request("Read", request)
        result, index = self.core.barrier(context, caller, fields["resource"], fields["key"], read_index=True)
        value = result.value
        return pb.ReadResponse(
            header=self.core.header(index),
            found=value is not None,
            value=b"" if value is None else value,
            version=result.version or 0,
            hwm=result.hwm,
        )


# -- Cluster -----------------------------------------------------------------------------


class ClusterServicer(pb_grpc.ClusterServicer):
    def __init__(self, core: Core) -> None:
        self.core = core

    @unary
    def Status(self, request: pb.StatusRequest, context, caller: Principal | None) -> pb.StatusResponse:
        if request.local:
            # This member's own view, at once: what `fencingctl endpoint status` asks each
            # member, so it answers with the quorum lost (no barrier; may be stale).
            self.core.authorize(caller, None)
            epoch, index = self.core.node.read(lambda sm: sm.epoch), 0
        else:
            # Linearizable like a read (I9): without a barrier through the log there is no answer.
            result, index = self.core.barrier(context, caller)
            epoch = result.epoch
        cluster_level = self.core.node.read(lambda sm: sm.cluster_level)  # as applied here (>= the barrier)
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
            epoch=epoch,
            has_quorum=bool(status["has_quorum"]),
            version=distribution_version(),
            data_size_bytes=_data_size_bytes(getattr(self.core.node.config, "data_dir", None)),
            local=request.local,
            cluster_level=cluster_level,
            entry_level=commands.ENTRY_LEVEL,
        )


def _data_size_bytes(data_dir: str | None) -> int:
    """The files at the top of ``data_dir`` (journal, snapshots, identity): what a member
    keeps (0 for a node without a data dir: the in-memory test cluster)."""
    if data_dir is None:
        return 0
    total = 0
    try:
        with os.scandir(data_dir) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue  # removed meanwhile (a snapshot replaced)
    except OSError:
        return 0
    return total
