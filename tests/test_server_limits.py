"""Issue 14 on real processes: a poisoned restore, idle streams, waiting Acquires, and the
audit log's names.

One three-member cluster with a principals file, an audit log per member, and small stream
caps (4 streams per member, 2 per principal, 3 s idle timeout) and waiter caps (2 waiting
Acquires per member, 1 per principal) on a small thread pool (9: the caps plus the two backup
transfers stay below it, as config.py requires), so the caps are reached with a handful of
calls and "past the worker count" is 10 of them.
Every wait is a poll with a deadline or an RPC deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import grpc
import msgpack
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from coordinator.server.auth import token_digest
from coordinator.server.errors import ServiceError
from coordinator.server.streams import StreamGate, caller_key, waiter_gate
from testsupport.grpc_cluster import RPC_TIMEOUT_S, SERVING, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
THREADS, STREAMS_MAX, PER_PRINCIPAL, IDLE_S = 9, 4, 2, 3.0
WAITERS_MAX, WAITERS_PER_PRINCIPAL = 2, 1
# An idle stream's own deadline: far past the idle timeout, so only the server's timeout (or
# on a server without one, this) ends it.
STREAM_DEADLINE_S = 30.0
TENANTS = ("alice", "bob", "carol", "dave")
ADMIN_NAME = "ops"


def token_of(name: str) -> str:
    return f"{name}-secret-token"


def auth(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token_of(name)}"),)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = str(tmp_path_factory.mktemp("limits"))
    principals = os.path.join(base, "principals.toml")
    with open(principals, "w", encoding="utf-8") as f:
        for name in TENANTS:
            f.write(f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{token_digest(token_of(name))}"\n'
                    f'prefixes = ["{name}/"]\n\n')
        f.write(f'[[principal]]\nname = "{ADMIN_NAME}"\ntoken_sha256 = "{token_digest(token_of(ADMIN_NAME))}"\n'
                'admin = true\n')
    settings = {
        "principals_file": principals,
        "grpc_threads": THREADS,
        "streams_max": STREAMS_MAX,
        "streams_per_principal_max": PER_PRINCIPAL,
        "stream_idle_timeout_s": IDLE_S,
        "acquire_waiters_max": WAITERS_MAX,
        "acquire_waiters_per_principal_max": WAITERS_PER_PRINCIPAL,
    }
    node_settings = {i: {"audit_log_path": os.path.join(base, f"audit{i}.log")} for i in range(3)}
    yield from running_cluster(base, request, settings=settings, node_settings=node_settings)


def error_info(err: grpc.RpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    status = rpc_status.from_call(err)
    for detail in (status.details if status is not None else ()):
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return err.code(), info.reason, dict(info.metadata)
    return err.code(), "", {}


def acquire(node, name: str, resource: str, ttl_ms: int = 600_000) -> pb.AcquireResponse:
    return node.lease.Acquire(pb.AcquireRequest(resource=resource, holder=name, ttl_ms=ttl_ms,
                                                op_id=os.urandom(16)), timeout=T, metadata=auth(name))


# -- poisoned restore --------------------------------------------------------------------------


def test_a_crafted_restore_is_refused_and_every_member_keeps_serving(cluster):
    """The finding: a backup with revision 2^64-1 was accepted, and the next write on it put
    every member in a crash loop (exit 70). Now it is refused before it is proposed."""
    n0, n1, _ = cluster.nodes
    lease = acquire(n0, "alice", "alice/poison")
    backup = msgpack.packb(
        ["fencing-coordinator/state", 1, 5, 0, [["alice/poison", 5, 2**64 - 1, None, []]], []], use_bin_type=True
    )
    epoch = n0.cluster.Status(pb.StatusRequest(), timeout=T, metadata=auth("alice")).epoch
    with pytest.raises(grpc.RpcError) as caught:
        n1.admin.Restore(pb.RestoreRequest(data=backup, epoch_floor=epoch + 10), timeout=T,
                         metadata=auth(ADMIN_NAME))
    code, reason, meta = error_info(caught.value)
    assert (code, reason, meta.get(M.FIELD)) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD, "data")
    assert "revision" in caught.value.details()
    # Nothing changed, and what would have killed the members now is an ordinary write.
    assert n0.cluster.Status(pb.StatusRequest(), timeout=T, metadata=auth("alice")).epoch == epoch
    written = n1.store.Write(pb.WriteRequest(resource="alice/poison", key="k", value=b"v", token=lease.token,
                                             op_id=os.urandom(16)), timeout=T, metadata=auth("alice"))
    assert written.version == 1
    for node in cluster.nodes:
        node.check_running()
        assert node.health_status() == SERVING
        read = node.store.Read(pb.ReadRequest(resource="alice/poison", key="k"), timeout=T, metadata=auth("alice"))
        assert (read.value, read.version) == (b"v", 1)


# -- streams --------------------------------------------------------------------------------------


def reader_threads(node) -> int:
    """How many stream-reader threads the member's process has (names as /proc shows them)."""
    task_dir = f"/proc/{node.proc.pid}/task"
    count = 0
    for tid in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, tid, "comm"), encoding="utf-8") as f:
                count += f.read().strip() == "stream-reader"
        except FileNotFoundError:
            pass  # the thread ended while we looked
    return count


