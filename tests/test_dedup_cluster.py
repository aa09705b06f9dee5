"""Per-principal dedup budgets on three real ``fencingd serve`` processes (issue 26, finding 5).

The finding, reproduced through the API with a principals file: tenant X writing with fresh
op_ids past the dedup table's 100,000 entries emptied tenant Y's retry window, so Y's
Acquire retry answered LEASE_HELD against Y's own lease and Y's Write retry applied a second
time. Now X's op_ids evict only X's own (its ``dedup_entries_max``): Y's retries with the
same op_ids return their first outcome.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os

import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import limits
from coordinator.server.auth import token_digest
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
TTL_MS = 10 * 60 * 1000  # Y's lease outlives the flood: a retry must find it held by Y alone
TENANTS = {"x": "x-secret", "y": "y-secret"}  # both with the default quotas
# Past the shared table's cap with room to spare: on the code before budgets this evicted
# every entry Y had.
FLOOD_WRITES = limits.DEDUP_ENTRIES_MAX + 5_000
FLOOD_THREADS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("dedup")
    path = base / "principals.toml"
    path.write_text("\n".join(
        f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{token_digest(token)}"\nprefixes = ["{name}/"]\n'
        for name, token in TENANTS.items()
    ))
    yield from running_cluster(str(base), request, settings={"principals_file": str(path)})


def bearer(tenant: str) -> tuple:
    return (("authorization", f"Bearer {TENANTS[tenant]}"),)


def leader(cluster):
    """The member the others name as leader (Status needs a principal's token here)."""

    def named():
        status = cluster.nodes[0].cluster.Status(pb.StatusRequest(), timeout=T, metadata=bearer("x"))
        return cluster.node_by_raft(status.leader) if status.leader else None

    return wait_until(named, 15.0, interval_s=0.1, what="a leader")


def flood(node, token: int) -> int:
    """X writes FLOOD_WRITES times, each with a fresh op_id, in WriteMany batches from a few
    threads; returns how many applied."""
    counter = itertools.count()
    batch = limits.WRITE_MANY_ITEMS_MAX

    def worker() -> int:
        applied = 0
        while next(counter) * batch < FLOOD_WRITES:
            items = [
                pb.WriteRequest(resource="x/flood", key="k", value=b"v", token=token, op_id=os.urandom(16))
                for _ in range(batch)
            ]
            reply = node.store.WriteMany(pb.WriteManyRequest(writes=items), timeout=30, metadata=bearer("x"))
            applied += sum(r.WhichOneof("outcome") == "write" for r in reply.results)
        return applied

    with concurrent.futures.ThreadPoolExecutor(FLOOD_THREADS) as pool:
        return sum(pool.map(lambda _: worker(), range(FLOOD_THREADS)))


def test_a_flooding_tenant_leaves_another_tenants_retries_their_first_outcome(cluster):
    node = leader(cluster)  # no forwarding hop per batch
    acquire = pb.AcquireRequest(resource="y/lock", holder="y", ttl_ms=TTL_MS, op_id=os.urandom(16))
    first = node.lease.Acquire(acquire, timeout=T, metadata=bearer("y"))
    write = pb.WriteRequest(resource="y/lock", key="k", value=b"once", token=first.token, op_id=os.urandom(16))
    wrote = node.store.Write(write, timeout=T, metadata=bearer("y"))
    x_lease = node.lease.Acquire(
        pb.AcquireRequest(resource="x/flood", holder="x", ttl_ms=TTL_MS, op_id=os.urandom(16)),
        timeout=T, metadata=bearer("x"),
    )

    assert flood(node, x_lease.token) >= FLOOD_WRITES

    # Y retries both with the same op_ids, on every member: the first outcomes, applied once.
    for member in cluster.nodes:
        again = member.lease.Acquire(acquire, timeout=T, metadata=bearer("y"))  # not LEASE_HELD
        assert (again.token, again.expires_at_ms) == (first.token, first.expires_at_ms)
        rewrote = member.store.Write(write, timeout=T, metadata=bearer("y"))
        assert (rewrote.version, rewrote.hwm) == (wrote.version, wrote.hwm)
    read = node.store.Read(pb.ReadRequest(resource="y/lock", key="k"), timeout=T, metadata=bearer("y"))
    assert (read.value, read.version) == (b"once", wrote.version)  # no second apply
