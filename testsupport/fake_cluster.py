"""An in-process fake fencing cluster for client and fencingctl tests (a test seam).

Owns: N in-process gRPC servers on 127.0.0.1 that share ONE ``FencingStateMachine`` (no
Raft), answer the fencing.v1 API with the server's error contract (status code +
ErrorInfo), and let a test inject faults per RPC: NO_LEADER, an outcome unknown *after*
applying, a delay past the client's deadline, a node that is down. Every call is recorded.
Must never: be used as a server. The real server is ``coordinator/server/app.py``; this fake
only exists so the client's retry and mapping rules can be tested deterministically.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from concurrent import futures
from typing import Any, Callable

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from coordinator.core import commands as c
from coordinator.core import validation
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason

DOMAIN = "fencing.v1"

_REASON_CODES = {
    Reason.MALFORMED: (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
    Reason.STALE_TOKEN: (grpc.StatusCode.FAILED_PRECONDITION, "STALE_TOKEN"),
    Reason.UNKNOWN_TOKEN: (grpc.StatusCode.FAILED_PRECONDITION, "UNKNOWN_TOKEN"),
    Reason.LEASE_HELD: (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD"),
    Reason.LEASE_EXPIRED: (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EXPIRED"),
    Reason.VERSION_MISMATCH: (grpc.StatusCode.FAILED_PRECONDITION, "VERSION_MISMATCH"),
    Reason.LIMIT_EXCEEDED: (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"),
    Reason.EPOCH_EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED, "EPOCH_EXHAUSTED"),
    Reason.OP_ID_CONFLICT: (grpc.StatusCode.ALREADY_EXISTS, "OP_ID_CONFLICT"),
}


class FakeAbort(Exception):
    """Raised inside a handler: answer with this status and ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, reason: str = "", message: str = "", **metadata: Any):
        super().__init__(message or reason or code.name)
        self.code = code
        self.reason = reason
        self.message = message or reason or code.name
        self.metadata = {k: str(v) for k, v in metadata.items()}


@dataclasses.dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple


def rich_status(code: grpc.StatusCode, message: str, reason: str = "", metadata=None, trailers=()):
    """A grpc.Status carrying google.rpc.Status with a fencing.v1 ErrorInfo (if reason),
    plus ``trailers`` (the real server sends fencing-member-id etc. there)."""
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message)
    if reason:
        info = error_details_pb2.ErrorInfo(
            domain=DOMAIN, reason=reason, metadata={k: str(v) for k, v in (metadata or {}).items()}
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        status.details.append(detail)
    base = rpc_status.to_status(status)
    return _Status(base.code, base.details, tuple(base.trailing_metadata) + tuple(trailers))


@dataclasses.dataclass
class Call:
    node: int
    method: str
    request: Any


# A fault is a callable run before the handler: fault(node, apply) -> response or raises
# FakeAbort. ``apply()`` runs the real handler and returns its response.
Fault = Callable[["FakeNode", Callable[[], Any]], Any]


def no_leader(leader_api: str = "") -> Fault:
    def fault(node, apply):
        raise FakeAbort(grpc.StatusCode.UNAVAILABLE, "NO_LEADER", "no leader", leader="", leader_api=leader_api)
    return fault


def unknown_after_apply() -> Fault:
    """Apply the request, then answer ABORTED/OUTCOME_UNKNOWN (the leader lost its term)."""
    def fault(node, apply):
        apply()
        raise FakeAbort(grpc.StatusCode.ABORTED, "OUTCOME_UNKNOWN", "leadership lost", detail="leadership lost")
    return fault


def unknown_before_apply() -> Fault:
    def fault(node, apply):
        raise FakeAbort(grpc.StatusCode.ABORTED, "OUTCOME_UNKNOWN", "leadership lost", detail="not proposed")
    return fault


def delay(seconds: float, *, then_apply: bool = True) -> Fault:
    """Sleep (past the client's attempt deadline), then apply: the client hears nothing."""
    def fault(node, apply):
        time.sleep(seconds)
        if then_apply:
            return apply()
        raise FakeAbort(grpc.StatusCode.UNAVAILABLE, "NO_LEADER", "gave up")
    return fault


def abort(code: grpc.StatusCode, reason: str = "", message: str = "", **metadata: Any) -> Fault:
    def fault(node, apply):
        raise FakeAbort(code, reason, message, **metadata)
    return fault


class FakeCluster:
    """N fake nodes sharing one state machine. Use as a context manager.

    ``leader`` is the index the nodes name in Status (None: no leader). ``admin_token``: if
    set, Admin RPCs need ``authorization: Bearer <admin_token>``. ``clock_offset_ms`` is
    added to the wall clock stamped into commands (tests move time with it).
    """

    def __init__(self, nodes: int = 3, *, admin_token: str | None = None) -> None:
        self.sm = FencingStateMachine()
        self.lock = threading.Lock()
        self.admin_token = admin_token
        self.leader: int | None = 0
        self.clock_offset_ms = 0
        self._last_stamp = 0
        self.calls: list[Call] = []
        self._faults: dict[tuple[int | None, str], collections.deque] = collections.defaultdict(
            collections.deque
        )
        self.nodes = [FakeNode(self, i) for i in range(nodes)]

    # -- control ----------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        return [n.address for n in self.nodes]

    def inject(self, method: str, *faults: Fault, node: int | None = None) -> None:
        """Queue faults for the next calls of ``method`` (on ``node`` or on any node)."""
        with self.lock:
            self._faults[(node, method)].extend(faults)

    def calls_to(self, method: str) -> list[Call]:
        with self.lock:
            return [call for call in self.calls if call.method == method]

    def stop_node(self, index: int) -> None:
        self.nodes[index].stop()

    def close(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------
    def _next_fault(self, node: int, method: str) -> Fault | None:
        with self.lock:
            for key in ((node, method), (None, method)):
                queue_ = self._faults.get(key)
                if queue_:
                    return queue_.popleft()
        return None

    def stamp_ms(self) -> int:
        self._last_stamp = max(self._last_stamp + 1, int(time.time() * 1000) + self.clock_offset_ms)
        return self._last_stamp

    def execute(self, cmd_factory: Callable[[int], c.Command]) -> dict[str, Any]:
        with self.lock:
            outcome = self.sm.execute(cmd_factory(self.stamp_ms()))
            if isinstance(outcome, Applied):
                return outcome.result
            code, reason = _REASON_CODES[outcome.reason]
            meta = dict(outcome.details)
            if outcome.reason in (Reason.UNKNOWN_TOKEN, Reason.STALE_TOKEN) and "hwm" not in meta:
                resource = cmd_factory(0).body.get("resource")
                info = self.sm.describe(resource) if resource else None
                meta["hwm"] = info["hwm"] if info else 0
        raise FakeAbort(code, reason, outcome.message, **meta)


class FakeNode(
    pb_grpc.LeaseServicer,
    pb_grpc.FencedStoreServicer,
    pb_grpc.ClusterServicer,
    pb_grpc.AdminServicer,
):
    def __init__(self, cluster: FakeCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        for add in (
            pb_grpc.add_LeaseServicer_to_server,
            pb_grpc.add_FencedStoreServicer_to_server,
            pb_grpc.add_ClusterServicer_to_server,
            pb_grpc.add_AdminServicer_to_server,
        ):
            add(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.server.stop(grace=0).wait(5)

    def header(self) -> pb.ResponseHeader:
        return pb.ResponseHeader(member_id=f"fake-{self.index}", raft_term=1, applied_index=len(self.cluster.calls))

    def trailers(self) -> tuple[tuple[str, str], ...]:
        return (
            ("fencing-member-id", f"fake-{self.index}"),
            ("fencing-raft-term", "1"),
            ("fencing-applied-index", str(len(self.cluster.calls))),
        )

    def _serve(self, method: str, request: Any, context: grpc.ServicerContext, handler, *, admin=False):
        with self.cluster.lock:
            self.cluster.calls.append(Call(self.index, method, request))
        try:
            if admin and self.cluster.admin_token is not None:
                auth = dict(context.invocation_metadata()).get("authorization", "")
                if not auth:
                    raise FakeAbort(grpc.StatusCode.UNAUTHENTICATED, "", "no credential")
                if auth != f"Bearer {self.cluster.admin_token}":
                    raise FakeAbort(grpc.StatusCode.PERMISSION_DENIED, "", "not an admin")
            fault = self.cluster._next_fault(self.index, method)
            apply = lambda: handler(request)  # noqa: E731
            return apply() if fault is None else (fault(self, apply) or apply())
        except FakeAbort as exc:
            context.abort_with_status(
                rich_status(exc.code, exc.message, exc.reason, exc.metadata, self.trailers())
            )
        except validation.InvalidField as exc:
            context.abort_with_status(
                rich_status(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "INVALID_FIELD",
                            {"field": exc.field}, self.trailers())
            )

    # -- Lease ---------------------------------------------------------------------------
    def Acquire(self, request, context):
        def handle(r):
            result = self.cluster.execute(lambda stamp: c.acquire(
                resource=r.resource, holder=r.holder, ttl_ms=r.ttl_ms, op_id=r.op_id, stamp_ms=stamp))
            return pb.AcquireResponse(header=self.header(), token=result["token"], lease_id=result["token"],
                                      expires_at_ms=result["expires_at_ms"])
        return self._serve("Acquire", request, context, handle)

    def _keep_alive(self, r):
        validation.check_token(r.token)
        result = self.cluster.execute(lambda stamp: c.keep_alive(
            resource=r.resource, token=r.token, ttl_ms=r.ttl_ms or None, stamp_ms=stamp))
        return pb.KeepAliveResponse(header=self.header(), resource=r.resource, token=r.token,
                                    expires_at_ms=result["expires_at_ms"])

    def KeepAlive(self, request, context):
        return self._serve("KeepAlive", request, context, self._keep_alive)

    def KeepAliveMany(self, request, context):
        def handle(r):
            out = []
            for item in r.leases:
                try:
                    resp = self._keep_alive(item)
                    out.append(pb.KeepAliveResult(resource=item.resource, token=item.token, ok=True,
                                                  expires_at_ms=resp.expires_at_ms))
                except FakeAbort as exc:
                    out.append(pb.KeepAliveResult(resource=item.resource, token=item.token, ok=False,
                                                  reason=exc.reason, message=exc.message))
            return pb.KeepAliveManyResponse(header=self.header(), results=out)
        return self._serve("KeepAliveMany", request, context, handle)

    def Release(self, request, context):
        def handle(r):
            validation.check_token(r.token)
            result = self.cluster.execute(lambda stamp: c.release(
                resource=r.resource, token=r.token, op_id=r.op_id or None, stamp_ms=stamp))
            return pb.ReleaseResponse(header=self.header(), released=result["released"], hwm=result["hwm"])
        return self._serve("Release", request, context, handle)

    def Describe(self, request, context):
        def handle(r):
            result = self.cluster.execute(lambda stamp: c.read_barrier(resource=r.resource, stamp_ms=stamp))
            lease = result.get("lease")
            return pb.DescribeResponse(
                header=self.header(), resource=r.resource, held=lease is not None,
                holder=lease["holder"] if lease else "", token=lease["token"] if lease else 0,
                hwm=result["hwm"], expires_at_ms=lease["expires_at_ms"] if lease else 0,
                log_clock_ms=result["log_clock_ms"])
        return self._serve("Describe", request, context, handle)

    # -- FencedStore ---------------------------------------------------------------------
    def Write(self, request, context):
        def handle(r):
            validation.check_token(r.token)
            expected = r.expected_version if r.HasField("expected_version") else None
            result = self.cluster.execute(lambda stamp: c.write(
                resource=r.resource, key=r.key, value=r.value, token=r.token, op_id=r.op_id,
                expected_version=expected, stamp_ms=stamp))
            return pb.WriteResponse(header=self.header(), version=result["version"], hwm=result["hwm"])
        return self._serve("Write", request, context, handle)

    def Delete(self, request, context):
        def handle(r):
            validation.check_token(r.token)
            result = self.cluster.execute(lambda stamp: c.delete(
                resource=r.resource, key=r.key, token=r.token, op_id=r.op_id, stamp_ms=stamp))
            return pb.DeleteResponse(header=self.header(), version=result["version"], deleted=result["deleted"])
        return self._serve("Delete", request, context, handle)

    def Read(self, request, context):
        def handle(r):
            result = self.cluster.execute(lambda stamp: c.read_barrier(
                resource=r.resource, key=r.key, stamp_ms=stamp))
            value = result.get("value")
            return pb.ReadResponse(header=self.header(), found=value is not None, value=value or b"",
                                   version=result.get("version", 0), hwm=result.get("hwm", 0))
        return self._serve("Read", request, context, handle)

    # -- Cluster -------------------------------------------------------------------------
    def Status(self, request, context):
        def handle(r):
            leader = self.cluster.leader
            members = [
                pb.Member(id=f"fake-{n.index}", api_address=n.address, is_leader=n.index == leader)
                for n in self.cluster.nodes
            ]
            with self.cluster.lock:
                epoch = self.cluster.sm.epoch
            return pb.StatusResponse(
                header=self.header(), members=members,
                leader="" if leader is None else f"fake-{leader}",
                leader_api_address="" if leader is None else self.cluster.nodes[leader].address,
                term=1, commit_index=len(self.cluster.calls), applied_index=len(self.cluster.calls),
                epoch=epoch, has_quorum=leader is not None)
        return self._serve("Status", request, context, handle)

    # -- Admin ---------------------------------------------------------------------------
    def ForceRelease(self, request, context):
        def handle(r):
            result = self.cluster.execute(lambda stamp: c.force_release(
                resource=r.resource, op_id=r.op_id, stamp_ms=stamp))
            return pb.ForceReleaseResponse(header=self.header(), hwm=result["hwm"])
        return self._serve("ForceRelease", request, context, handle, admin=True)

    def SetEpochFloor(self, request, context):
        def handle(r):
            validation.check_floor(r.floor)
            result = self.cluster.execute(lambda stamp: c.set_epoch_floor(
                floor=r.floor, fence_all=r.fence_all, stamp_ms=stamp))
            return pb.SetEpochFloorResponse(header=self.header(), epoch=result["epoch"])
        return self._serve("SetEpochFloor", request, context, handle, admin=True)

    def Snapshot(self, request, context):
        def handle(r):
            with self.cluster.lock:
                data, epoch = self.cluster.sm.snapshot(), self.cluster.sm.epoch
            return pb.SnapshotResponse(header=self.header(), data=data, epoch=epoch, index=1)
        return self._serve("Snapshot", request, context, handle, admin=True)

    def Restore(self, request, context):
        def handle(r):
            validation.check_epoch_floor(r.epoch_floor)
            with self.cluster.lock:
                try:
                    self.cluster.sm.restore(r.data)
                except ValueError as exc:
                    raise FakeAbort(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", str(exc), field="data")
            result = self.cluster.execute(lambda stamp: c.set_epoch_floor(
                floor=r.epoch_floor, fence_all=True, stamp_ms=stamp))
            return pb.RestoreResponse(header=self.header(), epoch=result["epoch"])
        return self._serve("Restore", request, context, handle, admin=True)
