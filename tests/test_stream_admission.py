"""Issue 26, finding 1 on real processes: idle streams of any service -- server reflection,
Health.Watch, Admin's RestoreStream -- count under the stream caps and end when idle, so no
caller without a credential holds the threads health, Admin and unary calls need.

One three-member cluster with a principals file and an admin token, a small thread pool (8)
and small caps (4 streams per member, 2 per caller, 3 s idle timeout, 16 RPCs admitted at
once), so "more streams than threads" and "more than grpc_max_concurrent_rpcs" are a few dozen
calls; member 2 serves no reflection. Every wait is a poll with a deadline or an RPC deadline.
"""

from __future__ import annotations

import os
import threading

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.server.auth import token_digest
from coordinator.server.errors import ServiceError
from coordinator.server.streams import StreamGate
from testsupport.grpc_cluster import RPC_TIMEOUT_S, SERVING, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
THREADS, STREAMS_MAX, PER_CALLER, WAITERS_MAX, IDLE_S = 8, 4, 2, 1, 3.0
CONCURRENT_RPCS_MAX = 16
# Streams opened at once by a caller with no credential: three times the threads, past
# grpc_max_concurrent_rpcs too, so on a member without the caps they would hold every thread.
FLOOD = 3 * THREADS
ADMIN_TOKEN = "admin-token-for-the-stream-tests"
TENANTS = ("alice", "bob", "carol")
# Generous: an answer at all, not a speed (a member whose threads are all held never answers).
ANSWER_DEADLINE_S = 20.0
# Threads a member may add while flooded: its pool, one helper per admitted stream, a few more.
THREADS_ADDED_MAX = THREADS + STREAMS_MAX + 6


def auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = str(tmp_path_factory.mktemp("streams"))
    principals = os.path.join(base, "principals.toml")
    with open(principals, "w", encoding="utf-8") as f:
        for name in TENANTS:
            f.write(f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{token_digest(name + "-token")}"\n'
                    f'prefixes = ["{name}/"]\n\n')
    settings = {
        "principals_file": principals,
        "admin_token": ADMIN_TOKEN,
        "grpc_threads": THREADS,
        "grpc_max_concurrent_rpcs": CONCURRENT_RPCS_MAX,
        "streams_max": STREAMS_MAX,
        "streams_per_principal_max": PER_CALLER,
        "stream_idle_timeout_s": IDLE_S,
        "acquire_waiters_max": WAITERS_MAX,
        "acquire_waiters_per_principal_max": WAITERS_MAX,
    }
    yield from running_cluster(base, request, settings=settings, node_settings={2: {"reflection": False}})


