"""Every failure the server can report reaches the client as the exception meant for it.

For each key of ``coordinator.server.errors.STATUS_TABLE`` (every state-machine Reason and
every Failure) a real gRPC server on loopback, running the real servicers, answers a Write
with that failure: the servicer's error handling, ``errors.rich_status`` and the trailers
are the production ones; only the Raft node and the proposer are stand-ins, and the
proposer raises the failure. The real ``FencingClient`` then has to raise the class
``EXPECTED`` names, with the ErrorInfo metadata and the who-answered trailers parsed; and so
must a multiplexed client, whose write, acquire or release travels as an item of a WriteMany,
AcquireMany or ReleaseMany whose answer carries the same status and ErrorInfo per item.

``EXPECTED`` is written here, apart from both tables, on purpose: a new Reason or Failure,
or a new ErrorInfo reason, fails these tests until someone decides which client class it is
(and the client's table says so too).
"""

from __future__ import annotations

import concurrent.futures
import types
from typing import Any

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from coordinator.core.names import DOMAIN, Trailer
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from coordinator.core.results import LockState
from coordinator.server import errors, request_core, service
from coordinator.server.streams import waiter_gate

MEMBER_ID = "127.0.0.1:7200"  # what the stand-in node calls itself (the trailers carry it)
TERM, APPLIED = 7, 42

# ErrorInfo reason -> (the client's class, metadata the server sends, what the exception's
# own attributes must read from it).
EXPECTED: dict[R, tuple[type[E.FencingError], dict[M, str], dict[str, Any]]] = {
    R.INVALID_FIELD: (E.InvalidArgument, {M.FIELD: "key"}, {"field": "key"}),
    R.STALE_TOKEN: (E.StaleToken, {M.HWM: "9"}, {"hwm": 9}),
    R.UNKNOWN_TOKEN: (E.UnknownToken, {M.HWM: "2"}, {"hwm": 2}),
    R.LEASE_HELD: (
        E.LeaseHeld,
        {M.HOLDER: "b", M.EXPIRES_AT_MS: "1700000000000", M.TOKEN: "4", M.REMAINING_MS: "2500"},
        {"holder": "b", "expires_at_ms": 1700000000000, "token": 4, "remaining_ms": 2500},
    ),
    R.LEASE_EXPIRED: (E.LeaseExpired, {}, {}),
    R.VERSION_MISMATCH: (E.VersionMismatch, {M.VERSION: "3"}, {"version": 3}),
    R.EPOCH_FLOOR_TOO_LOW: (E.EpochFloorTooLow, {M.EPOCH: "12"}, {"epoch": 12}),
    R.OP_ID_CONFLICT: (E.OpIdConflict, {M.OP: "4", M.RESOURCE: "orders/7"}, {}),
    R.LIMIT_EXCEEDED: (E.LimitExceeded, {M.LIMIT: "keys_per_resource", M.MAX: "10"}, {}),
    R.QUOTA_EXCEEDED: (
        E.QuotaExceeded,
        {M.QUOTA: "resources", M.MAX: "3", M.PRINCIPAL: "orders"},
        {"quota": "resources", "max": 3},
    ),
    R.EPOCH_EXHAUSTED: (E.EpochExhausted, {}, {}),
    R.OVERLOADED: (E.Overloaded, {M.DETAIL: "queue_full"}, {}),
    R.NO_LEADER: (
        E.NoLeader,
        {M.LEADER: "10.9.9.9:7200", M.LEADER_API: "10.9.9.9:7100", M.DETAIL: "no_leader"},
        {"leader_hint": "10.9.9.9:7100"},
    ),
    R.OUTCOME_UNKNOWN: (E.OutcomeUnknown, {M.DETAIL: "leader_changed"}, {}),
    R.UNAUTHENTICATED: (E.Unauthenticated, {}, {}),
    R.PERMISSION_DENIED: (E.PermissionDenied, {}, {}),
    R.MEMBER_CHANGE_REFUSED: (E.Refused, {M.DETAIL: "change_in_progress"}, {}),
    R.UNKNOWN_MEMBER: (E.UnknownMember, {M.DETAIL: "unknown_member"}, {}),
    R.CLUSTER_LEVEL_TOO_LOW: (E.Refused, {M.NEEDED_LEVEL: "2", M.CLUSTER_LEVEL: "1"}, {}),
    R.COMPACTED: (
        E.Compacted, {M.CURRENT_REVISION: "40", M.OLDEST_REVISION: "31"},
        {"current_revision": 40, "oldest_revision": 31},
    ),
}

ALL_KEYS = list(errors.STATUS_TABLE)


def _expected(key) -> tuple[type[E.FencingError], dict[M, str], dict[str, Any]]:
    reason = errors.STATUS_TABLE[key][1]
    if reason not in EXPECTED:
        pytest.fail(f"{key!r} is sent as {reason}: say in EXPECTED which client class that is")
    return EXPECTED[reason]


