"""Tests of the Python client (coordinator.client, coordinator.client.exceptions).

Two layers:

- against ``testsupport.inmemory.InMemoryCluster``: three in-process gRPC servers running the
  real servicers over one in-memory log, with faults injected where they happen: a proposal's
  fate at the node (no leader, outcome unknown before or after applying, a slow commit, a
  refusal), a stalled member or an unlisted status at the server's edge, a stopped server.
  Deterministic and fast: these pin the error table, the retry rules and the Lease helper;
- against a real three-process cluster (``testsupport/grpc_cluster.py``, ``fencingd serve`` on
  127.0.0.2-4): failover when the leader is killed, the same-op_id retry applying once
  across a paused leader, and a Lease fenced by an admin force-release.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
import threading
import time

import grpc
import pytest

from coordinator.client import AsyncFencingClient, AsyncLease, FencingClient, Lease, new_op_id
from coordinator.client import exceptions as E
from coordinator.client.retry import Backoff, Kind, classify
from coordinator.core.names import ErrorReason as R
from coordinator.core.state_machine import Reason
from coordinator.server.errors import Failure
from testsupport.inmemory import InMemoryCluster
from testsupport.inmemory_faults import (
    fail,
    no_leader,
    queue_full,
    refuse,
    slow_commit,
    stall,
    unknown_after_apply,
    unknown_before_apply,
    unlisted_status,
)

# Short deadlines keep the fault tests quick; the in-memory cluster answers in about a millisecond.
FAST = dict(timeout_s=3.0, attempt_timeout_s=0.5, retry_backoff_s=0.01, retry_backoff_max_s=0.05)


@pytest.fixture
def cluster():
    with InMemoryCluster() as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with FencingClient(cluster.endpoints, **FAST) as c:
        yield c


def op_ids(calls):
    return [call.request.op_id for call in calls]


# ---------------------------------------------------------------- the error table


_C = grpc.StatusCode
NO = "server says no"


@pytest.mark.parametrize(
    "fault, code, reason, metadata, cls, attrs",
    [
        # Refusals come from the node as the state machine's own, through the service's table.
        (refuse(Reason.STALE_TOKEN, NO, hwm=9), _C.FAILED_PRECONDITION, R.STALE_TOKEN, {"hwm": "9"},
         E.StaleToken, {"hwm": 9}),
        (refuse(Reason.UNKNOWN_TOKEN, NO, hwm=2), _C.FAILED_PRECONDITION, R.UNKNOWN_TOKEN, {"hwm": "2"},
         E.UnknownToken, {"hwm": 2}),
        (refuse(Reason.LEASE_HELD, NO, holder="w-b", expires_at_ms=1700000000000, token=4),
         _C.FAILED_PRECONDITION, R.LEASE_HELD, {"holder": "w-b", "expires_at_ms": "1700000000000", "token": "4"},
         E.LeaseHeld, {"holder": "w-b", "expires_at_ms": 1700000000000, "token": 4}),
        (refuse(Reason.LEASE_EXPIRED, NO), _C.FAILED_PRECONDITION, R.LEASE_EXPIRED, {}, E.LeaseExpired, {}),
        (refuse(Reason.VERSION_MISMATCH, NO, version=3), _C.FAILED_PRECONDITION, R.VERSION_MISMATCH,
         {"version": "3"}, E.VersionMismatch, {"version": 3}),
        (refuse(Reason.EPOCH_FLOOR_TOO_LOW, NO, epoch=12), _C.FAILED_PRECONDITION, R.EPOCH_FLOOR_TOO_LOW,
         {"epoch": "12"}, E.EpochFloorTooLow, {"epoch": 12}),
        (refuse(Reason.OP_ID_CONFLICT, NO, op=4), _C.ALREADY_EXISTS, R.OP_ID_CONFLICT, {"op": "4"},
         E.OpIdConflict, {}),
        (refuse(Reason.MALFORMED, NO, field="token"), _C.INVALID_ARGUMENT, R.INVALID_FIELD, {"field": "token"},
         E.InvalidArgument, {"field": "token"}),
        (refuse(Reason.LIMIT_EXCEEDED, NO, limit="keys"), _C.RESOURCE_EXHAUSTED, R.LIMIT_EXCEEDED,
         {"limit": "keys"}, E.LimitExceeded, {}),
        (refuse(Reason.EPOCH_EXHAUSTED, NO), _C.RESOURCE_EXHAUSTED, R.EPOCH_EXHAUSTED, {}, E.EpochExhausted, {}),
        # Failures the service raises before proposing, through the same table.
        (fail(Failure.UNAUTHENTICATED, NO), _C.UNAUTHENTICATED, R.UNAUTHENTICATED, {}, E.Unauthenticated, {}),
        (fail(Failure.PERMISSION_DENIED, NO), _C.PERMISSION_DENIED, R.PERMISSION_DENIED, {},
         E.PermissionDenied, {}),
        # Statuses this server never sends: a newer server's reason, a bare gRPC code.
        (unlisted_status(_C.FAILED_PRECONDITION, NO, "SOMETHING_NEW"), _C.FAILED_PRECONDITION, "SOMETHING_NEW",
         {}, E.Refused, {}),
        (unlisted_status(_C.INTERNAL, NO), _C.INTERNAL, "", {}, E.ServerError, {}),
        (unlisted_status(_C.UNIMPLEMENTED, NO), _C.UNIMPLEMENTED, "", {}, E.ServerError, {}),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_each_status_maps_to_its_exception_with_details(cluster, client, fault, code, reason, metadata, cls, attrs):
    cluster.inject("Describe", fault)
    with pytest.raises(E.FencingError) as info:
        client.describe("orders/7")
    err = info.value
    assert type(err) is cls
    assert err.code == code and err.reason == reason and err.metadata == metadata
    assert err.server_message == NO
    assert err.endpoint in cluster.endpoints
    assert err.header == E.Header(
        member_id=cluster.members[0].member_id, raft_term=1, applied_index=err.header.applied_index
    )
    for name, value in attrs.items():
        assert getattr(err, name) == value
    assert "\n" not in str(err) and str(err)
    assert isinstance(err.__cause__, grpc.RpcError)
    assert len(cluster.calls_to("Describe")) == 1  # none of these is retried


def test_the_tree_answers_did_it_apply():
    assert issubclass(E.NoLeader, E.Unavailable) and issubclass(E.Unavailable, E.NotApplied)
    for cls in (E.StaleToken, E.UnknownToken, E.LeaseHeld, E.LeaseExpired, E.VersionMismatch,
                E.OpIdConflict, E.EpochFloorTooLow):
        assert issubclass(cls, E.Refused) and issubclass(cls, E.NotApplied)
    for cls in (E.LimitExceeded, E.EpochExhausted, E.Overloaded):
        assert issubclass(cls, E.ResourceExhausted) and issubclass(cls, E.NotApplied)
    assert not issubclass(E.OutcomeUnknown, E.NotApplied)
    assert not issubclass(E.ServerError, E.NotApplied)
    assert not issubclass(E.LeaseLost, E.NotApplied)
    every = [v for v in vars(E).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert all(issubclass(cls, E.FencingError) for cls in every)
    # The docstring draws every class of the tree.
    for cls in every:
        assert cls.__name__ in E.__doc__, cls.__name__


def test_friendly_messages_name_the_facts():
    stale = E.error_for_reason(R.STALE_TOKEN, "x", code=grpc.StatusCode.FAILED_PRECONDITION,
                               metadata={"hwm": "2"}, request={"resource": "orders/7", "token": 1})
    assert str(stale) == "token 1 is stale for orders/7 (high-water mark is 2)"
    assert stale.category == "refused"
    held = E.error_for_reason(R.LEASE_HELD, "", code=grpc.StatusCode.FAILED_PRECONDITION,
                              metadata={"holder": "worker-a", "expires_at_ms": "0", "token": "5"},
                              request={"resource": "orders/7"})
    assert str(held) == "orders/7 is held by 'worker-a' (token 5) until 1970-01-01T00:00:00.000Z (log clock)"
    # A member that says the TTL left: a duration, not a date on the log clock (issue 29).
    held = E.error_for_reason(R.LEASE_HELD, "", code=grpc.StatusCode.FAILED_PRECONDITION,
                              metadata={"holder": "worker-a", "expires_at_ms": "186887", "token": "5",
                                        "remaining_ms": "29500"}, request={"resource": "orders/7"})
    assert str(held) == "orders/7 is held by 'worker-a' (token 5), 29.5s of its TTL left"
    assert held.remaining_ms == 29500
    unknown = E.OutcomeUnknown(request={"rpc": "write", "op_id": b"\x01" * 16})
    assert "retry with op id " + "01" * 16 in str(unknown)
    # A reason alone (KeepAliveMany items carry no status code) still finds its class.
    assert type(E.error_for_reason(R.LEASE_EXPIRED)) is E.LeaseExpired
    assert type(E.error_for_reason("NEVER_HEARD_OF")) is E.ServerError


def test_error_info_from_another_domain_is_ignored():
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    status = status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message="m")
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(domain="other.v1", reason=R.STALE_TOKEN))
    status.details.append(detail)
    grpc_status = rpc_status.to_status(status)

    class FakeError(grpc.RpcError):
        def code(self):
            return grpc_status.code

        def details(self):
            return grpc_status.details

        def trailing_metadata(self):
            return grpc_status.trailing_metadata

    err = E.from_rpc_error(FakeError())
    assert type(err) is E.Refused and err.reason == ""


# ---------------------------------------------------------------- the retry rules


def test_classify_rules():
    no_leader_exc = E.NoLeader(metadata={"leader_api": "h:1"})
    assert classify(no_leader_exc, Kind.DEDUP) == classify(no_leader_exc, Kind.ONCE)
    assert classify(no_leader_exc, Kind.DEDUP).retry and not classify(no_leader_exc, Kind.DEDUP).maybe_applied
    assert classify(no_leader_exc, Kind.DEDUP).leader_hint == "h:1"
    refused_conn = E.Unavailable(server_message="failed to connect to all addresses; ...")
    reset = E.Unavailable(server_message="Socket closed")
    assert not classify(refused_conn, Kind.DEDUP).maybe_applied
    assert classify(reset, Kind.DEDUP).maybe_applied and classify(reset, Kind.DEDUP).retry
    assert not classify(reset, Kind.READ).maybe_applied
    assert not classify(reset, Kind.ONCE).retry  # a restore is not resent blindly
    unknown = E.OutcomeUnknown()
    assert classify(unknown, Kind.DEDUP).retry and classify(unknown, Kind.DEDUP).maybe_applied
    assert classify(unknown, Kind.REPEATABLE).retry
    assert not classify(unknown, Kind.ONCE).retry
    assert classify(E.Overloaded(), Kind.DEDUP).retry
    for refusal in (E.StaleToken(), E.LeaseHeld(), E.InvalidArgument(), E.PermissionDenied(),
                    E.LimitExceeded(), E.ServerError()):
        assert not classify(refusal, Kind.READ).retry


class _TransportError(grpc.RpcError):
    """What grpc raises for a call whose connection failed: a status and a message, no
    ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()


