"""Lease reads on three real ``fencingd serve`` members (RAFT.md "Lease reads").

- A leader answers Read and Describe by its lease: ``fencing_raft_lease_reads_total`` counts
  them, and each sees the write acknowledged before it.
- A leader paused (SIGSTOP) until the others elected a new leader and acknowledged a newer
  write, then resumed with a read already sent to it, never answers that read from its old
  state: its monotonic clock ran on through the pause, so its lease has lapsed, the read takes
  a round it cannot win, and it answers the new value (through the log) or an error.
"""

from __future__ import annotations

import os

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from testsupport.grpc_cluster import metered_cluster, metric_value
from testsupport.supervisor import wait_until

RPC_S = 5.0
READS = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from metered_cluster(str(tmp_path_factory.mktemp("lease-read")), request)


def lease_reads(cluster, i: int) -> float:
    return metric_value(cluster.metrics_urls[i], "fencing_raft_lease_reads_total")


def acquire(node, resource: str) -> int:
    return node.lease.Acquire(
        pb.AcquireRequest(resource=resource, holder="t", ttl_ms=120_000, op_id=os.urandom(16)), timeout=RPC_S
    ).token


def write(node, resource: str, token: int, value: bytes) -> None:
    node.store.Write(pb.WriteRequest(resource=resource, key="k", value=value, token=token, op_id=os.urandom(16)),
                     timeout=RPC_S)


def read(node, resource: str) -> bytes:
    return node.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=RPC_S).value


def test_the_leader_answers_reads_by_its_lease(cluster):
    leader_i = cluster.wait_ready()
    leader = cluster.nodes[leader_i]
    token = acquire(leader, "lr/a")
    before = lease_reads(cluster, leader_i)
    for n in range(READS):
        write(leader, "lr/a", token, b"v%d" % n)
        assert read(leader, "lr/a") == b"v%d" % n
    # Heartbeats renew the lease every 0.1 s; a read that found it lapsed took a round instead.
    served = lease_reads(cluster, leader_i) - before
    assert served >= READS * 0.8, f"only {served:g} of {READS} reads answered by the lease"


def test_a_paused_then_resumed_old_leader_serves_no_stale_read(cluster):
    old_i = cluster.wait_ready()
    old = cluster.nodes[old_i]
    token = acquire(old, "lr/stale")
    write(old, "lr/stale", token, b"old")
    assert read(old, "lr/stale") == b"old"  # by lease: the channel is up, the lease held
    others = [n for n in cluster.nodes if n.index != old_i]
    served_before = lease_reads(cluster, old_i)
    cluster.pause(old_i)
    try:
        def new_leader():
            for status in cluster.statuses(nodes=others).values():
                if status.leader and status.leader != old.raft_address:
                    return (cluster.index_of_raft(status.leader),)
            return None

        new_i = wait_until(new_leader, 20, interval_s=0.1, what="the others to elect a new leader")[0]
        write(cluster.nodes[new_i], "lr/stale", token, b"new")  # acknowledged by the new majority
        # Sent while the old leader is stopped: it is handled as the process resumes, when its
        # gRPC threads may run before its Raft thread hears of the new term.
        pending = old.store.Read.future(pb.ReadRequest(resource="lr/stale", key="k"), timeout=RPC_S)
    finally:
        cluster.resume(old_i)
    try:
        value = pending.result().value
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED,
                              grpc.StatusCode.DEADLINE_EXCEEDED), exc
    else:
        assert value == b"new", f"the resumed old leader answered {value!r} after b'new' was acknowledged"
    assert lease_reads(cluster, old_i) == served_before, "the resumed old leader answered by a lapsed lease"
    cluster.wait_ready(60)
    assert read(old, "lr/stale") == b"new"