class _FailingProposer:
    """Stands in for proposer.Proposer: every proposal fails with ``error``."""

    deadline_margin_s = 0.0

    def __init__(self) -> None:
        self.error: errors.ServiceError | None = None

    def timeout_s(self, context) -> float:
        return 1.0

    def propose(self, command, timeout_s: float, *, max_bytes: int | None = None):
        assert self.error is not None, "the test sets the failure before calling"
        raise self.error

    def propose_many(self, commands, timeout_s: float):
        assert self.error is not None, "the test sets the failure before calling"
        return [self.error] * len(commands)  # a batch RPC: every item fails with it


@pytest.fixture(scope="module")
def server():
    """The real Lease and FencedStore servicers on loopback, over a failing proposer."""
    node = types.SimpleNamespace(
        config=types.SimpleNamespace(self_address=MEMBER_ID),
        term_and_applied=lambda: (TERM, APPLIED),
        # An Acquire refused LEASE_HELD looks up whether its op_id was granted through the
        # lock queue (a lost answer's retry); here it never was.
        read=lambda query: query(types.SimpleNamespace(
            lock_state=lambda resource, waiter_id: LockState(granted=False, queued=False))),
    )
    proposer = _FailingProposer()
    core = request_core.Core(node, proposer, members={MEMBER_ID: "127.0.0.1:7100"})
    lease = service.LeaseServicer(
        core, waiters=waiter_gate(waiters_max=2, per_caller_max=2),
    )
    grpc_server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_FencedStoreServicer_to_server(service.FencedStoreServicer(core), grpc_server)
    pb_grpc.add_LeaseServicer_to_server(lease, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield proposer, f"127.0.0.1:{port}"
    finally:
        grpc_server.stop(grace=None)
        lease.close()


@pytest.fixture(scope="module")
def client(server):
    # One attempt: a retryable failure (NoLeader, Overloaded) is raised as it came.
    with FencingClient([server[1]], retry_max_attempts=1, timeout_s=5) as c:
        yield c


@pytest.fixture(scope="module")
def mux_client(server):
    # The same, with writes multiplexed: each one travels as an item of a WriteMany.
    with FencingClient([server[1]], retry_max_attempts=1, timeout_s=5, multiplex=True) as c:
        c._batcher.single_as_plain = False  # a lone call too goes as an item of a batch
        yield c


def _failure(key, metadata: dict[M, str]) -> errors.ServiceError:
    return errors.ServiceError(key, f"refused by the test ({key.name})", dict(metadata))


def _server_answer(exc: BaseException) -> E.FencingError:
    """The exception the client built from the server's answer itself: the one whose cause
    is the grpc.RpcError. The client may wrap it (OutcomeUnknown for a mutation that may
    have applied, a summary after the last attempt), keeping it as the cause."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, E.FencingError) and isinstance(seen.__cause__, grpc.RpcError):
            return seen
        seen = seen.__cause__
    raise AssertionError(f"no exception built from a server answer behind {exc!r}")


@pytest.mark.parametrize("key", ALL_KEYS, ids=lambda key: f"{type(key).__name__}.{key.name}")
def test_every_status_table_entry_reaches_the_client_as_its_class(server, client, key):
    proposer, _ = server
    cls, metadata, attributes = _expected(key)
    code, reason = errors.STATUS_TABLE[key]
    proposer.error = _failure(key, metadata)

    with pytest.raises(E.FencingError) as caught:
        client.write("orders/7", "k", b"v", token=3)

    assert type(caught.value) is cls, f"{key!r}: {type(caught.value).__name__}: {caught.value}"
    answer = _server_answer(caught.value)
    assert type(answer) is cls
    assert (answer.code, answer.reason) == (code, reason)
    assert answer.metadata == {str(k): v for k, v in metadata.items()}
    assert answer.server_message == f"refused by the test ({key.name})"
    assert answer.header == E.Header(member_id=MEMBER_ID, raft_term=TERM, applied_index=APPLIED)
    for name, value in attributes.items():
        assert getattr(answer, name) == value, name


@pytest.mark.parametrize("key", ALL_KEYS, ids=lambda key: f"{type(key).__name__}.{key.name}")
def test_every_status_table_entry_reaches_a_keep_alive_many_item_as_its_class(server, client, key):
    # KeepAliveMany reports each item's failure by its reason alone, without a status code.
    proposer, _ = server
    cls, metadata, _ = _expected(key)
    proposer.error = _failure(key, metadata)

    [item] = client.keep_alive_many([("orders/7", 3)])

    assert not item.ok and item.reason == errors.STATUS_TABLE[key][1]
    assert type(item.error) is cls


@pytest.mark.parametrize("key", ALL_KEYS, ids=lambda key: f"{type(key).__name__}.{key.name}")
def test_every_status_table_entry_reaches_a_multiplexed_write_as_its_class(server, mux_client, key):
    # A WriteMany item carries the status code name, reason, message and metadata the Write
    # alone would have had; the multiplexed client must raise what the plain write raises.
    proposer, _ = server
    cls, metadata, attributes = _expected(key)
    code, reason = errors.STATUS_TABLE[key]
    proposer.error = _failure(key, metadata)

    with pytest.raises(E.FencingError) as caught:
        mux_client.write("orders/7", "k", b"v", token=3)

    assert type(caught.value) is cls, f"{key!r}: {type(caught.value).__name__}: {caught.value}"
    answer = caught.value  # the item's own exception: the innermost FencingError of the chain
    while isinstance(answer.__cause__, E.FencingError):
        answer = answer.__cause__
    assert type(answer) is cls
    assert (answer.code, answer.reason) == (code, reason)
    assert answer.metadata == {str(k): v for k, v in metadata.items()}
    assert answer.server_message == f"refused by the test ({key.name})"
    assert answer.header == E.Header(member_id=MEMBER_ID, raft_term=TERM, applied_index=APPLIED)
    assert answer.request["op_id"] == caught.value.request["op_id"] and answer.request["rpc"] == "write"
    for name, value in attributes.items():
        assert getattr(answer, name) == value, name


@pytest.mark.parametrize("rpc", ["acquire", "release"])
@pytest.mark.parametrize("key", ALL_KEYS, ids=lambda key: f"{type(key).__name__}.{key.name}")
def test_every_status_table_entry_reaches_a_multiplexed_acquire_or_release_as_its_class(server, mux_client, key, rpc):
    # An AcquireMany or ReleaseMany item carries what the Acquire or Release alone would have
    # had; the multiplexed client must raise what the plain call raises.
    proposer, _ = server
    cls, metadata, attributes = _expected(key)
    code, reason = errors.STATUS_TABLE[key]
    proposer.error = _failure(key, metadata)

    with pytest.raises(E.FencingError) as caught:
        if rpc == "acquire":
            mux_client.acquire("orders/7", ttl_ms=5000)
        else:
            mux_client.release("orders/7", 3)

    assert type(caught.value) is cls, f"{key!r}: {type(caught.value).__name__}: {caught.value}"
    answer = caught.value
    while isinstance(answer.__cause__, E.FencingError):
        answer = answer.__cause__
    assert type(answer) is cls
    assert (answer.code, answer.reason) == (code, reason)
    assert answer.metadata == {str(k): v for k, v in metadata.items()}
    assert answer.server_message == f"refused by the test ({key.name})"
    assert answer.header == E.Header(member_id=MEMBER_ID, raft_term=TERM, applied_index=APPLIED)
    assert answer.request["op_id"] == caught.value.request["op_id"] and answer.request["rpc"] == rpc
    for name, value in attributes.items():
        assert getattr(answer, name) == value, name


def test_the_client_table_names_every_pair_the_server_sends():
    sent = set(errors.STATUS_TABLE.values())
    missing = sorted(f"{code.name}/{reason}" for code, reason in sent if (code, reason) not in E.ERROR_CLASSES)
    assert not missing, f"the client has no class for {missing}"
    # ...and this test's own expectations cover every reason the server sends.
    assert {reason for _, reason in sent} <= set(EXPECTED)


def test_every_declared_reason_has_a_client_class():
    # Reasons the server never sends (NOT_LEADER, NO_QUORUM) are declared for the client.
    known = {reason for _, reason in E.ERROR_CLASSES if reason}
    assert set(R) == known


def test_the_wire_strings_are_pinned():
    # The one place the wire strings are typed out, on purpose: everything else compares
    # with coordinator.core.names, so renaming a value there would pass every other test
    # while breaking every client and server already deployed.
    assert DOMAIN == "fencing.v1"
    assert sorted(R) == sorted([
        "INVALID_FIELD", "STALE_TOKEN", "UNKNOWN_TOKEN", "LEASE_HELD", "LEASE_EXPIRED",
        "VERSION_MISMATCH", "EPOCH_FLOOR_TOO_LOW", "OP_ID_CONFLICT", "LIMIT_EXCEEDED",
        "EPOCH_EXHAUSTED", "OVERLOADED", "NO_LEADER", "OUTCOME_UNKNOWN", "UNAUTHENTICATED",
        "PERMISSION_DENIED", "NOT_LEADER", "NO_QUORUM", "QUOTA_EXCEEDED",
        "MEMBER_CHANGE_REFUSED", "UNKNOWN_MEMBER", "CLUSTER_LEVEL_TOO_LOW", "COMPACTED",
    ])
    assert all(reason.value == reason.name for reason in R)
    assert sorted(M) == sorted([
        "field", "hwm", "holder", "expires_at_ms", "token", "version", "epoch", "op",
        "resource", "limit", "max", "leader", "leader_api", "detail", "quota", "principal", "remaining_ms",
        "needed_level", "cluster_level", "current_revision", "oldest_revision",
    ])
    assert sorted(Trailer) == ["fencing-applied-index", "fencing-member-id", "fencing-raft-term"]
