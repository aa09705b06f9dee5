"""Lease.AcquireMany and Lease.ReleaseMany, and the multiplexed client's acquire() and
release(), end to end on three real ``fencingd serve`` processes.

Each item must come out as the same Acquire or Release alone would (its status, ErrorInfo
and effect); an Acquire item that asks to wait is refused alone (the batch form never
waits); retries of an item are deduplicated by its op_id; a call past a limit applies
nothing; and ``FencingClient(multiplex=True)`` gives every one of many threads acquiring and
releasing distinct and shared resources its own answer: its result, or the exception the
plain call raises. The threads' history goes through the chaos checker. Every wait is a poll
with a deadline; no timing is asserted.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from chaos import check as chaos_check
from chaos import history as chaos_history
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from coordinator.core import limits
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from tests.test_server import failure
from tests.test_write_many import op_id, unique
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
TTL_MS = 60_000  # no lease of these tests expires while it runs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("acquire-many")), request)


def acquire_request(resource: str, holder: str = "h", **fields) -> pb.AcquireRequest:
    return pb.AcquireRequest(**{"resource": resource, "holder": holder, "ttl_ms": TTL_MS, "op_id": op_id(), **fields})


def acquire(node, resource: str, holder: str = "h") -> int:
    return node.lease.Acquire(acquire_request(resource, holder), timeout=T).token


def describe(node, resource: str) -> pb.DescribeResponse:
    return node.lease.Describe(pb.DescribeRequest(resource=resource), timeout=T)


def alone(call, item) -> tuple[str, str, dict[str, str]]:
    """What the same item answers as a call of its own (only for items that are refused)."""
    code, reason, metadata, _ = failure(call, item, timeout=T)
    return code.name, reason, metadata


def error_of(result) -> tuple[str, str, dict[str, str]]:
    error = result.error
    return error.code, error.reason, dict(error.metadata)


def test_a_mixed_acquire_batch_gives_each_item_the_outcome_it_would_have_alone(cluster):
    node = cluster.nodes[1]  # a follower or the leader: every member serves AcquireMany
    free, other, held = unique("acq-free"), unique("acq-other"), unique("acq-held")
    holder_token = acquire(node, held, holder="someone-else")
    items = [
        acquire_request(free),
        acquire_request(held),  # LEASE_HELD, with the holder's name, token and expiry
        acquire_request("bad resource!"),  # bad input
        acquire_request(other),
        acquire_request(free, op_id=b"x"),  # an op_id too short
        acquire_request(unique("acq-waits"), wait_ms=100),  # a batched Acquire may not wait
    ]
    reply = node.lease.AcquireMany(pb.AcquireManyRequest(acquires=items), timeout=T)

    kinds = [r.WhichOneof("outcome") for r in reply.results]
    assert kinds == ["acquire", "error", "error", "acquire", "error", "error"], reply
    first, fourth = reply.results[0].acquire, reply.results[3].acquire
    assert holder_token < first.token != fourth.token and first.lease_id == first.token
    assert first.header.member_id == node.raft_address and first.header.applied_index >= 1
    assert reply.header.applied_index >= max(first.header.applied_index, fourth.header.applied_index)
    lease_held, bad, short, waits = (error_of(reply.results[i]) for i in (1, 2, 4, 5))
    assert lease_held[:2] == ("FAILED_PRECONDITION", R.LEASE_HELD)
    assert lease_held[2][M.HOLDER] == "someone-else" and lease_held[2][M.TOKEN] == str(holder_token)
    assert bad == ("INVALID_ARGUMENT", R.INVALID_FIELD, {M.FIELD: "resource"})
    assert short[:2] == ("INVALID_ARGUMENT", R.INVALID_FIELD) and short[2][M.FIELD] == "op_id"
    assert waits == ("INVALID_ARGUMENT", R.INVALID_FIELD, {M.FIELD: "wait_ms"})
    assert "AcquireMany" in reply.results[5].error.message
    # Each refused item answers exactly as the same Acquire alone (which changes nothing
    # either); the waiting one is refused by the batch form only.
    for i, error in zip((1, 2, 4), (lease_held, bad, short), strict=True):
        code, reason, metadata = alone(node.lease.Acquire, items[i])
        if reason == R.LEASE_HELD:
            # The TTL left is as of each refusal: the later call's is no more than the batch's.
            assert int(metadata.pop(M.REMAINING_MS)) <= int(error[2][M.REMAINING_MS]), i
            error = (error[0], error[1], {k: v for k, v in error[2].items() if k != M.REMAINING_MS})
        assert error == (code, reason, metadata), i
    # Only the two good items took their leases; the held one is still its holder's.
    for resource, token in ((free, first.token), (other, fourth.token), (held, holder_token)):
        d = describe(node, resource)
        assert (d.held, d.token, d.hwm) == (True, token, token), resource
    assert not describe(node, items[5].resource).held


def test_a_mixed_release_batch_gives_each_item_the_outcome_it_would_have_alone(cluster):
    node = cluster.nodes[2]
    current, fenced, ended = unique("rel-current"), unique("rel-fenced"), unique("rel-ended")
    token = acquire(node, current)
    old = acquire(node, fenced)
    node.lease.Release(pb.ReleaseRequest(resource=fenced, token=old, op_id=op_id()), timeout=T)
    new = acquire(node, fenced)
    gone = acquire(node, ended)
    node.lease.Release(pb.ReleaseRequest(resource=ended, token=gone, op_id=op_id()), timeout=T)
    items = [
        pb.ReleaseRequest(resource=current, token=token, op_id=op_id()),  # released
        pb.ReleaseRequest(resource=fenced, token=old, op_id=op_id()),  # a fenced token
        pb.ReleaseRequest(resource=fenced, token=new + 1000, op_id=op_id()),  # never issued
        pb.ReleaseRequest(resource=ended, token=gone, op_id=op_id()),  # already released
        pb.ReleaseRequest(resource="bad resource!", token=1, op_id=op_id()),  # bad input
        pb.ReleaseRequest(resource=current, token=0, op_id=op_id()),  # no token
    ]
    reply = node.lease.ReleaseMany(pb.ReleaseManyRequest(releases=items), timeout=T)

    kinds = [r.WhichOneof("outcome") for r in reply.results]
    assert kinds[0] == "release" and kinds[4:] == ["error", "error"], reply
    assert (reply.results[0].release.released, reply.results[0].release.hwm) == (True, token)
    # The rest answer exactly as the same Release alone, error or not (nothing has changed
    # since: the released lease stays released, the hwm stays).
    for i in (1, 2, 3, 4, 5):
        if kinds[i] == "error":
            assert error_of(reply.results[i]) == alone(node.lease.Release, items[i]), i
        else:
            again = node.lease.Release(pb.ReleaseRequest(resource=items[i].resource, token=items[i].token,
                                                         op_id=op_id()), timeout=T)
            assert (reply.results[i].release.released, reply.results[i].release.hwm) == (again.released, again.hwm)
    assert error_of(reply.results[4]) == ("INVALID_ARGUMENT", R.INVALID_FIELD, {M.FIELD: "resource"})
    assert error_of(reply.results[5])[2][M.FIELD] == "token"
    assert not describe(node, current).held  # (and forgotten: no lease, no data)
    d = describe(node, fenced)
    assert (d.held, d.token, d.hwm) == (True, new, new)  # the fenced token released nothing


def test_retried_items_with_the_same_op_id_apply_once(cluster):
    node = cluster.nodes[0]
    resource, other = unique("acq-retry"), unique("acq-retry-other")
    item, second = acquire_request(resource), acquire_request(other)

    first = node.lease.AcquireMany(pb.AcquireManyRequest(acquires=[item, second]), timeout=T)
    again = node.lease.AcquireMany(pb.AcquireManyRequest(acquires=[item]), timeout=T)  # the retry
    alone_again = node.lease.Acquire(item, timeout=T)  # and as a plain Acquire with that op_id

    token = first.results[0].acquire.token
    assert again.results[0].acquire.token == alone_again.token == token
    assert again.results[0].acquire.header.applied_index == first.results[0].acquire.header.applied_index
    assert describe(node, resource).hwm == token  # issued once, not three times

    release = pb.ReleaseRequest(resource=resource, token=token, op_id=op_id())
    released = node.lease.ReleaseMany(pb.ReleaseManyRequest(releases=[release]), timeout=T).results[0].release
    retried = node.lease.ReleaseMany(pb.ReleaseManyRequest(releases=[release]), timeout=T).results[0].release
    assert released.released and retried.released  # the first outcome, not "already released"
    assert retried.header.applied_index == released.header.applied_index
    # A new op_id is a new acquire: a new token.
    fresh = node.lease.AcquireMany(pb.AcquireManyRequest(acquires=[acquire_request(resource)]), timeout=T)
    assert fresh.results[0].acquire.token > token


def test_a_call_past_a_limit_is_refused_whole_and_applies_nothing(cluster):
    node = cluster.nodes[cluster.leader_index(timeout_s=T)]  # 64 proposals, none forwarded
    prefix = unique("acq-limits")

    def acquires(n: int) -> list[pb.AcquireRequest]:
        return [acquire_request(f"{prefix}/{i}") for i in range(n)]

    too_many = acquires(limits.ACQUIRE_MANY_ITEMS_MAX + 1)
    code, reason, metadata, err = failure(node.lease.AcquireMany, pb.AcquireManyRequest(acquires=too_many), timeout=T)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD)
    assert metadata == {M.FIELD: "acquires", M.LIMIT: "acquire_many_items", M.MAX: str(limits.ACQUIRE_MANY_ITEMS_MAX)}
    assert "ACQUIRE_MANY_ITEMS_MAX" in err.details() and "nothing was applied" in err.details()
    assert not any(describe(node, item.resource).held for item in too_many)

    # At the limit it is served: every item applied.
    at_limit = node.lease.AcquireMany(
        pb.AcquireManyRequest(acquires=acquires(limits.ACQUIRE_MANY_ITEMS_MAX)), timeout=T
    )
    granted = [r.acquire for r in at_limit.results if r.WhichOneof("outcome") == "acquire"]
    assert len(granted) == limits.ACQUIRE_MANY_ITEMS_MAX, at_limit.results[:3]
    releases = [
        pb.ReleaseRequest(resource=f"{prefix}/{i}", token=g.token, op_id=op_id()) for i, g in enumerate(granted)
    ]

    over = releases + releases[:1]
    code, reason, metadata, err = failure(node.lease.ReleaseMany, pb.ReleaseManyRequest(releases=over), timeout=T)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD)
    assert metadata == {M.FIELD: "releases", M.LIMIT: "release_many_items", M.MAX: str(limits.RELEASE_MANY_ITEMS_MAX)}
    assert "RELEASE_MANY_ITEMS_MAX" in err.details()
    assert all(describe(node, r.resource).held for r in releases[:4])  # still held: nothing applied

    done = node.lease.ReleaseMany(pb.ReleaseManyRequest(releases=releases), timeout=T)
    assert all(r.WhichOneof("outcome") == "release" and r.release.released for r in done.results)


class _Recording:
    """A stub wrapper: every call runs ``before(method, items)`` first (items: the batch's
    size, 1 for a plain call)."""

    def __init__(self, real, before) -> None:
        self.real, self.before = real, before

    def __getattr__(self, method):
        real = getattr(self.real, method)

        def call(request, **kwargs):
            items = next(
                (len(getattr(request, f)) for f in ("acquires", "releases", "writes") if hasattr(request, f)), 1
            )
            self.before(method, items)
            return real(request, **kwargs)

        return call


class _GatedFirstCall:
    """Wraps the batcher's stub lookup: the first call waits until ``hold_for`` more attempts
    are queued behind it (so the next batch carries them together whatever the scheduling),
    and every call's (method, size) is recorded."""

    def __init__(self, client: FencingClient, hold_for: int) -> None:
        self.batcher = client._batcher
        self.batcher.batches_in_flight_max = 1  # so the queue builds behind the held call
        self.real = self.batcher._stub_for
        self.hold_for = hold_for
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.batcher._stub_for = lambda endpoint, service: _Recording(self.real(endpoint, service), self.before)

    def queued(self) -> int:
        with self.batcher._lock:
            return sum(len(q) for q in self.batcher._queues.values())

    def before(self, method: str, items: int) -> None:
        with self.lock:
            first = not self.calls
            self.calls.append((method, items))
        if first and self.hold_for:
            wait_until(lambda: self.queued() >= self.hold_for, timeout_s=30,
                       what=f"{self.hold_for} calls queued behind the first")


