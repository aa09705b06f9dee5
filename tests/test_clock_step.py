"""A step of one member's clock, on three real ``fencingd serve`` processes (DESIGN I6).

Issue "Deeper chaos", point 1: A holds R with a 60 s TTL, the leader's clock jumps +1 h, and
B's Acquire of R succeeded 1.7 s later: stamps took ``max(last + 1, wall_ms, log clock)``, so
one member's clock moved the log clock for everyone. Now only the leader stamps, by its
monotonic time and at most STAMP_ADVANCE_MS_MAX per stamp (coordinator/raft/stamp_clock.py).

Every member runs under libfaketime (Debian's ``faketime`` package; ``.ci/run`` installs it)
with a wall-clock offset file of its own, re-read at every clock call, so the test steps one
member's wall clock while it runs. libfaketime cannot also jump a Python member's monotonic
clock here: faked, every timed wait in the process hangs; so it keeps monotonic real
(FAKETIME_DONT_FAKE_MONOTONIC) and ``testsupport/clock_step/sitecustomize.py`` adds the
monotonic jump (and works around libfaketime breaking ``time.sleep`` in that mode).
Cases: the leader's wall clock +1 h and -1 h (a wall step: moves no lease), and the
leader's wall and monotonic clocks +1 h together (a VM resumed after an hour: shortens a
lease by at most STAMP_ADVANCE_MS_MAX).
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


CLOCK_STEP_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "testsupport", "clock_step")


class SteppableCluster(GrpcCluster):
    """Each member under libfaketime; its offsets in ``nodeN.wall`` and ``nodeN.monotonic``."""

    def __init__(self, base_dir: str, **kwargs) -> None:
        super().__init__(base_dir, **kwargs)
        for node in self.nodes:
            self.step(node.index, wall="+0", monotonic="0")

    def offset_path(self, i: int, clock: str) -> str:
        return os.path.join(self.base_dir, f"node{i}.{clock}")

    def step(self, i: int, *, wall: str | None = None, monotonic: str | None = None) -> None:
        """Member ``i``'s wall clock reads ``wall`` seconds off real time ("+3600"); its
        monotonic clock is ``monotonic`` seconds ahead ("3600")."""
        for clock, offset in (("wall", wall), ("monotonic", monotonic)):
            if offset is None:
                continue
            path = self.offset_path(i, clock)
            with open(path + ".tmp", "w", encoding="ascii") as f:
                f.write(offset + "\n")
            os.replace(path + ".tmp", path)  # a member never reads half a file

    def env(self, node) -> dict:
        env = child_env({
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": self.offset_path(node.index, "wall"),
            "FAKETIME_NO_CACHE": "1",  # re-read the offset at every call: a step takes effect at once
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FENCING_TEST_MONOTONIC_OFFSET_FILE": self.offset_path(node.index, "monotonic"),
        })
        env["PYTHONPATH"] = CLOCK_STEP_SITE + os.pathsep + env["PYTHONPATH"]
        return env


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


def acquire_as_a(cluster, resource: str, ttl_ms: int) -> tuple[pb.AcquireResponse, float]:
    """A's Acquire through the leader, and when (test monotonic s) its answered attempt began."""
    def through_leader():
        leader = cluster.nodes[cluster.leader_index()]
        request = pb.AcquireRequest(resource=resource, holder="a", ttl_ms=ttl_ms, op_id=os.urandom(16))
        invoked_at = time.monotonic()
        try:
            return leader.lease.Acquire(request, timeout=RPC_TIMEOUT_S), invoked_at
        except grpc.RpcError:
            return None  # an election under way: ask again

    return wait_until(through_leader, SETTLE_S, interval_s=0.1, what=f"A's acquire of {resource}")


STEPS = {
    "wall+1h": {"wall": "+3600"},
    "wall-1h": {"wall": "-3600"},
    "resumed+1h": {"wall": "+3600", "monotonic": "3600"},
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_step_of_the_leaders_clock_neither_hands_over_nor_stretches_a_lease(cluster, step):
    leader = cluster.wait_ready()
    held, acquired_at = acquire_as_a(cluster, "held", HELD_TTL_MS)
    cluster.step(leader, **STEPS[step])
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
    _, short_at = acquire_as_a(cluster, "short", SHORT_TTL_MS)
    tries: list[tuple[int, str]] = []

    def b_acquired():
        node = cluster.nodes[len(tries) % len(cluster.nodes)]
        tries.append((node.index, try_acquire(node, "short", "b", SHORT_TTL_MS)))
        return tries[-1][1] == "acquired"

    wait_until(b_acquired, SHORT_TTL_MS / 1000 + SETTLE_S, interval_s=0.1, what="B's acquire of short")
    waited_s = time.monotonic() - short_at
    # Not shortened: the jump counted once (at most the bound) before this lease began. (From
    # A's invoke: its lease is stamped after that, B's acquire before B's answer.)
    assert waited_s >= SHORT_TTL_MS / 1000, (waited_s, tries)
    # Not stretched beyond the clock's lag (one TICK interval) and an election's worth.
    assert waited_s <= SHORT_TTL_MS / 1000 + STAMP_ADVANCE_MS_MAX / 1000 + 5.0, (waited_s, tries)
