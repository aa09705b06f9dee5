"""The gRPC server end to end: three real ``fencingd serve`` processes, real sockets.

Two clusters: ``cluster`` (admin token on, shared by most tests, left healthy by each) and
``cluster_b`` (member 0 has an in-flight bound of 1; hosts the destructive tests: overload,
restore, losing the quorum). Every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import commands, limits
from coordinator.core.names import DOMAIN, Trailer
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from coordinator.server import cpu_pin
from testsupport.grpc_cluster import RPC_TIMEOUT_S, SERVING, running_cluster
from testsupport.supervisor import wait_until

ADMIN_TOKEN = "test-admin-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
T = RPC_TIMEOUT_S


def op_id() -> bytes:
    return os.urandom(16)


def unique(prefix: str) -> str:
    return f"{prefix}/{os.urandom(4).hex()}"


def failure(call, *args, **kwargs) -> tuple[grpc.StatusCode, str, dict[str, str], grpc.RpcError]:
    """Run a call that must fail; return (code, ErrorInfo reason, ErrorInfo metadata, error)."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return decoded(caught.value)


def decoded(err: grpc.RpcError) -> tuple[grpc.StatusCode, str, dict[str, str], grpc.RpcError]:
    """(code, ErrorInfo reason, ErrorInfo metadata, error) of a failed call."""
    status = rpc_status.from_call(err)
    reason, metadata = "", {}
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                assert info.domain == DOMAIN
                reason, metadata = info.reason, dict(info.metadata)
    return err.code(), reason, metadata, err


def trailers(err: grpc.RpcError) -> dict[str, str]:
    return {k: v for k, v in (err.trailing_metadata() or ()) if not k.endswith("-bin")}


def check_header(header: pb.ResponseHeader, node) -> None:
    assert header.member_id == node.raft_address
    assert header.raft_term >= 1
    assert header.applied_index >= 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = str(tmp_path_factory.mktemp("grpc-a"))
    node_settings = {i: {"audit_log_path": os.path.join(base, f"audit{i}.log")} for i in range(3)}
    yield from running_cluster(base, request, settings={"admin_token": ADMIN_TOKEN}, node_settings=node_settings)


@pytest.fixture(scope="module")
def victim(cluster):
    """A held resource with one key, plus a token issued later for another resource."""
    n0 = cluster.nodes[0]
    resource = unique("victim")
    acquired = n0.lease.Acquire(
        pb.AcquireRequest(resource=resource, holder="victim-holder", ttl_ms=limits.LEASE_TTL_MS_MAX,
                          op_id=(acquire_op := op_id())), timeout=T)
    written = n0.store.Write(pb.WriteRequest(resource=resource, key="k", value=b"orig", token=acquired.token,
                                             op_id=op_id()), timeout=T)
    other = n0.lease.Acquire(pb.AcquireRequest(resource=unique("other"), holder="o", ttl_ms=60_000, op_id=op_id()),
                             timeout=T)
    assert other.token > acquired.token
    return {"resource": resource, "token": acquired.token, "version": written.version,
            "other_token": other.token, "acquire_op_id": acquire_op}


def state_of(node, resource: str) -> tuple:
    d = node.lease.Describe(pb.DescribeRequest(resource=resource), timeout=T)
    r = node.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=T)
    return (d.held, d.holder, d.token, d.hwm, d.expires_at_ms, r.found, r.value, r.version)


# -- health, reflection, headers ---------------------------------------------------------


def test_health_is_serving_for_every_service(cluster):
    for node in cluster.nodes:
        for service in ("", "fencing.v1.Lease", "fencing.v1.FencedStore", "fencing.v1.Cluster", "fencing.v1.Admin"):
            assert node.health_status(service) == SERVING, (node.index, service)


def test_reflection_lists_the_services(cluster):
    # The cluster has an admin token: reflection needs a credential (test_stream_admission.py).
    stub = reflection_pb2_grpc.ServerReflectionStub(cluster.nodes[1].channel)
    responses = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               timeout=T, metadata=ADMIN))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"fencing.v1.Lease", "fencing.v1.FencedStore", "fencing.v1.Cluster", "fencing.v1.Admin",
            "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    # The descriptors are served too: a generic client can build requests from them.
    responses = list(stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="fencing.v1.Lease")]), timeout=T,
        metadata=ADMIN))
    assert responses[0].file_descriptor_response.file_descriptor_proto