class IdleStream:
    """A KeepAliveStream that sends one keep-alive, reads its answer, then stays idle."""

    def __init__(self, node, name: str, resource: str, token: int):
        self._release = threading.Event()
        first = pb.KeepAliveRequest(resource=resource, token=token)

        def requests():
            yield first
            self._release.wait(STREAM_DEADLINE_S)  # idle: no further request until closed

        self.started = time.monotonic()
        self.responses = node.lease.KeepAliveStream(requests(), timeout=STREAM_DEADLINE_S, metadata=auth(name))

    def first(self):
        """The answer to the first keep-alive, or the RpcError that refused the stream."""
        try:
            return next(self.responses)
        except grpc.RpcError as err:
            return err

    def end(self) -> grpc.RpcError | None:
        """Wait (at most the stream's deadline) for the server to end the stream."""
        try:
            next(self.responses)
        except grpc.RpcError as err:
            return err
        except StopIteration:
            return None
        raise AssertionError("an idle stream answered a request it never sent")

    def close(self) -> None:
        self._release.set()
        self.responses.cancel()


def test_idle_streams_past_the_caps_starve_nothing_and_are_closed(cluster):
    node = cluster.nodes[0]
    leases = {name: acquire(node, name, f"{name}/streamed") for name in ("alice", "bob", "carol")}
    streams: list[IdleStream] = []
    try:
        # Three principals try 10 streams, more than the 9 worker threads. The first 9 first,
        # each waited for, so the order the member sees them in is fixed.
        attempts = [(name, n) for name in ("alice", "bob", "carol") for n in range(3)] + [("carol", 3)]
        outcomes = {}
        for name, n in attempts[:-1]:
            stream = IdleStream(node, name, f"{name}/streamed", leases[name].token)
            streams.append(stream)
            outcomes[(name, n)] = stream.first()

        # With 9 idle streams asked for: health answers, another principal is served within
        # its deadline, and Admin works (before the caps, these 9 held every thread).
        assert node.health_status(timeout_s=2.0) == SERVING
        got = acquire(node, "dave", "dave/while-streams-are-open")
        assert got.token > 0
        snap = node.admin.Snapshot(pb.SnapshotRequest(local=True), timeout=T, metadata=auth(ADMIN_NAME))
        assert snap.epoch >= got.token
        assert reader_threads(node) == STREAMS_MAX  # one helper per admitted stream, no more

        last = IdleStream(node, "carol", "carol/streamed", leases["carol"].token)
        streams.append(last)
        outcomes[attempts[-1]] = last.first()
        admitted = [key for key in attempts if isinstance(outcomes[key], pb.KeepAliveResponse)]
        assert admitted == [("alice", 0), ("alice", 1), ("bob", 0), ("bob", 1)]
        refused = {key: error_info(outcomes[key]) for key in attempts if key not in admitted}
        exhausted = (grpc.StatusCode.RESOURCE_EXHAUSTED, R.LIMIT_EXCEEDED)
        assert refused[("alice", 2)][:2] == exhausted
        assert refused[("alice", 2)][2][M.LIMIT] == "streams_per_principal_max"
        for key in (("bob", 2), ("carol", 0), ("carol", 1), ("carol", 2), ("carol", 3)):
            assert refused[key][:2] == exhausted and refused[key][2][M.LIMIT] == "streams_max", key

        # The idle ones are closed by the server after the idle timeout, with a clear status.
        for stream in streams[:2] + streams[3:5]:
            err = stream.end()
            assert err is not None
            code, reason, meta = error_info(err)
            assert (code, reason, meta[M.LIMIT]) == (*exhausted, "stream_idle_timeout_s")
            assert "no request for 3 s" in err.details()
            assert IDLE_S <= time.monotonic() - stream.started < STREAM_DEADLINE_S
    finally:
        for stream in streams:
            stream.close()

    # Their threads end with them, and their slots are given back: the principal opens one again.
    wait_until(lambda: reader_threads(node) == 0, 10, what="the streams' reader threads to end")
    def admitted_again():
        stream = IdleStream(node, "alice", "alice/streamed", leases["alice"].token)
        try:
            return isinstance(stream.first(), pb.KeepAliveResponse) or None
        finally:
            stream.close()

    wait_until(admitted_again, 10, what="a stream slot given back")


