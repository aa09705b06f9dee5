"""Lease.List and ``fencingctl ls`` on a real three-process cluster (issue 29 point 4).

Three ``fencingd serve`` processes with a principals file: a listing asked of the leader (read
index) and of a follower (a READ_BARRIER through the log) agrees, pages through a prefix with
every resource once, reports remaining TTLs on the log clock and the lock waiters queued; a
tenant sees only its own prefixes; ``fencingctl ls`` prints the same as a table and as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import exceptions as exc
from coordinator.client.sync import FencingClient
from coordinator.server.auth import token_digest
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TTL_MS = 60_000
OPS, TENANT = "ops-secret", "orders-secret"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("list")
    path = base / "principals.toml"
    path.write_text(
        f'[[principal]]\nname = "ops"\ntoken_sha256 = "{token_digest(OPS)}"\nadmin = true\n'
        f'[[principal]]\nname = "orders"\ntoken_sha256 = "{token_digest(TENANT)}"\nprefixes = ["orders/"]\n'
    )
    yield from running_cluster(str(base), request, settings={"principals_file": str(path)})


def _ctl(cluster, *argv: str, credential: str = OPS) -> subprocess.CompletedProcess:
    endpoints = ",".join(n.api_address for n in cluster.nodes)
    return subprocess.run(
        [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", endpoints,
         "--credential", credential, *argv],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )


def test_list_pages_agree_on_leader_and_follower_with_ttls_and_waiters(cluster):
    ops = FencingClient([n.api_address for n in cluster.nodes], bearer_token=OPS)
    # Status needs a credential here (the supervisor's own status poll has none).
    leader = [n.api_address for n in cluster.nodes].index(ops.status().leader_api_address)
    follower = (leader + 1) % len(cluster.nodes)
    names = [f"orders/{n:02d}" for n in range(25)]
    for name in names:
        ops.acquire(name, ttl_ms=TTL_MS, holder="worker-1")
    ops.acquire("billing/1", ttl_ms=TTL_MS)
    # One lock waiter queued behind orders/00's holder (Lock with no server-side wait).
    queued = cluster.nodes[leader].lease.Lock(
        pb.LockRequest(resource="orders/00", holder="waiter", ttl_ms=TTL_MS, waiter_id=os.urandom(16), wait_ms=0),
        metadata=(("authorization", f"Bearer {OPS}"),), timeout=RPC_TIMEOUT_S,
    )
    assert queued.queued and not queued.granted

    # A follower's listing goes through the log as a READ_BARRIER with prefixes (entry level 3):
    # the leader raises the cluster's level once it has polled every member (LevelPoller).
    at_follower = FencingClient([cluster.nodes[follower].api_address], bearer_token=OPS)

    def follower_lists() -> bool:
        try:
            return bool(at_follower.list("orders/", limit=1).resources)
        except exc.Refused as refused:
            assert refused.reason == "CLUSTER_LEVEL_TOO_LOW", refused
            return False

    wait_until(follower_lists, 30, what="the cluster level that lets a follower list")
    pages = {}
    for index in (leader, follower):
        at = FencingClient([cluster.nodes[index].api_address], bearer_token=OPS)
        listed = list(at.list_all("orders/", page_size=10))
        assert [r.resource for r in listed] == names
        pages[index] = listed
        first = at.list("orders/", limit=10)
        assert first.header.member_id and len(first.resources) == 10 and first.next_page_token
    head = pages[follower][0]
    assert head.held and head.holder == "worker-1" and head.waiters == 1 and head.token == head.hwm
    assert all(0 < r.remaining_ms <= TTL_MS for r in pages[follower])
    assert pages[leader][1].waiters == 0

    tenant = FencingClient([n.api_address for n in cluster.nodes], bearer_token=TENANT)
    assert [r.resource for r in tenant.list_all()] == names  # billing/1 is not the tenant's
    with pytest.raises(exc.AuthError):
        tenant.list("billing/")
    with pytest.raises(exc.InvalidArgument) as caught:
        tenant.list("orders/", limit=0)
    assert caught.value.field == "limit"
    # The server's own refusal, not only the client's: a raw call with limit 0.
    with pytest.raises(grpc.RpcError) as raw:
        cluster.nodes[follower].lease.List(pb.ListRequest(prefix="orders/", limit=0),
                                           metadata=(("authorization", f"Bearer {TENANT}"),), timeout=RPC_TIMEOUT_S)
    assert raw.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "limit" in raw.value.details()


def test_fencingctl_ls_on_the_cluster(cluster):
    ops = FencingClient([n.api_address for n in cluster.nodes], bearer_token=OPS)
    ops.acquire("ctl/a", ttl_ms=TTL_MS, holder="svc-a")
    token = ops.acquire("ctl/b", ttl_ms=TTL_MS, holder="svc-b").token
    ops.release("ctl/b", token)

    table = _ctl(cluster, "ls", "ctl/")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["RESOURCE", "HOLDER", "TOKEN", "TTL", "HWM", "WAITERS"]
    assert [row.split()[0] for row in rows] == ["ctl/a"]  # ctl/b: released, no data, forgotten
    ttl = rows[0].split()[3]
    assert ttl.endswith("s") and 30 < float(ttl.rstrip("s")) <= 60, ttl

    doc = json.loads(_ctl(cluster, "-o", "json", "ls", "ctl/").stdout)
    [item] = doc["resources"]
    assert item["resource"] == "ctl/a" and item["holder"] == "svc-a" and 30_000 < item["remaining_ms"] <= TTL_MS

    denied = _ctl(cluster, "ls", "ctl/", credential=TENANT)
    assert denied.returncode == 6 and "permission" in denied.stderr, denied
    bad = _ctl(cluster, "ls", "ctl/", "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr, bad
