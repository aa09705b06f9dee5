"""Status during failure, on a real three-process cluster (issue 29 point 6).

``fencingctl endpoint status|health`` ask each endpoint on its own with a short deadline, so
they answer with one and with two of three members SIGKILLed; ``fencingctl status`` marks the
members that do not answer and, without a quorum, shows the most advanced member's own view
(exit 4); ``fencingd health`` exits 0 / 2 / 4 like ``grpc_health_probe``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from testsupport.supervisor import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_UNAVAILABLE = 4


def _ctl(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.client.fencingctl", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def _health(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "health", "--address", address,
                           "--timeout-s", "1"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


@pytest.fixture
def cluster(tmp_path, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path / "cluster"), request)


def _by_endpoint(doc: dict) -> dict[str, dict]:
    return {e["endpoint"]: e for e in doc["endpoints"]}


def test_endpoint_status_and_health_with_one_then_two_members_down(cluster):
    eps = [n.api_address for n in cluster.nodes]
    leader = cluster.leader_index()
    endpoints = ("--endpoints", ",".join(eps))

    proc = _ctl(*endpoints, "-o", "json", "endpoint", "status")
    assert proc.returncode == 0, proc.stderr
    rows = _by_endpoint(json.loads(proc.stdout))
    assert set(rows) == set(eps)
    assert [ep for ep, row in rows.items() if row["is_leader"]] == [eps[leader]]
    for row in rows.values():
        assert row["reachable"] and row["has_quorum"] and row["term"] >= 1 and row["applied_index"] >= 1
        assert row["version"] and row["data_size_bytes"] > 0
    proc = _ctl(*endpoints, "endpoint", "status")  # the table
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].split()[:4] == [
        "ENDPOINT", "REACHABLE", "MEMBER", "LEADER"], proc.stdout
    proc = _ctl(*endpoints, "endpoint", "health")
    assert proc.returncode == 0 and proc.stdout.count("SERVING") == 3, proc.stdout + proc.stderr
    assert _health(eps[0]).returncode == 0

    # One follower SIGKILLed: status still answers (quorum) and marks it.
    down = (leader + 1) % 3
    cluster.kill(down)
    proc = _ctl(*endpoints, "-o", "json", "status")
    assert proc.returncode == 0, proc.stderr
    members = {m["api_address"]: m for m in json.loads(proc.stdout)["members"]}
    assert members[eps[down]]["reachable"] is False
    assert all(members[eps[i]]["reachable"] is True for i in range(3) if i != down)
    proc = _ctl(*endpoints, "status")
    dead_row = next(line for line in proc.stdout.splitlines() if eps[down] in line and "raft" not in line)
    assert dead_row.split()[-1] == "NO", proc.stdout
    assert _health(eps[down]).returncode == 2  # unreachable, grpc_health_probe's code

    # Two of three down: no quorum. Each endpoint is still asked on its own, in about its deadline.
    down2 = leader
    cluster.kill(down2)
    alive = next(i for i in range(3) if i not in (down, down2))
    started = time.monotonic()
    proc = _ctl(*endpoints, "-o", "json", "endpoint", "status")
    took = time.monotonic() - started
    assert proc.returncode == EXIT_UNAVAILABLE, proc.stderr
    rows = _by_endpoint(json.loads(proc.stdout))
    assert not rows[eps[down]]["reachable"] and not rows[eps[down2]]["reachable"]
    assert rows[eps[alive]]["reachable"] and rows[eps[alive]]["term"] >= 1
    assert rows[eps[alive]]["applied_index"] >= 1 and rows[eps[alive]]["version"]
    assert took < 10, f"endpoint status took {took:.1f} s with two members down"

    started = time.monotonic()
    proc = _ctl(*endpoints, "-o", "json", "status")  # the default 10 s deadline: not waited for
    took = time.monotonic() - started
    assert proc.returncode == EXIT_UNAVAILABLE, proc.stderr
    assert took < 8, f"status took {took:.1f} s with two members down"
    doc = json.loads(proc.stdout)
    assert doc["has_quorum"] is False and "own view" in proc.stderr
    reach = {m["api_address"]: m["reachable"] for m in doc["members"]}
    assert reach == {eps[down]: False, eps[down2]: False, eps[alive]: True}

    # The survivor stops serving once it sees the quorum gone: NOT_SERVING is 4, dead is 2.
    wait_until(lambda: _health(eps[alive]).returncode == 4, 30, what="the survivor NOT_SERVING")
    assert _health(eps[down2]).returncode == 2
    proc = _ctl(*endpoints, "-o", "json", "endpoint", "health")
    assert proc.returncode == EXIT_UNAVAILABLE
    health = {e["endpoint"]: e["health"] for e in json.loads(proc.stdout)["endpoints"]}
    assert health == {eps[down]: "UNREACHABLE", eps[down2]: "UNREACHABLE", eps[alive]: "NOT_SERVING"}


def test_an_endpoint_with_a_scheme_is_a_usage_error_at_once():
    started = time.monotonic()
    proc = _ctl("--endpoints", "http://127.0.0.1:7100", "status")
    assert proc.returncode == 2 and time.monotonic() - started < 5
    assert len(proc.stderr.splitlines()) == 1 and "without a scheme" in proc.stderr
    assert "'127.0.0.1:7100'" in proc.stderr  # what to type instead


def test_fencingd_health_usage_error_is_1_not_unreachable():
    """grpc_health_probe's 1: argparse's own 2 would read as "unreachable" to a probe."""
    proc = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "health", "--timeout-s", "x"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 1 and "--timeout-s" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "health", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 0
    for line in ("0  SERVING", "2  unreachable", "4  NOT_SERVING"):
        assert line in proc.stdout


def test_the_client_decodes_every_health_status_as_grpc_health_encodes_it():
    """`endpoint health` speaks grpc.health.v1 without grpcio-health-checking (a server-only
    dependency): its decoder must agree with the library's encoding of every status."""
    from grpc_health.v1 import health_pb2

    from coordinator.client.ctl_endpoint import serving_status

    for value in health_pb2.HealthCheckResponse.ServingStatus.values():
        encoded = health_pb2.HealthCheckResponse(status=value).SerializeToString()
        assert serving_status(encoded) == health_pb2.HealthCheckResponse.ServingStatus.Name(value)
    assert serving_status(b"\x08\x09").startswith("UNKNOWN") and serving_status(b"\x10\x01").startswith("UNKNOWN")