def test_every_response_has_a_header(cluster):
    n0, n1, n2 = cluster.nodes
    resource = unique("header")
    acq = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=op_id()), timeout=T)
    responses = [
        (n0, acq),
        (n1, n1.lease.KeepAlive(pb.KeepAliveRequest(resource=resource, token=acq.token), timeout=T)),
        (n2, n2.lease.KeepAliveMany(pb.KeepAliveManyRequest(
            leases=[pb.KeepAliveRequest(resource=resource, token=acq.token)]), timeout=T)),
        (n0, next(iter(n0.lease.KeepAliveStream(iter([pb.KeepAliveRequest(resource=resource, token=acq.token)]),
                                                 timeout=T)))),
        (n1, n1.lease.Describe(pb.DescribeRequest(resource=resource), timeout=T)),
        (n2, n2.store.Write(pb.WriteRequest(resource=resource, key="k", value=b"v", token=acq.token, op_id=op_id()),
                            timeout=T)),
        (n0, n0.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=T)),
        (n1, n1.store.Delete(pb.DeleteRequest(resource=resource, key="k", token=acq.token, op_id=op_id()), timeout=T)),
        (n2, n2.cluster.Status(pb.StatusRequest(), timeout=T)),
        (n0, n0.admin.Snapshot(pb.SnapshotRequest(), timeout=T, metadata=ADMIN)),
        (n1, n1.lease.Release(pb.ReleaseRequest(resource=resource, token=acq.token), timeout=T)),
        (n2, n2.admin.ForceRelease(pb.ForceReleaseRequest(resource=resource, op_id=op_id()), timeout=T,
                                   metadata=ADMIN)),
        (n0, n0.admin.SetEpochFloor(pb.SetEpochFloorRequest(floor=1, fence_all=False), timeout=T, metadata=ADMIN)),
    ]
    for node, response in responses:
        check_header(response.header, node)
    # Mutations report the index of their own entry: later answers never report less.
    indexes = [r.header.applied_index for _, r in responses if not isinstance(r, pb.StatusResponse)]
    assert indexes[0] < indexes[-1]
    # Errors carry the same three facts as trailing metadata.
    code, reason, _, err = failure(n1.store.Write, pb.WriteRequest(
        resource=resource, key="k", value=b"v", token=acq.token, op_id=op_id()), timeout=T)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, R.STALE_TOKEN)
    meta = trailers(err)
    assert meta[Trailer.MEMBER_ID] == n1.raft_address
    assert int(meta[Trailer.RAFT_TERM]) >= 1
    assert int(meta[Trailer.APPLIED_INDEX]) > indexes[-1]
    # ... also errors refused before proposing.
    _, _, _, err = failure(n2.store.Read, pb.ReadRequest(resource="", key="k"), timeout=T)
    assert trailers(err)[Trailer.MEMBER_ID] == n2.raft_address


# -- the seed scenario ---------------------------------------------------------------------

# A second client in its own process: only the generated stubs and grpcio-status.
OLD_HOLDER_CLIENT = r"""
import json, os, sys, grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from coordinator.api.v1 import fencing_pb2 as pb, fencing_pb2_grpc as stubs
address, resource, token = sys.argv[1], sys.argv[2], int(sys.argv[3])
with grpc.insecure_channel(address) as channel:
    try:
        stubs.FencedStoreStub(channel).Write(pb.WriteRequest(
            resource=resource, key="total", value=b"from-the-old-holder", token=token,
            op_id=os.urandom(16)), timeout=5)
        print(json.dumps({"ok": True}))
    except grpc.RpcError as err:
        out = {"code": err.code().name}
        for detail in rpc_status.from_call(err).details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                out.update(reason=info.reason, metadata=dict(info.metadata))
        print(json.dumps(out))
"""


def test_seed_scenario_stale_writer_is_refused(cluster):
    n0, n1, n2 = cluster.nodes
    resource = unique("orders")
    a = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="worker-a", ttl_ms=1_000, op_id=op_id()),
                         timeout=T)
    n0.store.Write(pb.WriteRequest(resource=resource, key="total", value=b"1", token=a.token, op_id=op_id()),
                   timeout=T)

    # B is refused while A's lease lives: LEASE_HELD says who holds it and until when.
    code, reason, meta, _ = failure(n1.lease.Acquire, pb.AcquireRequest(
        resource=resource, holder="worker-b", ttl_ms=5_000, op_id=op_id()), timeout=T)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, R.LEASE_HELD)
    remaining = int(meta.pop(M.REMAINING_MS))  # the TTL left as of the refusal, on the log clock
    assert 0 < remaining <= 1_000
    assert meta == {M.HOLDER: "worker-a", M.EXPIRES_AT_MS: str(a.expires_at_ms), M.TOKEN: str(a.token)}

    # B waits server-side until A's lease expires on the log clock, then gets a new token.
    b = n1.lease.Acquire(pb.AcquireRequest(resource=resource, holder="worker-b", ttl_ms=5_000, op_id=op_id(),
                                           wait_ms=5_000), timeout=10)
    assert b.token > a.token and b.lease_id == b.token
    assert a.token_proof == b.token_proof == b"", "no token_signing_key_file: no proofs"

    # A wakes up and writes: refused, and told the current high-water mark.
    code, reason, meta, _ = failure(n2.store.Write, pb.WriteRequest(
        resource=resource, key="total", value=b"17", token=a.token, op_id=op_id()), timeout=T)
    assert (code, reason, meta) == (grpc.StatusCode.FAILED_PRECONDITION, R.STALE_TOKEN, {M.HWM: str(b.token)})

    # Another process holding A's old token is refused the same way.
    out = subprocess.run([sys.executable, "-c", OLD_HOLDER_CLIENT, n0.api_address, resource, str(a.token)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"code": "FAILED_PRECONDITION", "reason": R.STALE_TOKEN,
                                      "metadata": {M.HWM: str(b.token)}}

    # B writes twice in its epoch (equal tokens are eligible, I4).
    w1 = n1.store.Write(pb.WriteRequest(resource=resource, key="total", value=b"42", token=b.token, op_id=op_id()),
                        timeout=T)
    w2 = n2.store.Write(pb.WriteRequest(resource=resource, key="total", value=b"43", token=b.token, op_id=op_id()),
                        timeout=T)
    assert w2.version > w1.version and w1.hwm == w2.hwm == b.token

    # A malformed token is refused before anything is proposed.
    code, reason, meta, _ = failure(n0.store.Write, pb.WriteRequest(
        resource=resource, key="total", value=b"0", token=0, op_id=op_id()), timeout=T)
    assert (code, reason, meta) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD, {M.FIELD: "token"})

    for node in cluster.nodes:
        read = node.store.Read(pb.ReadRequest(resource=resource, key="total"), timeout=T)
        assert (read.found, read.value, read.version, read.hwm) == (True, b"43", w2.version, b.token)