def test_a_busy_stream_is_not_closed_as_idle(cluster):
    """The idle timeout counts from the last request, not from the stream's start."""
    node = cluster.nodes[1]
    lease = acquire(node, "dave", "dave/busy")
    request = pb.KeepAliveRequest(resource="dave/busy", token=lease.token)
    pace = threading.Event()

    def requests():
        deadline = time.monotonic() + 2 * IDLE_S
        while time.monotonic() < deadline:
            yield request
            pace.wait(IDLE_S / 3)  # a request every second: never idle for IDLE_S

    answers = list(node.lease.KeepAliveStream(requests(), timeout=STREAM_DEADLINE_S, metadata=auth("dave")))
    assert len(answers) >= 6 and all(a.token == lease.token for a in answers)


# -- waiting Acquires -----------------------------------------------------------------------------

WAIT_MS = 20_000  # far past every check below: only a release (or the cap) ends a wait early


def test_waiting_acquires_cannot_take_every_worker_thread(cluster):
    """The finding: Acquires waiting with wait_ms on held leases each held a worker thread, so
    a few past the worker count starved health and every other caller. Now at most
    WAITERS_MAX wait (WAITERS_PER_PRINCIPAL per principal); the rest are answered at once."""
    node, other, _ = cluster.nodes
    waiters = ("alice", "bob", "carol")
    per_waiter = 4  # 12 waiting Acquires on 9 worker threads
    held = {name: acquire(node, name, f"{name}/waited-for") for name in waiters}
    def applied() -> int:
        return other.cluster.Status(pb.StatusRequest(), timeout=T, metadata=auth("dave")).applied_index

    base = applied()
    outcomes: dict[tuple[str, int], object] = {}
    took_s: dict[tuple[str, int], float] = {}

    def wait_for(name: str, i: int) -> None:
        started = time.monotonic()
        try:
            outcomes[(name, i)] = node.lease.Acquire(
                pb.AcquireRequest(resource=f"{name}/waited-for", holder=f"waiter-{i}", ttl_ms=60_000,
                                  op_id=os.urandom(16), wait_ms=WAIT_MS),
                timeout=WAIT_MS / 1000 + 5, metadata=auth(name))
        except grpc.RpcError as err:
            outcomes[(name, i)] = err
        took_s[(name, i)] = time.monotonic() - started

    threads = [threading.Thread(target=wait_for, args=(name, i), daemon=True)
               for name in waiters for i in range(per_waiter)]
    for thread in threads:
        thread.start()
    try:
        # Every Acquire's first try is a log entry: once another member has applied as many,
        # the Acquires are on this member's threads (on a member without the caps, all of them).
        wait_until(lambda: applied() >= base + len(threads), 10,
                   what="the waiting Acquires' first tries")
        assert node.health_status(timeout_s=2.0) == SERVING
        got = acquire(node, "dave", "dave/while-acquires-wait")
        assert got.token > 0
        snap = node.admin.Snapshot(pb.SnapshotRequest(local=True), timeout=T, metadata=auth(ADMIN_NAME))
        assert snap.epoch >= got.token

        # The excess was answered at once, as if wait_ms were 0: LEASE_HELD, saying why.
        excess = len(threads) - WAITERS_MAX
        wait_until(lambda: len(outcomes) >= excess, 10, what="the Acquires past the caps to be answered")
        assert len(outcomes) == excess  # the others still wait
        for key, outcome in list(outcomes.items()):
            assert isinstance(outcome, grpc.RpcError), key
            code, reason, meta = error_info(outcome)
            assert (code, reason, meta[M.HOLDER]) == (grpc.StatusCode.FAILED_PRECONDITION, R.LEASE_HELD, key[0])
            assert "not waiting" in outcome.details() and "acquire_waiters" in outcome.details()
            assert took_s[key] < WAIT_MS / 1000 / 4
        answered = {name for name, _ in outcomes}
        waiting = [name for name in waiters if sum(1 for n, _ in outcomes if n == name) < per_waiter]
        assert len(waiting) == WAITERS_MAX and answered == set(waiters)  # one per principal at most

        # A release ends a wait early: each principal's one waiter gets the lease.
        for name in waiting:
            node.lease.Release(pb.ReleaseRequest(resource=f"{name}/waited-for", token=held[name].token,
                                                 op_id=os.urandom(16)), timeout=T, metadata=auth(name))
        for thread in threads:
            thread.join(WAIT_MS / 1000 + 10)
        granted = [key for key, outcome in outcomes.items() if isinstance(outcome, pb.AcquireResponse)]
        assert sorted(name for name, _ in granted) == sorted(waiting)
        assert all(took_s[key] < WAIT_MS / 1000 for key in granted)
    finally:
        for name in waiters:
            with contextlib.suppress(grpc.RpcError):
                node.admin.ForceRelease(pb.ForceReleaseRequest(resource=f"{name}/waited-for"), timeout=T,
                                        metadata=auth(ADMIN_NAME))