def test_a_call_sent_once_whose_connection_dropped_is_unknown_not_unavailable():
    """A membership change (or a restore) is sent once. A connection that dropped after the
    request went out ("Socket closed": seen when a member restarted under a MemberReplace)
    may have applied it: the caller must hear OutcomeUnknown and check, not Unavailable, which
    says nothing was applied (fencingctl: exit 4 instead of 5)."""
    from coordinator.api.v1 import fencing_pb2 as pb
    from coordinator.client._calls import Attempts, Call

    client = FencingClient(["127.0.0.1:1"], timeout_s=5.0)  # never dialled: Attempts only
    try:
        def attempt(kind: Kind, err: grpc.RpcError):
            call = Call("admin", "MemberReplace", pb.MemberReplaceRequest(member_id="m2"), kind,
                        {"rpc": "member-replace", "member_id": "m2"}, lambda r: r)
            attempts = Attempts(client, call)
            attempts.begin()
            return attempts.failed(err, "127.0.0.1:1")

        dropped = _TransportError(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
        with pytest.raises(E.OutcomeUnknown) as caught:
            attempt(Kind.ONCE, dropped)
        assert isinstance(caught.value.__cause__, E.Unavailable)  # the typed cause, then grpc's
        # Never connected: surely not applied, so retried even when sent once.
        never = _TransportError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; x")
        assert attempt(Kind.ONCE, never) >= 0.0
        # A call that dedups is retried after the same drop (same op_id).
        assert attempt(Kind.DEDUP, dropped) >= 0.0
        # A definite refusal stays itself.
        refused = _TransportError(grpc.StatusCode.FAILED_PRECONDITION, "nothing changed")
        with pytest.raises(E.Refused):
            attempt(Kind.ONCE, refused)
    finally:
        client.close()


def test_backoff_is_bounded_and_jittered():
    backoff = Backoff(base_s=0.05, max_s=1.0)
    rng = random.Random(7)
    for n in range(50):
        d = backoff.delay_s(n, rng)
        ceiling = min(1.0, 0.05 * 2**n)
        assert ceiling / 2 <= d <= ceiling
    assert len({round(backoff.delay_s(3, rng), 6) for _ in range(20)}) > 1


def test_unknown_outcome_is_retried_with_the_same_op_id_and_applies_once(cluster, client):
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    cluster.inject("Write", unknown_after_apply())  # the first attempt applies, then "aborts"
    result = client.write("orders/7", "total", b"42", token=lease.token)
    calls = cluster.calls_to("Write")
    assert len(calls) == 2
    assert op_ids(calls) == [result.op_id, result.op_id]
    assert len(result.op_id) == 16
    read = client.read("orders/7", "total")
    assert (read.value, read.version) == (b"42", result.version)
    # Exactly one application: the next write is the resource's second revision.
    assert client.write("orders/7", "total", b"43", token=lease.token).version == result.version + 1


def test_a_deadline_on_a_mutation_is_retried_with_the_same_op_id(cluster, client):
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    # The member stalls past attempt_timeout_s=0.5: the client's own deadline expires, and
    # the member serves the request late anyway.
    cluster.inject("Write", stall(0.8))
    result = client.write("orders/7", "k", b"v", token=lease.token)
    calls = cluster.calls_to("Write")
    assert len(calls) == 2 and op_ids(calls) == [result.op_id] * 2
    assert calls[0].done.wait(5.0)  # the late first attempt reached the log: dedup absorbed it
    assert client.read("orders/7", "k").version == result.version
    assert client.write("orders/7", "k", b"w", token=lease.token).version == result.version + 1


def test_a_slow_commit_is_answered_outcome_unknown_in_time_and_retried_with_the_same_op_id(cluster, client):
    """The server gives a proposal the RPC's deadline minus a margin, so the client hears
    OUTCOME_UNKNOWN from the member (not its own deadline), retries with the same op_id, and
    the late commit is absorbed by the dedup table."""
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    cluster.inject("Write", slow_commit(0.8))  # past the proposal deadline (0.5 s - 0.1 s margin)
    result = client.write("orders/7", "k", b"v", token=lease.token)
    calls = cluster.calls_to("Write")
    assert len(calls) == 2 and op_ids(calls) == [result.op_id] * 2
    assert calls[0].code is grpc.StatusCode.ABORTED  # the member's OUTCOME_UNKNOWN
    assert cluster.log.wait_slow_commits(5.0)
    assert client.read("orders/7", "k").version == result.version
    assert client.write("orders/7", "k", b"w", token=lease.token).version == result.version + 1


def test_unknown_outcomes_until_the_deadline_raise_outcome_unknown_never_failure(cluster):
    with FencingClient(cluster.endpoints, **{**FAST, "retry_max_attempts": 3}) as client:
        lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
        cluster.inject("Write", unknown_after_apply(), unknown_before_apply(), unknown_before_apply())
        op_id = new_op_id()
        with pytest.raises(E.OutcomeUnknown) as info:
            client.write("orders/7", "k", b"v", token=lease.token, op_id=op_id)
        assert info.value.op_id == op_id
        assert op_ids(cluster.calls_to("Write")) == [op_id] * 3
        # The caller learns the outcome with the same op_id: the first attempt had applied.
        again = client.write("orders/7", "k", b"v", token=lease.token, op_id=op_id)
        assert again.version == 1
        assert client.read("orders/7", "k").version == 1


def test_no_leader_is_retried_and_the_hint_is_followed(cluster, client):
    cluster.inject("Describe", no_leader(new_leader=2))  # node 0 lost it; node 2 leads now
    client.describe("orders/7")
    nodes = [call.node for call in cluster.calls_to("Describe")]
    assert nodes == [0, 2]
    assert client.leader_endpoint == cluster.endpoints[2]


def test_leader_is_discovered_from_status(cluster):
    cluster.leader = 1
    with FencingClient(cluster.endpoints, **FAST) as client:
        client.describe("orders/7")
        assert [c.node for c in cluster.calls_to("Describe")] == [1]
        assert client.leader_endpoint == cluster.endpoints[1]


def test_without_a_leader_the_client_round_robins(cluster):
    cluster.leader = None
    with FencingClient(cluster.endpoints, **FAST) as client:
        for _ in range(3):
            client.describe("orders/7")
        assert sorted(c.node for c in cluster.calls_to("Describe")) == [0, 1, 2]


def test_refusals_are_never_retried(cluster, client):
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    client.force_release("orders/7")
    with pytest.raises(E.StaleToken) as info:
        client.write("orders/7", "k", b"v", token=lease.token)
    assert info.value.hwm == lease.token + 1
    assert str(info.value) == f"token {lease.token} is stale for orders/7 (high-water mark is {lease.token + 1})"
    assert len(cluster.calls_to("Write")) == 1
    with pytest.raises(E.LeaseHeld):
        client.acquire("orders/7", ttl_ms=5000, holder="b")
        client.acquire("orders/7", ttl_ms=5000, holder="c")
    assert len(cluster.calls_to("Acquire")) == 3


@pytest.mark.parametrize("token", [0, -1, True, 1.5, "1", None, 2**64])
def test_malformed_tokens_are_refused_before_sending(cluster, client, token):
    with pytest.raises(E.InvalidArgument) as info:
        client.write("orders/7", "k", b"v", token=token)
    assert info.value.field == "token"
    assert cluster.calls_to("Write") == []


def test_bad_fields_are_refused_before_sending(cluster, client):
    with pytest.raises(E.InvalidArgument, match="resource"):
        client.write("orders 7", "k", b"v", token=1)
    with pytest.raises(E.InvalidArgument, match="op_id"):
        client.write("orders/7", "k", b"v", token=1, op_id=b"short")
    with pytest.raises(E.InvalidArgument, match="value"):
        client.write("orders/7", "k", "text, not bytes", token=1)
    with pytest.raises(E.InvalidArgument, match="ttl_ms"):
        client.acquire("orders/7", ttl_ms=5)
    with pytest.raises(E.InvalidArgument, match="wait_ms"):
        client.acquire("orders/7", ttl_ms=5000, wait_ms=-1)
    # The table lets fence_all be absent, but the wire cannot say so (an unset bool reads
    # as False, which fences nothing): the client refuses None instead of sending False.
    with pytest.raises(E.InvalidArgument) as info:
        client.set_epoch_floor(5, fence_all=None)
    assert info.value.field == "fence_all"
    assert cluster.calls == []


def test_the_client_reports_the_first_bad_field_in_the_tables_order(cluster, client):
    with pytest.raises(E.InvalidArgument) as info:
        client.write("orders/7", "", b"v", token=0)  # key and token are bad; key comes first
    assert info.value.field == "key"
    with pytest.raises(E.InvalidArgument) as info:
        client.restore(b"", epoch_floor=0)
    assert info.value.field == "data"
    assert cluster.calls == []


def test_overloaded_is_backed_off_and_retried(cluster, client):
    cluster.inject("Describe", queue_full())  # the service answers OVERLOADED
    client.describe("orders/7")
    assert len(cluster.calls_to("Describe")) == 2


def test_overloaded_until_the_attempts_run_out_raises_overloaded(cluster):
    with FencingClient(cluster.endpoints, **{**FAST, "retry_max_attempts": 2}) as client:
        cluster.inject("Describe", *[queue_full()] * 2)
        with pytest.raises(E.Overloaded):
            client.describe("orders/7")


def test_restore_is_not_resent_after_an_unknown_outcome(cluster, client):
    snapshot = client.snapshot()
    cluster.inject("RestoreStream", unknown_before_apply())
    with pytest.raises(E.OutcomeUnknown):
        client.restore(snapshot.data, epoch_floor=10)
    assert len(cluster.calls_to("RestoreStream")) == 1


def test_a_stopped_node_is_skipped(cluster, client):
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    cluster.stop_node(0)
    cluster.leader = 1
    started = time.monotonic()
    result = client.write("orders/7", "k", b"v", token=lease.token)
    assert time.monotonic() - started < 2.0
    assert {c.node for c in cluster.calls_to("Write")} == {1}
    assert client.read("orders/7", "k").version == result.version


def test_a_slow_leader_that_others_still_name_is_not_retried_at_once(cluster, client):
    """Like a paused leader: its followers keep naming it until they elect another."""
    lease = client.acquire("orders/7", ttl_ms=5000, holder="a")
    cluster.inject("Write", *[stall(1.0)] * 5, node=0)
    started = time.monotonic()
    client.write("orders/7", "k", b"v", token=lease.token)
    assert time.monotonic() - started < 1.5
    assert [c.node for c in cluster.calls_to("Write")][0] == 0
    assert [c.node for c in cluster.calls_to("Write")].count(0) == 1


def test_nothing_reachable_is_unavailable_not_unknown(cluster):
    endpoints = cluster.endpoints
    cluster.close()
    with FencingClient(endpoints, **{**FAST, "timeout_s": 1.0}) as client:
        started = time.monotonic()
        with pytest.raises(E.Unavailable) as info:
            client.write("orders/7", "k", b"v", token=1)
        elapsed = time.monotonic() - started
    assert not isinstance(info.value, E.OutcomeUnknown)
    assert elapsed < 2.5  # bounded by the attempts (10) and the whole-call deadline
    assert "10 attempt(s)" in str(info.value)
    assert "attempt" in str(info.value)


def test_no_leader_until_the_deadline_raises_no_leader(cluster):
    with FencingClient(cluster.endpoints, **{**FAST, "timeout_s": 0.6}) as client:
        cluster.inject("Read", *[no_leader()] * 100)
        started = time.monotonic()
        with pytest.raises(E.NoLeader):
            client.read("orders/7", "k")
        assert time.monotonic() - started < 2.0


def test_admin_credential_is_sent_as_bearer():
    with InMemoryCluster(admin_token="sekret") as cluster:
        with FencingClient(cluster.endpoints, **FAST) as anonymous:
            with pytest.raises(E.Unauthenticated):
                anonymous.force_release("orders/7")
        with FencingClient(cluster.endpoints, admin_token="wrong", **FAST) as wrong:
            with pytest.raises(E.PermissionDenied):
                wrong.force_release("orders/7")
        with FencingClient(cluster.endpoints, admin_token="sekret", **FAST) as admin:
            assert admin.force_release("orders/7").hwm == 1
            assert admin.set_epoch_floor(100).epoch == 101


def test_results_are_frozen_dataclasses_with_header(cluster, client):
    result = client.acquire("orders/7", ttl_ms=5000, holder="a")
    assert result.header.member_id == cluster.members[0].member_id
    with pytest.raises(AttributeError):
        result.token = 5  # type: ignore[misc]
    desc = client.describe("orders/7")
    assert (desc.held, desc.holder, desc.token, desc.hwm) == (True, "a", result.token, result.token)
    status = client.status()
    assert status.epoch == result.token and status.has_quorum and len(status.members) == 3
    assert client.status(endpoint=client.endpoints[2]).header.member_id == cluster.members[2].member_id
    local = client.status(endpoint=client.endpoints[2], local=True)  # its own view: no read through the log
    assert local.local and not status.local and local.epoch == result.token and local.version
    with pytest.raises(ValueError, match="without a scheme"):
        FencingClient("http://127.0.0.1:7100")


def test_keep_alive_many_reports_each_lease(client):
    a = client.acquire("orders/1", ttl_ms=5000, holder="a")
    b = client.acquire("orders/2", ttl_ms=5000, holder="a")
    client.force_release("orders/2")
    items = client.keep_alive_many([("orders/1", a.token), ("orders/2", b.token)])
    assert [i.ok for i in items] == [True, False]
    assert items[0].error is None and items[0].expires_at_ms >= a.expires_at_ms
    assert isinstance(items[1].error, E.StaleToken)


def test_keep_alive_release_and_expiry(client):
    a = client.acquire("orders/7", ttl_ms=5000, holder="a")
    renewed = client.keep_alive("orders/7", a.token)
    assert renewed.expires_at_ms >= a.expires_at_ms
    client.write("orders/7", "k", b"v", token=a.token)  # data: the release keeps the resource
    assert client.release("orders/7", a.token).released
    with pytest.raises(E.LeaseExpired):
        client.keep_alive("orders/7", a.token)
    # With no data left, a released resource is forgotten: its token is then unknown to it.
    b = client.acquire("orders/8", ttl_ms=5000, holder="a")
    assert client.release("orders/8", b.token).released
    with pytest.raises(E.UnknownToken):
        client.keep_alive("orders/8", b.token)


def test_closed_client_refuses_calls(cluster):
    client = FencingClient(cluster.endpoints, **FAST)
    client.close()
    with pytest.raises(RuntimeError):
        client.describe("orders/7")


def test_constructor_checks_its_configuration():
    with pytest.raises(ValueError):
        FencingClient([])
    with pytest.raises(ValueError):
        FencingClient(["no-port"])
    with pytest.raises(ValueError):
        FencingClient(["h:1"], timeout_s=0)
    with pytest.raises(ValueError):
        FencingClient(["h:1"], retry_max_attempts=0)
    with pytest.raises(TypeError):
        FencingClient(["h:1"], 5.0)  # configuration is keyword-only
    c = FencingClient("localhost:1, 127.0.0.1:2,localhost:1")
    assert c.endpoints == ("127.0.0.1:1", "127.0.0.1:2")
    c.close()


# ---------------------------------------------------------------- the Lease helper


def test_lease_renews_in_the_background_and_releases_on_exit(cluster, client):
    with client.lease("orders/7", ttl_ms=600, holder="a") as lease:
        assert isinstance(lease, Lease)
        first_expiry = lease.expires_at_ms
        time.sleep(1.5)  # two and a half TTLs: only renewals keep it
        assert not lease.lost.is_set()
        assert lease.expires_at_ms > first_expiry
        assert len(cluster.calls_to("KeepAlive")) >= 3
        assert lease.write("k", b"v").version == 1
        assert lease.read("k").value == b"v"
        assert client.describe("orders/7").token == lease.token
    desc = client.describe("orders/7")
    assert not desc.held and desc.hwm == lease.token
    calls = len(cluster.calls_to("KeepAlive"))
    time.sleep(0.3)
    assert len(cluster.calls_to("KeepAlive")) == calls  # the thread stopped


def test_lease_is_lost_when_fenced_and_the_server_still_judges(cluster, client):
    seen = []
    with client.lease("orders/7", ttl_ms=300, holder="a", on_lost=seen.append) as lease:
        client.force_release("orders/7")
        assert lease.lost.wait(2.0)
        deadline = time.monotonic() + 2.0  # on_lost runs right after `lost` is set
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) == 1 and isinstance(seen[0], E.LeaseLost)
        assert isinstance(seen[0].cause, E.StaleToken)
        with pytest.raises(E.LeaseLost):
            lease.raise_if_lost()
        # Writes are not blocked locally: the server refuses them.
        with pytest.raises(E.StaleToken):
            lease.write("k", b"late")
    assert client.read("orders/7", "k").found is False


