"""The asyncio variant of the fencing client (``grpc.aio``): same methods, same rules.

Owns: asyncio channels, the awaiting retry loop and discovery, and ``AsyncLease`` (its
keep-alive is a task). Everything else (validation, requests, the retry policy, the
bookkeeping of attempts, the results and exceptions) is shared with the sync client
through ``_base`` and the private modules it names (the constructor too: this class only
opens asyncio channels). Must never: block the event loop (no time.sleep, no sync RPC).

    async with AsyncFencingClient(endpoints) as client:
        async with client.lease("orders/7", ttl_ms=5000) as lease:
            await lease.write("total", b"42")

Every method of ``FencingClient`` exists here and returns an awaitable of the same result
type (the annotations name the result). Argument errors (InvalidArgument) are raised when
the method is called, before anything is sent, as in the sync client. Create the client
inside the event loop that uses it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Generator, TypeVar, cast

import grpc
import grpc.aio

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client._base import _ClientBase
from coordinator.client._calls import Attempts, Call, Shape, Stubs, send
from coordinator.client._defaults import CHANNEL_OPTIONS
from coordinator.client._lease import RENEWAL_ERRORS, KeepAliveAction, LeaseBase, Renewal, keepalive_step
from coordinator.client._lock_wait import LockWait
from coordinator.client._requests import check_field
from coordinator.client._session import session_ttl_ms
from coordinator.client.exceptions import FencingError, LeaseLost, Refused
from coordinator.client.results import AcquireResult, KeepAliveResult, ListedResource, ReleaseResult
from coordinator.core import requests

if TYPE_CHECKING:
    from coordinator.client.aio_session import AsyncSession
from coordinator.client.watch import AsyncWatcher

log = logging.getLogger("coordinator.client.aio")

__all__ = ["AsyncFencingClient", "AsyncLease"]


class AsyncFencingClient(_ClientBase):
    """The asyncio client: ``FencingClient``'s configuration, methods and retry rules,
    each method returning an awaitable. ``await client.close()`` or ``async with``."""

    _log = log
    # Strong: an AsyncLease leaves it in close(); until then close() of the client stops it.
    _lease_registry = set

    def _open_channel(self, endpoint: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
        if credentials is None:
            return grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(endpoint, credentials, options=CHANNEL_OPTIONS)

    async def close(self) -> None:
        """Take every waiting ``lock()`` out of its queue (each then raises RuntimeError),
        stop the keep-alive of every open lease (they are not released), close channels."""
        if self._closed:
            return
        # While the channels are still open: a waiter left behind would stay in line until its
        # slot expired (LOCK_WAITER_TTL_MS) and could be granted a lease nobody holds. A grant
        # its lock() had not yet seen is released by the same DEQUEUE.
        waits = list(self._lock_waits)
        for wait in waits:
            wait.abandoned = True  # before any await: its loop makes no further Lock call
        await asyncio.gather(*(self._leave_line(wait) for wait in waits))
        self._closed = True
        for lease in list(self._leases):
            await lease._stop_keepalive()
        for stubs in self._stubs.values():
            await stubs.channel.close()

    async def _leave_line(self, wait: LockWait) -> None:
        try:
            await self.cancel_lock(wait.resource, wait.waiter_id, timeout_s=self._attempt_timeout_s)
        except (FencingError, RuntimeError) as error:  # its slot expires by itself
            log.info("leaving the lock queue of %s failed: %r", wait.resource, error)

    async def __aenter__(self) -> AsyncFencingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the retry loop -------------------------------------------------------------------

    async def _execute(self, call: Call) -> Any:
        if self._closed:
            raise RuntimeError("the AsyncFencingClient is closed")
        attempts = Attempts(self, call)
        while True:
            endpoint = call.endpoint or await self._pick_endpoint(attempts.deadline)
            attempt_s = attempts.begin()
            if attempt_s is None:
                raise attempts.exhausted()
            rpc = getattr(getattr(self._stubs[endpoint], call.service), call.method)
            try:
                stream = send(call, rpc, attempt_s, self._metadata)
                if call.shape is Shape.STREAM_OUT:
                    response = [message async for message in stream]  # errors belong to this attempt
                else:
                    response = await stream
            except grpc.RpcError as err:
                pause_s = attempts.failed(err, endpoint)  # raises when it is final
                if pause_s > 0:
                    await asyncio.sleep(pause_s)
                continue
            except grpc.aio.UsageError:
                raise RuntimeError("the AsyncFencingClient is closed") from None
            return call.convert(response)

    async def _pick_endpoint(self, deadline: float) -> str:
        leader, discover = self._known_or_discover()
        if leader is not None:
            return leader
        if discover:
            budget_s = self._discovery_budget_s(deadline)
            leader = await self._discover(budget_s) if budget_s > 0 else None
        return self._adopt(leader)

    async def _discover(self, budget_s: float) -> str | None:
        """Cluster.Status on every endpoint at once; the first leader that is one of our
        endpoints wins; None if nobody named one within ``budget_s``."""

        async def ask(stubs: Stubs) -> str | None:
            try:
                response = await stubs.cluster.Status(
                    pb.StatusRequest(), timeout=budget_s, metadata=self._metadata
                )
            except grpc.RpcError as err:
                return self._leader_from_answer(error=err)
            return self._leader_from_answer(response=response)

        tasks = [asyncio.ensure_future(ask(stubs)) for stubs in self._stubs.values()]
        leader = None
        try:
            for next_done in asyncio.as_completed(tasks, timeout=budget_s):
                try:
                    leader = await next_done
                except asyncio.TimeoutError:
                    break
                # A channel closed under the call fails in types grpc.aio does not document: no answer.
                except Exception:  # noqa: BLE001 - see above
                    continue
                if leader is not None:
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        log.debug("leader discovery: %s", leader or "no leader among the endpoints")
        return leader

    # -- the lease helpers ---------------------------------------------------------------

    async def lock(
        self,
        resource: str,
        *,
        ttl_ms: int,
        timeout_s: float | None = None,
        holder: str | None = None,
        on_lost: Callable[[LeaseLost], Any] | None = None,
    ) -> AsyncLease:
        """``FencingClient.lock`` for asyncio: wait in the FIFO queue until granted, the
        deadline passes (LockTimeout), the client closes (RuntimeError) or the task is
        cancelled; in every case but the grant the waiter leaves the queue."""
        acquired, sent_at = await self._lock_granted(resource, ttl_ms=ttl_ms, timeout_s=timeout_s, holder=holder)
        lease = AsyncLease(self, acquired, ttl_ms=ttl_ms, on_lost=on_lost, sent_at=sent_at)
        self._leases.add(lease)
        lease._start_keepalive()
        return lease

    async def _lock_granted(
        self, resource: str, *, ttl_ms: int, timeout_s: float | None, holder: str | None
    ) -> tuple[AcquireResult, float]:
        """``lock()``'s wait: the granted lease and the monotonic time its TTL counts from
        (``AsyncSession.lock`` keeps it in a session instead of a lease task of its own)."""
        wait = LockWait(self, resource, ttl_ms=ttl_ms, holder=holder, timeout_s=timeout_s)
        self._lock_waits.add(wait)
        try:
            while True:
                call = wait.next_call()
                if call is None:
                    raise wait.timed_out()
                if wait.abandoned:
                    raise RuntimeError("the AsyncFencingClient was closed while lock() waited")
                try:
                    step = await self._execute(call)
                except FencingError as error:
                    pause_s = wait.after_failure(error)  # raises when the wait is over
                    if pause_s > 0:
                        await asyncio.sleep(pause_s)
                    continue
                if wait.abandoned:  # close() left the line meanwhile (and released a grant)
                    raise RuntimeError("the AsyncFencingClient was closed while lock() waited")
                if step.acquired is not None:
                    return step.acquired, wait.granted_after
                pause_s = wait.pause_s(step)
                if pause_s > 0:
                    await asyncio.sleep(pause_s)
        except BaseException as exc:  # any exit, cancellation too, leaves the queue; re-raised
            if wait.abandoned:
                # close() took the waiter out of line. Closing the channels cancels the Lock
                # call in flight, which grpc.aio raises as CancelledError: that is the close,
                # unless this task itself is being cancelled.
                task = asyncio.current_task()
                if isinstance(exc, RuntimeError) or (task is not None and task.cancelling()):
                    raise
                raise RuntimeError("the AsyncFencingClient was closed while lock() waited") from exc
            closed = self._closed
            cancel_s = wait.cancel_timeout_s()
            if not closed and cancel_s is not None:
                try:
                    # Shielded: a cancelled lock() still leaves the queue.
                    await asyncio.shield(self.cancel_lock(resource, wait.waiter_id, timeout_s=cancel_s))
                except (FencingError, RuntimeError, asyncio.CancelledError) as cancel_error:
                    log.info("leaving the lock queue of %s failed: %r", resource, cancel_error)
            if closed and not isinstance(exc, (RuntimeError, asyncio.CancelledError)):
                raise RuntimeError("the AsyncFencingClient was closed while lock() waited") from exc
            raise
        finally:
            self._lock_waits.discard(wait)

    def session(
        self,
        ttl_ms: int | None = None,
        *,
        ttl: str | float | None = None,
        holder: str | None = None,
        on_lost: Callable[[LeaseLost], Any] | None = None,
    ) -> AsyncSession:
        """``FencingClient.session`` for asyncio: ``async with client.session(ttl="10s") as s``;
        its leases are renewed by one task (``coordinator.client.aio_session``)."""
        from coordinator.client.aio_session import AsyncSession  # it builds on AsyncLease, defined here

        ttl_ms = session_ttl_ms(ttl_ms, ttl)
        check_field(requests.REQUESTS["Acquire"]["ttl_ms"].check, ttl_ms, {"rpc": "session", "ttl_ms": ttl_ms})
        if self._closed:
            raise RuntimeError("the AsyncFencingClient is closed")
        session = AsyncSession(self, ttl_ms=ttl_ms, holder=holder, on_lost=on_lost)
        self._leases.add(session)  # close() stops its task, as an AsyncLease's
        return session
    def watch(self, prefix: str = "", *, start_revision: int = 0) -> AsyncWatcher:
        """As ``FencingClient.watch``: ``async for event in client.watch("jobs/")``."""
        if self._closed:
            raise RuntimeError("the AsyncFencingClient is closed")
        return AsyncWatcher(self, prefix, start_revision)

    def lease(
        self,
        resource: str,
        *,
        ttl_ms: int,
        holder: str | None = None,
        wait_ms: int = 0,
        on_lost: Callable[[LeaseLost], Any] | None = None,
        auto_renew: bool = True,
        timeout_s: float | None = None,
    ) -> _LeaseStarter:
        """``async with client.lease(...) as lease`` (released on exit) or
        ``lease = await client.lease(...)``: acquire, then renew every ttl/3 in a task.
        ``on_lost`` may be a function or a coroutine function."""
        return _LeaseStarter(
            self, resource, ttl_ms=ttl_ms, holder=holder, wait_ms=wait_ms, on_lost=on_lost,
            auto_renew=auto_renew, timeout_s=timeout_s,
        )

    # ---- List (issue 29 point 4)
    async def list_all(  # type: ignore[override]  # the sync client's is a plain iterator
        self, prefix: str = "", *, page_size: int | None = None, timeout_s: float | None = None,
    ) -> AsyncIterator[ListedResource]:
        """``async for item in client.list_all(prefix)``: ``FencingClient.list_all``, page
        after page, each page awaited as it is needed."""
        token = ""
        while True:
            page = await _awaited(self.list(prefix, limit=page_size, page_token=token, timeout_s=timeout_s))
            for item in page.resources:
                yield item
            token = page.next_page_token
            if not token:
                return
    # ---- end List


_T = TypeVar("_T")


def _awaited(result: _T) -> Awaitable[_T]:
    """What a method of this client gives, to the type checker: the methods are _ClientBase's,
    annotated with the result they produce, and ``_execute`` here makes each return an
    awaitable of it."""
    return cast("Awaitable[_T]", result)


class _LeaseStarter:
    """Awaitable and async context manager around one acquisition (the aiohttp pattern)."""

    def __init__(self, client: AsyncFencingClient, resource: str, **options: Any) -> None:
        self._client = client
        self._resource = resource
        self._options = options
        self._lease: AsyncLease | None = None

    async def _start(self) -> AsyncLease:
        options = dict(self._options)
        on_lost = options.pop("on_lost")
        auto_renew = options.pop("auto_renew")
        sent_at = time.monotonic()
        acquired = await _awaited(self._client.acquire(self._resource, **options))
        lease = AsyncLease(
            self._client, acquired, ttl_ms=options["ttl_ms"], on_lost=on_lost, sent_at=sent_at
        )
        self._client._leases.add(lease)
        if auto_renew:
            lease._start_keepalive()
        return lease

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._start().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._start()
        return self._lease

    async def __aexit__(self, *exc_info: object) -> None:
        if self._lease is not None:
            await self._lease.close()


class AsyncLease(LeaseBase):
    """``Lease`` for asyncio: ``lost`` is an ``asyncio.Event``; ``write``/``delete``/``read``
    return awaitables. The same warning holds: ``lost`` is advisory, the server's fence is
    the guarantee."""

    def __init__(
        self,
        client: AsyncFencingClient,
        acquired: AcquireResult,
        *,
        ttl_ms: int,
        on_lost: Callable[[LeaseLost], Any] | None = None,
        sent_at: float | None = None,
    ) -> None:
        super().__init__(
            client, acquired, ttl_ms=ttl_ms,
            sent_at=time.monotonic() if sent_at is None else sent_at,
        )
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None

    def _is_lost(self) -> bool:
        return self.lost.is_set()

    async def keep_alive(self, *, timeout_s: float | None = None) -> KeepAliveResult:
        """Renew once now (the background task does this by itself)."""
        sent_at = time.monotonic()
        result: KeepAliveResult = await self._client.keep_alive(self.resource, self.token, timeout_s=timeout_s)
        self._renewed(result, sent_at)
        return result

    async def _mark_lost(self, cause: BaseException | None, message: str = "") -> None:
        if self.lost.is_set():
            return
        self.lost_error = LeaseLost(message, cause=cause, request=self._context())
        self.lost.set()
        # A caller with on_lost reports the loss itself: a warning too would say it twice.
        log.log(logging.INFO if self._on_lost is not None else logging.WARNING, "%s", self.lost_error)
        if self._on_lost is not None:
            try:
                outcome = self._on_lost(self.lost_error)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # the caller's callback, failing in any way, must not kill the task
                log.exception("on_lost callback for %s raised", self.resource)

    def _start_keepalive(self) -> None:
        self._task = asyncio.ensure_future(self._keepalive_loop())

    async def _stop_keepalive(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _keepalive_loop(self) -> None:
        last: Renewal | BaseException = Renewal.RENEWED  # the acquire
        while True:
            step = keepalive_step(
                now=time.monotonic(), renewed_at=self._renewed_at, ttl_ms=self.ttl_ms, last=last
            )
            if step.action is KeepAliveAction.SLEEP:
                if step.cause is not None:
                    log.info("renewal of %s token %s failed: %s", self.resource, self.token, step.cause)
                await asyncio.sleep(step.seconds)  # _stop_keepalive cancels the task here
                last = Renewal.DUE
            elif step.action is KeepAliveAction.RENEW:
                try:
                    await self.keep_alive(timeout_s=step.seconds)
                    last = Renewal.RENEWED
                except RENEWAL_ERRORS as exc:
                    last = exc
            elif step.action is KeepAliveAction.LOST:
                await self._mark_lost(step.cause, "" if step.cause is not None else self._expired_message())
                return
            else:  # STOP: the client was closed
                return

    async def release(self, *, timeout_s: float | None = None) -> ReleaseResult | None:
        """Stop renewing and release (raises what ``client.release`` raises)."""
        await self._stop_keepalive()
        if self._released:
            return None
        self._released = True
        released: ReleaseResult = await self._client.release(self.resource, self.token, timeout_s=timeout_s)
        return released

    async def close(self) -> None:
        """Stop renewing and release, best effort: failures are logged, never raised."""
        try:
            await self.release()
        except Refused as exc:
            log.debug("release of %s token %s: %s", self.resource, self.token, exc)
        except FencingError as exc:
            log.warning("release of %s token %s failed: %s", self.resource, self.token, exc)
        except RuntimeError as exc:
            log.debug("release of %s skipped: %s", self.resource, exc)
        finally:
            self._client._leases.discard(self)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
