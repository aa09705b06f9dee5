"""A step of one member's clock, on three real ``fencingd serve`` processes (DESIGN I6).

Issue "Deeper chaos", point 1: A holds R with a 60 s TTL, the leader's clock jumps +1 h, and
B's Acquire of R succeeded 1.7 s later: stamps took ``max(last + 1, wall_ms, log clock)``, so
one member's clock moved the log clock for everyone. Now only the leader stamps, by its
monotonic time and at most STAMP_ADVANCE_MS_MAX per stamp (coordinator/raft/stamp_clock.py).

Every member runs under libfaketime (Debian's ``faketime`` package; ``.ci/run`` installs it)
with an offset file of its own, re-read at every clock call, so the test steps one member's
clock while it runs. libfaketime steps CLOCK_MONOTONIC with the wall clock: keeping monotonic
real (FAKETIME_DONT_FAKE_MONOTONIC) makes ``time.sleep`` fail with EINVAL in the member
(CHAOS.md, "Clock steps"). So each step here is wall + monotonic: +1 h looks to the member
like a VM resumed after an hour, -1 h like a monotonic clock going back. A wall-only step
cannot reach the stamp at all: it reads no wall clock (tests/test_stamp_clock.py).
"""

from __future__ import annotations

import os
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core.names import ErrorReason
from coordinator.raft.limits import STAMP_ADVANCE_MS_MAX
from testsupport.grpc_cluster import RPC_TIMEOUT_S, GrpcCluster
from testsupport.supervisor import child_env, wait_until

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
HELD_TTL_MS = 60_000  # the finding's lease: it must stay held for the whole observation
SHORT_TTL_MS = 3_000  # a lease the test waits out after the step
OBSERVE_S = 5.0  # B keeps trying this long after the step (the finding took 1.7 s)
# After a step the members may elect a new leader (the stepped one sees an hour without
# answers, or none of its heartbeats are due for an hour); an election here takes ~1 s.
SETTLE_S = 20.0


class SteppableCluster(GrpcCluster):
    """Each member under libfaketime, its clock offset in ``nodeN.faketime``."""

    def __init__(self, base_dir: str, **kwargs) -> None:
        super().__init__(base_dir, **kwargs)
        for node in self.nodes:
            self.step(node.index, "+0")

    def offset_path(self, i: int) -> str:
        return os.path.join(self.base_dir, f"node{i}.faketime")

    def step(self, i: int, offset: str) -> None:
        """Member ``i``'s clocks (wall and monotonic) read ``offset`` seconds from real time."""
        tmp = self.offset_path(i) + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(offset + "\n")
        os.replace(tmp, self.offset_path(i))  # a member never reads half a file

    def env(self, node) -> dict:
        return child_env({
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": self.offset_path(node.index),
            "FAKETIME_NO_CACHE": "1",  # re-read the offset at every call: a step takes effect at once
        })


@pytest.fixture
def cluster(tmp_path, request):
    if not os.path.exists(LIBFAKETIME):
        pytest.fail(f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run does)")
    with SteppableCluster(str(tmp_path)) as cluster:
        try:
            cluster.start_all()
            yield cluster
        finally:
            if request.session.testsfailed:
                print(cluster.logs())


def try_acquire(node, resource: str, holder: str, ttl_ms: int) -> str:
    """One raw Acquire through ``node``: "acquired", "held", or why there was no answer."""
    request = pb.AcquireRequest(resource=resource, holder=holder, ttl_ms=ttl_ms, op_id=os.urandom(16))
    try:
        node.lease.Acquire(request, timeout=RPC_TIMEOUT_S)
        return "acquired"
    except grpc.RpcError as err:
        status = rpc_status.from_call(err)
        info = error_details_pb2.ErrorInfo()
        if status is not None and status.details and status.details[0].Unpack(info):
            if info.reason == ErrorReason.LEASE_HELD:
                return "held"
            return info.reason
        return err.code().name


def acquire_as_a(cluster, resource: str, ttl_ms: int) -> pb.AcquireResponse:
    def through_leader():
        leader = cluster.nodes[cluster.leader_index()]
        try:
            request = pb.AcquireRequest(resource=resource, holder="a", ttl_ms=ttl_ms, op_id=os.urandom(16))
            return (leader.lease.Acquire(request, timeout=RPC_TIMEOUT_S),)
        except grpc.RpcError:
            return None  # an election under way: ask again

    return wait_until(through_leader, SETTLE_S, interval_s=0.1, what=f"A's acquire of {resource}")[0]


@pytest.mark.parametrize("offset", ["+3600", "-3600"])
def test_a_step_of_the_leaders_clock_neither_hands_over_nor_stretches_a_lease(cluster, offset):
    leader = cluster.wait_ready()
    held = acquire_as_a(cluster, "held", HELD_TTL_MS)
    acquired_at = time.monotonic()
    cluster.step(leader, offset)
    stepped_at = time.monotonic()

    # B asks through every member in turn (the stepped one too, leading or not) for
    # OBSERVE_S: every answer must be LEASE_HELD while A's 60 s have time left.
    answers: list[tuple[int, str]] = []

    def observed_long_enough():
        node = cluster.nodes[len(answers) % len(cluster.nodes)]
        answers.append((node.index, try_acquire(node, "held", "b", HELD_TTL_MS)))
        return time.monotonic() - stepped_at >= OBSERVE_S

    wait_until(observed_long_enough, OBSERVE_S + SETTLE_S, interval_s=0.1, what="B's attempts")
    assert time.monotonic() - acquired_at < HELD_TTL_MS / 1000, "too slow to judge: A's lease ran out"
    outcomes = [outcome for _, outcome in answers]
    assert "acquired" not in outcomes, answers
    assert outcomes.count("held") >= 5, answers
    assert any(index == leader and outcome == "held" for index, outcome in answers), answers
    describe = cluster.nodes[cluster.wait_ready()].lease.Describe(
        pb.DescribeRequest(resource="held"), timeout=RPC_TIMEOUT_S
    )
    assert (describe.holder, describe.token) == ("a", held.token)

    # A lease taken after the step lasts its TTL: B gets it once it ends, not before
    # (shortened) and not an hour later (stretched: a clock that went back stamping).
    acquire_as_a(cluster, "short", SHORT_TTL_MS)
    short_at = time.monotonic()
    tries: list[tuple[int, str]] = []

    def b_acquired():
        node = cluster.nodes[len(tries) % len(cluster.nodes)]
        tries.append((node.index, try_acquire(node, "short", "b", SHORT_TTL_MS)))
        return tries[-1][1] == "acquired"

    wait_until(b_acquired, SHORT_TTL_MS / 1000 + SETTLE_S, interval_s=0.1, what="B's acquire of short")
    waited_s = time.monotonic() - short_at
    # Not shortened: the jump counted once (at most the bound) before this lease began.
    assert waited_s >= SHORT_TTL_MS / 1000, (waited_s, tries)
    # Not stretched beyond the clock's lag (one TICK interval) and an election's worth.
    assert waited_s <= SHORT_TTL_MS / 1000 + STAMP_ADVANCE_MS_MAX / 1000 + 5.0, (waited_s, tries)
