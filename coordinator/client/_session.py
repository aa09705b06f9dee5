"""The renewal policy of a session, shared by ``Session`` and ``AsyncSession``: pure decisions.

Owns: ``session_step`` (when the next round goes and which leases it renews), ``item_verdict``
and ``call_verdict`` (what a renewal's answer or failure means for a lease and for the
session), ``session_lost`` (the session's LeaseLost), and the session's limits.
Must never: block, sleep, read a clock of its own or do I/O (the thread or task that runs the
session does, and passes in its readings). Its upper-case constants are limits, each a row of
SECURITY.md's table (tests/test_security_doc.py).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Sequence

from coordinator.client import _lease
from coordinator.client.durations import parse_s
from coordinator.client.exceptions import AuthError, FencingError, InvalidArgument, LeaseExpired, LeaseLost, Refused
from coordinator.client.results import KeepAliveItem
from coordinator.core import limits

# Leases renewed per KeepAliveMany call: the server's own items limit (more go in further calls).
RENEW_BATCH_ITEMS = limits.KEEP_ALIVE_BATCH_ITEMS_MAX
# Leases released per ReleaseMany call when a session closes: the server's items limit.
RELEASE_BATCH_ITEMS = limits.RELEASE_MANY_ITEMS_MAX
# Renewal lag samples (seconds, one per lease renewed) a session keeps for ``renewal_lags_s``:
# the latest 10,000 (80 KB of floats), enough for percentiles over ten rounds of 1,000 leases.
RENEWAL_LAG_SAMPLES_MAX = 10_000


class SessionAction(enum.Enum):
    SLEEP = "sleep"  # wait ``seconds``, then step again
    RENEW = "renew"  # renew the leases ``due`` (indexes), each call's deadline ``seconds``
    LOST = "lost"  # the oldest lease may have expired: the session is lost


@dataclasses.dataclass(frozen=True)
class SessionStep:
    action: SessionAction
    seconds: float = 0.0
    due: tuple[int, ...] = ()


def interval_s(ttl_ms: int) -> float:
    """A lease is due this long after its latest renewal: two rounds may fail before it expires."""
    return ttl_ms / 1000 / _lease.RENEW_FRACTION


def session_step(*, now: float, renewed_at: Sequence[float], ttl_ms: int, retry_at: float = 0.0) -> SessionStep:
    """The session's renewal schedule, as one pure decision.

    ``renewed_at``: per lease, the send time of its latest successful renewal (the acquire
    included), on the clock of ``now``. ``retry_at``: after a round that failed, no new round
    before it. A lease is due ttl/RENEW_FRACTION after its renewal; a round renews every lease
    due within half an interval from now; the deadline is the time left before the oldest of
    them may expire. Lost once the oldest lease's ``renewed_at + ttl`` has passed.
    """
    every_s = interval_s(ttl_ms)
    if not renewed_at:
        return SessionStep(SessionAction.SLEEP, every_s)
    oldest = min(renewed_at)
    if oldest + ttl_ms / 1000 <= now:
        return SessionStep(SessionAction.LOST)
    start = max(oldest + every_s, retry_at)
    if now < start:
        return SessionStep(SessionAction.SLEEP, start - now)
    due = tuple(n for n, at in enumerate(renewed_at) if at + every_s <= now + every_s / 2)
    return SessionStep(SessionAction.RENEW, oldest + ttl_ms / 1000 - now, due)


def retry_at(now: float, ttl_ms: int) -> float:
    """After a round that left a lease unrenewed but possibly live: the next round's earliest start."""
    return now + min(interval_s(ttl_ms), _lease.RENEW_RETRY_S)


class Verdict(enum.Enum):
    RENEWED = "renewed"  # the lease's expiry moved on
    LEASE_LOST = "lease_lost"  # refused for this lease alone (fenced, never issued): it leaves
    SESSION_LOST = "session_lost"  # the session's TTL ran out on the server, or the call was refused
    RETRY = "retry"  # not renewed, possibly live: the next round comes soon
    STOP = "stop"  # the client (or its channel) was closed: end without a verdict


def item_verdict(item: KeepAliveItem) -> tuple[Verdict, FencingError | None]:
    """What one lease's answer in a KeepAliveMany means, and its exception if not renewed."""
    error = item.error
    if error is None:
        return Verdict.RENEWED, None
    if isinstance(error, LeaseExpired):  # its TTL ran out on the server: so did the session's
        return Verdict.SESSION_LOST, error
    if isinstance(error, (Refused, InvalidArgument, AuthError)):  # StaleToken, UnknownToken, ...
        return Verdict.LEASE_LOST, error
    return Verdict.RETRY, error  # Overloaded, NoLeader, OutcomeUnknown on this item


def call_verdict(exc: BaseException) -> Verdict:
    """What a whole KeepAliveMany's failure (one of _lease.RENEWAL_ERRORS) means."""
    if isinstance(exc, (Refused, InvalidArgument, AuthError)):  # PermissionDenied, ...: never renewed
        return Verdict.SESSION_LOST
    if isinstance(exc, FencingError):  # Unavailable, OutcomeUnknown, ...: try again soon
        return Verdict.RETRY
    return Verdict.STOP  # RuntimeError/ValueError: the client was closed


def session_lost(ttl_ms: int, leases: int, why: str, cause: BaseException | None) -> LeaseLost:
    return LeaseLost(f"the session (ttl {ttl_ms} ms, {leases} lease(s)) is lost: {why}",
                     cause=cause, request={"rpc": "keep-alive-many"})


def lease_lost_message(resource: str, token: int) -> str:
    return f"the lease with token {token} on {resource} is lost with its session"


def session_ttl_ms(ttl_ms: int | None, ttl: str | float | None) -> int:
    """The session TTL in ms from exactly one of ``ttl_ms`` and ``ttl`` (seconds, or a
    duration word such as ``"10s"``); ValueError otherwise."""
    if (ttl_ms is None) == (ttl is None):
        raise ValueError("give the session's TTL as ttl_ms or as ttl (one of them)")
    if ttl_ms is not None:
        return ttl_ms
    seconds = parse_s(ttl, default_unit="s") if isinstance(ttl, str) else float(ttl)  # type: ignore[arg-type]
    return round(seconds * 1000)