# -- audit ---------------------------------------------------------------------------------------


def audit_lines(cluster, index: int) -> list[dict]:
    path = os.path.join(cluster.base_dir, f"audit{index}.log")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_audit_log_names_the_principal_of_every_call(cluster):
    """The finding: an Admin call by a known, non-admin principal was logged as
    "unauthenticated". Every line now names who called, refused or not."""
    node = cluster.nodes[2]
    before = len(audit_lines(cluster, 2))
    calls = [
        ("alice", grpc.StatusCode.PERMISSION_DENIED),
        (ADMIN_NAME, None),
        ("mallory", grpc.StatusCode.UNAUTHENTICATED),  # no such principal
    ]
    for name, want in calls:
        try:
            node.admin.SetEpochFloor(pb.SetEpochFloorRequest(floor=1, fence_all=False), timeout=T,
                                     metadata=auth(name))
            assert want is None, name
        except grpc.RpcError as err:
            assert err.code() == want, name
    lines = wait_until(lambda: (lambda got: got if len(got) >= before + len(calls) else None)(
        audit_lines(cluster, 2)), 5, what="the audit lines")[before:]
    assert [(line["rpc"], line["principal"]) for line in lines] == [
        ("SetEpochFloor", "alice"), ("SetEpochFloor", ADMIN_NAME), ("SetEpochFloor", "unauthenticated")]
    assert lines[0]["outcome"] == "PERMISSION_DENIED/PERMISSION_DENIED" and lines[1]["outcome"] == "OK"



