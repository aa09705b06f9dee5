"""Sessions (issue 29 point 5): ``client.session(ttl)`` keeps many leases alive on one thread.

The schedule (``session_step``) is walked with a manual clock; the rest runs against
``testsupport.inmemory.InMemoryCluster`` (the real servicers over in-memory Raft). The same on
real processes with 1,000 leases: tests/test_session_cluster.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from coordinator.client import AsyncFencingClient, AsyncSession, FencingClient, Session, SessionLease
from coordinator.client import exceptions as E
from coordinator.client._lease import RENEW_FRACTION
from coordinator.client._session import SessionAction, SessionStep, session_step
from testsupport.inmemory import InMemoryCluster
from testsupport.inmemory_faults import stall
from testsupport.supervisor import wait_until

FAST = dict(timeout_s=3.0, attempt_timeout_s=0.5, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
TTL_MS = 1500
INTERVAL_S = TTL_MS / 1000 / RENEW_FRACTION


# ---------------------------------------------------------------- the schedule, pure


def test_an_empty_session_sleeps_an_interval():
    assert session_step(now=10.0, renewed_at=[], ttl_ms=TTL_MS) == SessionStep(SessionAction.SLEEP, INTERVAL_S)


def test_the_round_waits_for_the_oldest_lease_to_be_due():
    step = session_step(now=10.0, renewed_at=[9.9, 9.95], ttl_ms=TTL_MS)
    assert step.action is SessionAction.SLEEP
    assert step.seconds == pytest.approx(9.9 + INTERVAL_S - 10.0)


def test_a_round_renews_the_leases_due_within_half_an_interval_with_the_oldest_ones_deadline():
    now = 10.0
    renewed_at = [now - INTERVAL_S, now - INTERVAL_S * 0.6, now - INTERVAL_S * 0.4, now]
    step = session_step(now=now, renewed_at=renewed_at, ttl_ms=TTL_MS)
    assert step.action is SessionAction.RENEW
    assert step.due == (0, 1)  # due now, and due within half an interval; not the fresh ones
    assert step.seconds == pytest.approx(now - INTERVAL_S + TTL_MS / 1000 - now)


def test_after_a_failed_round_the_next_waits_for_retry_at():
    step = session_step(now=10.0, renewed_at=[10.0 - INTERVAL_S], ttl_ms=TTL_MS, retry_at=10.2)
    assert step == SessionStep(SessionAction.SLEEP, pytest.approx(0.2))


def test_the_session_is_lost_once_its_oldest_lease_may_have_expired():
    assert session_step(now=10.0, renewed_at=[10.0 - TTL_MS / 1000, 9.99], ttl_ms=TTL_MS).action is SessionAction.LOST


# ---------------------------------------------------------------- against the in-memory cluster


@pytest.fixture
def cluster():
    with InMemoryCluster() as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with FencingClient(cluster.endpoints, **FAST) as c:
        yield c


def _keepalive_threads() -> list[str]:
    """The client's renewal threads (the in-memory servers' own threads share this process)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("fencing-session-", "fencing-keepalive-"))]


def _held(client: FencingClient, lease: SessionLease) -> bool:
    d = client.describe(lease.resource)
    return d.held and d.token == lease.token


def test_many_leases_stay_alive_past_several_ttls_on_one_thread_over_keep_alive_many(cluster, client):
    with client.session(ttl_ms=TTL_MS) as session:
        leases = [session.acquire(f"s/{n}") for n in range(50)]
        assert len(_keepalive_threads()) == 1  # the session's one thread
        end = time.monotonic() + 3 * TTL_MS / 1000
        while time.monotonic() < end:
            assert not session.done.is_set() and not any(lease.lost.is_set() for lease in leases)
            time.sleep(0.05)
        assert all(_held(client, lease) for lease in leases)
        assert len(_keepalive_threads()) == 1
        assert cluster.calls_to("KeepAliveMany") and not cluster.calls_to("KeepAlive")
        assert max(len(c.request.leases) for c in cluster.calls_to("KeepAliveMany")) == 50
        assert session.rounds >= 3 and session.renewal_lags_s()
    # Closing sent them all to ReleaseMany (the in-memory node cannot run a batch of proposals:
    # that they are released is checked on real processes) and ended the thread.
    assert [len(c.request.releases) for c in cluster.calls_to("ReleaseMany")] == [50]  # under 64 a call
    assert _keepalive_threads() == []


def test_a_force_released_lease_is_lost_alone_and_the_session_goes_on(cluster, client):
    lost: list[E.LeaseLost] = []
    with client.session(ttl_ms=TTL_MS) as session:
        fenced = session.acquire("f/0", on_lost=lost.append)
        kept = session.acquire("f/1")
        client.force_release("f/0")
        assert wait_until(fenced.lost.is_set, 3 * TTL_MS / 1000)
        assert isinstance(fenced.lost_error.cause, E.StaleToken) and lost == [fenced.lost_error]
        assert fenced not in session.leases and len(session) == 1
        time.sleep(TTL_MS / 1000)  # past a TTL more: the other lease is renewed still
        assert not session.done.is_set() and not kept.lost.is_set() and _held(client, kept)