def outcome(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """(status code, the limit its ErrorInfo names, or "")."""
    status = rpc_status.from_call(err)
    for detail in (status.details if status is not None else ()):
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return err.code(), info.metadata.get("limit", "")
    return err.code(), ""


class Streams:
    """Streams that send nothing (beyond a server-streaming call's one request), each read to
    its end by a thread of its own; ``ended`` maps each one to how it ended."""

    def __init__(self) -> None:
        self.release = threading.Event()  # the clients' idle request streams end when set
        self.ended: dict[int, tuple[grpc.StatusCode, str]] = {}
        self.first_replies: dict[int, object] = {}
        self._calls: list = []
        self._lock = threading.Lock()

    def _silent(self, first):
        if first is not None:
            yield first
        self.release.wait(600)  # then nothing until released

    def open(self, start, first=None, *, one_reply: bool = False) -> int:
        """Start a call with ``start(requests)``; ``first``: the one request its stream
        sends (then nothing), so an admitted stream shows itself by its first reply;
        ``one_reply``: a client-streaming call (a future with one reply at its end)."""
        call = start(self._silent(first))
        number = len(self._calls)
        self._calls.append(call)
        threading.Thread(target=self._read, args=(number, call, one_reply), daemon=True).start()
        return number

    def settled(self, number: int) -> bool:
        """Stream ``number`` was refused (it ended) or admitted (it replied)."""
        with self._lock:
            return number in self.ended or number in self.first_replies

    def _read(self, number: int, call, one_reply: bool) -> None:
        try:
            for reply in [call.result()] if one_reply else call:
                with self._lock:
                    self.first_replies.setdefault(number, reply)
            result = (grpc.StatusCode.OK, "")
        except grpc.RpcError as err:
            result = outcome(err)
        except grpc.FutureCancelledError:  # a client-streaming call the test cancelled
            result = (grpc.StatusCode.CANCELLED, "")
        with self._lock:
            self.ended[number] = result

    def count(self, result: tuple[grpc.StatusCode, str]) -> int:
        with self._lock:
            return sum(1 for r in self.ended.values() if r == result)

    def close(self) -> None:
        self.release.set()
        for call in self._calls:
            call.cancel()


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def answers(node) -> bool:
    """Health.Check, a tenant's unary call and an Admin call all answer on this member."""
    try:
        health = node.health.Check(health_pb2.HealthCheckRequest(), timeout=ANSWER_DEADLINE_S)
        node.cluster.Status(pb.StatusRequest(), timeout=ANSWER_DEADLINE_S, metadata=auth("alice-token"))
        node.admin.MemberList(pb.MemberListRequest(), timeout=ANSWER_DEADLINE_S, metadata=auth(ADMIN_TOKEN))
    except grpc.RpcError:
        return False
    return health.status == SERVING


LIST = reflection_pb2.ServerReflectionRequest(list_services="")
REFUSED_PER_CALLER = (grpc.StatusCode.RESOURCE_EXHAUSTED, "streams_per_principal_max")
REFUSED_TOTAL = (grpc.StatusCode.RESOURCE_EXHAUSTED, "streams_max")
IDLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream_idle_timeout_s")


@pytest.mark.parametrize("kind", ["reflection", "watch"])
def test_idle_streams_without_a_credential_leave_health_admin_and_unary_calls_their_threads(cluster, kind):
    """The finding: 64 idle reflection streams on one connection, no token, and Health.Check
    and a tenant's Status timed out; the member went from 14 to 77 threads. Now such streams
    -- reflection (with a token it does not have: refused) or Health.Watch (open to all) --
    are admitted up to the per-caller cap, the rest refused naming it, and the admitted ones
    end after the idle timeout."""
    node = cluster.nodes[0]
    pid = cluster.pids[0]
    wait_until(lambda: answers(node), ANSWER_DEADLINE_S, what="the member to answer before the flood")
    before = threads_of(pid)
    streams = Streams()
    channels = [grpc.insecure_channel(node.api_address) for _ in range(3)]
    try:
        for number in range(FLOOD):
            channel = channels[0] if number < FLOOD // 2 else channels[1 + number % 2]  # one, then several
            if kind == "reflection":
                stub = reflection_pb2_grpc.ServerReflectionStub(channel)
                streams.open(lambda silent, stub=stub: stub.ServerReflectionInfo(silent, timeout=120))
            else:
                stub = health_pb2_grpc.HealthStub(channel)
                streams.open(lambda _silent, stub=stub: stub.Watch(health_pb2.HealthCheckRequest(), timeout=120))
        # What the finding lost: on a member without the caps these never answered.
        assert wait_until(lambda: answers(node), ANSWER_DEADLINE_S, what="health, a tenant and Admin answering")
        if kind == "reflection":
            # Authentication is on: reflection needs a credential, and no stream is admitted.
            unauthenticated = (grpc.StatusCode.UNAUTHENTICATED, "")
            wait_until(lambda: streams.count(unauthenticated) == FLOOD, ANSWER_DEADLINE_S,
                       what="every reflection stream without a credential refused")
        else:
            wait_until(lambda: streams.count(REFUSED_PER_CALLER) == FLOOD - PER_CALLER, ANSWER_DEADLINE_S,
                       what="the Watch streams past the per-caller cap refused naming it")
        assert answers(node)
        assert threads_of(pid) <= before + THREADS_ADDED_MAX
        if kind == "watch":
            assert len(streams.first_replies) >= PER_CALLER  # the admitted ones were served their status
            # nothing changes on a steady member: the admitted Watches go idle and are closed
            wait_until(lambda: streams.count(IDLE) == PER_CALLER, 4 * IDLE_S + T,
                       what="the admitted Watch streams closed after the idle timeout")
    finally:
        streams.close()
        for channel in channels:
            channel.close()


def test_streams_with_credentials_meet_the_member_wide_cap_and_end_when_idle(cluster):
    """Reflection with a tenant's token is served, counted per principal; past streams_max
    every further stream, whoever opens it, is refused naming it; idle ones are closed."""
    node = cluster.nodes[1]
    streams = Streams()
    channel = grpc.insecure_channel(node.api_address)
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    try:
        listed = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                timeout=T, metadata=auth("alice-token")))
        assert "fencing.v1.Lease" in {s.name for s in listed[0].list_services_response.service}
        # One at a time, 3 per principal: alice 2 admitted and 1 past her cap, bob 2 admitted
        # (4 in all) and 1 past the member's, carol 3 past the member's.
        for name in TENANTS:
            for _ in range(PER_CALLER + 1):
                number = streams.open(lambda silent, name=name: stub.ServerReflectionInfo(
                    silent, timeout=120, metadata=auth(f"{name}-token")), LIST)
                wait_until(lambda number=number: streams.settled(number), T, what="the stream admitted or refused")
        assert len(streams.first_replies) == STREAMS_MAX
        assert (streams.count(REFUSED_PER_CALLER), streams.count(REFUSED_TOTAL)) == (1, 4)
        # a Health.Watch is a stream too: refused while the member is at streams_max
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(node.health.Watch(health_pb2.HealthCheckRequest(), timeout=T)))
        assert outcome(caught.value) == REFUSED_TOTAL
        assert wait_until(lambda: answers(node), ANSWER_DEADLINE_S, what="health, a tenant and Admin answering")
        wait_until(lambda: streams.count(IDLE) == STREAMS_MAX, 4 * IDLE_S + T,
                   what="the admitted streams closed after the idle timeout")
        # their slots are free again
        assert next(iter(node.health.Watch(health_pb2.HealthCheckRequest(), timeout=T))).status == SERVING
    finally:
        streams.close()
        channel.close()