def test_the_multiplexed_client_gives_each_of_32_threads_its_own_lease_answers(cluster):
    threads_n, cycles, shared_n = 32, 4, 4
    setup = cluster.nodes[0]
    own = {i: unique("mux-own") for i in range(threads_n // 2)}  # threads 0-15: a resource each
    shared = [unique("mux-shared") for _ in range(shared_n)]  # threads 16-31: 4 threads per resource
    records: list[dict] = []
    records_lock = threading.Lock()
    errors: list[str] = []
    granted: list[int] = []

    def record(**fields) -> None:
        with records_lock:
            records.append({"type": "op", **fields})

    client = FencingClient(cluster.endpoints, multiplex=True)
    client.status()  # learn the leader first: batches form per endpoint, and all go there then
    gate = _GatedFirstCall(client, hold_for=threads_n - 1)
    start = threading.Barrier(threads_n)

    def worker(i: int) -> None:
        resource = own[i] if i in own else shared[i % shared_n]
        holder = f"t{i}"
        start.wait(timeout=30)
        for n in range(cycles):
            mine, invoke = op_id(), time.monotonic_ns()
            try:
                got = client.acquire(resource, ttl_ms=TTL_MS, holder=holder, op_id=mine)
            except E.LeaseHeld as exc:
                record(process=holder, op_id=mine.hex(), f="acquire", resource=resource, invoke_ns=invoke,
                       complete_ns=time.monotonic_ns(), outcome="refused", reason=exc.reason)
                if i in own or exc.request.get("op_id") != mine or exc.holder == holder:
                    errors.append(f"t{i} acquire {n}: unexpected {exc!r} (holder {exc.holder})")
                continue
            except Exception as exc:  # noqa: BLE001 - any other answer fails the test below
                errors.append(f"t{i} acquire {n}: {type(exc).__name__}: {exc}")
                continue
            record(process=holder, op_id=mine.hex(), f="acquire", resource=resource, invoke_ns=invoke,
                   complete_ns=time.monotonic_ns(), outcome="ok",
                   result={"token": got.token, "hwm": got.token, "expires_at_ms": got.expires_at_ms,
                           "applied_index": got.header.applied_index})
            if (got.op_id, got.resource, got.holder) != (mine, resource, holder):
                errors.append(f"t{i} acquire {n}: someone else's answer {got!r}")
            with records_lock:
                granted.append(got.token)
            mine, invoke = op_id(), time.monotonic_ns()
            try:
                released = client.release(resource, got.token, op_id=mine)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"t{i} release {n}: {type(exc).__name__}: {exc}")
                continue
            record(process=holder, op_id=mine.hex(), f="release", resource=resource, token=got.token,
                   invoke_ns=invoke, complete_ns=time.monotonic_ns(), outcome="ok",
                   result={"hwm": released.hwm, "applied_index": released.header.applied_index})
            if not released.released or released.hwm != got.token:
                errors.append(f"t{i} release {n}: unexpected {released!r} for token {got.token}")

    threads = [threading.Thread(target=worker, args=(i,), name=f"mux-lease-{i}") for i in range(threads_n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a worker is still waiting"
    finally:
        client.close()
    assert not errors, "\n".join(errors)
    assert len(granted) == len(set(granted)), "a token was handed out twice"
    assert len(granted) >= len(own) * cycles + shared_n  # every own cycle, at least one per shared resource
    # The calls really travelled together: the gate made the second batch wait for the rest.
    batches = [(m, n) for m, n in gate.calls if m.endswith("Many")]
    assert any(m == "AcquireMany" and n > 1 for m, n in batches), gate.calls
    assert any(m == "ReleaseMany" for m, _ in batches), gate.calls

    for resource in (*own.values(), *shared):
        d = describe(setup, resource)
        assert not d.held, resource  # every granted lease was released
        records.append({"type": "final_state", "resource": resource, "hwm": d.hwm, "data": {}})
    report = chaos_check.check_history(chaos_history.History.of(records))
    assert report.ok, chaos_check.format_report(report)


def test_a_multiplexed_acquire_that_waits_goes_on_its_own(cluster):
    client = FencingClient(cluster.endpoints, multiplex=True)
    try:
        client._batcher.single_as_plain = False  # a lone batchable call goes as a batch too
        gate = _GatedFirstCall(client, hold_for=0)
        waited = client.acquire(unique("mux-waits"), ttl_ms=TTL_MS, wait_ms=100)
        assert gate.calls == [], gate.calls  # not through the batcher: a plain Acquire
        batched = client.acquire(unique("mux-batched"), ttl_ms=TTL_MS)
        assert gate.calls == [("AcquireMany", 1)], gate.calls
        client.release(batched.resource, batched.token)
        client.release(waited.resource, waited.token)
        assert gate.calls[1:] == [("ReleaseMany", 1), ("ReleaseMany", 1)], gate.calls
    finally:
        client.close()


def test_multiplex_writes_is_the_deprecated_name_of_multiplex(cluster):
    with pytest.warns(DeprecationWarning, match="multiplex="):
        client = FencingClient(cluster.endpoints, multiplex_writes=True)
    with client:
        assert client._batcher is not None
    with FencingClient(cluster.endpoints) as plain:
        assert plain._batcher is None
