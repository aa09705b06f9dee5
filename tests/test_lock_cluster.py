"""The lock queue on a real three-process cluster: FIFO grants, fencing of each holder, the
election recipe, Acquire with ``wait_ms`` waiting in the same queue (O(1) entries per wait,
arrival order), and a cancelled call's wait ending at once. ``fencingctl lock`` running a
command, and lock waits against a dead cluster, are tests/test_lock_command.py.

Every test here runs real ``fencingd serve`` processes (testsupport.grpc_cluster) and waits by
polling with a deadline (``wait_until``), never by sleeping.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import AsyncFencingClient, FencingClient
from coordinator.client.election import Election
from coordinator.client.exceptions import LeaseHeld, LockTimeout, StaleToken
from coordinator.server.config import ServerConfig
from testsupport.grpc_cluster import RPC_TIMEOUT_S, TEST_SETTINGS
from testsupport.supervisor import wait_until

# A grant travels one RELEASE entry and one server-side wake-up: a second is generous.
GRANT_WAIT_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path_factory.mktemp("lock-cluster")), request)


def _endpoints(cluster) -> list[str]:
    return [n.api_address for n in cluster.nodes]


def _waiters(client: FencingClient, resource: str) -> int:
    return client.describe(resource).waiters


def test_three_clients_are_granted_in_arrival_order_and_each_holder_is_fenced(cluster):
    resource = "lock/fifo"
    eps = _endpoints(cluster)
    admin = FencingClient(eps)
    first = admin.lock(resource, ttl_ms=30_000, holder="first")
    granted: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        with FencingClient(eps) as client:
            try:
                lease = client.lock(resource, ttl_ms=30_000, holder=name, timeout_s=60)
                lease.write("owner", name.encode())  # accepted: this holder's token is current
                granted.append((name, lease.token))
                lease.release()  # the next in line is granted in this same entry
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

    threads = []
    for i, name in enumerate(["w1", "w2", "w3"]):
        thread = threading.Thread(target=worker, args=(name,))
        thread.start()
        threads.append(thread)
        # Arrival order is made certain: the next worker starts once this one is queued.
        wait_until(lambda i=i: _waiters(admin, resource) == i + 1, timeout_s=GRANT_WAIT_S, what=f"{name} queued")
    first.release()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert [name for name, _ in granted] == ["w1", "w2", "w3"]
    tokens = [token for _, token in granted]
    assert tokens == sorted(tokens) and tokens[0] > first.token
    # Each holder but the last is fenced by the next grant: its token is stale now.
    for stale in [first.token, *tokens[:-1]]:
        with pytest.raises(StaleToken):
            admin.write(resource, "owner", b"late", token=stale)
    assert admin.read(resource, "owner").value == b"w3"
    admin.close()


def test_election_campaign_observe_resign(cluster):
    eps = _endpoints(cluster)
    resource = "election/scheduler"
    with FencingClient(eps) as a, FencingClient(eps) as b, FencingClient(eps) as watcher:
        alice, bob = Election(a, resource, ttl_ms=5000), Election(b, resource, ttl_ms=5000)
        lead = alice.campaign("alice")
        seen: list[str | None] = []
        stop = threading.Event()
        observer = threading.Thread(
            target=lambda: seen.extend(Election(watcher, resource, ttl_ms=5000).observe(interval_s=0.1, stop=stop)),
            daemon=True,
        )
        observer.start()
        bob_lead: list = []
        campaigner = threading.Thread(target=lambda: bob_lead.append(bob.campaign("bob", timeout_s=60)))
        campaigner.start()
        wait_until(lambda: _waiters(watcher, resource) == 1, timeout_s=GRANT_WAIT_S, what="bob in line")
        assert alice.leader() == "alice"
        alice.resign()
        campaigner.join(timeout=60)
        assert bob_lead and bob_lead[0].token > lead.token
        wait_until(lambda: seen[-1:] == ["bob"], timeout_s=GRANT_WAIT_S, what="the observer to see bob")
        stop.set()
        observer.join(timeout=10)
        assert seen == ["alice", "bob"]
        with pytest.raises(StaleToken):  # the old leader's term is over at every fenced resource
            a.write(resource, "plan", b"alice's", token=lead.token)
        bob.resign()
        assert bob.leader() is None


# -- Acquire with wait_ms: one queue with Lock ------------------------------------------------

# Far past every check below: only a release, a cancel or the test's own bound ends such a wait.
LONG_WAIT_MS = 20_000
# The leader TICKs at most once per lease_tick_interval_s (1 s by default, and TEST_SETTINGS
# leaves it): the only entries besides the Acquire's own while it waits.
TICK_INTERVAL_S = TEST_SETTINGS.get("lease_tick_interval_s", ServerConfig.lease_tick_interval_s)


def _applied(cluster) -> int:
    return cluster.nodes[0].status(timeout_s=RPC_TIMEOUT_S).applied_index


def test_a_waiting_acquire_adds_o1_entries_not_one_per_poll_and_leaves_the_queue(cluster):
    """The finding: a waiting Acquire proposed one ACQUIRE every <= 100 ms (about 20 over a
    2 s wait). Now it is ACQUIRE, ENQUEUE, then nothing until its wait ends, then DEQUEUE and
    one last ACQUIRE: 4 entries whatever the wait, plus the leader's TICKs meanwhile."""
    resource = "lock/acquire-o1"
    eps = _endpoints(cluster)
    wait_ms = 2_000
    with FencingClient(eps) as holder, FencingClient([eps[1]]) as waiter:
        held = holder.acquire(resource, ttl_ms=60_000, holder="holder")
        before = _applied(cluster)
        started = time.monotonic()
        with pytest.raises(LeaseHeld) as refused:
            waiter.acquire(resource, ttl_ms=5_000, holder="waiter", wait_ms=wait_ms)
        took_s = time.monotonic() - started
        grown = _applied(cluster) - before
        assert took_s >= wait_ms / 1000 * 0.9, f"answered after {took_s:.2f} s: it did not wait"
        assert (refused.value.holder, refused.value.token) == ("holder", held.token)  # the contract as before
        ticks = math.ceil(took_s / TICK_INTERVAL_S) + 1
        # +1: the Status read that measures the index afterwards is a barrier entry.
        assert grown <= 4 + ticks + 1, f"{grown} entries over a {took_s:.2f} s wait ({ticks} TICKs at most)"
        assert _waiters(holder, resource) == 0  # it left the line
        holder.release(resource, held.token)