def test_force_release_fences_the_old_holder(cluster):
    n0, n1, n2 = cluster.nodes
    resource = unique("stuck")
    a = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="a", ttl_ms=600_000, op_id=op_id()), timeout=T)
    forced = n1.admin.ForceRelease(pb.ForceReleaseRequest(resource=resource, op_id=op_id()), timeout=T,
                                   metadata=ADMIN)
    assert forced.hwm > a.token
    b = n2.lease.Acquire(pb.AcquireRequest(resource=resource, holder="b", ttl_ms=5_000, op_id=op_id()), timeout=T)
    assert b.token > forced.hwm
    code, reason, meta, _ = failure(n0.store.Write, pb.WriteRequest(
        resource=resource, key="k", value=b"x", token=a.token, op_id=op_id()), timeout=T)
    assert (reason, meta[M.HWM]) == (R.STALE_TOKEN, str(b.token))
    code, reason, _, _ = failure(n0.lease.KeepAlive, pb.KeepAliveRequest(resource=resource, token=a.token),
                                 timeout=T)
    assert reason == R.STALE_TOKEN


def test_admin_needs_the_token_and_every_call_is_audited(cluster):
    node = cluster.nodes[2]
    audit_path = os.path.join(cluster.base_dir, "audit2.log")

    def audit_lines():
        try:
            with open(audit_path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    before = len(audit_lines())
    request = pb.ForceReleaseRequest(resource=unique("admin"), op_id=op_id())
    code, reason, _, _ = failure(node.admin.ForceRelease, request, timeout=T)
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, R.UNAUTHENTICATED)
    code, reason, _, _ = failure(node.admin.ForceRelease, request, timeout=T,
                                 metadata=(("authorization", "Bearer wrong"),))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, R.PERMISSION_DENIED)
    node.admin.ForceRelease(request, timeout=T, metadata=ADMIN)
    lines = wait_until(
        lambda: (lambda got: got if len(got) >= before + 3 else None)(audit_lines()), 5, what="audit lines"
    )
    assert len(lines) == before + 3
    assert [(entry["rpc"], entry["outcome"]) for entry in lines[before:]] == [
        ("ForceRelease", "UNAUTHENTICATED/UNAUTHENTICATED"),
        ("ForceRelease", "PERMISSION_DENIED/PERMISSION_DENIED"),
        ("ForceRelease", "OK"),
    ]
    assert lines[-1]["principal"] == "admin-token" and lines[-1]["args"]["resource"] == request.resource
    assert ADMIN_TOKEN not in json.dumps(lines)


# -- malformed and refused input changes nothing ------------------------------------------------

BIG = 2**63
BAD = grpc.StatusCode.INVALID_ARGUMENT
PRE = grpc.StatusCode.FAILED_PRECONDITION