def test_lease_is_lost_when_renewals_fail_past_expiry(cluster):
    with FencingClient(cluster.endpoints, **FAST) as client:
        lost = threading.Event()
        lease = client.lease("orders/7", ttl_ms=400, holder="a", on_lost=lambda e: lost.set())
        cluster.close()  # every node down: renewals cannot get through
        assert lost.wait(3.0)
        assert lease.lost_error.cause is None or isinstance(lease.lost_error.cause, E.FencingError)
        assert "renewals failed" in str(lease.lost_error) or lease.lost_error.cause is not None
        lease.close()  # best effort: logs, never raises


def test_lease_held_is_raised_by_lease(client):
    client.acquire("orders/7", ttl_ms=5000, holder="a")
    with pytest.raises(E.LeaseHeld) as info:
        client.lease("orders/7", ttl_ms=5000, holder="b")
    assert info.value.holder == "a"


def test_on_lost_callback_errors_do_not_kill_the_thread(cluster, client, caplog):
    def boom(_):
        raise RuntimeError("callback bug")

    with caplog.at_level(logging.ERROR, logger="coordinator.client"):
        lease = client.lease("orders/7", ttl_ms=300, holder="a", on_lost=boom)
        client.force_release("orders/7")
        assert lease.lost.wait(2.0)
        time.sleep(0.1)
        lease.close()
    assert any("on_lost" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- the asyncio client


def test_async_client_follows_the_same_rules(cluster):
    async def main():
        async with AsyncFencingClient(cluster.endpoints, **FAST) as client:
            cluster.inject("Describe", no_leader(new_leader=2))
            await client.describe("orders/7")
            assert [c.node for c in cluster.calls_to("Describe")] == [0, 2]
            assert client.leader_endpoint == cluster.endpoints[2]
            lease = await client.acquire("orders/7", ttl_ms=5000, holder="a")
            cluster.inject("Write", unknown_after_apply())
            result = await client.write("orders/7", "k", b"v", token=lease.token)
            assert op_ids(cluster.calls_to("Write")) == [result.op_id] * 2
            assert (await client.read("orders/7", "k")).version == result.version
            await client.force_release("orders/7")
            with pytest.raises(E.StaleToken):
                await client.write("orders/7", "k", b"v", token=lease.token)
            assert len(cluster.calls_to("Write")) == 3  # the refusal was not retried
            with pytest.raises(E.InvalidArgument):
                await client.write("orders/7", "k", b"v", token=0)
            status = await client.status()
            assert status.epoch == 2
            local = await client.status(endpoint=cluster.endpoints[1], local=True)  # no read through the log
            assert local.local and local.epoch == 2 and local.header.member_id == cluster.members[1].member_id

    asyncio.run(main())


def test_async_client_discovers_the_leader_and_fails_over(cluster):
    async def main():
        cluster.leader = 1
        async with AsyncFencingClient(cluster.endpoints, **FAST) as client:
            lease = await client.acquire("orders/7", ttl_ms=5000, holder="a")
            assert [c.node for c in cluster.calls_to("Acquire")] == [1]
            cluster.stop_node(1)
            cluster.leader = 2
            await client.write("orders/7", "k", b"v", token=lease.token)
            assert {c.node for c in cluster.calls_to("Write")} <= {0, 2}

    asyncio.run(main())


def test_async_nothing_reachable_is_unavailable(cluster):
    endpoints = cluster.endpoints
    cluster.close()

    async def main():
        async with AsyncFencingClient(endpoints, **{**FAST, "timeout_s": 1.0}) as client:
            with pytest.raises(E.Unavailable):
                await client.write("orders/7", "k", b"v", token=1)

    asyncio.run(main())


def test_async_lease_renews_and_is_lost_when_fenced(cluster):
    seen = []

    async def on_lost(error):
        seen.append(error)

    async def main():
        async with AsyncFencingClient(cluster.endpoints, **FAST) as client:
            async with client.lease("orders/7", ttl_ms=600, holder="a") as lease:
                assert isinstance(lease, AsyncLease)
                first = lease.expires_at_ms
                await asyncio.sleep(1.5)
                assert not lease.lost.is_set() and lease.expires_at_ms > first
                assert (await lease.write("k", b"v")).version == 1
            assert not (await client.describe("orders/7")).held  # released on exit
            lease = await client.lease("orders/7", ttl_ms=300, holder="b", on_lost=on_lost)
            await client.force_release("orders/7")
            await asyncio.wait_for(lease.lost.wait(), 2.0)
            assert len(seen) == 1 and isinstance(seen[0].cause, E.StaleToken)
            with pytest.raises(E.StaleToken):
                await lease.write("k", b"late")
            await lease.close()  # best effort: never raises

    asyncio.run(main())


# ---------------------------------------------------------------- real three-process cluster


def _server_exists() -> bool:
    return importlib.util.find_spec("coordinator.server.app") is not None


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory):
    if not _server_exists():
        pytest.skip("coordinator/server/app.py (the gRPC server) does not exist yet")
    from testsupport.grpc_cluster import GrpcCluster

    cluster = GrpcCluster(str(tmp_path_factory.mktemp("grpc-cluster")))
    try:
        cluster.start_all(timeout_s=60)
        yield cluster
    finally:
        cluster.close()