# -- the gate itself, in-process ---------------------------------------------------------------


def test_streams_count_against_their_principal_or_their_client_host():
    assert caller_key("alice", "ipv4:10.0.0.7:53012") == "principal alice"
    assert caller_key(None, "ipv4:10.0.0.7:53012") == caller_key(None, "ipv4:10.0.0.7:1") == "host ipv4:10.0.0.7"
    assert caller_key(None, "ipv6:[::1]:5555") == "host ipv6:[::1]"


def test_a_slot_is_given_back_however_the_stream_ends():
    gate = StreamGate(streams_max=2, per_caller_max=1, idle_timeout_s=1.0)
    with pytest.raises(RuntimeError):
        with gate.admit("a"):
            with pytest.raises(ServiceError) as caught:
                with gate.admit("a"):
                    pass
            assert caught.value.metadata == {"limit": "streams_per_principal_max", "max": "1"}
            raise RuntimeError("the handler failed")
    assert gate.open_count() == 0
    with gate.admit("a"), gate.admit("b"):
        with pytest.raises(ServiceError) as caught:
            with gate.admit("c"):
                pass
        assert caught.value.metadata == {"limit": "streams_max", "max": "2"}
    assert gate.open_count() == 0


def test_a_waiter_slot_is_given_back_and_names_its_cap():
    gate = waiter_gate(waiters_max=2, per_caller_max=1)
    gate.take("a")
    with pytest.raises(ServiceError) as caught:
        gate.take("a")
    assert caught.value.metadata == {"limit": "acquire_waiters_per_principal_max", "max": "1"}
    gate.take("b")
    with pytest.raises(ServiceError) as caught:
        gate.take("c")
    assert caught.value.metadata == {"limit": "acquire_waiters_max", "max": "2"}
    gate.give_back("a")
    gate.give_back("b")
    assert gate.open_count() == 0
    gate.take("c")  # the slots are free again
    gate.give_back("c")


def reader_alive() -> bool:
    return any(t.name == "stream-reader" and t.is_alive() for t in threading.enumerate())


def test_requests_end_with_the_client_and_time_out_when_idle():
    gate = StreamGate(streams_max=1, per_caller_max=1, idle_timeout_s=0.2)
    assert list(gate.requests(iter([1, 2, 3]))) == [1, 2, 3]
    wait_until(lambda: not reader_alive(), 5, what="the reader to end with the stream")

    never = threading.Event()

    def idle():
        yield 1
        never.wait(10)  # a client that sends nothing more

    got = []
    started = time.monotonic()
    with pytest.raises(ServiceError) as caught:
        for item in gate.requests(idle()):
            got.append(item)
    assert got == [1] and caught.value.metadata["limit"] == "stream_idle_timeout_s"
    assert 0.2 <= time.monotonic() - started < 5
    never.set()
    wait_until(lambda: not reader_alive(), 5, what="the reader to end after the timeout")


def test_a_worker_that_stops_early_lets_the_reader_go():
    """A refused keep-alive ends the stream while the client keeps sending: the reader,
    blocked on handing over the next item, must not outlive the stream."""
    gate = StreamGate(streams_max=1, per_caller_max=1, idle_timeout_s=30.0)

    def flood():
        n = 0
        while True:
            n += 1
            yield n

    with contextlib.closing(gate.requests(flood())) as requests:
        assert next(requests) == 1
    wait_until(lambda: not reader_alive(), 5, what="the reader to end when the worker stops")