def test_waiting_acquires_on_different_members_are_granted_in_arrival_order(cluster):
    resource = "lock/acquire-fifo"
    eps = _endpoints(cluster)
    granted: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def wait_then_pass_on(name: str, endpoint: str) -> None:
        # Each on its own member: the queue is replicated state, not a member's threads.
        with FencingClient([endpoint]) as client:
            try:
                got = client.acquire(resource, ttl_ms=30_000, holder=name, wait_ms=LONG_WAIT_MS)
                granted.append((name, got.token))
                client.release(resource, got.token)  # the next in line is granted in this entry
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

    with FencingClient(eps) as admin:
        first = admin.acquire(resource, ttl_ms=60_000, holder="first")
        threads = []
        for i, (name, endpoint) in enumerate(zip(["a1", "a2", "a3"], eps, strict=True)):
            thread = threading.Thread(target=wait_then_pass_on, args=(name, endpoint))
            thread.start()
            threads.append(thread)
            # Arrival order made certain: the next Acquire starts once this one is queued.
            wait_until(lambda i=i: _waiters(admin, resource) == i + 1, timeout_s=GRANT_WAIT_S, what=f"{name} queued")
        admin.release(resource, first.token)
        for thread in threads:
            thread.join(timeout=LONG_WAIT_MS / 1000 + 10)
        assert not errors, errors
        assert [name for name, _ in granted] == ["a1", "a2", "a3"]
        tokens = [token for _, token in granted]
        assert tokens == sorted(tokens) and tokens[0] > first.token


def _cancel_when_queued(admin: FencingClient, resource: str, future: grpc.Future) -> None:
    wait_until(lambda: _waiters(admin, resource) == 1, timeout_s=GRANT_WAIT_S, what="the call to queue")
    assert future.cancel()


def test_a_cancelled_waiting_acquire_leaves_the_queue_at_once(cluster):
    """The call's end wakes its server-side wait (before, a waiter stayed until its wait_ms ran
    out): the member DEQUEUEs it within moments of the cancel, not after 20 s."""
    resource = "lock/acquire-cancel"
    node = cluster.nodes[2]
    with FencingClient(_endpoints(cluster)) as admin:
        held = admin.acquire(resource, ttl_ms=60_000, holder="holder")
        future = node.lease.Acquire.future(
            pb.AcquireRequest(resource=resource, holder="gives-up", ttl_ms=5_000, op_id=os.urandom(16),
                              wait_ms=LONG_WAIT_MS),
            timeout=LONG_WAIT_MS / 1000 + 5,
        )
        _cancel_when_queued(admin, resource, future)
        cancelled_at = time.monotonic()
        wait_until(lambda: _waiters(admin, resource) == 0, timeout_s=LONG_WAIT_MS / 1000 / 4,
                   what="the cancelled Acquire to leave the queue")
        assert time.monotonic() - cancelled_at < LONG_WAIT_MS / 1000 / 4
        # Nothing was granted behind the holder's back either.
        assert admin.describe(resource).token == held.token
        admin.release(resource, held.token)