def _restart_dead(cluster) -> None:
    for node in cluster.nodes:
        if node.paused:
            cluster.resume(node.index)
        if not node.alive:
            cluster.start(node.index)
    cluster.wait_serving(timeout_s=30)


@pytest.fixture
def real_client(real_cluster):
    _restart_dead(real_cluster)
    with FencingClient([n.api_address for n in real_cluster.nodes]) as c:
        yield c


def test_real_failover_when_the_leader_is_killed(real_cluster, real_client):
    """A workload keeps writing while the leader is SIGKILLed: the client carries on by
    itself within a few seconds, without an error reaching the caller."""
    resource = f"failover/{os.getpid()}"
    lease = real_client.acquire(resource, ttl_ms=30_000, holder="workload")
    done_at: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def workload():
        n = 0
        while not stop.is_set():
            n += 1
            try:
                real_client.write(resource, "counter", str(n).encode(), token=lease.token)
                done_at.append(time.monotonic())
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)
                return

    thread = threading.Thread(target=workload, daemon=True)
    thread.start()
    time.sleep(1.0)
    leader = real_cluster.leader_index()
    killed_at = time.monotonic()
    real_cluster.kill(leader)
    time.sleep(6.0)
    stop.set()
    thread.join(15)
    assert not errors, errors
    after = [t for t in done_at if t > killed_at]
    assert after, "no write completed after the leader was killed"
    assert after[0] - killed_at < 5.0, f"first write after the kill took {after[0] - killed_at:.1f} s"
    new_leader = real_cluster.leader_index()
    assert new_leader != leader
    final = real_client.read(resource, "counter")
    assert final.found and int(final.value) >= len(done_at)