def _cases(v):
    """(name, call(node), code, reason, expected metadata subset)."""
    r, tok = v["resource"], v["token"]

    def write(**kw):
        fields = {"resource": r, "key": "k", "value": b"changed", "token": tok, "op_id": op_id(), **kw}
        return lambda n: n.store.Write(pb.WriteRequest(**fields), timeout=T)

    def acquire(**kw):
        fields = {"resource": unique("fresh"), "holder": "h", "ttl_ms": 5_000, "op_id": op_id(), **kw}
        return lambda n: n.lease.Acquire(pb.AcquireRequest(**fields), timeout=T)

    return [
        ("token 0", write(token=0), BAD, R.INVALID_FIELD, {M.FIELD: "token"}),
        ("token missing", lambda n: n.store.Write(pb.WriteRequest(resource=r, key="k", value=b"x", op_id=op_id()),
                                                  timeout=T), BAD, R.INVALID_FIELD, {M.FIELD: "token"}),
        ("token never issued (2**63)", write(token=BIG), PRE, R.UNKNOWN_TOKEN, {M.HWM: str(tok)}),
        ("token issued for another resource", write(token=v["other_token"]), PRE, R.UNKNOWN_TOKEN,
         {M.HWM: str(tok)}),
        ("value over 64 KiB", write(value=b"x" * (limits.VALUE_BYTES_MAX + 1)), BAD, R.INVALID_FIELD,
         {M.FIELD: "value"}),
        ("empty resource", write(resource=""), BAD, R.INVALID_FIELD, {M.FIELD: "resource"}),
        ("resource with a space", write(resource="orders 7"), BAD, R.INVALID_FIELD, {M.FIELD: "resource"}),
        ("resource not ASCII", write(resource="ordérs/7"), BAD, R.INVALID_FIELD, {M.FIELD: "resource"}),
        ("resource of 257 bytes", write(resource="r" * 257), BAD, R.INVALID_FIELD, {M.FIELD: "resource"}),
        ("key with a space", write(key="a key"), BAD, R.INVALID_FIELD, {M.FIELD: "key"}),
        ("op_id of 15 bytes", write(op_id=b"x" * 15), BAD, R.INVALID_FIELD, {M.FIELD: "op_id"}),
        ("op_id missing", write(op_id=b""), BAD, R.INVALID_FIELD, {M.FIELD: "op_id"}),
        ("op_id of 65 bytes", write(op_id=b"x" * 65), BAD, R.INVALID_FIELD, {M.FIELD: "op_id"}),
        ("op_id reused for another op", write(op_id=v["acquire_op_id"]), grpc.StatusCode.ALREADY_EXISTS,
         R.OP_ID_CONFLICT, {}),
        ("expected_version mismatch", write(expected_version=v["version"] + 100), PRE, R.VERSION_MISMATCH,
         {M.VERSION: str(v["version"])}),
        ("ttl 0", acquire(ttl_ms=0), BAD, R.INVALID_FIELD, {M.FIELD: "ttl_ms"}),
        ("ttl over 1 h", acquire(ttl_ms=limits.LEASE_TTL_MS_MAX + 1), BAD, R.INVALID_FIELD, {M.FIELD: "ttl_ms"}),
        ("ttl huge", acquire(ttl_ms=2**64 - 1), BAD, R.INVALID_FIELD, {M.FIELD: "ttl_ms"}),
        ("holder empty", acquire(holder=""), BAD, R.INVALID_FIELD, {M.FIELD: "holder"}),
        ("acquire while held", acquire(resource=r), PRE, R.LEASE_HELD, {M.HOLDER: "victim-holder"}),
        ("keep-alive lease_id != token",
         lambda n: n.lease.KeepAlive(pb.KeepAliveRequest(resource=r, token=tok, lease_id=tok + 1), timeout=T),
         BAD, R.INVALID_FIELD, {M.FIELD: "lease_id"}),
        ("keep-alive ttl 50 ms",
         lambda n: n.lease.KeepAlive(pb.KeepAliveRequest(resource=r, token=tok, ttl_ms=50), timeout=T),
         BAD, R.INVALID_FIELD, {M.FIELD: "ttl_ms"}),
        ("release token 0", lambda n: n.lease.Release(pb.ReleaseRequest(resource=r, token=0), timeout=T),
         BAD, R.INVALID_FIELD, {M.FIELD: "token"}),
        ("release never-issued token", lambda n: n.lease.Release(pb.ReleaseRequest(resource=r, token=BIG), timeout=T),
         PRE, R.UNKNOWN_TOKEN, {}),
        ("delete token 0", lambda n: n.store.Delete(pb.DeleteRequest(resource=r, key="k", token=0, op_id=op_id()),
                                                    timeout=T), BAD, R.INVALID_FIELD, {M.FIELD: "token"}),
        ("read bad key", lambda n: n.store.Read(pb.ReadRequest(resource=r, key=""), timeout=T),
         BAD, R.INVALID_FIELD, {M.FIELD: "key"}),
        ("describe bad resource", lambda n: n.lease.Describe(pb.DescribeRequest(resource="a b"), timeout=T),
         BAD, R.INVALID_FIELD, {M.FIELD: "resource"}),
        ("keep-alive batch too big", lambda n: n.lease.KeepAliveMany(pb.KeepAliveManyRequest(
            leases=[pb.KeepAliveRequest(resource=r, token=tok)] * (limits.KEEP_ALIVE_BATCH_ITEMS_MAX + 1)),
            timeout=T), BAD, R.INVALID_FIELD, {M.FIELD: "leases"}),
        ("epoch floor 0", lambda n: n.admin.SetEpochFloor(pb.SetEpochFloorRequest(floor=0), timeout=T,
                                                          metadata=ADMIN), BAD, R.INVALID_FIELD, {M.FIELD: "floor"}),
        ("force-release short op_id", lambda n: n.admin.ForceRelease(
            pb.ForceReleaseRequest(resource=r, op_id=b"short"), timeout=T, metadata=ADMIN),
         BAD, R.INVALID_FIELD, {M.FIELD: "op_id"}),
    ]


def test_malformed_and_refused_input_changes_nothing(cluster, victim):
    before = state_of(cluster.nodes[0], victim["resource"])
    assert before[0] and before[6] == b"orig"
    problems = []
    for number, (name, call, code, reason, meta) in enumerate(_cases(victim)):
        node = cluster.nodes[number % 3]
        got_code, got_reason, got_meta, err = failure(call, node)
        if (got_code, got_reason) != (code, reason) or any(got_meta.get(k) != v for k, v in meta.items()):
            problems.append(f"{name}: got {got_code.name}/{got_reason} {got_meta} ({err.details()}), "
                            f"want {code.name}/{reason} {meta}")
    assert not problems, "\n".join(problems)
    for node in cluster.nodes:
        assert state_of(node, victim["resource"]) == before


# -- retries, linearizability, keep-alives, status --------------------------------------------


def test_same_op_id_applies_once(cluster):
    n0, n1, n2 = cluster.nodes
    resource = unique("retry")
    acq_op = op_id()
    a = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=acq_op), timeout=T)
    again = n1.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=acq_op), timeout=T)
    assert (again.token, again.expires_at_ms) == (a.token, a.expires_at_ms)  # the first outcome, no new epoch
    write_op = op_id()
    request = pb.WriteRequest(resource=resource, key="k", value=b"once", token=a.token, op_id=write_op)
    first = n1.store.Write(request, timeout=T)
    second = n2.store.Write(request, timeout=T)
    assert (second.version, second.hwm) == (first.version, first.hwm)
    # The retry's header names the entry where the write first applied, not its own.
    assert second.header.applied_index == first.header.applied_index
    following = n0.store.Write(pb.WriteRequest(resource=resource, key="k2", value=b"next", token=a.token,
                                               op_id=op_id()), timeout=T)
    assert following.version == first.version + 1  # the retry applied nothing


