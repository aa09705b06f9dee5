from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResponseHeader(_message.Message):
    __slots__ = ("member_id", "raft_term", "applied_index")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    raft_term: int
    applied_index: int
    def __init__(self, member_id: _Optional[str] = ..., raft_term: _Optional[int] = ..., applied_index: _Optional[int] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("resource", "holder", "ttl_ms", "op_id", "wait_ms")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    holder: str
    ttl_ms: int
    op_id: bytes
    wait_ms: int
    def __init__(self, resource: _Optional[str] = ..., holder: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., op_id: _Optional[bytes] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("header", "token", "lease_id", "expires_at_ms", "token_proof")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PROOF_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    token: int
    lease_id: int
    expires_at_ms: int
    token_proof: bytes
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., token: _Optional[int] = ..., lease_id: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., token_proof: _Optional[bytes] = ...) -> None: ...

class AcquireManyRequest(_message.Message):
    __slots__ = ("acquires",)
    ACQUIRES_FIELD_NUMBER: _ClassVar[int]
    acquires: _containers.RepeatedCompositeFieldContainer[AcquireRequest]
    def __init__(self, acquires: _Optional[_Iterable[_Union[AcquireRequest, _Mapping]]] = ...) -> None: ...

class AcquireManyResult(_message.Message):
    __slots__ = ("acquire", "error")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireResponse
    error: WriteItemError
    def __init__(self, acquire: _Optional[_Union[AcquireResponse, _Mapping]] = ..., error: _Optional[_Union[WriteItemError, _Mapping]] = ...) -> None: ...

class AcquireManyResponse(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[AcquireManyResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[AcquireManyResult, _Mapping]]] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("resource", "token", "lease_id", "ttl_ms")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    token: int
    lease_id: int
    ttl_ms: int
    def __init__(self, resource: _Optional[str] = ..., token: _Optional[int] = ..., lease_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("header", "resource", "token", "expires_at_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    resource: str
    token: int
    expires_at_ms: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., resource: _Optional[str] = ..., token: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class KeepAliveManyRequest(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[KeepAliveRequest]
    def __init__(self, leases: _Optional[_Iterable[_Union[KeepAliveRequest, _Mapping]]] = ...) -> None: ...

class KeepAliveResult(_message.Message):
    __slots__ = ("resource", "token", "ok", "expires_at_ms", "reason", "message")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    token: int
    ok: bool
    expires_at_ms: int
    reason: str
    message: str
    def __init__(self, resource: _Optional[str] = ..., token: _Optional[int] = ..., ok: _Optional[bool] = ..., expires_at_ms: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class KeepAliveManyResponse(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[KeepAliveResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeepAliveResult, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("resource", "token", "op_id")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    resource: str
    token: int
    op_id: bytes
    def __init__(self, resource: _Optional[str] = ..., token: _Optional[int] = ..., op_id: _Optional[bytes] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("header", "released", "hwm")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    released: bool
    hwm: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., released: _Optional[bool] = ..., hwm: _Optional[int] = ...) -> None: ...

class ReleaseManyRequest(_message.Message):
    __slots__ = ("releases",)
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    def __init__(self, releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ...) -> None: ...

class ReleaseManyResult(_message.Message):
    __slots__ = ("release", "error")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    release: ReleaseResponse
    error: WriteItemError
    def __init__(self, release: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., error: _Optional[_Union[WriteItemError, _Mapping]] = ...) -> None: ...

class ReleaseManyResponse(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[ReleaseManyResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[ReleaseManyResult, _Mapping]]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("resource",)
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    def __init__(self, resource: _Optional[str] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("header", "resource", "held", "holder", "token", "hwm", "expires_at_ms", "log_clock_ms", "waiters")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_CLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    resource: str
    held: bool
    holder: str
    token: int
    hwm: int
    expires_at_ms: int
    log_clock_ms: int
    waiters: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., resource: _Optional[str] = ..., held: _Optional[bool] = ..., holder: _Optional[str] = ..., token: _Optional[int] = ..., hwm: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., log_clock_ms: _Optional[int] = ..., waiters: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "limit", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    limit: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListedResource(_message.Message):
    __slots__ = ("resource", "held", "holder", "token", "hwm", "remaining_ms", "waiters")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    held: bool
    holder: str
    token: int
    hwm: int
    remaining_ms: int
    waiters: int
    def __init__(self, resource: _Optional[str] = ..., held: _Optional[bool] = ..., holder: _Optional[str] = ..., token: _Optional[int] = ..., hwm: _Optional[int] = ..., remaining_ms: _Optional[int] = ..., waiters: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("header", "resources", "next_page_token", "log_clock_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOG_CLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    resources: _containers.RepeatedCompositeFieldContainer[ListedResource]
    next_page_token: str
    log_clock_ms: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., resources: _Optional[_Iterable[_Union[ListedResource, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., log_clock_ms: _Optional[int] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("resource", "key", "value", "token", "op_id", "expected_version")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    resource: str
    key: str
    value: bytes
    token: int
    op_id: bytes
    expected_version: int
    def __init__(self, resource: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ..., token: _Optional[int] = ..., op_id: _Optional[bytes] = ..., expected_version: _Optional[int] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("header", "version", "hwm")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    version: int
    hwm: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., version: _Optional[int] = ..., hwm: _Optional[int] = ...) -> None: ...

class WriteManyRequest(_message.Message):
    __slots__ = ("writes",)
    WRITES_FIELD_NUMBER: _ClassVar[int]
    writes: _containers.RepeatedCompositeFieldContainer[WriteRequest]
    def __init__(self, writes: _Optional[_Iterable[_Union[WriteRequest, _Mapping]]] = ...) -> None: ...

class WriteItemError(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WriteManyResult(_message.Message):
    __slots__ = ("write", "error")
    WRITE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    write: WriteResponse
    error: WriteItemError
    def __init__(self, write: _Optional[_Union[WriteResponse, _Mapping]] = ..., error: _Optional[_Union[WriteItemError, _Mapping]] = ...) -> None: ...

class WriteManyResponse(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[WriteManyResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[WriteManyResult, _Mapping]]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("resource", "key", "token", "op_id", "expected_version")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    resource: str
    key: str
    token: int
    op_id: bytes
    expected_version: int
    def __init__(self, resource: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., op_id: _Optional[bytes] = ..., expected_version: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("header", "version", "deleted")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    version: int
    deleted: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., version: _Optional[int] = ..., deleted: _Optional[bool] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("resource", "key")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    resource: str
    key: str
    def __init__(self, resource: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("header", "found", "value", "version", "hwm")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    found: bool
    value: bytes
    version: int
    hwm: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., found: _Optional[bool] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ..., hwm: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("local",)
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    local: bool
    def __init__(self, local: _Optional[bool] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "api_address", "is_leader", "member_id", "incarnation", "role", "match_index", "voter")
    ID_FIELD_NUMBER: _ClassVar[int]
    API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    id: str
    api_address: str
    is_leader: bool
    member_id: str
    incarnation: int
    role: str
    match_index: int
    voter: bool
    def __init__(self, id: _Optional[str] = ..., api_address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., member_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., role: _Optional[str] = ..., match_index: _Optional[int] = ..., voter: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("header", "members", "leader", "leader_api_address", "term", "commit_index", "applied_index", "epoch", "has_quorum", "version", "data_size_bytes", "local", "cluster_level", "entry_level")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    ENTRY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    members: _containers.RepeatedCompositeFieldContainer[Member]
    leader: str
    leader_api_address: str
    term: int
    commit_index: int
    applied_index: int
    epoch: int
    has_quorum: bool
    version: str
    data_size_bytes: int
    local: bool
    cluster_level: int
    entry_level: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., leader: _Optional[str] = ..., leader_api_address: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., epoch: _Optional[int] = ..., has_quorum: _Optional[bool] = ..., version: _Optional[str] = ..., data_size_bytes: _Optional[int] = ..., local: _Optional[bool] = ..., cluster_level: _Optional[int] = ..., entry_level: _Optional[int] = ...) -> None: ...

class MemberListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberAddRequest(_message.Message):
    __slots__ = ("member_id", "raft_address")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    raft_address: str
    def __init__(self, member_id: _Optional[str] = ..., raft_address: _Optional[str] = ...) -> None: ...

class MemberRemoveRequest(_message.Message):
    __slots__ = ("member_id",)
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    def __init__(self, member_id: _Optional[str] = ...) -> None: ...

class MemberReplaceRequest(_message.Message):
    __slots__ = ("member_id", "raft_address")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    raft_address: str
    def __init__(self, member_id: _Optional[str] = ..., raft_address: _Optional[str] = ...) -> None: ...

class MemberListResponse(_message.Message):
    __slots__ = ("header", "cluster_id", "members", "index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    cluster_id: str
    members: _containers.RepeatedCompositeFieldContainer[Member]
    index: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., cluster_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class ForceReleaseRequest(_message.Message):
    __slots__ = ("resource", "op_id")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    resource: str
    op_id: bytes
    def __init__(self, resource: _Optional[str] = ..., op_id: _Optional[bytes] = ...) -> None: ...

class ForceReleaseResponse(_message.Message):
    __slots__ = ("header", "hwm")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    HWM_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    hwm: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., hwm: _Optional[int] = ...) -> None: ...

class SetEpochFloorRequest(_message.Message):
    __slots__ = ("floor", "fence_all")
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    FENCE_ALL_FIELD_NUMBER: _ClassVar[int]
    floor: int
    fence_all: bool
    def __init__(self, floor: _Optional[int] = ..., fence_all: _Optional[bool] = ...) -> None: ...

class SetEpochFloorResponse(_message.Message):
    __slots__ = ("header", "epoch")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    epoch: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("local",)
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    local: bool
    def __init__(self, local: _Optional[bool] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("header", "data", "epoch", "index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    data: bytes
    epoch: int
    index: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., epoch: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("header", "data", "epoch", "index", "size", "sha256")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    data: bytes
    epoch: int
    index: int
    size: int
    sha256: bytes
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., epoch: _Optional[int] = ..., index: _Optional[int] = ..., size: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class RestoreStreamRequest(_message.Message):
    __slots__ = ("epoch_floor", "data")
    EPOCH_FLOOR_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    epoch_floor: int
    data: bytes
    def __init__(self, epoch_floor: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("data", "epoch_floor")
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FLOOR_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    epoch_floor: int
    def __init__(self, data: _Optional[bytes] = ..., epoch_floor: _Optional[int] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("header", "epoch")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    epoch: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class LockRequest(_message.Message):
    __slots__ = ("resource", "holder", "ttl_ms", "waiter_id", "wait_ms")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WAITER_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    holder: str
    ttl_ms: int
    waiter_id: bytes
    wait_ms: int
    def __init__(self, resource: _Optional[str] = ..., holder: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., waiter_id: _Optional[bytes] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class LockResponse(_message.Message):
    __slots__ = ("header", "granted", "token", "lease_id", "expires_at_ms", "token_proof", "queued", "position")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PROOF_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    granted: bool
    token: int
    lease_id: int
    expires_at_ms: int
    token_proof: bytes
    queued: bool
    position: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., granted: _Optional[bool] = ..., token: _Optional[int] = ..., lease_id: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., token_proof: _Optional[bytes] = ..., queued: _Optional[bool] = ..., position: _Optional[int] = ...) -> None: ...

class CancelLockRequest(_message.Message):
    __slots__ = ("resource", "waiter_id")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    WAITER_ID_FIELD_NUMBER: _ClassVar[int]
    resource: str
    waiter_id: bytes
    def __init__(self, resource: _Optional[str] = ..., waiter_id: _Optional[bytes] = ...) -> None: ...

class CancelLockResponse(_message.Message):
    __slots__ = ("header", "cancelled", "released")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    cancelled: bool
    released: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., cancelled: _Optional[bool] = ..., released: _Optional[bool] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("prefix", "start_revision")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    start_revision: int
    def __init__(self, prefix: _Optional[str] = ..., start_revision: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "revision", "resource", "holder", "token", "expires_at_ms", "key", "value", "version")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[WatchEvent.Type]
        ACQUIRED: _ClassVar[WatchEvent.Type]
        RELEASED: _ClassVar[WatchEvent.Type]
        EXPIRED: _ClassVar[WatchEvent.Type]
        FORCE_RELEASED: _ClassVar[WatchEvent.Type]
        WRITTEN: _ClassVar[WatchEvent.Type]
        DELETED: _ClassVar[WatchEvent.Type]
        RESET: _ClassVar[WatchEvent.Type]
    TYPE_UNSPECIFIED: WatchEvent.Type
    ACQUIRED: WatchEvent.Type
    RELEASED: WatchEvent.Type
    EXPIRED: WatchEvent.Type
    FORCE_RELEASED: WatchEvent.Type
    WRITTEN: WatchEvent.Type
    DELETED: WatchEvent.Type
    RESET: WatchEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    type: WatchEvent.Type
    revision: int
    resource: str
    holder: str
    token: int
    expires_at_ms: int
    key: str
    value: bytes
    version: int
    def __init__(self, type: _Optional[_Union[WatchEvent.Type, str]] = ..., revision: _Optional[int] = ..., resource: _Optional[str] = ..., holder: _Optional[str] = ..., token: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("header", "revision", "events", "created")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    revision: int
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    created: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., revision: _Optional[int] = ..., events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ..., created: _Optional[bool] = ...) -> None: ...
