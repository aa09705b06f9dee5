"""Issue 26, finding 3, on real processes: what callers can make a member write to its logs.

The finding: Admin calls were audited with their string fields whole, so 50 MemberAdd and
ForceRelease calls with a 4 MB field, from a caller with no credential, grew the audit file and
the process log by 200 MB each (~100 MB/s; a non-admin principal ~67 MB/s). One three-member
cluster with a principals file (a tenant, an admin) and an audit log per member; each test aims
at a member of its own, so each has its own limiter, and a short ``refused_log_window_s`` lets
a test see a window end. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import os
import time

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.server import log_limits
from coordinator.server.auth import token_digest
from tests.test_server_limits import auth, token_of
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
WINDOW_S = 2.0  # refused_log_window_s of this cluster: a test can wait one out
TENANT, ADMIN = "alice", "ops"
# 4 MB, as in the finding: a field this size still fits one gRPC message (GRPC_MESSAGE_BYTES_MAX).
BIG = "a" * 4_000_000
CALLS = 50
# What 100 such calls (50 without a credential, 50 by a tenant) may add to one member's audit
# file and process log together: a few short lines per caller and window, never a field whole.
# Measured ~7.6 KB; 64 KiB leaves room for a slow run spanning a few windows.
LOG_GROWTH_BYTES_MAX = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = str(tmp_path_factory.mktemp("logbounds"))
    principals = os.path.join(base, "principals.toml")
    with open(principals, "w", encoding="utf-8") as f:
        f.write(f'[[principal]]\nname = "{TENANT}"\ntoken_sha256 = "{token_digest(token_of(TENANT))}"\n'
                f'prefixes = ["{TENANT}/"]\n\n')
        f.write(f'[[principal]]\nname = "{ADMIN}"\ntoken_sha256 = "{token_digest(token_of(ADMIN))}"\n'
                'admin = true\n')
    settings = {"principals_file": principals, "refused_log_window_s": WINDOW_S}
    node_settings = {i: {"audit_log_path": os.path.join(base, f"audit{i}.log")} for i in range(3)}
    yield from running_cluster(base, request, settings=settings, node_settings=node_settings)


def audit_path(cluster, index: int) -> str:
    return os.path.join(cluster.base_dir, f"audit{index}.log")


def audit_lines(cluster, index: int) -> list[dict]:
    path = audit_path(cluster, index)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def log_bytes(cluster, index: int) -> int:
    path = audit_path(cluster, index)
    return (os.path.getsize(path) if os.path.exists(path) else 0) + os.path.getsize(cluster.nodes[index].log_path)


def big_call(node, i: int, metadata) -> grpc.StatusCode:
    """One Admin call with a 4 MB string field: MemberAdd's raft_address or ForceRelease's resource."""
    try:
        if i % 2:
            node.admin.MemberAdd(pb.MemberAddRequest(member_id="m9", raft_address=BIG), timeout=T, metadata=metadata)
        else:
            node.admin.ForceRelease(pb.ForceReleaseRequest(resource=BIG, op_id=os.urandom(16)), timeout=T,
                                    metadata=metadata)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_big_fields_from_callers_without_admin_grow_the_logs_by_a_few_kilobytes(cluster):
    """The finding's measurement: 50 calls with no credential and 50 by a non-admin principal,
    each with a 4 MB field, grew both logs by 400 MB; now by less than LOG_GROWTH_BYTES_MAX."""
    node = cluster.nodes[0]
    before = log_bytes(cluster, 0)
    lines_before = len(audit_lines(cluster, 0))
    codes = {big_call(node, i, ()) for i in range(CALLS)} | {big_call(node, i, auth(TENANT)) for i in range(CALLS)}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
    # Each caller's first refused call is still audited (the limiter lets it through).
    lines = wait_until(lambda: (lambda got: got if {"unauthenticated", TENANT} <= {g["principal"] for g in got}
                                else None)(audit_lines(cluster, 0)[lines_before:]), 5, what="both callers' lines")
    grown = log_bytes(cluster, 0) - before
    assert grown < LOG_GROWTH_BYTES_MAX, f"the logs grew by {grown} bytes for {2 * CALLS} calls"
    first = lines[0]  # by size, beyond a short prefix
    assert first["args"]["resource_chars"] == len(BIG)
    assert first["args"]["resource_prefix"] == BIG[: log_limits.AUDIT_FIELD_PREFIX_CHARS_MAX]
    node.check_running()


def test_a_flood_of_refused_calls_from_one_peer_writes_a_few_lines_and_then_its_count(cluster):
    """40 refused calls from one client host: at most REFUSED_LOG_LINES_PER_CALLER_MAX lines a
    window, and once a window ends the host's next line says how many were held back, so the
    lines and their counts account for every call."""
    node, index = cluster.nodes[1], 1
    flood = 40
    before = len(audit_lines(cluster, index))
    started = time.monotonic()
    for _ in range(flood):
        with pytest.raises(grpc.RpcError) as caught:
            node.admin.SetEpochFloor(pb.SetEpochFloorRequest(floor=1), timeout=T)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    windows = int((time.monotonic() - started) // WINDOW_S) + 1  # windows the flood spanned
    flood_lines = audit_lines(cluster, index)[before:]
    assert 1 <= len(flood_lines) <= log_limits.REFUSED_LOG_LINES_PER_CALLER_MAX * windows < flood

    polls = 0

    def reported():
        # One more refused call per poll; the first after the window ends carries the count.
        nonlocal polls
        polls += 1
        with pytest.raises(grpc.RpcError):
            node.admin.SetEpochFloor(pb.SetEpochFloorRequest(floor=1), timeout=T)
        lines = audit_lines(cluster, index)[before + len(flood_lines):]
        return lines if any(line.get("suppressed") for line in lines) else None

    later = wait_until(reported, 4 * WINDOW_S, interval_s=0.2, what="a line with the suppressed count")
    counted = later[-1]  # written by the last poll's call: nothing of this host is pending after it
    assert counted["suppressed"] > 0
    assert counted["principal"] == "unauthenticated" and counted["outcome"] == "UNAUTHENTICATED/UNAUTHENTICATED"
    # Every call is a line or in the count a later line carries: none is lost, none is doubled.
    assert sum(1 + line.get("suppressed", 0) for line in flood_lines + later) == flood + polls


def test_an_authorized_admin_call_keeps_its_own_audit_line_with_its_fields_by_size(cluster):
    """Accountability: every call of an admin that may change something has its line, beyond
    any rate of refusals, and a long field is recorded by its prefix and length."""
    node, index = cluster.nodes[2], 2
    resource = f"{TENANT}/" + "r" * 200  # a valid name, longer than the prefix an audit line shows
    before = len(audit_lines(cluster, index))
    calls = 3 * log_limits.REFUSED_LOG_LINES_PER_CALLER_MAX  # more than any refused caller gets
    for _ in range(calls):
        response = node.admin.ForceRelease(pb.ForceReleaseRequest(resource=resource, op_id=os.urandom(16)),
                                           timeout=T, metadata=auth(ADMIN))
        assert response.header.applied_index > 0
    lines = wait_until(lambda: (lambda got: got if len(got) >= calls else None)(audit_lines(cluster, index)[before:]),
                       5, what="an audit line per call")
    assert len(lines) == calls
    for line in lines:
        assert (line["rpc"], line["principal"], line["outcome"]) == ("ForceRelease", ADMIN, "OK")
        assert line["args"]["resource_chars"] == len(resource)
        assert line["args"]["resource_prefix"] == resource[: log_limits.AUDIT_FIELD_PREFIX_CHARS_MAX]
        assert line["args"]["op_id_bytes"] == 16
        assert len(json.dumps(line)) <= log_limits.AUDIT_LINE_BYTES_MAX


def test_undecodable_requests_without_a_credential_write_a_few_library_lines(cluster):
    """The gRPC library logs a traceback per request it cannot decode (~400 B for a few bytes
    sent, before any credential is looked at): 200 of them added ~78 KB to the process log.
    Now a few lines per window, and a later line says how many were held back."""
    node = cluster.nodes[2]
    channel = grpc.insecure_channel(node.api_address)
    raw = channel.unary_unary("/fencing.v1.Lease/Acquire", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
    corrupt = b"\x0a\xff\xff\xff\xff\x0f"  # a length past the end of the message

    def send() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            raw(corrupt, timeout=T)
        assert caught.value.code() == grpc.StatusCode.INTERNAL

    def process_log() -> str:
        with open(node.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    try:
        before = len(process_log())
        for _ in range(200):
            send()
        grown = len(process_log()) - before
        assert grown < 8 * 1024, f"the process log grew by {grown} bytes for 200 undecodable requests"

        def reported():
            send()
            return "similar suppressed)" in process_log()[before:]

        wait_until(reported, 4 * WINDOW_S, interval_s=0.2, what="a library line with the suppressed count")
        node.check_running()
    finally:
        channel.close()