def test_concurrent_writes_share_entries_only_across_resources(cluster):
    """Writes proposed at once may share a Raft entry (one applied index), but never two on
    the same resource: per resource every write has an index of its own, in version order
    (the chaos checker orders a resource's history by it)."""
    n0 = cluster.nodes[0]
    resources = [unique("share") for _ in range(6)]
    tokens = {r: n0.lease.Acquire(pb.AcquireRequest(resource=r, holder="h", ttl_ms=60_000, op_id=op_id()),
                                  timeout=T).token for r in resources}
    results: list[tuple[str, int, int]] = []  # (resource, applied index, version)
    lock = threading.Lock()

    def writer(resource: str, n: int) -> None:
        for i in range(n):
            w = n0.store.Write(pb.WriteRequest(resource=resource, key=f"k{i % 3}", value=b"v",
                                               token=tokens[resource], op_id=op_id()), timeout=T)
            with lock:
                results.append((resource, w.header.applied_index, w.version))

    shared_across = False
    deadline = time.monotonic() + 60
    while not shared_across and time.monotonic() < deadline:
        threads = [threading.Thread(target=writer, args=(r, 10)) for r in resources for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        by_index: dict[int, set[str]] = {}
        for resource, index, _ in results:
            by_index.setdefault(index, set()).add(resource)
        shared_across = any(len(rs) > 1 for rs in by_index.values())
    for resource in resources:
        mine = sorted((index, version) for r, index, version in results if r == resource)
        indexes = [index for index, _ in mine]
        assert len(set(indexes)) == len(indexes), f"two writes on {resource} share an index"
        assert [v for _, v in mine] == sorted(v for _, v in mine)  # versions follow the index order
    assert shared_across, "no two concurrent writes on different resources ever shared an entry"


def test_write_on_one_member_read_on_another(cluster):
    resource = unique("linear")
    n0 = cluster.nodes[0]
    a = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=op_id()), timeout=T)
    for i in range(9):
        writer, reader = cluster.nodes[i % 3], cluster.nodes[(i + 1) % 3]
        w = writer.store.Write(pb.WriteRequest(resource=resource, key="k", value=str(i).encode(), token=a.token,
                                               op_id=op_id()), timeout=T)
        r = reader.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=T)
        assert (r.value, r.version) == (str(i).encode(), w.version)
        # At least as new as the write: a read on the leader reports the index it read at (a
        # read-index read writes no entry), a follower's its READ_BARRIER entry's, after the write's.
        assert r.header.applied_index >= w.header.applied_index
    b_resource = unique("linear-lease")
    acq = cluster.nodes[1].lease.Acquire(pb.AcquireRequest(resource=b_resource, holder="who", ttl_ms=60_000,
                                                           op_id=op_id()), timeout=T)
    d = cluster.nodes[2].lease.Describe(pb.DescribeRequest(resource=b_resource), timeout=T)
    assert (d.held, d.holder, d.token, d.hwm) == (True, "who", acq.token, acq.token)


def test_keep_alive_unary_batch_and_stream(cluster):
    n0, n1, n2 = cluster.nodes
    r1, r2 = unique("ka"), unique("ka")
    a1 = n0.lease.Acquire(pb.AcquireRequest(resource=r1, holder="h", ttl_ms=2_000, op_id=op_id()), timeout=T)
    a2 = n0.lease.Acquire(pb.AcquireRequest(resource=r2, holder="h", ttl_ms=2_000, op_id=op_id()), timeout=T)
    k = n1.lease.KeepAlive(pb.KeepAliveRequest(resource=r1, token=a1.token, lease_id=a1.token, ttl_ms=10_000),
                           timeout=T)
    assert k.token == a1.token and k.expires_at_ms > a1.expires_at_ms and k.resource == r1

    many = n2.lease.KeepAliveMany(pb.KeepAliveManyRequest(leases=[
        pb.KeepAliveRequest(resource=r1, token=a1.token),
        pb.KeepAliveRequest(resource=r2, token=a2.token),
        pb.KeepAliveRequest(resource=r2, token=a1.token),  # a token of r1 is stale at r2
        pb.KeepAliveRequest(resource=r1, token=0),
    ]), timeout=T)
    got = [(x.resource, x.ok, x.reason) for x in many.results]
    assert got == [(r1, True, ""), (r2, True, ""), (r2, False, R.STALE_TOKEN), (r1, False, R.INVALID_FIELD)]
    assert many.results[0].expires_at_ms >= k.expires_at_ms

    requests = [pb.KeepAliveRequest(resource=r, token=t) for r, t in ((r1, a1.token), (r2, a2.token), (r1, a1.token))]
    answers = list(n0.lease.KeepAliveStream(iter(requests), timeout=T))
    assert [(x.resource, x.token) for x in answers] == [(r1, a1.token), (r2, a2.token), (r1, a1.token)]
    assert answers[2].expires_at_ms >= answers[0].expires_at_ms

    # The first refusal ends the stream with its status, after the answers before it.
    bad = [pb.KeepAliveRequest(resource=r1, token=a1.token), pb.KeepAliveRequest(resource=r1, token=a2.token),
           pb.KeepAliveRequest(resource=r1, token=a1.token)]
    seen = []
    code, reason, _, _ = failure(lambda: seen.extend(n1.lease.KeepAliveStream(iter(bad), timeout=T)))
    assert len(seen) == 1 and (code, reason) == (PRE, R.UNKNOWN_TOKEN)

    # An expired lease cannot be kept alive; a release ends it and keeps the hwm (of a resource
    # with data: one with none is forgotten, tests/test_quota_cluster.py).
    n2.store.Write(pb.WriteRequest(resource=r2, key="k", value=b"v", token=a2.token, op_id=op_id()), timeout=T)
    rel = n2.lease.Release(pb.ReleaseRequest(resource=r2, token=a2.token, op_id=op_id()), timeout=T)
    assert (rel.released, rel.hwm) == (True, a2.token)
    code, reason, _, _ = failure(n0.lease.KeepAlive, pb.KeepAliveRequest(resource=r2, token=a2.token), timeout=T)
    assert (code, reason) == (PRE, R.LEASE_EXPIRED)


