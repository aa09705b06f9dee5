"""What the fencing client returns: small frozen dataclasses, built from the API's responses.

Owns: the result types and their conversion from ``fencing_pb2`` messages. Must never: do
I/O or retry; the client (``coordinator.client.sync``) re-exports these names.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client.exceptions import FencingError, Header, error_for_reason

__all__ = [
    "AcquireResult",
    "ClusterStatus",
    "DeleteResult",
    "Description",
    "EpochResult",
    "ForceReleaseResult",
    "Header",
    "KeepAliveItem",
    "KeepAliveResult",
    "ListPage",
    "ListedResource",
    "Member",
    "ReadResult",
    "ReleaseResult",
    "Snapshot",
    "WriteResult",
]


def header_from_pb(msg: pb.ResponseHeader) -> Header:
    return Header(
        member_id=msg.member_id, raft_term=msg.raft_term, applied_index=msg.applied_index
    )


def _plain(value: Any) -> Any:
    """JSON-friendly form of a result field (bytes become hex, dataclasses dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


class _Result:
    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict of this result (bytes as hex; ``Read.value`` is special-cased
        by callers that know it is a value)."""
        plain: dict[str, Any] = _plain(self)
        return plain


@dataclasses.dataclass(frozen=True)
class AcquireResult(_Result):
    """A new lease: ``token`` is the fencing token to send with every write."""

    resource: str
    holder: str
    token: int
    lease_id: int
    expires_at_ms: int  # on the log clock (DESIGN I6), not this machine's clock
    op_id: bytes
    header: Header
    # DESIGN §6: the cluster's signature over (resource, token) for guards at external
    # resources (coordinator.client.guard, coordinator.client.proof); b"" when the cluster signs nothing.
    token_proof: bytes = b""


@dataclasses.dataclass(frozen=True)
class KeepAliveResult(_Result):
    resource: str
    token: int
    expires_at_ms: int
    header: Header


@dataclasses.dataclass(frozen=True)
class KeepAliveItem(_Result):
    """One lease's outcome in ``keep_alive_many``; ``error`` is the typed refusal if not ok."""

    resource: str
    token: int
    ok: bool
    expires_at_ms: int
    reason: str
    message: str

    @property
    def error(self) -> FencingError | None:
        if self.ok:
            return None
        return error_for_reason(
            self.reason,
            self.message,
            request={"rpc": "keep-alive", "resource": self.resource, "token": self.token},
        )


@dataclasses.dataclass(frozen=True)
class ReleaseResult(_Result):
    released: bool  # False if the lease had already expired or been released
    hwm: int
    header: Header


@dataclasses.dataclass(frozen=True)
class Description(_Result):
    resource: str
    held: bool
    holder: str
    token: int
    hwm: int
    expires_at_ms: int
    log_clock_ms: int
    header: Header
    waiters: int = 0  # lock waiters queued behind the holder


# ---- List (issue 29 point 4)
@dataclasses.dataclass(frozen=True)
class ListedResource(_Result):
    """One resource of a ``list`` page: its live lease (if ``held``) and lock waiters."""

    resource: str
    held: bool
    holder: str  # "" when not held
    token: int  # the live lease's token, 0 when not held
    hwm: int
    remaining_ms: int  # the live lease's remaining TTL on the log clock, 0 when not held
    waiters: int


@dataclasses.dataclass(frozen=True)
class ListPage(_Result):
    """A page of ``list``: resources sorted by name; ``next_page_token`` continues the listing
    (``""``: this was the last page)."""

    resources: tuple[ListedResource, ...]
    next_page_token: str
    log_clock_ms: int
    header: Header


def list_page(r: pb.ListResponse) -> ListPage:
    return ListPage(
        resources=tuple(
            ListedResource(
                resource=i.resource, held=i.held, holder=i.holder, token=i.token, hwm=i.hwm,
                remaining_ms=i.remaining_ms, waiters=i.waiters,
            )
            for i in r.resources
        ),
        next_page_token=r.next_page_token,
        log_clock_ms=r.log_clock_ms,
        header=header_from_pb(r.header),
    )
# ---- end List


@dataclasses.dataclass(frozen=True)
class WriteResult(_Result):
    version: int
    hwm: int
    op_id: bytes
    header: Header


@dataclasses.dataclass(frozen=True)
class DeleteResult(_Result):
    version: int
    deleted: bool
    op_id: bytes
    header: Header


@dataclasses.dataclass(frozen=True)
class ReadResult(_Result):
    found: bool
    value: bytes
    version: int
    hwm: int
    header: Header


@dataclasses.dataclass(frozen=True)
class Member(_Result):
    id: str  # Raft address
    api_address: str  # "" for a member the answering member's config file does not name
    is_leader: bool
    # From the replicated configuration (the answering member's view):
    member_id: str = ""
    incarnation: int = 0  # 0: a learner not bound yet
    role: str = ""  # leader, follower or learner
    match_index: int = 0
    voter: bool = False


@dataclasses.dataclass(frozen=True)
class ClusterStatus(_Result):
    members: tuple[Member, ...]
    leader: str
    leader_api_address: str
    term: int
    commit_index: int
    applied_index: int
    epoch: int
    has_quorum: bool
    header: Header
    version: str = ""  # the answering member's software version ("": a member too old to say)
    data_size_bytes: int = 0  # its data dir on disk
    local: bool = False  # answered from its own view (status(local=True)), not through the log
    cluster_level: int = 0  # the entry level the cluster runs at (0: a member too old to say)
    entry_level: int = 0  # the highest level the answering member's build applies


@dataclasses.dataclass(frozen=True)
class ForceReleaseResult(_Result):
    hwm: int
    op_id: bytes
    header: Header


@dataclasses.dataclass(frozen=True)
class EpochResult(_Result):
    epoch: int
    header: Header


@dataclasses.dataclass(frozen=True)
class Snapshot(_Result):
    data: bytes
    epoch: int
    index: int
    header: Header


# -- conversions ---------------------------------------------------------------------------


def acquire_result(r: pb.AcquireResponse, *, resource: str, holder: str, op_id: bytes) -> AcquireResult:
    return AcquireResult(
        resource=resource,
        holder=holder,
        token=r.token,
        lease_id=r.lease_id or r.token,
        expires_at_ms=r.expires_at_ms,
        op_id=op_id,
        header=header_from_pb(r.header),
        token_proof=r.token_proof,
    )


def keep_alive_result(r: pb.KeepAliveResponse, *, resource: str, token: int) -> KeepAliveResult:
    return KeepAliveResult(
        resource=r.resource or resource,
        token=r.token or token,
        expires_at_ms=r.expires_at_ms,
        header=header_from_pb(r.header),
    )


def keep_alive_items(r: pb.KeepAliveManyResponse) -> list[KeepAliveItem]:
    return [
        KeepAliveItem(
            resource=i.resource,
            token=i.token,
            ok=i.ok,
            expires_at_ms=i.expires_at_ms,
            reason=i.reason,
            message=i.message,
        )
        for i in r.results
    ]


def release_result(r: pb.ReleaseResponse) -> ReleaseResult:
    return ReleaseResult(released=r.released, hwm=r.hwm, header=header_from_pb(r.header))


def release_many_outcomes(r: pb.ReleaseManyResponse) -> list[ReleaseResult | FencingError]:
    """Per item of a ReleaseMany, its ReleaseResult or the exception its Release alone raises."""
    outcomes: list[ReleaseResult | FencingError] = []
    for item in r.results:
        if item.WhichOneof("outcome") == "release":
            outcomes.append(release_result(item.release))
        else:
            code = getattr(grpc.StatusCode, item.error.code, None) if item.error.code else None
            outcomes.append(error_for_reason(
                item.error.reason, item.error.message, code=code if isinstance(code, grpc.StatusCode) else None,
                metadata=dict(item.error.metadata), header=header_from_pb(r.header),
                request={"rpc": "release"},
            ))
    return outcomes


def description(r: pb.DescribeResponse, *, resource: str) -> Description:
    return Description(
        resource=r.resource or resource,
        held=r.held,
        holder=r.holder,
        token=r.token,
        hwm=r.hwm,
        expires_at_ms=r.expires_at_ms,
        log_clock_ms=r.log_clock_ms,
        header=header_from_pb(r.header),
        waiters=r.waiters,
    )


def write_result(r: pb.WriteResponse, *, op_id: bytes) -> WriteResult:
    return WriteResult(version=r.version, hwm=r.hwm, op_id=op_id, header=header_from_pb(r.header))


def delete_result(r: pb.DeleteResponse, *, op_id: bytes) -> DeleteResult:
    return DeleteResult(
        version=r.version, deleted=r.deleted, op_id=op_id, header=header_from_pb(r.header)
    )


def read_result(r: pb.ReadResponse) -> ReadResult:
    return ReadResult(
        found=r.found, value=r.value, version=r.version, hwm=r.hwm, header=header_from_pb(r.header)
    )


def member_from_pb(m: pb.Member) -> Member:
    return Member(
        id=m.id, api_address=m.api_address, is_leader=m.is_leader, member_id=m.member_id,
        incarnation=m.incarnation, role=m.role, match_index=m.match_index, voter=m.voter,
    )


@dataclasses.dataclass(frozen=True)
class MemberList(_Result):
    cluster_id: str
    members: tuple[Member, ...]
    index: int  # the CONFIG entry a change committed at (0: a listing)
    header: Header


def member_list(r: pb.MemberListResponse) -> MemberList:
    return MemberList(
        cluster_id=r.cluster_id, members=tuple(member_from_pb(m) for m in r.members), index=r.index,
        header=header_from_pb(r.header),
    )


def cluster_status(r: pb.StatusResponse) -> ClusterStatus:
    return ClusterStatus(
        members=tuple(member_from_pb(m) for m in r.members),
        leader=r.leader,
        leader_api_address=r.leader_api_address,
        term=r.term,
        commit_index=r.commit_index,
        applied_index=r.applied_index,
        epoch=r.epoch,
        has_quorum=r.has_quorum,
        header=header_from_pb(r.header),
        version=r.version,
        data_size_bytes=r.data_size_bytes,
        local=r.local,
        cluster_level=r.cluster_level,
        entry_level=r.entry_level,
    )


def force_release_result(r: pb.ForceReleaseResponse, *, op_id: bytes) -> ForceReleaseResult:
    return ForceReleaseResult(hwm=r.hwm, op_id=op_id, header=header_from_pb(r.header))


def epoch_result(r: pb.SetEpochFloorResponse | pb.RestoreResponse) -> EpochResult:
    return EpochResult(epoch=r.epoch, header=header_from_pb(r.header))


def snapshot(r: pb.SnapshotResponse) -> Snapshot:
    return Snapshot(data=r.data, epoch=r.epoch, index=r.index, header=header_from_pb(r.header))


class IncompleteSnapshot(ValueError):
    """A SnapshotStream ended without the bytes its first message declared."""


def snapshot_from_chunks(chunks: list[pb.SnapshotChunk]) -> Snapshot:
    """The backup a SnapshotStream sent, checked against the size and sha256 of its first chunk."""
    if not chunks:
        raise IncompleteSnapshot("the snapshot stream ended without a message")
    first = chunks[0]
    data = b"".join(chunk.data for chunk in chunks)
    if len(data) != first.size or hashlib.sha256(data).digest() != first.sha256:
        raise IncompleteSnapshot(
            f"the snapshot stream sent {len(data)} bytes that do not match the declared"
            f" {first.size} bytes and sha256 {first.sha256.hex()}"
        )
    return Snapshot(data=data, epoch=first.epoch, index=first.index, header=header_from_pb(first.header))