def test_renewals_failing_past_the_ttl_lose_the_session_and_every_lease_in_it(cluster, client):
    session_lost: list[E.LeaseLost] = []
    lease_lost: list[E.LeaseLost] = []
    session = client.session(ttl_ms=TTL_MS, on_lost=session_lost.append)
    leases = [session.acquire(f"x/{n}", on_lost=lease_lost.append) for n in range(5)]
    cluster.inject("KeepAliveMany", *[stall(TTL_MS / 1000)] * 20)  # the cluster cannot be reached in time
    assert session.done.wait(3 * TTL_MS / 1000)
    assert wait_until(lambda: session_lost, 5.0) == [session.lost_error]  # on_lost runs right after done
    assert "session" in str(session.lost_error)
    assert all(lease.lost.is_set() and lease.lost_error.cause is session.lost_error for lease in leases)
    assert len(lease_lost) == 5 and len(session) == 0
    with pytest.raises(E.LeaseLost):
        session.acquire("x/late")
    assert not client.describe("x/late").held
    session.close()


def test_a_lease_released_alone_leaves_the_session(cluster, client):
    with client.session(ttl_ms=TTL_MS) as session:
        one, two = session.acquire("r/1"), session.acquire("r/2")
        assert one.release().released
        assert session.leases == [two]
        time.sleep(TTL_MS / 1000)  # a round or more: nothing renews the released lease
        assert not session.done.is_set() and _held(client, two)


def test_a_lock_taken_in_a_session_is_renewed_and_its_release_sent_on_close(cluster, client):
    with client.session(ttl="1.5s") as session:
        assert session.ttl_ms == 1500
        lease = session.lock("l/1", timeout_s=2)
        time.sleep(2 * TTL_MS / 1000)
        assert _held(client, lease) and not lease.lost.is_set()
    assert [r.resource for c in cluster.calls_to("ReleaseMany") for r in c.request.releases] == ["l/1"]


def test_the_ttl_is_checked_before_anything_is_sent(cluster, client):
    with pytest.raises(ValueError):
        client.session()
    with pytest.raises(ValueError):
        client.session(1000, ttl=1.0)
    with pytest.raises(ValueError):
        client.session(ttl="ten seconds")
    with pytest.raises(E.InvalidArgument):
        client.session(ttl_ms=0)
    assert isinstance(client.session(ttl=2), Session)


def test_closing_the_client_stops_its_sessions_threads(cluster):
    c = FencingClient(cluster.endpoints, **FAST)
    session = c.session(ttl_ms=TTL_MS)
    session.acquire("c/1")
    assert len(_keepalive_threads()) == 1
    c.close()
    assert _keepalive_threads() == []
    with pytest.raises(RuntimeError):
        session.acquire("c/2")


# ---------------------------------------------------------------- AsyncSession


def _keepalive_tasks() -> int:
    """Renewal tasks of the running loop (sessions' and lone leases'), whatever else gRPC runs."""
    names = ("AsyncSession._run", "AsyncLease._keepalive_loop")
    return sum(1 for task in asyncio.all_tasks() if task.get_coro().__qualname__ in names)


def test_an_async_session_renews_many_leases_in_one_task_and_loses_a_fenced_one_alone(cluster):
    async def main():
        async with AsyncFencingClient(cluster.endpoints, **FAST) as client:
            async with client.session(ttl_ms=TTL_MS) as session:
                assert isinstance(session, AsyncSession)
                leases = [await session.acquire(f"a/{n}") for n in range(30)]
                locked = await session.lock("a/lock", timeout_s=2)
                assert _keepalive_tasks() == 1  # the session's one task
                await asyncio.sleep(3 * TTL_MS / 1000)
                assert not session.done.is_set() and not any(lease.lost.is_set() for lease in leases)
                assert _keepalive_tasks() == 1 and session.renewals >= 2 * 31
                held = [(await client.describe(lease.resource)).token == lease.token for lease in leases]
                assert all(held) and (await client.describe("a/lock")).held
                await client.force_release("a/0")
                await asyncio.wait_for(leases[0].lost.wait(), 3 * TTL_MS / 1000)
                assert isinstance(leases[0].lost_error.cause, E.StaleToken)
                assert len(session) == 30 and not session.done.is_set() and not locked.lost.is_set()
                assert await leases[1].release() is not None and len(session) == 29
            assert [len(c.request.releases) for c in cluster.calls_to("ReleaseMany")] == [29]
            assert _keepalive_tasks() == 0
            assert cluster.calls_to("KeepAliveMany") and not cluster.calls_to("KeepAlive")

    asyncio.run(main())


def test_an_async_session_that_cannot_renew_is_lost_with_its_leases(cluster):
    async def main():
        async with AsyncFencingClient(cluster.endpoints, **FAST) as client:
            lost: list[E.LeaseLost] = []

            async def on_lost(error):
                lost.append(error)

            session = client.session(ttl="1.5s", on_lost=on_lost)
            leases = [await session.acquire(f"ax/{n}") for n in range(5)]
            cluster.inject("KeepAliveMany", *[stall(TTL_MS / 1000)] * 20)
            await asyncio.wait_for(session.done.wait(), 3 * TTL_MS / 1000)
            assert all(lease.lost.is_set() and lease.lost_error.cause is session.lost_error for lease in leases)
            for _ in range(50):
                if lost:
                    break
                await asyncio.sleep(0.02)
            assert lost == [session.lost_error]
            with pytest.raises(E.LeaseLost):
                await session.acquire("ax/late")
            await session.close()

    asyncio.run(main())