def test_status_reports_the_cluster(cluster):
    n0 = cluster.nodes[0]
    a = n0.lease.Acquire(pb.AcquireRequest(resource=unique("status"), holder="h", ttl_ms=1_000, op_id=op_id()),
                         timeout=T)
    for node in cluster.nodes:
        s = node.cluster.Status(pb.StatusRequest(), timeout=T)
        assert [m.id for m in s.members] == [n.raft_address for n in cluster.nodes]
        assert [m.api_address for m in s.members] == [n.api_address for n in cluster.nodes]
        assert sum(m.is_leader for m in s.members) == 1
        leader = next(m for m in s.members if m.is_leader)
        assert (s.leader, s.leader_api_address) == (leader.id, leader.api_address)
        assert s.epoch >= a.token  # linearizable: includes every token issued before the call
        assert s.has_quorum and s.term >= 1 and s.applied_index >= s.header.applied_index >= 1
        assert s.entry_level == commands.ENTRY_LEVEL and 1 <= s.cluster_level <= s.entry_level


def test_outcome_unknown_then_retry_with_the_same_op_id_applies_once(cluster):
    """SIGSTOP mid-call: the client hears OUTCOME_UNKNOWN (or its deadline), retries, one write results."""
    resource = unique("unknown")
    n0 = cluster.nodes[0]
    a = n0.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=600_000, op_id=op_id()), timeout=T)
    base = n0.store.Write(pb.WriteRequest(resource=resource, key="base", value=b"0", token=a.token, op_id=op_id()),
                          timeout=T).version
    uncertain = {grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}

    def stalled_write(pause, target, key):
        request = pb.WriteRequest(resource=resource, key=key, value=key.encode(), token=a.token, op_id=op_id())
        for i in pause:
            cluster.pause(i)
        try:
            code, reason, meta, _ = failure(cluster.nodes[target].store.Write, request, timeout=1.5)
        finally:
            for i in pause:
                cluster.resume(i)
        assert code in uncertain, (code, reason, meta)
        if code is grpc.StatusCode.ABORTED:
            assert reason == R.OUTCOME_UNKNOWN and meta[M.DETAIL]
        cluster.wait_ready()
        return request

    # 1. The leader stops; a follower forwarded the write to it and cannot know its fate. The
    #    other follower stops too: otherwise the two left elect a leader within the election
    #    timeout (0.5-1 s), and a write that reaches its follower after that (under load, once
    #    on CI) is simply applied. Two of three stopped, whoever leads can commit nothing.
    leader = cluster.leader_index()
    follower = (leader + 1) % 3
    r1 = stalled_write([leader, (leader + 2) % 3], follower, "k1")
    # 2. Both followers stop; the leader appended the write but cannot commit it yet. When
    #    they come back it may well commit: the retry must then return the first outcome.
    leader = cluster.leader_index()
    r2 = stalled_write([(leader + 1) % 3, (leader + 2) % 3], leader, "k2")

    v1 = cluster.nodes[1].store.Write(r1, timeout=T).version
    v2 = cluster.nodes[2].store.Write(r2, timeout=T).version
    assert cluster.nodes[0].store.Write(r1, timeout=T).version == v1  # a second retry: same answer
    last = n0.store.Write(pb.WriteRequest(resource=resource, key="last", value=b"z", token=a.token, op_id=op_id()),
                          timeout=T).version
    # Versions count applied writes on the resource: base, k1, k2, last -> exactly 3 after base.
    assert sorted([v1, v2]) == [base + 1, base + 2] and last == base + 3
    for key, request in (("k1", r1), ("k2", r2)):
        read = cluster.nodes[2].store.Read(pb.ReadRequest(resource=resource, key=key), timeout=T)
        assert read.value == request.value


# -- cluster B: overload, restore, losing the quorum -----------------------------------------


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory, request):
    base = str(tmp_path_factory.mktemp("grpc-b"))
    # Member 0's reads must wait for a read-index round (the in-flight test's slow call holds
    # the slot that way), not be answered by its read lease in the first 0.25 s of a pause.
    yield from running_cluster(base, request, node_settings={
        0: {"inflight_proposals_max": 1, "cpu_affinity": "off", "lease_reads": False}})