def test_a_cancelled_lock_call_gives_its_waiter_slot_back_at_once(cluster):
    """A Lock call waits up to LOCK_WAIT_MS_MAX (5 s) holding one of the member's waiter slots
    (two per client host by default). Cancelled calls used to keep theirs for the rest of the
    5 s, so a new call from the same host found none and was answered at once; now the call's
    end wakes the wait and the next call can wait at once."""
    resource = "lock/lock-cancel"
    node = cluster.nodes[1]
    per_host = 2  # acquire_waiters_per_principal_max's default: this test process is one host
    probe_wait_ms = 3_000
    with FencingClient(_endpoints(cluster)) as admin:
        held = admin.lock(resource, ttl_ms=60_000, holder="holder")
        ids = [os.urandom(16) for _ in range(per_host + 1)]

        def lock_call(waiter_id: bytes, wait_ms: int):
            return pb.LockRequest(resource=resource, holder="w", ttl_ms=5_000, waiter_id=waiter_id, wait_ms=wait_ms)

        def answered_at_once() -> bool:
            sent = time.monotonic()
            node.lease.Lock(lock_call(ids[-1], 1_000), timeout=10)
            return time.monotonic() - sent < 0.5

        calls = []
        for i, waiter_id in enumerate(ids[:per_host]):
            calls.append(node.lease.Lock.future(lock_call(waiter_id, 5_000), timeout=10))
            wait_until(lambda i=i: _waiters(admin, resource) == i + 1, timeout_s=GRANT_WAIT_S, what="the call to queue")
        # Queued is not yet waiting (the member takes its slot after the ENQUEUE applies there):
        # once a probe finds no slot, both calls hold theirs.
        wait_until(answered_at_once, timeout_s=GRANT_WAIT_S, what="both calls to hold the host's waiter slots")
        for call in calls:
            assert call.cancel()
        cancelled_at = time.monotonic()
        # The probe waits its full wait_ms if it got a slot, else it is answered at once; it is
        # repeated (the same waiter, renewed) until it waits or the old 5 s would not be over.
        waited_s = 0.0
        while time.monotonic() - cancelled_at < 2.0:
            sent = time.monotonic()
            probe = node.lease.Lock(lock_call(ids[-1], probe_wait_ms), timeout=10)
            assert probe.queued and not probe.granted
            waited_s = time.monotonic() - sent
            if waited_s >= probe_wait_ms / 1000 * 0.9:
                break
        assert waited_s >= probe_wait_ms / 1000 * 0.9, "the cancelled calls still held every waiter slot"
        for waiter_id in ids:
            admin.cancel_lock(resource, waiter_id)
        held.release()


# -- AsyncFencingClient.lock ---------------------------------------------------------------


async def _eventually(check, timeout_s: float, what: str):
    """Await ``check()`` until it is truthy (``wait_until`` for coroutines, no sleeping
    thread): its value, or TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


async def _queued(client: AsyncFencingClient, resource: str) -> int:
    return (await client.describe(resource)).waiters


def test_async_lock_is_granted_in_line_and_a_timeout_or_cancel_leaves_the_queue(cluster):
    resource = "lock/aio"
    eps = _endpoints(cluster)

    async def scenario() -> None:
        async with AsyncFencingClient(eps) as a, AsyncFencingClient(eps) as b:
            first = await a.lock(resource, ttl_ms=30_000, holder="first")
            # A timeout: LockTimeout, and the waiter is out of the line before lock() returns.
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                await b.lock(resource, ttl_ms=30_000, holder="gives-up", timeout_s=1.0)
            assert time.monotonic() - started >= 1.0
            assert await _queued(a, resource) == 0
            # A cancelled task: CancelledError as ever, and out of the line all the same.
            cancelled = asyncio.ensure_future(b.lock(resource, ttl_ms=30_000, holder="cancelled", timeout_s=60))
            await _eventually(lambda: _queued(a, resource), GRANT_WAIT_S, "the waiter in line")
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            assert await _queued(a, resource) == 0
            # In line: granted by the release, with the next token, and the old one fenced.
            second = asyncio.ensure_future(b.lock(resource, ttl_ms=30_000, holder="second", timeout_s=60))
            await _eventually(lambda: _queued(a, resource), GRANT_WAIT_S, "second in line")
            assert not second.done()
            await first.release()
            lease = await asyncio.wait_for(second, GRANT_WAIT_S)
            assert lease.holder == "second" and lease.token > first.token
            with pytest.raises(StaleToken):
                await a.write(resource, "k", b"late", token=first.token)
            await lease.write("k", b"second's")
            await lease.release()

    asyncio.run(scenario())


def test_async_lock_waiting_when_its_client_closes_raises_and_leaves_the_queue(cluster):
    resource = "lock/aio-close"
    eps = _endpoints(cluster)

    async def scenario() -> None:
        async with AsyncFencingClient(eps) as a:
            held = await a.lock(resource, ttl_ms=30_000, holder="held")
            b = AsyncFencingClient(eps)
            waiting = asyncio.ensure_future(b.lock(resource, ttl_ms=30_000, holder="closed", timeout_s=60))
            await _eventually(lambda: _queued(a, resource), GRANT_WAIT_S, "the waiter in line")
            await b.close()
            with pytest.raises(RuntimeError, match="closed"):
                await asyncio.wait_for(waiting, GRANT_WAIT_S)
            # Out of the line now, not when its slot expires (LOCK_WAITER_TTL_MS, 30 s) ...
            assert await _queued(a, resource) == 0
            # ... so a release leaves the resource free instead of granting a closed client.
            await held.release()
            assert not (await a.describe(resource)).held

    asyncio.run(scenario())
