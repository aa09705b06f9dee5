"""Sessions for asyncio: ``AsyncFencingClient.session(ttl)``, any number of leases renewed by
one task, lost together (the asyncio twin of ``session``).

Owns: ``AsyncSession`` (its renewal task, its leases, ``done``, releasing everything on close)
and ``AsyncSessionLease`` (an ``AsyncLease`` the session renews). The schedule and what each
answer means are ``_session``'s, shared with the sync ``Session``.
Must never: block the event loop, start a task per lease, send a call without a deadline, or
keep a lease it cannot prove live past ``renewed_at + ttl``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from coordinator.client._lease import RENEWAL_ERRORS
from coordinator.client._session import (
    RELEASE_BATCH_ITEMS,
    RENEW_BATCH_ITEMS,
    RENEWAL_LAG_SAMPLES_MAX,
    SessionAction,
    Verdict,
    call_verdict,
    interval_s,
    item_verdict,
    lease_lost_message,
    retry_at,
    session_lost,
    session_step,
)
from coordinator.client.aio import AsyncLease, _awaited
from coordinator.client.exceptions import FencingError, LeaseLost, Refused
from coordinator.client.results import AcquireResult, KeepAliveItem

if TYPE_CHECKING:
    from coordinator.client.aio import AsyncFencingClient

log = logging.getLogger("coordinator.client.aio")


class AsyncSessionLease(AsyncLease):
    """An ``AsyncLease`` its ``AsyncSession`` renews (no task of its own). ``release()`` and
    ``close()`` take it out of the session, then release it as a lone lease's do."""

    def __init__(self, session: AsyncSession, acquired: AcquireResult, *, sent_at: float,
                 on_lost: Callable[[LeaseLost], Any] | None) -> None:
        super().__init__(session._client, acquired, ttl_ms=session.ttl_ms, on_lost=on_lost, sent_at=sent_at)
        self.session = session

    def _start_keepalive(self) -> None:  # the session's task renews it
        raise RuntimeError("an AsyncSessionLease is renewed by its session")

    async def _stop_keepalive(self) -> None:
        self.session._forget(self)

    def _renewed_item(self, item: KeepAliveItem, sent_at: float) -> None:
        self._expires_at_ms = item.expires_at_ms
        self._renewed_at = max(self._renewed_at, sent_at)