def test_cpu_affinity_off_leaves_threads_to_the_os(cluster_b):
    cluster_b.wait_ready()
    assert cpu_pin.threads_cpus(cluster_b.nodes[0].proc.pid) == cpu_pin.threads_cpus(os.getpid())


def test_resource_exhausted_beyond_the_inflight_bound(cluster_b):
    node = cluster_b.nodes[0]  # inflight_proposals_max = 1
    resource = unique("busy")
    # With the other two members stopped, one proposal on member 0 waits for its deadline,
    # holding the only in-flight slot: the next call is refused at once, not queued.
    overloaded = (grpc.StatusCode.RESOURCE_EXHAUSTED, R.OVERLOADED)
    box = []
    # The slow call must reach the member first. If a probe overtakes it (a loaded machine
    # starts the thread late), the probe holds the slot and the slow call is the one
    # refused: that race says nothing, so the scenario runs again, from a healthy cluster
    # each time (by then a member cut off from its peers has no leader, and a proposal
    # there fails at once instead of holding the slot).
    for _attempt in range(3):
        box.clear()
        cluster_b.wait_ready()
        cluster_b.pause(1)
        cluster_b.pause(2)
        try:
            slow = threading.Thread(target=lambda: box.append(
                failure(node.lease.Describe, pb.DescribeRequest(resource=resource), timeout=3.0)))
            slow.start()
            seen = None
            deadline = time.monotonic() + 3.0
            while slow.is_alive() and time.monotonic() < deadline and seen is None:
                code, reason, _, _ = failure(node.lease.Describe, pb.DescribeRequest(resource=resource), timeout=1.0)
                if (code, reason) == overloaded:
                    seen = (code, reason)
                time.sleep(0.05)
            slow.join(timeout=10)
        finally:
            cluster_b.resume(1)
            cluster_b.resume(2)
        if seen is not None or not box or box[0][:2] != overloaded:
            break
    assert seen == overloaded
    assert box and box[0][0] in {grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE,
                                 grpc.StatusCode.DEADLINE_EXCEEDED}
    cluster_b.wait_ready()
    node.lease.Describe(pb.DescribeRequest(resource=resource), timeout=T)  # the slot was given back


def test_snapshot_and_restore_fence_every_restored_resource(cluster_b):
    n0, n1, n2 = cluster_b.nodes
    kept, lost = unique("backup"), unique("after-backup")
    a = n0.lease.Acquire(pb.AcquireRequest(resource=kept, holder="h", ttl_ms=600_000, op_id=op_id()), timeout=T)
    w = n0.store.Write(pb.WriteRequest(resource=kept, key="k", value=b"in-backup", token=a.token, op_id=op_id()),
                       timeout=T)
    # Enough data that the backup is far bigger than an ordinary command: its RESTORE_CHUNK
    # entries take the large-command path through Raft.
    for i in range(20):
        n0.store.Write(pb.WriteRequest(resource=kept, key=f"big{i}", value=bytes([i]) * 60_000, token=a.token,
                                       op_id=op_id()), timeout=T)
    snap = n1.admin.Snapshot(pb.SnapshotRequest(), timeout=T)
    assert snap.epoch >= a.token and snap.index >= w.header.applied_index
    assert limits.COMMAND_BYTES_MAX < len(snap.data) <= limits.RESTORE_SNAPSHOT_BYTES_MAX
    # Life goes on after the backup: more tokens, more writes.
    n0.store.Write(pb.WriteRequest(resource=kept, key="k", value=b"after", token=a.token, op_id=op_id()), timeout=T)
    b = n0.lease.Acquire(pb.AcquireRequest(resource=lost, holder="h", ttl_ms=600_000, op_id=op_id()), timeout=T)

    code, reason, meta, _ = failure(n2.admin.Restore, pb.RestoreRequest(data=snap.data, epoch_floor=b.token),
                                    timeout=T)
    assert (code, reason, meta[M.EPOCH]) == (PRE, R.EPOCH_FLOOR_TOO_LOW, str(b.token))
    for data, floor, field in ((b"", b.token + 10, "data"), (b"not a snapshot", b.token + 10, "data"),
                               (snap.data, 0, "epoch_floor"),
                               (b"x" * (limits.RESTORE_SNAPSHOT_BYTES_MAX + 1), b.token + 10, "data")):
        code, reason, meta, _ = failure(n2.admin.Restore, pb.RestoreRequest(data=data, epoch_floor=floor), timeout=T)
        assert (code, reason, meta.get(M.FIELD)) == (BAD, R.INVALID_FIELD, field)

    restored = n2.admin.Restore(pb.RestoreRequest(data=snap.data, epoch_floor=b.token + 10), timeout=T)
    assert restored.epoch >= b.token + 10
    for node in cluster_b.nodes:
        read = node.store.Read(pb.ReadRequest(resource=kept, key="k"), timeout=T)
        assert (read.value, read.hwm) == (b"in-backup", restored.epoch)
        d = node.lease.Describe(pb.DescribeRequest(resource=kept), timeout=T)
        assert (d.held, d.hwm) == (False, restored.epoch)
        big = node.store.Read(pb.ReadRequest(resource=kept, key="big19"), timeout=T)
        assert big.value == bytes([19]) * 60_000
    # Every token issued before the restore is refused: at restored and at vanished resources.
    for resource, token, want in ((kept, a.token, R.STALE_TOKEN), (lost, b.token, R.UNKNOWN_TOKEN)):
        _, reason, _, _ = failure(n1.store.Write, pb.WriteRequest(resource=resource, key="k", value=b"x",
                                                                  token=token, op_id=op_id()), timeout=T)
        assert reason == want
    # New tokens are above everything ever issued (I1, I11).
    c = n1.lease.Acquire(pb.AcquireRequest(resource=kept, holder="new", ttl_ms=5_000, op_id=op_id()), timeout=T)
    assert c.token > restored.epoch > b.token
    assert n0.cluster.Status(pb.StatusRequest(), timeout=T).epoch == c.token


