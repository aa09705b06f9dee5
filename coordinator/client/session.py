"""Sessions: any number of leases of one process kept alive by one thread (etcd's
``concurrency.Session``), and a lock taken in a session lost with it.

Owns: ``Session`` (``client.session(ttl_ms)``: its one renewal thread, its leases, its lost
signal ``done``, and releasing everything on close) and ``SessionLease`` (a ``Lease`` the
session renews). The schedule and what each answer means are ``_session``'s pure decisions,
kept apart so an asyncio session can share them.
Must never: start a thread per lease, send a call without a deadline, or keep a lease it
cannot prove live past ``renewed_at + ttl``.

Why KeepAliveMany and not KeepAliveStream: a stream message carries one lease and the member
answers a stream's messages one at a time, in order, so a round of 1,000 leases would be 1,000
Raft round trips end to end (and each open stream holds a member's worker thread, at most
limits.PRINCIPAL_STREAMS_MAX per principal). One KeepAliveMany carries up to
limits.KEEP_ALIVE_BATCH_ITEMS_MAX leases, renewed concurrently on the member's pool; a session
with more sends one such call after another from its thread, over the client's one channel.

Semantics. Every lease of a session has the session's TTL. The thread renews, every
ttl/RENEW_FRACTION, the leases due within half that interval (so leases acquired at different
times fall into one cadence). A lease refused alone (StaleToken after an Admin ForceRelease,
UnknownToken) is lost alone and leaves the session. The session is lost -- ``done`` set, every
lease in it marked lost as a lone lease's loss is (``lease.lost``, ``on_lost``) -- when a renewal
is refused LeaseExpired (the server ended one of its leases: the session's TTL ran out), when
the call itself is refused (PermissionDenied, InvalidArgument), or when no renewal has
succeeded by ``renewed_at + ttl`` of its oldest lease (the cluster could not be reached in
time). Closing the session stops the thread and releases its leases (ReleaseMany, at most
limits.RELEASE_MANY_ITEMS_MAX a call). ``lease.release()`` takes one lease out of the session.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

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
from coordinator.client.exceptions import FencingError, LeaseLost, Refused
from coordinator.client.results import AcquireResult, KeepAliveItem
from coordinator.client.sync import Lease

if TYPE_CHECKING:
    from coordinator.client.sync import FencingClient

log = logging.getLogger("coordinator.client")
# How long close() waits for the renewal thread: a renewal in flight ends by its own deadline.
THREAD_JOIN_GRACE_S = 1.0


class SessionLease(Lease):
    """A ``Lease`` its ``Session`` renews (no thread of its own). ``release()`` and
    ``close()`` take it out of the session, then release it as a lone lease's do."""

    def __init__(self, session: Session, acquired: AcquireResult, *, sent_at: float,
                 on_lost: Callable[[LeaseLost], None] | None) -> None:
        super().__init__(session._client, acquired, ttl_ms=session.ttl_ms, on_lost=on_lost, sent_at=sent_at)
        self.session = session

    def _start_keepalive(self) -> None:  # the session's thread renews it
        raise RuntimeError("a SessionLease is renewed by its session")

    def _stop_keepalive(self) -> None:
        self.session._forget(self)

    def _renewed_item(self, item: KeepAliveItem, sent_at: float) -> None:
        with self._state_lock:
            self._expires_at_ms = item.expires_at_ms
            self._renewed_at = max(self._renewed_at, sent_at)