class AsyncSession:
    """``Session`` for asyncio: ``done`` is an ``asyncio.Event``; ``acquire``, ``lock`` and
    ``close`` are coroutines; ``on_lost`` may be a function or a coroutine function. Create it
    (``client.session``) inside the event loop that uses it."""

    def __init__(self, client: AsyncFencingClient, *, ttl_ms: int, holder: str | None = None,
                 on_lost: Callable[[LeaseLost], Any] | None = None) -> None:
        self._client = client
        self.ttl_ms = ttl_ms
        self.holder = holder
        self.done = asyncio.Event()
        self.lost_error: LeaseLost | None = None
        self._on_lost = on_lost
        self._leases: dict[tuple[str, int], AsyncSessionLease] = {}
        self._closed = False
        self._lags: collections.deque[float] = collections.deque(maxlen=RENEWAL_LAG_SAMPLES_MAX)
        self.rounds = 0  # renewal rounds sent
        self.renewals = 0  # leases renewed, all rounds together
        self._task: asyncio.Task[None] | None = asyncio.ensure_future(self._run())

    def __len__(self) -> int:
        return len(self._leases)

    @property
    def leases(self) -> list[AsyncSessionLease]:
        return list(self._leases.values())

    def renewal_lags_s(self) -> list[float]:
        """As ``Session.renewal_lags_s``."""
        return list(self._lags)

    async def acquire(self, resource: str, *, holder: str | None = None, wait_ms: int = 0,
                      timeout_s: float | None = None,
                      on_lost: Callable[[LeaseLost], Any] | None = None) -> AsyncSessionLease:
        """``client.acquire`` with the session's TTL, then renewed by the session."""
        self._check_open()
        sent_at = time.monotonic()
        acquired = await _awaited(self._client.acquire(
            resource, ttl_ms=self.ttl_ms, holder=self.holder if holder is None else holder,
            wait_ms=wait_ms, timeout_s=timeout_s))
        return await self._adopt(acquired, sent_at, on_lost)

    async def lock(self, resource: str, *, timeout_s: float | None = None, holder: str | None = None,
                   on_lost: Callable[[LeaseLost], Any] | None = None) -> AsyncSessionLease:
        """``client.lock`` with the session's TTL, then renewed by the session and lost with it."""
        self._check_open()
        acquired, sent_at = await self._client._lock_granted(
            resource, ttl_ms=self.ttl_ms, timeout_s=timeout_s, holder=self.holder if holder is None else holder)
        return await self._adopt(acquired, sent_at, on_lost)

    def _check_open(self) -> None:
        if self.lost_error is not None:
            raise self.lost_error
        if self._closed:
            raise RuntimeError("the session is closed")

    async def _adopt(self, acquired: AcquireResult, sent_at: float,
                     on_lost: Callable[[LeaseLost], Any] | None) -> AsyncSessionLease:
        lease = AsyncSessionLease(self, acquired, sent_at=sent_at, on_lost=on_lost)
        if self._closed or self.lost_error is not None:  # ended while it was being acquired
            lease._released = True
            await self._release_all([lease], timeout_s=None)
            self._check_open()
        self._leases[(lease.resource, lease.token)] = lease
        return lease

    def _forget(self, lease: AsyncSessionLease) -> None:
        self._leases.pop((lease.resource, lease.token), None)

    async def _run(self) -> None:
        not_before = 0.0
        while not self._closed:
            leases = list(self._leases.values())
            renewed_at = [lease._renewed_at for lease in leases]
            step = session_step(now=time.monotonic(), renewed_at=renewed_at, ttl_ms=self.ttl_ms, retry_at=not_before)
            if step.action is SessionAction.SLEEP:
                await asyncio.sleep(step.seconds)  # close() cancels the task here
                continue
            if step.action is SessionAction.LOST:
                await self._lose(None, "renewals failed until its oldest lease may have expired")
                return
            failed = await self._renew([leases[n] for n in step.due])
            if failed is None:
                return
            not_before = retry_at(time.monotonic(), self.ttl_ms) if failed else 0.0

    async def _renew(self, due: list[AsyncSessionLease]) -> bool | None:
        """One round, as ``Session._renew``: True if a lease stays unrenewed but possibly live,
        None when the session is lost or the client closed."""
        self.rounds += 1
        failed = False
        for start in range(0, len(due), RENEW_BATCH_ITEMS):
            chunk = due[start:start + RENEW_BATCH_ITEMS]
            sent_at = time.monotonic()
            deadline_s = min(lease._renewed_at for lease in chunk) + self.ttl_ms / 1000 - sent_at
            if deadline_s <= 0:
                return True  # the next step finds the oldest lease expired
            try:
                items = await _awaited(self._client.keep_alive_many(
                    [(lease.resource, lease.token) for lease in chunk], timeout_s=deadline_s))
            except RENEWAL_ERRORS as exc:
                verdict = call_verdict(exc)
                if verdict is Verdict.SESSION_LOST:
                    await self._lose(exc, "its renewal was refused")
                if verdict is not Verdict.RETRY:
                    return None
                log.info("session renewal of %d lease(s) failed: %s", len(chunk), exc)
                failed = True
                continue
            outcome = await self._renewed(chunk, items, sent_at)
            if outcome is None:
                return None
            failed = outcome or failed
        return failed

    async def _renewed(self, chunk: list[AsyncSessionLease], items: list[KeepAliveItem],
                       sent_at: float) -> bool | None:
        answered_at = time.monotonic()
        every_s = interval_s(self.ttl_ms)
        failed = len(items) < len(chunk)
        for lease, item in zip(chunk, items, strict=False):  # a short answer leaves the rest unrenewed
            if self._leases.get((lease.resource, lease.token)) is not lease:
                continue  # released meanwhile
            verdict, error = item_verdict(item)
            if verdict is Verdict.RENEWED:
                self._lags.append(answered_at - (lease._renewed_at + every_s))
                self.renewals += 1
                lease._renewed_item(item, sent_at)
            elif verdict is Verdict.SESSION_LOST:
                await self._lose(error, f"the server ended its lease on {lease.resource} (token {lease.token})")
                return None
            elif verdict is Verdict.LEASE_LOST:
                self._forget(lease)
                await lease._mark_lost(error, "")
            else:
                failed = True
        return failed

    async def _lose(self, cause: BaseException | None, why: str) -> None:
        if self.lost_error is not None:
            return
        leases = list(self._leases.values())
        self._leases.clear()
        self.lost_error = session_lost(self.ttl_ms, len(leases), why, cause)
        log.log(logging.INFO if self._on_lost is not None else logging.WARNING, "%s", self.lost_error)
        for lease in leases:  # before ``done``: whoever waits on it finds every lease lost
            await lease._mark_lost(self.lost_error, lease_lost_message(lease.resource, lease.token))
        self.done.set()
        if self._on_lost is not None:
            try:
                outcome = self._on_lost(self.lost_error)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # the caller's callback, failing in any way, must not kill the task
                log.exception("on_lost callback of a session raised")

    async def _stop_keepalive(self) -> None:
        """Stop the task without releasing (what ``client.close()`` does to open sessions)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self, *, timeout_s: float | None = None) -> None:
        """Stop the task and release every lease still in the session, RELEASE_BATCH_ITEMS a
        call (best effort: failures are logged, never raised). Idempotent."""
        await self._stop_keepalive()
        self._client._leases.discard(self)
        leases = list(self._leases.values())
        self._leases.clear()
        for lease in leases:
            lease._released = True
        if leases and self.lost_error is None:
            await self._release_all(leases, timeout_s=timeout_s)

    async def _release_all(self, leases: list[AsyncSessionLease], *, timeout_s: float | None) -> None:
        for start in range(0, len(leases), RELEASE_BATCH_ITEMS):
            chunk = leases[start:start + RELEASE_BATCH_ITEMS]
            try:
                outcomes = await _awaited(self._client.release_many(
                    [(lease.resource, lease.token) for lease in chunk], timeout_s=timeout_s))
            except (FencingError, RuntimeError) as exc:
                log.warning("releasing %d lease(s) of a session failed: %s", len(chunk), exc)
                continue
            for lease, outcome in zip(chunk, outcomes, strict=False):
                if isinstance(outcome, FencingError) and not isinstance(outcome, Refused):
                    log.warning("release of %s token %s failed: %s", lease.resource, lease.token, outcome)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
