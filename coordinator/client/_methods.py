"""Every public RPC method of the clients, written once for the sync and the asyncio one.

Owns: ``ClientMethods``, mixed into ``_ClientBase``: each method checks and builds its
request (``_requests``, by its row of ``requests.REQUESTS``), says how it may be retried
(``retry.Kind``) and how its answer is read (``results``), and hands the ``Call`` to
``_execute``, which the sync client runs in a thread and the asyncio client as an awaitable.
Must never: send anything itself, wait, or choose an endpoint (``_execute`` and
``_ClientBase`` do), or describe a call as safe to repeat when a repeat could apply it twice.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import results
from coordinator.client._calls import Call, Shape
from coordinator.client._defaults import BACKUP_TIMEOUT_S_DEFAULT
from coordinator.client._lock_wait import LockStep
from coordinator.client._requests import (
    as_bytes,
    check_field,
    check_wait_ms,
    default_holder,
    new_op_id,
    request_of,
    restore_messages,
)
from coordinator.client.exceptions import FencingError, InvalidArgument
from coordinator.client.results import (
    AcquireResult,
    ClusterStatus,
    DeleteResult,
    Description,
    EpochResult,
    ForceReleaseResult,
    KeepAliveItem,
    KeepAliveResult,
    ListedResource,
    ListPage,
    MemberList,
    ReadResult,
    ReleaseResult,
    Snapshot,
    WriteResult,
)
from coordinator.client.retry import Kind
from coordinator.core import limits, requests, validation
from coordinator.core.names import ErrorMeta, ErrorReason


class ClientMethods:
    """The RPC methods; ``_ClientBase`` adds configuration and endpoint choice, and the
    sync and asyncio clients ``_execute``."""

    def _execute(self, call: Call) -> Any:  # pragma: no cover - the client's own loop
        raise NotImplementedError

    def _match_endpoint(self, address: str) -> str | None:  # pragma: no cover - _ClientBase's
        raise NotImplementedError

    # -- Lease ----------------------------------------------------------------------------

    def acquire(
        self,
        resource: str,
        *,
        ttl_ms: int,
        holder: str | None = None,
        wait_ms: int = 0,
        op_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Take the lease on ``resource`` and get a new fencing token (DESIGN I2).

        Raises LeaseHeld while another live lease holds it; with ``wait_ms`` the server
        waits up to that long (limits.ACQUIRE_WAIT_MS_MAX) for it to go. ``holder``
        defaults to ``<hostname>/<pid>``.
        """
        holder = default_holder() if holder is None else holder
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "acquire", "resource": resource, "holder": holder, "op_id": op_id}
        req = request_of(
            pb.AcquireRequest, ctx, resource=resource, holder=holder, ttl_ms=ttl_ms, op_id=op_id
        )
        wait_ms = check_field(check_wait_ms, wait_ms, ctx)  # not in the table: the server clamps it
        req.wait_ms = wait_ms
        return self._execute(Call(
            "lease", "Acquire", req, Kind.DEDUP, ctx,
            lambda r: results.acquire_result(r, resource=resource, holder=holder, op_id=op_id),
            timeout_s=timeout_s, extra_attempt_s=wait_ms / 1000,
            # An Acquire that waits in line goes on its own: AcquireMany refuses items with a
            # wait (one would hold every other item's answer for up to its wait).
            batch="acquire" if wait_ms == 0 else None,
        ))

    def keep_alive(
        self,
        resource: str,
        token: int,
        *,
        ttl_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> KeepAliveResult:
        """Extend the live lease holding ``token`` (same token, DESIGN I6).

        Raises LeaseExpired if it has ended (a new acquire is needed), StaleToken if a
        newer token exists. Repeating a keep-alive is harmless, so it is retried after an
        unknown outcome.
        """
        ctx = {"rpc": "keep-alive", "resource": resource, "token": token}
        req = request_of(pb.KeepAliveRequest, ctx, resource=resource, token=token, ttl_ms=ttl_ms)
        return self._execute(Call(
            "lease", "KeepAlive", req, Kind.REPEATABLE, ctx,
            lambda r: results.keep_alive_result(r, resource=resource, token=token),
            timeout_s=timeout_s,
        ))

    def keep_alive_many(
        self,
        leases: Iterable[tuple[str, int]],
        *,
        ttl_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> list[KeepAliveItem]:
        """Renew many ``(resource, token)`` leases in one call; each item succeeds or fails
        on its own (``item.ok``, ``item.error``). At most limits.KEEP_ALIVE_BATCH_ITEMS_MAX
        items (InvalidArgument beyond)."""
        ctx: dict[str, Any] = {"rpc": "keep-alive-many"}
        if ttl_ms is not None:  # checked once, before the items: it is the batch's
            check_field(requests.REQUESTS["KeepAlive"]["ttl_ms"].check, ttl_ms, ctx)
        items = [
            request_of(
                pb.KeepAliveRequest, {**ctx, "resource": resource, "token": token},
                resource=resource, token=token, ttl_ms=ttl_ms,
            )
            for resource, token in leases
        ]
        if len(items) > limits.KEEP_ALIVE_BATCH_ITEMS_MAX:
            raise InvalidArgument(
                f"{len(items)} leases, more than {limits.KEEP_ALIVE_BATCH_ITEMS_MAX} in one call",
                reason=ErrorReason.INVALID_FIELD, metadata={ErrorMeta.FIELD: "leases"}, request=ctx,
            )
        return self._execute(Call(
            "lease", "KeepAliveMany", pb.KeepAliveManyRequest(leases=items), Kind.REPEATABLE,
            ctx, results.keep_alive_items, timeout_s=timeout_s,
        ))

    def release(
        self,
        resource: str,
        token: int,
        *,
        op_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> ReleaseResult:
        """End the lease holding ``token``; the hwm stays (``released`` is False if the
        lease had already ended)."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "release", "resource": resource, "token": token, "op_id": op_id}
        req = request_of(pb.ReleaseRequest, ctx, resource=resource, token=token, op_id=op_id)
        return self._execute(Call(
            "lease", "Release", req, Kind.DEDUP, ctx, results.release_result, timeout_s=timeout_s,
            batch="release",
        ))

    def release_many(
        self,
        leases: Iterable[tuple[str, int]],
        *,
        timeout_s: float | None = None,
    ) -> list[ReleaseResult | FencingError]:
        """End many ``(resource, token)`` leases in one ReleaseMany call: per lease, in order,
        the ReleaseResult or the exception its Release alone would raise. At most
        limits.RELEASE_MANY_ITEMS_MAX leases (InvalidArgument beyond). Each item carries an
        op_id, so the call is retried like a single release."""
        ctx: dict[str, Any] = {"rpc": "release-many"}
        requests = [
            request_of(
                pb.ReleaseRequest, {**ctx, "resource": resource, "token": token},
                resource=resource, token=token, op_id=new_op_id(),
            )
            for resource, token in leases
        ]
        if len(requests) > limits.RELEASE_MANY_ITEMS_MAX:
            raise InvalidArgument(
                f"{len(requests)} leases, more than {limits.RELEASE_MANY_ITEMS_MAX} in one call",
                reason=ErrorReason.INVALID_FIELD, metadata={ErrorMeta.FIELD: "leases"}, request=ctx,
            )
        return self._execute(Call(
            "lease", "ReleaseMany", pb.ReleaseManyRequest(releases=requests), Kind.DEDUP, ctx,
            results.release_many_outcomes, timeout_s=timeout_s,
        ))

    def _lock_call(
        self, resource: str, *, ttl_ms: int, holder: str, waiter_id: bytes, wait_ms: int,
        timeout_s: float | None = None, start_by: float | None = None,
    ) -> Call:
        """One Lock call: queue (or renew) ``waiter_id`` and wait up to ``wait_ms`` for the
        grant. Repeating it is harmless (the waiter_id makes it one waiter), so it is retried
        like a keep-alive; ``timeout_s`` is its budget on top of the wait (None: the client's
        whole-call timeout)."""
        ctx = {"rpc": "lock", "resource": resource, "holder": holder}
        req = request_of(
            pb.LockRequest, ctx, resource=resource, holder=holder, ttl_ms=ttl_ms, waiter_id=waiter_id
        )
        req.wait_ms = wait_ms  # not in the table: the server clamps it
        return Call(
            "lease", "Lock", req, Kind.REPEATABLE, ctx,
            lambda r: LockStep.of(r, resource=resource, holder=holder, waiter_id=waiter_id),
            timeout_s=timeout_s, extra_attempt_s=wait_ms / 1000, start_by=start_by,
        )

    def cancel_lock(self, resource: str, waiter_id: bytes, *, timeout_s: float | None = None) -> Any:
        """Take ``waiter_id`` out of ``resource``'s lock queue; if it was granted meanwhile,
        that lease is released. Returns the CancelLockResponse (``cancelled``, ``released``)."""
        ctx = {"rpc": "cancel-lock", "resource": resource}
        req = request_of(pb.CancelLockRequest, ctx, resource=resource, waiter_id=waiter_id)
        return self._execute(Call(
            "lease", "CancelLock", req, Kind.REPEATABLE, ctx, lambda r: r, timeout_s=timeout_s,
        ))

    def describe(self, resource: str, *, timeout_s: float | None = None) -> Description:
        """The resource's lease and hwm, linearizable (read through the log)."""
        ctx = {"rpc": "describe", "resource": resource}
        req = request_of(pb.DescribeRequest, ctx, resource=resource)
        return self._execute(Call(
            "lease", "Describe", req, Kind.READ, ctx,
            lambda r: results.description(r, resource=resource), timeout_s=timeout_s,
        ))

    # ---- List (issue 29 point 4)
    def list(
        self, prefix: str = "", *, limit: int | None = None, page_token: str = "", timeout_s: float | None = None,
    ) -> ListPage:
        """One page of the resources whose names start with ``prefix`` (those this caller's
        principal may use), sorted by name, each with holder, token, remaining TTL and lock
        waiters; linearizable like ``describe``. ``limit``: 1 to LIST_LIMIT_MAX (None: the
        server's LIST_LIMIT_DEFAULT). Pass the page's ``next_page_token`` (with the same
        prefix) for the next page; ``list_all`` pages through everything."""
        ctx = {"rpc": "list", "prefix": prefix, "limit": limit, "page_token": page_token}
        check_field(_check_list_request, {"prefix": prefix, "limit": limit, "page_token": page_token or None}, ctx)
        req = pb.ListRequest(prefix=prefix, limit=limit, page_token=page_token)
        return self._execute(Call("lease", "List", req, Kind.READ, ctx, results.list_page, timeout_s=timeout_s))

    def list_all(
        self, prefix: str = "", *, page_size: int | None = None, timeout_s: float | None = None,
    ) -> Iterator[ListedResource]:
        """Every resource under ``prefix`` this caller may use, by name: ``list`` page after page
        (``page_size`` per call; each page a linearizable read of its own, so a resource created
        or removed meanwhile may be missed or still shown); ``timeout_s`` bounds each page's call.
        The asyncio client's is an async iterator (``async for``)."""
        return walk_pages(lambda token: self.list(prefix, limit=page_size, page_token=token, timeout_s=timeout_s))
    # ---- end List

    # -- FencedStore ---------------------------------------------------------------------

    def write(
        self,
        resource: str,
        key: str,
        value: bytes,
        *,
        token: int,
        op_id: bytes | None = None,
        expected_version: int | None = None,
        timeout_s: float | None = None,
    ) -> WriteResult:
        """Fenced write (DESIGN I3): applied iff ``token`` equals the resource's hwm.

        ``expected_version``: None writes unconditionally, 0 requires the key to be absent,
        N requires version N (VersionMismatch otherwise). Pass the ``op_id`` of an earlier
        call that raised OutcomeUnknown to learn its outcome without applying twice.
        """
        op_id = new_op_id() if op_id is None else op_id
        ctx = {
            "rpc": "write", "resource": resource, "key": key, "token": token, "op_id": op_id,
            "expected_version": expected_version,
        }
        req = request_of(
            pb.WriteRequest, ctx, resource=resource, key=key, value=as_bytes(value), token=token,
            op_id=op_id, expected_version=expected_version,
        )
        return self._execute(Call(
            "store", "Write", req, Kind.DEDUP, ctx,
            lambda r: results.write_result(r, op_id=op_id), timeout_s=timeout_s, batch="write",
        ))

    def delete(
        self,
        resource: str,
        key: str,
        *,
        token: int,
        op_id: bytes | None = None,
        expected_version: int | None = None,
        timeout_s: float | None = None,
    ) -> DeleteResult:
        """Fenced delete of ``key`` (checked like a write, DESIGN I7). ``expected_version``
        (entry level 2): only while the key is at that version (VersionMismatch otherwise);
        Refused (CLUSTER_LEVEL_TOO_LOW) while a member runs an older build. A member of the
        release before levels does not know the field and deletes unconditionally: send it
        only once every member is upgraded, or to an upgraded member."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {
            "rpc": "delete", "resource": resource, "key": key, "token": token, "op_id": op_id,
            "expected_version": expected_version,
        }
        req = request_of(
            pb.DeleteRequest, ctx, resource=resource, key=key, token=token, op_id=op_id,
            expected_version=expected_version,
        )
        return self._execute(Call(
            "store", "Delete", req, Kind.DEDUP, ctx,
            lambda r: results.delete_result(r, op_id=op_id), timeout_s=timeout_s,
        ))

    def read(self, resource: str, key: str, *, timeout_s: float | None = None) -> ReadResult:
        """Linearizable read of ``key`` (DESIGN I9); ``found`` is False if absent."""
        ctx = {"rpc": "read", "resource": resource, "key": key}
        req = request_of(pb.ReadRequest, ctx, resource=resource, key=key)
        return self._execute(Call(
            "store", "Read", req, Kind.READ, ctx,
            results.read_result, timeout_s=timeout_s,
        ))

    # -- Cluster and Admin --------------------------------------------------------------

    def status(
        self, *, endpoint: str | None = None, timeout_s: float | None = None, local: bool = False
    ) -> ClusterStatus:
        """Cluster.Status: members, leader, term, indexes, epoch (linearizable). With
        ``endpoint`` the question goes to that node only, in one attempt. With ``local`` the
        node answers from its own view, without a read through the log (works without a
        quorum; may be stale): what ``fencingctl endpoint status`` asks each endpoint."""
        target = None
        if endpoint is not None:
            target = self._match_endpoint(endpoint)
            if target is None:
                raise ValueError(f"{endpoint!r} is not one of this client's endpoints")
        return self._execute(Call(
            "cluster", "Status", pb.StatusRequest(local=local), Kind.READ, {"rpc": "status"},
            results.cluster_status, timeout_s=timeout_s, endpoint=target,
        ))

    def force_release(
        self, resource: str, *, op_id: bytes | None = None, timeout_s: float | None = None
    ) -> ForceReleaseResult:
        """Admin: clear the lease by issuing a new epoch; the old holder is fenced (I7)."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "force-release", "resource": resource, "op_id": op_id}
        req = request_of(pb.ForceReleaseRequest, ctx, resource=resource, op_id=op_id)
        return self._execute(Call(
            "admin", "ForceRelease", req, Kind.DEDUP, ctx,
            lambda r: results.force_release_result(r, op_id=op_id), timeout_s=timeout_s,
        ))

    def set_epoch_floor(
        self, floor: int, *, fence_all: bool = True, timeout_s: float | None = None
    ) -> EpochResult:
        """Admin: raise the epoch counter to at least ``floor``; with ``fence_all`` (the
        default) every resource is fenced at a new epoch (I11). Repeating it only raises
        the epoch further, so it is retried after an unknown outcome."""
        ctx = {"rpc": "set-epoch-floor", "floor": floor}
        req = request_of(pb.SetEpochFloorRequest, ctx, floor=floor, fence_all=fence_all)
        return self._execute(Call(
            "admin", "SetEpochFloor", req, Kind.REPEATABLE, ctx, results.epoch_result,
            timeout_s=timeout_s,
        ))

    def member_list(self, *, timeout_s: float | None = None) -> MemberList:
        """Admin: the cluster configuration as the answering member knows it."""
        return self._execute(Call(
            "admin", "MemberList", pb.MemberListRequest(), Kind.READ, {"rpc": "member-list"},
            results.member_list, timeout_s=timeout_s,
        ))

    def member_add(self, member_id: str, raft_address: str, *, timeout_s: float | None = None) -> MemberList:
        """Admin: add ``member_id`` at ``raft_address`` as a learner; the leader promotes it to a
        voter once it has caught up. Sent once where it may have applied (a repeat is refused
        as MEMBER_EXISTS): check ``member_list()`` after an unknown outcome."""
        ctx = {"rpc": "member-add", "member_id": member_id, "raft_address": raft_address}
        req = pb.MemberAddRequest(member_id=member_id, raft_address=raft_address)
        return self._execute(Call("admin", "MemberAdd", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s))

    def member_remove(self, member_id: str, *, timeout_s: float | None = None) -> MemberList:
        """Admin: remove ``member_id`` from the configuration (one voter out per change)."""
        ctx = {"rpc": "member-remove", "member_id": member_id}
        req = pb.MemberRemoveRequest(member_id=member_id)
        return self._execute(
            Call("admin", "MemberRemove", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s)
        )

    def member_replace(
        self, member_id: str, raft_address: str = "", *, timeout_s: float | None = None
    ) -> MemberList:
        """Admin: remove ``member_id``'s lost incarnation, then add a fresh learner under the same
        id at ``raft_address`` (default: the same address), promoted once caught up."""
        ctx = {"rpc": "member-replace", "member_id": member_id, "raft_address": raft_address}
        req = pb.MemberReplaceRequest(member_id=member_id, raft_address=raft_address)
        return self._execute(
            Call("admin", "MemberReplace", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s)
        )

    def snapshot(self, *, local: bool = False, timeout_s: float | None = None) -> Snapshot:
        """Admin: a consistent backup of the whole state (read through the log; ``local``:
        the answering member's state as applied, without a barrier), of any size the limits
        allow: it arrives in chunks (Admin.SnapshotStream) and is checked against the size
        and sha256 the first chunk declares. ``timeout_s``: one attempt may take all of it
        (default BACKUP_TIMEOUT_S_DEFAULT)."""
        timeout_s = BACKUP_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        return self._execute(Call(
            "admin", "SnapshotStream", pb.SnapshotRequest(local=local), Kind.READ, {"rpc": "snapshot"},
            results.snapshot_from_chunks, timeout_s=timeout_s, extra_attempt_s=timeout_s,
            shape=Shape.STREAM_OUT,
        ))

    def restore(
        self, data: bytes, *, epoch_floor: int, timeout_s: float | None = None
    ) -> EpochResult:
        """Admin: replace the state by a backup, with an epoch floor above every token ever
        issued (I11). Any size the limits allow: it is sent in chunks (Admin.RestoreStream)
        and enters the log in chunks. Not resent after an attempt that may have applied: that
        raises OutcomeUnknown, and the operator checks ``status()`` before trying again.
        ``timeout_s``: one attempt may take all of it (default BACKUP_TIMEOUT_S_DEFAULT)."""
        ctx = {"rpc": "restore", "epoch_floor": epoch_floor}
        backup: bytes = check_field(validation.check_backup_data, as_bytes(data), ctx)
        request_of(pb.RestoreStreamRequest, ctx, epoch_floor=epoch_floor)  # checks the floor
        timeout_s = BACKUP_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        return self._execute(Call(
            "admin", "RestoreStream", lambda: restore_messages(backup, epoch_floor), Kind.ONCE, ctx,
            results.epoch_result, timeout_s=timeout_s, extra_attempt_s=timeout_s, shape=Shape.STREAM_IN,
        ))


def _check_list_request(fields: dict[str, Any]) -> dict[str, Any]:
    """List's fields, as the server checks them: the table's row, and a page token that
    continues a listing of this very prefix."""
    checked = requests.check_request("List", fields)
    if checked["page_token"] is not None and checked["page_token"][0] != (checked["prefix"] or ""):
        raise validation.InvalidField(
            "page_token", f"continues a listing of prefix {checked['page_token'][0]!r}, not {fields['prefix']!r}"
        )
    return checked


def walk_pages(fetch: Callable[[str], ListPage]) -> Iterator[ListedResource]:
    """Every resource of the pages ``fetch(page_token)`` returns, from the first ("") until a
    page has no next_page_token: the sync client's ``list_all``."""
    token = ""
    while True:
        page = fetch(token)
        yield from page.resources
        token = page.next_page_token
        if not token:
            return