class Session:
    """Leases with one TTL kept alive together by one daemon thread (``client.session``).

    ``acquire()`` and ``lock()`` take leases in the session; ``done`` (a threading.Event) is
    set, and ``on_lost(LeaseLost)`` called once from the session's thread, when the session is
    lost; ``lost_error`` then says why. Use it as a context manager: leaving the block stops
    the thread and releases every lease still in it (best effort: failures are logged).
    Advisory like a Lease's ``lost``: the server's fencing check is the judge.
    """

    def __init__(self, client: FencingClient, *, ttl_ms: int, holder: str | None = None,
                 on_lost: Callable[[LeaseLost], None] | None = None) -> None:
        self._client = client
        self.ttl_ms = ttl_ms
        self.holder = holder
        self.done = threading.Event()
        self.lost_error: LeaseLost | None = None
        self._on_lost = on_lost
        self._lock = threading.Lock()  # guards _leases and _closed; never held across I/O
        self._leases: dict[tuple[str, int], SessionLease] = {}
        self._closed = False
        self._stop = threading.Event()
        self._lags: collections.deque[float] = collections.deque(maxlen=RENEWAL_LAG_SAMPLES_MAX)
        self.rounds = 0  # renewal rounds sent (each one KeepAliveMany call per RENEW_BATCH_ITEMS leases)
        self.renewals = 0  # leases renewed, all rounds together
        self._thread = threading.Thread(target=self._run, name=f"fencing-session-{id(self):x}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        state = "lost" if self.done.is_set() else ("closed" if self._closed else "open")
        return f"<Session ttl_ms={self.ttl_ms} leases={len(self)} {state}>"

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    @property
    def leases(self) -> list[SessionLease]:
        """The leases in the session now."""
        with self._lock:
            return list(self._leases.values())

    def renewal_lags_s(self) -> list[float]:
        """How late each recent renewal took effect, in seconds: its answer's arrival minus the
        moment it was due (renewed_at + ttl/RENEW_FRACTION); negative when renewed early. The
        latest RENEWAL_LAG_SAMPLES_MAX."""
        with self._lock:
            return list(self._lags)

    # -- taking leases ------------------------------------------------------------------------

    def acquire(self, resource: str, *, holder: str | None = None, wait_ms: int = 0,
                timeout_s: float | None = None, on_lost: Callable[[LeaseLost], None] | None = None) -> SessionLease:
        """``client.acquire`` with the session's TTL, the lease then renewed by the session.
        Raises what ``acquire`` raises, ``lost_error`` if the session is lost, RuntimeError if
        it is closed."""
        self._check_open()
        sent_at = time.monotonic()
        acquired = self._client.acquire(resource, ttl_ms=self.ttl_ms, holder=self._holder(holder),
                                        wait_ms=wait_ms, timeout_s=timeout_s)
        return self._adopt(acquired, sent_at, on_lost)

    def lock(self, resource: str, *, timeout_s: float | None = None, holder: str | None = None,
             on_lost: Callable[[LeaseLost], None] | None = None) -> SessionLease:
        """``client.lock`` (a FIFO wait, LockTimeout after ``timeout_s``) with the session's
        TTL; the lease is then renewed by the session and lost with it."""
        self._check_open()
        acquired, sent_at = self._client._lock_granted(
            resource, ttl_ms=self.ttl_ms, timeout_s=timeout_s, holder=self._holder(holder))
        return self._adopt(acquired, sent_at, on_lost)

    def _holder(self, holder: str | None) -> str | None:
        return self.holder if holder is None else holder

    def _check_open(self) -> None:
        if self.lost_error is not None:
            raise self.lost_error
        if self._closed:
            raise RuntimeError("the session is closed")

    def _adopt(self, acquired: AcquireResult, sent_at: float,
               on_lost: Callable[[LeaseLost], None] | None) -> SessionLease:
        lease = SessionLease(self, acquired, sent_at=sent_at, on_lost=on_lost)
        with self._lock:
            ended = self._closed or self.lost_error is not None
            if not ended:
                self._leases[(lease.resource, lease.token)] = lease
        if ended:  # lost or closed while it was being acquired: not kept past the session
            lease._released = True
            self._release_all([lease], timeout_s=None)
            self._check_open()
            raise RuntimeError("the session ended")  # pragma: no cover - _check_open raised
        return lease

    def _forget(self, lease: SessionLease) -> None:
        with self._lock:
            self._leases.pop((lease.resource, lease.token), None)

    # -- the renewal thread -------------------------------------------------------------------

    def _run(self) -> None:
        not_before = 0.0
        while True:
            with self._lock:
                if self._closed:
                    return
                leases = list(self._leases.values())
            renewed_at = [lease._renewed_at for lease in leases]
            step = session_step(now=time.monotonic(), renewed_at=renewed_at, ttl_ms=self.ttl_ms, retry_at=not_before)
            if step.action is SessionAction.SLEEP:
                if self._stop.wait(step.seconds):
                    return
                continue
            if step.action is SessionAction.LOST:
                self._lose(None, "renewals failed until its oldest lease may have expired")
                return
            try:
                failed = self._renew([leases[n] for n in step.due])
            except _SessionEnded:
                return
            not_before = retry_at(time.monotonic(), self.ttl_ms) if failed else 0.0

    def _renew(self, due: list[SessionLease]) -> bool:
        """One round: renew ``due`` in calls of RENEW_BATCH_ITEMS. True if some lease could not
        be renewed and may still be live (a retry is due soon). Raises _SessionEnded when
        the session is lost or the client closed."""
        self.rounds += 1
        failed = False
        for start in range(0, len(due), RENEW_BATCH_ITEMS):
            chunk = due[start:start + RENEW_BATCH_ITEMS]
            sent_at = time.monotonic()
            deadline_s = min(lease._renewed_at for lease in chunk) + self.ttl_ms / 1000 - sent_at
            if deadline_s <= 0:
                return True  # the next step finds the oldest lease expired
            try:
                items = self._client.keep_alive_many(
                    [(lease.resource, lease.token) for lease in chunk], timeout_s=deadline_s)
            except RENEWAL_ERRORS as exc:
                verdict = call_verdict(exc)
                if verdict is Verdict.SESSION_LOST:
                    self._lose(exc, "its renewal was refused")
                if verdict is not Verdict.RETRY:
                    raise _SessionEnded from exc
                log.info("session renewal of %d lease(s) failed: %s", len(chunk), exc)
                failed = True
                continue
            failed = self._renewed(chunk, items, sent_at) or failed
        return failed

    def _renewed(self, chunk: list[SessionLease], items: list[KeepAliveItem], sent_at: float) -> bool:
        """Apply one call's answers; True if some lease stays unrenewed but possibly live."""
        answered_at = time.monotonic()
        every_s = interval_s(self.ttl_ms)
        failed = len(items) < len(chunk)  # a short answer: the rest are retried
        lags = []
        for lease, item in zip(chunk, items, strict=False):  # a short answer leaves the rest unrenewed
            with self._lock:
                if self._leases.get((lease.resource, lease.token)) is not lease:
                    continue  # released meanwhile: its answer no longer matters
            verdict, error = item_verdict(item)
            if verdict is Verdict.RENEWED:
                lags.append(answered_at - (lease._renewed_at + every_s))
                lease._renewed_item(item, sent_at)
            elif verdict is Verdict.SESSION_LOST:
                self._lose(error, f"the server ended its lease on {lease.resource} (token {lease.token})")
                raise _SessionEnded
            elif verdict is Verdict.LEASE_LOST:
                self._forget(lease)  # fenced (ForceRelease) or never issued: this lease alone
                lease._mark_lost(error, "")
            else:
                failed = True
        with self._lock:
            self._lags.extend(lags)
            self.renewals += len(lags)
        return failed

    def _lose(self, cause: BaseException | None, why: str) -> None:
        with self._lock:
            if self.lost_error is not None:
                return
            leases = list(self._leases.values())
            self._leases.clear()
            self.lost_error = session_lost(self.ttl_ms, len(leases), why, cause)
        log.log(logging.INFO if self._on_lost is not None else logging.WARNING, "%s", self.lost_error)
        for lease in leases:  # before ``done``: whoever waits on it finds every lease lost
            lease._mark_lost(self.lost_error, lease_lost_message(lease.resource, lease.token))
        self.done.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self.lost_error)
            except Exception:  # the caller's callback, failing in any way, must not kill the thread
                log.exception("on_lost callback of a session raised")

    # -- ending -------------------------------------------------------------------------------

    def _stop_keepalive(self) -> None:
        """Stop the thread without releasing (what ``client.close()`` does to open sessions)."""
        with self._lock:
            self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._client._attempt_timeout_s + THREAD_JOIN_GRACE_S)

    def close(self, *, timeout_s: float | None = None) -> None:
        """Stop the thread and release every lease still in the session, RELEASE_BATCH_ITEMS a
        call (best effort: failures are logged, never raised). Idempotent."""
        self._stop_keepalive()
        with self._lock:
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            with lease._state_lock:
                lease._released = True
        if leases and self.lost_error is None:
            self._release_all(leases, timeout_s=timeout_s)

    def _release_all(self, leases: list[SessionLease], *, timeout_s: float | None) -> None:
        for start in range(0, len(leases), RELEASE_BATCH_ITEMS):
            chunk = leases[start:start + RELEASE_BATCH_ITEMS]
            try:
                outcomes = self._client.release_many([(lease.resource, lease.token) for lease in chunk],
                                                     timeout_s=timeout_s)
            except (FencingError, RuntimeError) as exc:
                log.warning("releasing %d lease(s) of a session failed: %s", len(chunk), exc)
                continue
            for lease, outcome in zip(chunk, outcomes, strict=False):
                if isinstance(outcome, FencingError) and not isinstance(outcome, Refused):
                    log.warning("release of %s token %s failed: %s", lease.resource, lease.token, outcome)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _SessionEnded(Exception):
    """The session's thread ends: the session is lost, or the client was closed."""

