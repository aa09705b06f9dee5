"""A step of the leader's monotonic clock and its read lease (RAFT.md "Lease reads", item 5), on
three real members under libfaketime (tests/test_clock_step.py's SteppableCluster). The Raft
layer reads CLOCK_MONOTONIC_RAW (pysyncobj's clock), which testsupport/clock_step/sitecustomize.py
jumps by the seconds in each member's ``nodeN.raw`` file.

- Back 2 s: CLOCK_MONOTONIC never does this, a faked clock can; the leader's next reading is
  below an earlier one, so it voids its lease (counted) instead of stretching it by the step,
  and every read still sees the last acknowledged write.
- Forward 1 h (a VM resumed after an hour, as that leader sees it): its lease has lapsed; reads
  still see the last acknowledged write, answered by whoever leads once the step settled.
"""

from __future__ import annotations

import os

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from tests.test_clock_step import LIBFAKETIME, SETTLE_S, SteppableCluster
from testsupport.grpc_cluster import RPC_TIMEOUT_S, metric_value
from testsupport.supervisor import DEFAULT_HOSTS, pick_ports, wait_until


class RawSteppableCluster(SteppableCluster):
    """SteppableCluster whose members' CLOCK_MONOTONIC_RAW also jumps (``step_raw``)."""

    def step_raw(self, i: int, offset: str) -> None:
        path = self.offset_path(i, "raw")
        with open(path + ".tmp", "w", encoding="ascii") as f:
            f.write(offset + "\n")
        os.replace(path + ".tmp", path)  # a member never reads half a file

    def env(self, node) -> dict:
        env = super().env(node)
        env["FENCING_TEST_RAW_MONOTONIC_OFFSET_FILE"] = self.offset_path(node.index, "raw")
        return env


@pytest.fixture
def cluster(tmp_path, request):
    if not os.path.exists(LIBFAKETIME):
        pytest.fail(f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run does)")
    port, _ = pick_ports(DEFAULT_HOSTS)
    node_settings = {i: {"metrics_address": f"{h}:{port}"} for i, h in enumerate(DEFAULT_HOSTS)}
    with RawSteppableCluster(str(tmp_path), node_settings=node_settings) as c:
        c.metrics_urls = [f"http://{h}:{port}/metrics" for h in DEFAULT_HOSTS]
        try:
            c.start_all()
            yield c
        finally:
            if request.session.testsfailed:
                print(c.logs())


def _write(cluster, resource: str, token: int, value: bytes) -> None:
    def through_leader():
        try:
            cluster.nodes[cluster.leader_index()].store.Write(pb.WriteRequest(
                resource=resource, key="k", value=value, token=token, op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)
            return (True,)
        except grpc.RpcError:
            return None  # an election under way: ask again (a retry of a write with a fresh op_id is fine here)

    wait_until(through_leader, SETTLE_S, interval_s=0.1, what=f"the write of {value!r}")


def _reads_see(cluster, resource: str, value: bytes) -> None:
    """Every member, leader or not, answers ``value`` or an error; at least the leader answers."""
    for node in cluster.nodes:
        try:
            got = node.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=RPC_TIMEOUT_S).value
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED), exc
            continue
        assert got == value, f"member {node.index} read {got!r} after {value!r} was acknowledged"


@pytest.mark.parametrize("monotonic, counted_back", [("-2", True), ("3600", False)])
def test_a_step_of_the_leader_s_monotonic_clock_stretches_no_lease(cluster, monotonic, counted_back):
    leader_i = cluster.wait_ready()
    leader = cluster.nodes[leader_i]
    token = leader.lease.Acquire(pb.AcquireRequest(resource="lcs", holder="t", ttl_ms=600_000,
                                                   op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S).token
    _write(cluster, "lcs", token, b"before")
    assert leader.store.Read(pb.ReadRequest(resource="lcs", key="k"), timeout=RPC_TIMEOUT_S).value == b"before"
    url = cluster.metrics_urls[leader_i]
    assert metric_value(url, "fencing_raft_lease_clock_steps_back_total") == 0
    cluster.step_raw(leader_i, monotonic)
    _write(cluster, "lcs", token, b"after")
    _reads_see(cluster, "lcs", b"after")
    if counted_back:
        # Any reading of the stepped member's lease sees the step: its ticks read it continually.
        wait_until(lambda: metric_value(url, "fencing_raft_lease_clock_steps_back_total") >= 1, SETTLE_S,
                   interval_s=0.1, what="the stepped leader to count the clock going back")
    cluster.wait_ready(SETTLE_S)
    _write(cluster, "lcs", token, b"settled")
    _reads_see(cluster, "lcs", b"settled")
