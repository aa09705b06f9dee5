"""The keep-alive policy of Lease and AsyncLease (``_lease.keepalive_step``), driven with a
manual clock: when a lease is renewed, how long a failing renewal is retried, when it is lost.

The policy is a pure function, so these tests walk it step by step the way both loops do
(sleep -> due -> renew -> outcome) without threads, sockets or real time.
"""

from __future__ import annotations

import pytest

from coordinator.client import exceptions as E
from coordinator.client._lease import (
    RENEW_FRACTION,
    RENEW_RETRY_S,
    KeepAliveAction,
    KeepAliveStep,
    Renewal,
    keepalive_step,
)

TTL_MS = 3000
INTERVAL_S = TTL_MS / 1000 / RENEW_FRACTION


class ManualClock:
    """Monotonic seconds that move only when told, and never backwards."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds


def step(clock: ManualClock, renewed_at: float, last) -> KeepAliveStep:
    return keepalive_step(now=clock.now, renewed_at=renewed_at, ttl_ms=TTL_MS, last=last)


def test_after_a_success_the_next_renewal_is_a_third_of_the_ttl_later():
    clock = ManualClock()
    assert step(clock, clock.now, Renewal.RENEWED) == KeepAliveStep(KeepAliveAction.SLEEP, INTERVAL_S)


def test_a_due_renewal_gets_the_time_left_before_the_lease_may_expire_as_its_deadline():
    clock = ManualClock()
    renewed_at = clock.now
    clock.advance(INTERVAL_S)
    due = step(clock, renewed_at, Renewal.DUE)
    assert due.action is KeepAliveAction.RENEW
    assert due.seconds == pytest.approx(TTL_MS / 1000 - INTERVAL_S)


@pytest.mark.parametrize(
    "error", [E.Unavailable(), E.OutcomeUnknown(), E.Overloaded(), E.NoLeader(), E.ServerError()]
)
def test_a_failure_that_may_leave_the_lease_live_is_retried_soon(error):
    clock = ManualClock()
    retry = step(clock, clock.now, error)
    assert retry == KeepAliveStep(KeepAliveAction.SLEEP, min(INTERVAL_S, RENEW_RETRY_S), cause=error)


def test_the_retry_pause_never_exceeds_the_usual_pace():
    short = keepalive_step(now=0.0, renewed_at=0.0, ttl_ms=300, last=E.Unavailable())
    assert short.seconds == pytest.approx(0.1)  # ttl/3 < RENEW_RETRY_S


@pytest.mark.parametrize(
    "refusal",
    [E.StaleToken(), E.LeaseExpired(), E.UnknownToken(), E.InvalidArgument(), E.PermissionDenied(),
     E.Unauthenticated()],
)
def test_a_definite_refusal_loses_the_lease_at_once(refusal):
    clock = ManualClock()
    lost = step(clock, clock.now, refusal)
    assert lost == KeepAliveStep(KeepAliveAction.LOST, cause=refusal)


def test_renewals_failing_until_the_ttl_has_passed_lose_the_lease_without_a_cause():
    clock = ManualClock()
    renewed_at = clock.now
    last = Renewal.RENEWED
    renewals = 0
    while True:
        decision = step(clock, renewed_at, last)
        if decision.action is KeepAliveAction.SLEEP:
            clock.advance(decision.seconds)
            last = Renewal.DUE
        elif decision.action is KeepAliveAction.RENEW:
            renewals += 1
            clock.advance(decision.seconds / 2)  # each failing attempt uses part of its deadline
            last = E.Unavailable()
        else:
            break
    assert decision == KeepAliveStep(KeepAliveAction.LOST)
    assert clock.now >= renewed_at + TTL_MS / 1000  # never before the lease may have expired
    assert renewals >= 3  # the first after ttl/3, then retries every RENEW_RETRY_S at most


def test_a_success_moves_the_expiry_on():
    clock = ManualClock()
    renewed_at = clock.now
    clock.advance(TTL_MS / 1000 - 0.01)
    assert step(clock, renewed_at, Renewal.DUE).action is KeepAliveAction.RENEW
    renewed_at = clock.now  # that renewal succeeded (sent now)
    clock.advance(INTERVAL_S)
    renew = step(clock, renewed_at, Renewal.DUE)
    assert renew.action is KeepAliveAction.RENEW and renew.seconds == pytest.approx(TTL_MS / 1000 - INTERVAL_S)


@pytest.mark.parametrize("closed", [RuntimeError("the FencingClient is closed"), ValueError("closed channel")])
def test_a_closed_client_stops_the_keep_alive_without_a_verdict(closed):
    clock = ManualClock()
    assert step(clock, clock.now, closed) == KeepAliveStep(KeepAliveAction.STOP, cause=closed)
