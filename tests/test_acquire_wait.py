"""Acquire with ``wait_ms`` in the lock queue, where a real cluster cannot place the moment:
a grant that lands between the end of the wait and its DEQUEUE, and a retry of an Acquire
whose queue grant was answered but lost. The real servicers over the in-memory log
(testsupport.inmemory), with a proposal fault that applies the racing entry first.
"""

from __future__ import annotations

import os

import pytest

from coordinator.client import FencingClient
from coordinator.client.exceptions import LeaseHeld, StaleToken
from coordinator.core import commands
from coordinator.core.state_machine import Op
from testsupport.inmemory import InMemoryCluster
from testsupport.inmemory_faults import ProposeFault

R = "orders/7"
# One attempt per call and short waits: each test is over in well under a second.
FAST = dict(timeout_s=3.0, attempt_timeout_s=2.0, retry_max_attempts=1)


def _through() -> ProposeFault:
    """Applies the proposal as usual (a place-holder for a proposal the test does not touch)."""
    return ProposeFault("through", lambda node, command, timeout_s: node.log.append(command))


def _release_first(token: int) -> ProposeFault:
    """Before the proposal, the holder of ``token`` releases: the head waiter is granted."""

    def decide(node, command, timeout_s):
        assert commands.decode(command).op is Op.DEQUEUE, "the fault meant the DEQUEUE"
        node.log.append(commands.release(resource=R, token=token, stamp_ms=node.next_stamp_ms()).encode())
        return node.log.append(command)

    return ProposeFault("release_first", decide)


def test_a_grant_racing_the_dequeue_is_ended_by_it_and_the_last_try_decides():
    with InMemoryCluster() as cluster, FencingClient(cluster.endpoints, **FAST) as client:
        held = client.acquire(R, ttl_ms=60_000, holder="holder")
        # The waiting Acquire's proposals: ACQUIRE (held), ENQUEUE, then -- its wait over --
        # a DEQUEUE that the holder's RELEASE beats, granting the waiter token 2 unseen.
        cluster.inject("Acquire", _through(), _through(), _release_first(held.token), _through())
        got = client.acquire(R, ttl_ms=5_000, holder="waiter", wait_ms=200)
        # The DEQUEUE released token 2 (never sent to anyone); the last try found the lease
        # free and nobody in line, and issued token 3.
        assert got.token == held.token + 2
        described = client.describe(R)
        assert (described.holder, described.token, described.waiters) == ("waiter", got.token, 0)
        with pytest.raises(StaleToken):
            client.write(R, "k", b"v", token=held.token + 1)


def test_a_wait_that_ends_with_the_lease_still_held_answers_lease_held_and_leaves_the_line():
    with InMemoryCluster() as cluster, FencingClient(cluster.endpoints, **FAST) as client:
        held = client.acquire(R, ttl_ms=60_000, holder="holder")
        before = cluster.log.applied_index
        with pytest.raises(LeaseHeld) as refused:
            client.acquire(R, ttl_ms=5_000, holder="waiter", wait_ms=300)
        # ACQUIRE, ENQUEUE, DEQUEUE, the last ACQUIRE: nothing while it waited (no TICKs here).
        # READ_BARRIERs are not the waiter's: the client's first call asked every member for
        # Cluster.Status at once and went on with the first leader named, so the other
        # members' Status barriers may still land in this window (once 5 entries for 4).
        waiter_ops = [op for op in cluster.log.ops[before:] if op is not Op.READ_BARRIER]
        assert waiter_ops == [Op.ACQUIRE, Op.ENQUEUE, Op.DEQUEUE, Op.ACQUIRE]
        assert (refused.value.holder, refused.value.token) == ("holder", held.token)
        assert client.describe(R).waiters == 0


def test_a_retry_of_an_acquire_granted_through_the_queue_gets_that_grant():
    with InMemoryCluster() as cluster, FencingClient(cluster.endpoints, **FAST) as client:
        held = client.acquire(R, ttl_ms=60_000, holder="holder")
        op_id = os.urandom(16)
        # The first attempt queued under its op_id and was granted by the release, but its
        # answer never arrived (here: the queue entry is made directly, as that attempt did).
        client._execute(client._lock_call(R, ttl_ms=5_000, holder="waiter", waiter_id=op_id, wait_ms=0))
        client.release(R, held.token)
        granted = client.describe(R)
        assert granted.holder == "waiter"
        # The retry (same op_id, no wait) finds that grant instead of LEASE_HELD by itself.
        again = client.acquire(R, ttl_ms=5_000, holder="waiter", op_id=op_id)
        assert again.token == granted.token