def test_an_idle_admin_restore_stream_is_counted_and_closed(cluster):
    node = cluster.nodes[1]
    streams = Streams()
    try:
        for _ in range(PER_CALLER + 1):
            streams.open(lambda silent: node.admin.RestoreStream.future(silent, timeout=120,
                                                                        metadata=auth(ADMIN_TOKEN)),
                         one_reply=True)
        wait_until(lambda: streams.count(REFUSED_PER_CALLER) == 1, T, what="the third restore stream refused")
        assert not streams.first_replies  # nothing was restored
        wait_until(lambda: streams.count(IDLE) == PER_CALLER, 4 * IDLE_S + T,
                   what="the idle restore streams closed after the idle timeout")
    finally:
        streams.close()


def test_reflection_needs_a_credential_and_can_be_turned_off(cluster):
    request = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    stub = reflection_pb2_grpc.ServerReflectionStub(cluster.nodes[0].channel)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.ServerReflectionInfo(request, timeout=T))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.ServerReflectionInfo(request, timeout=T, metadata=auth("mallory-token")))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    served = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=T, metadata=auth(ADMIN_TOKEN)))
    assert served[0].list_services_response.service
    off = reflection_pb2_grpc.ServerReflectionStub(cluster.nodes[2].channel)
    with pytest.raises(grpc.RpcError) as caught:
        list(off.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                      timeout=T, metadata=auth(ADMIN_TOKEN)))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED



# -- the idle timeout of a server-streaming call, in-process -----------------------------------


def helper_alive() -> bool:
    return any(t.name == "stream-responses" and t.is_alive() for t in threading.enumerate())


def test_responses_time_out_while_the_servicer_has_nothing_to_send_and_pass_its_errors_on():
    """What a Health.Watch worker waits for: its servicer's next response. None for the idle
    timeout ends the stream naming it; what the servicer raises reaches the worker's thread."""
    gate = StreamGate(streams_max=1, per_caller_max=1, idle_timeout_s=0.2)
    quiet = threading.Event()

    def watch():
        yield "SERVING"
        quiet.wait(10)  # the status does not change

    got = []
    with pytest.raises(ServiceError) as caught:
        for item in gate.responses(watch()):
            got.append(item)
    assert got == ["SERVING"] and caught.value.metadata["limit"] == "stream_idle_timeout_s"
    assert "nothing to send for 0.2 s" in caught.value.message
    quiet.set()
    wait_until(lambda: not helper_alive(), 5, what="the helper to end with the stream")

    def aborted():
        yield "first"
        raise RuntimeError("the servicer aborted the call")

    with pytest.raises(RuntimeError, match="the servicer aborted"):
        list(gate.responses(aborted()))
    wait_until(lambda: not helper_alive(), 5, what="the helper to end after the error")