def test_real_same_op_id_retry_applies_once_across_a_paused_leader(real_cluster, real_client, caplog):
    resource = f"dedup/{os.getpid()}"
    lease = real_client.acquire(resource, ttl_ms=30_000, holder="a")
    base = real_client.write(resource, "k", b"before", token=lease.token)
    leader = real_cluster.leader_index()
    with FencingClient([n.api_address for n in real_cluster.nodes], attempt_timeout_s=1.0) as client:
        assert client.describe(resource).hwm == lease.token  # discovers the leader
        assert client.leader_endpoint == real_cluster.nodes[leader].api_address
        real_cluster.pause(leader)  # its attempt hangs: DEADLINE_EXCEEDED, outcome unknown
        try:
            op_id = new_op_id()
            with caplog.at_level(logging.DEBUG, logger="coordinator.client"):
                first = client.write(resource, "k", b"after", token=lease.token, op_id=op_id)
        finally:
            real_cluster.resume(leader)
        leader_api = real_cluster.nodes[leader].api_address
        assert any(
            f"Write attempt 1 on {leader_api}: OutcomeUnknown" in r.getMessage() for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
        assert first.version == base.version + 1
        time.sleep(2.0)  # the resumed node's stale request (if any) reaches the log now
        again = client.write(resource, "k", b"after", token=lease.token, op_id=op_id)
        assert again.version == first.version  # the first outcome, not a new one
        read = client.read(resource, "k")
        assert (read.value, read.version) == (b"after", first.version)


def test_real_async_client_fails_over(real_cluster):
    async def main():
        endpoints = [n.api_address for n in real_cluster.nodes]
        async with AsyncFencingClient(endpoints) as client:
            resource = f"async/{os.getpid()}"
            lease = await client.acquire(resource, ttl_ms=30_000, holder="a")
            await client.write(resource, "k", b"1", token=lease.token)
            leader = real_cluster.leader_index()
            assert client.leader_endpoint == real_cluster.nodes[leader].api_address
            real_cluster.kill(leader)
            started = time.monotonic()
            await client.write(resource, "k", b"2", token=lease.token)
            assert time.monotonic() - started < 5.0
            assert (await client.read(resource, "k")).value == b"2"

    _restart_dead(real_cluster)
    asyncio.run(main())


def test_real_lease_keepalive_and_lost_after_force_release(real_cluster, real_client):
    resource = f"lease/{os.getpid()}"
    lost = threading.Event()
    with real_client.lease(resource, ttl_ms=1000, holder="a", on_lost=lambda e: lost.set()) as lease:
        time.sleep(2.5)  # two and a half TTLs: alive only through keep-alives
        desc = real_client.describe(resource)
        assert desc.held and desc.token == lease.token and not lease.lost.is_set()
        lease.write("k", b"v")
        fenced = real_client.force_release(resource)
        assert fenced.hwm > lease.token
        assert lost.wait(3.0), "the keep-alive did not notice the fence"
        assert isinstance(lease.lost_error.cause, E.StaleToken)
        with pytest.raises(E.StaleToken) as info:
            lease.write("k", b"late")
        assert info.value.hwm == fenced.hwm
    assert real_client.read(resource, "k").value == b"v"