def test_local_snapshot_adds_no_log_entry_and_replicas_agree(cluster_b):
    n0, n1, n2 = cluster_b.nodes
    barrier = n0.admin.Snapshot(pb.SnapshotRequest(), timeout=T)  # linearizable: one barrier entry
    assert n0.admin.Snapshot(pb.SnapshotRequest(), timeout=T).index > barrier.index

    def agreed():
        snaps = [n.admin.Snapshot(pb.SnapshotRequest(local=True), timeout=T) for n in (n0, n1, n2)]
        return snaps if len({(s.index, s.data) for s in snaps}) == 1 else None

    snaps = wait_until(agreed, 10, what="members to agree on a local snapshot")
    again = n0.admin.Snapshot(pb.SnapshotRequest(local=True), timeout=T)
    assert again.index == snaps[0].index  # a local snapshot proposes nothing


def test_losing_the_quorum_is_not_serving_and_unavailable(cluster_b):
    survivor = cluster_b.nodes[0]
    assert survivor.health_status() == SERVING
    cluster_b.kill(1)
    cluster_b.kill(2)
    wait_until(lambda: survivor.health_status() == health_pb2.HealthCheckResponse.NOT_SERVING, 10,
               what="the survivor to report NOT_SERVING")
    assert survivor.health_status("fencing.v1.Lease") == health_pb2.HealthCheckResponse.NOT_SERVING

    # Proposals fail definitely (UNAVAILABLE/NO_LEADER, with a leader hint that may be empty)
    # once the survivor knows it has no leader; until then they may be OUTCOME_UNKNOWN.
    def no_leader():
        try:
            survivor.lease.Describe(pb.DescribeRequest(resource="q"), timeout=3)
        except grpc.RpcError as err:
            code, reason, meta, _ = decoded(err)
        else:
            return None  # a leader's read lease outlives its last acknowledged round by < 0.25 s
        assert code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED}, (code, reason)
        return (code, reason, meta) if reason == R.NO_LEADER else None

    code, reason, meta = wait_until(no_leader, 15, what=R.NO_LEADER, interval_s=0.2)
    assert code == grpc.StatusCode.UNAVAILABLE and set(meta) >= {"leader", "leader_api"}

    cluster_b.start(1)
    cluster_b.start(2)
    cluster_b.wait_ready()
    # SIGTERM stops a member gracefully: exit code 0.
    for i in range(3):
        assert cluster_b.stop(i) == 0



def test_member_threads_carry_their_names_at_the_os_level(cluster):
    """top -H / perf / /proc show which thread is which (fencingd._name_os_threads)."""
    node = cluster.nodes[cluster.wait_ready()]
    node.lease.Describe(pb.DescribeRequest(resource=unique("names")), timeout=T)  # starts a gRPC worker
    task_dir = f"/proc/{node.proc.pid}/task"
    names = set()
    for tid in os.listdir(task_dir):
        with open(os.path.join(task_dir, tid, "comm")) as f:
            names.add(f.read().strip())
    assert {"_autoTickThread", "_serve", "leader-sync", "health-updater"} <= names, names
    assert any(n.startswith("grpc_") for n in names), names


def test_the_leader_runs_every_thread_on_the_cpu_auto_chose_and_followers_are_free(cluster):
    """cpu_affinity = "auto" (the default): the leader's threads on one CPU, followers' anywhere."""
    leader = cluster.nodes[cluster.wait_ready()]
    leader.lease.Describe(pb.DescribeRequest(resource=unique("cpus")), timeout=T)  # starts a gRPC worker
    assert_auto_placement(cluster, leader.index)


def assert_auto_placement(cluster, leader_index: int) -> None:
    everything = cpu_pin.threads_cpus(os.getpid())  # this test process: not pinned
    for node in cluster.nodes:
        if not node.alive:
            continue
        cpu = cpu_pin.choose_cpu("auto", node.index, cpu_pin.allowed_cpus())
        want = {frozenset({cpu})} if node.index == leader_index and cpu is not None else everything
        wait_until(
            lambda node=node, want=want: cpu_pin.threads_cpus(node.proc.pid) == want,
            10,
            what=f"node {node.index} on CPUs {want}",
        )


@pytest.fixture(scope="module")
def cluster_c(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("grpc-c")), request)


def test_placement_follows_leadership(cluster_c):
    first = cluster_c.wait_ready()
    assert_auto_placement(cluster_c, first)
    cluster_c.pause(first)  # the others elect a new leader meanwhile
    second = cluster_c.wait_ready()
    assert second != first
    cluster_c.resume(first)  # the same process learns it no longer leads
    assert cluster_c.wait_ready() == second
    assert_auto_placement(cluster_c, second)  # new leader pinned, old leader's threads freed
