"""The Python client of the fencing coordinator, and ``Lease``, its keep-alive helper.

Owns: ``FencingClient`` (sync, thread-safe: channels, the retry loop, leader discovery) and
``Lease`` (a daemon thread renews it); it re-exports the results, ``AsyncFencingClient`` and
``AsyncLease`` (asyncio, ``aio``). Shared with the asyncio client through ``_base`` and the
private modules it names: the constructor and its checks, request validation before sending
(the server's own field rules, ``coordinator.core.validation``), the keep-alive policy
(``keepalive_step``), the
retry policy (``retry``) and the frozen result dataclasses (``results``); failures are the
exception tree of ``coordinator.client.exceptions``. Must never: invent an outcome. After an
attempt that may have applied it says OutcomeUnknown, not "failed"; it never retries a
definite refusal; and it never treats a ``Lease``'s local ``lost`` flag as the fence: the
server's check is.

Quick start::

    from coordinator.client import FencingClient

    with FencingClient(["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]) as client:
        with client.lease("orders/7", ttl_ms=5000) as lease:
            lease.write("total", b"42")          # carries lease.token; fenced at the server
            if lease.lost.is_set():              # advisory: the server is the judge
                ...

Retries. Every call has a deadline (``timeout_s`` for the whole call, ``attempt_timeout_s``
per RPC). UNAVAILABLE/NO_LEADER, OUTCOME_UNKNOWN, DEADLINE_EXCEEDED, transport failures and
OVERLOADED (back-pressure: nothing applied) are retried with bounded exponential backoff and
jitter, on the leader if a node named one, else on the next endpoint. A mutation keeps the
**same op_id** (16 random bytes drawn once per logical call, or the caller's ``op_id=``),
so the server applies it at most once within its dedup window
(limits.DEDUP_RETENTION_MS). If the attempts run out after an attempt that may have
applied, the call raises OutcomeUnknown carrying the op_id: call again with ``op_id=`` to
learn the outcome. Refusals (StaleToken, LeaseHeld, InvalidArgument, PermissionDenied,
LimitExceeded, ...) are raised at once, never retried. Restore is the one mutation without
an op_id that is unsafe to repeat: it is resent only after failures that prove it was not
applied.

Leader discovery. Any node serves any RPC (followers forward), so the leader is only the
fastest choice. The client asks Cluster.Status of all endpoints in parallel, keeps the
leader's API address if it is one of the configured endpoints (a hint naming an address the
caller did not configure is ignored), follows NO_LEADER hints the same way, and falls back
to round-robin.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client._base import _ClientBase
from coordinator.client._calls import Attempts, Call, Shape, send
from coordinator.client._defaults import CHANNEL_OPTIONS, DEFAULT_ENDPOINTS
from coordinator.client._lease import RENEWAL_ERRORS, KeepAliveAction, LeaseBase, Renewal, keepalive_step
from coordinator.client._lock_wait import LockWait
from coordinator.client._requests import check_field, new_op_id
from coordinator.client._session import session_ttl_ms
from coordinator.client.aio import AsyncFencingClient, AsyncLease
from coordinator.client.exceptions import FencingError, LeaseLost, Refused, error_for_reason
from coordinator.client.multiplex import KINDS as BATCH_KINDS
from coordinator.client.multiplex import Batcher, ItemOutcome
from coordinator.client.results import (
    AcquireResult,
    ClusterStatus,
    DeleteResult,
    Description,
    EpochResult,
    ForceReleaseResult,
    Header,
    KeepAliveItem,
    KeepAliveResult,
    Member,
    ReadResult,
    ReleaseResult,
    Snapshot,
    WriteResult,
    header_from_pb,
)
from coordinator.client.watch import Watcher, WatchEvent
from coordinator.core import requests

__all__ = [
    "DEFAULT_ENDPOINTS",
    "AcquireResult",
    "AsyncFencingClient",
    "AsyncLease",
    "ClusterStatus",
    "DeleteResult",
    "Description",
    "EpochResult",
    "FencingClient",
    "ForceReleaseResult",
    "Header",
    "KeepAliveItem",
    "KeepAliveResult",
    "Lease",
    "Member",
    "ReadResult",
    "ReleaseResult",
    "Snapshot",
    "WatchEvent",
    "Watcher",
    "WriteResult",
    "new_op_id",
    "open_channel",
    "tls_credentials",
]

if TYPE_CHECKING:
    from coordinator.client.session import Session

log = logging.getLogger("coordinator.client")


def open_channel(
    target: str, credentials: grpc.ChannelCredentials | None = None, *, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A sync channel to ``target``: TLS with ``credentials``, plaintext without."""
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def tls_credentials(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> grpc.ChannelCredentials | None:
    """Channel credentials from PEM files: the CA that signed the members' certificates, and
    for mutual TLS this client's certificate and key. None when no file is given (plaintext).
    Raises OSError when a file cannot be read."""
    if not (ca_file or cert_file or key_file):
        return None

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))


class FencingClient(_ClientBase):
    """A client of one fencing cluster. Thread-safe; use one per process.

    ``endpoints``: the API addresses (``host:port``) of some or all nodes, as a list or a
    comma-separated string.

    Keyword-only configuration, each with a safe default:

    - ``timeout_s`` (10.0): deadline of one whole call, retries and backoff included.
    - ``attempt_timeout_s`` (3.0): deadline of one RPC attempt.
    - ``retry_max_attempts`` (10): attempts per call (1 disables retries).
    - ``retry_backoff_s`` (0.05) / ``retry_backoff_max_s`` (1.0): exponential backoff with
      jitter between attempts.
    - ``bearer_token`` (None): this caller's credential (not a fencing token), sent on every call as
      ``authorization: Bearer <token>``: a principal's token on a cluster with a principals
      file (README "Who may call"), or the admin token for Admin RPCs. ``admin_token`` is
      its older name.
    - ``credentials`` (None): ``grpc.ChannelCredentials`` for TLS/mTLS; None is plaintext.
    - ``multiplex`` (False): ``write()``, ``acquire()`` and ``release()`` calls made at once
      from many threads travel together, one ``FencedStore.WriteMany``,
      ``Lease.AcquireMany`` or ``Lease.ReleaseMany`` per kind and member
      (``coordinator.client.multiplex``): a call is sent at once when fewer than two
      batches of its kind are in flight there, else with the next batch as soon as one
      returns; never held back to let a batch grow. Each call keeps its own result or exception, op_id,
      deadline and retries, exactly as without it. An ``acquire(wait_ms=...)`` that waits
      goes on its own; the lease helpers (``lease()``, ``lock()``) and every other method
      call as usual, ``lease()``'s acquire and release riding the batches like any other.
      ``multiplex_writes=True`` is its older, deprecated name (it multiplexed writes only;
      it now means ``multiplex=True``, with a DeprecationWarning).

    Every method also takes ``timeout_s=`` to override the whole-call deadline once.
    Methods: acquire, keep_alive, keep_alive_many, release, describe, list, list_all, write, delete, read,
    status, force_release, set_epoch_floor, snapshot, restore, and ``lease()``.
    """

    _log = log
    # Weak: a Lease dropped without close() is no reason to keep it (its thread stops it).
    _lease_registry = weakref.WeakSet

    def __init__(
        self, endpoints: Sequence[str] | str, *, multiplex: bool = False, multiplex_writes: bool | None = None,
        **options: Any,
    ) -> None:
        if multiplex_writes is not None:
            warnings.warn(
                "FencingClient(multiplex_writes=...) is deprecated: use multiplex=..., which batches "
                "acquire() and release() as well as write()", DeprecationWarning, stacklevel=2,
            )
            multiplex = multiplex or bool(multiplex_writes)
        super().__init__(endpoints, **options)
        # multiplex: write(), acquire() and release() calls made at once from many threads
        # travel together, one batch call per kind and endpoint (coordinator/client/multiplex.py).
        self._batcher: Batcher | None = None
        if multiplex:
            self._batcher = Batcher(lambda endpoint, service: getattr(self._stubs[endpoint], service), self._metadata)

    def _open_channel(self, endpoint: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
        return open_channel(endpoint, credentials, options=CHANNEL_OPTIONS)

    def close(self) -> None:
        """Stop the keep-alive of every open Lease (they are not released) and close channels."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._batcher is not None:
            self._batcher.close()  # calls not sent yet raise RuntimeError, as after close
        for lease in list(self._leases):
            lease._stop_keepalive()
        for stubs in self._stubs.values():
            stubs.channel.close()

    def __enter__(self) -> FencingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the retry loop -------------------------------------------------------------------

    def _execute(self, call: Call) -> Any:
        if self._closed:
            raise RuntimeError("the FencingClient is closed")
        if call.batch is not None and self._batcher is not None and call.endpoint is None:
            return self._execute_batched(call)
        attempts = Attempts(self, call)
        while True:
            endpoint = call.endpoint or self._pick_endpoint(attempts.deadline)
            attempt_s = attempts.begin()
            if attempt_s is None:
                raise attempts.exhausted()
            rpc = getattr(getattr(self._stubs[endpoint], call.service), call.method)
            try:
                response = send(call, rpc, attempt_s, self._metadata)
                if call.shape is Shape.STREAM_OUT:
                    response = list(response)  # errors of the stream belong to this attempt
            except grpc.RpcError as err:
                pause_s = attempts.failed(err, endpoint)  # raises when it is final
                if pause_s > 0:
                    time.sleep(pause_s)
                continue
            except ValueError:
                if self._closed:  # grpc: "Cannot invoke RPC on closed channel!"
                    raise RuntimeError("the FencingClient is closed") from None
                raise
            return call.convert(response)

    def _execute_batched(self, call: Call) -> Any:
        """``_execute`` for a batchable call (a write, an acquire that does not wait, a release)
        of a multiplexing client: the same attempts, deadlines, endpoint choice and retry
        rules; each attempt rides in a batch of its kind, and its own item's answer (or the
        batch RPC's failure) is judged as the plain call's would be."""
        batcher = self._batcher
        assert call.batch is not None and batcher is not None  # _execute sends only these here
        kind = BATCH_KINDS[call.batch]
        attempts = Attempts(self, call)
        while True:
            if self._closed:
                raise RuntimeError("the FencingClient is closed")
            endpoint = self._pick_endpoint(attempts.deadline)
            attempt_s = attempts.begin()
            if attempt_s is None:
                raise attempts.exhausted()
            outcome = batcher.send(kind, endpoint, call.request, attempt_s)
            if outcome.response is not None:
                return call.convert(outcome.response)
            if outcome.closed:
                raise RuntimeError("the FencingClient is closed")
            if outcome.rpc_error is not None:
                pause_s = attempts.failed(outcome.rpc_error, endpoint)  # raises when it is final
            else:
                pause_s = attempts.failed_with(self._item_exception(call, outcome, endpoint), endpoint)
            if pause_s > 0:
                time.sleep(pause_s)

    @staticmethod
    def _item_exception(call: Call, outcome: ItemOutcome, endpoint: str) -> FencingError:
        """The exception of one batch item: the one the plain call answered with the same
        status and ErrorInfo raises (the client's one table, ``error_for_reason``); an item
        whose deadline passed before it was sent, as a plain call's DEADLINE_EXCEEDED."""
        if outcome.expired:
            return error_for_reason(
                "", f"Deadline Exceeded (before the batch carrying this {call.batch} was sent)",
                code=grpc.StatusCode.DEADLINE_EXCEEDED, endpoint=endpoint, request=call.context,
            )
        error = outcome.item_error
        assert error is not None  # neither a response, nor closed, nor a failed RPC: an item error
        code = getattr(grpc.StatusCode, error.code, None) if error.code else None
        return error_for_reason(
            error.reason, error.message, code=code if isinstance(code, grpc.StatusCode) else None,
            metadata=dict(error.metadata), endpoint=endpoint,
            header=None if outcome.header is None else header_from_pb(outcome.header), request=call.context,
        )

    def _pick_endpoint(self, deadline: float) -> str:
        leader, discover = self._known_or_discover()
        if leader is not None:
            return leader
        if discover:
            budget_s = self._discovery_budget_s(deadline)
            leader = self._discover(budget_s) if budget_s > 0 else None
        return self._adopt(leader)

    def _discover(self, budget_s: float) -> str | None:
        """Ask every endpoint for Cluster.Status at once; the first leader address that is
        one of our endpoints wins. None if nobody named one within ``budget_s``."""
        answers: queue.Queue[grpc.Future[pb.StatusResponse]] = queue.Queue()
        futures = []
        for stubs in self._stubs.values():
            try:
                future = stubs.cluster.Status.future(
                    pb.StatusRequest(), timeout=budget_s, metadata=self._metadata
                )
            except ValueError:  # the channel was closed
                continue
            future.add_done_callback(answers.put)
            futures.append(future)
        deadline = time.monotonic() + budget_s
        leader = None
        try:
            for _ in futures:
                try:
                    future = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                try:
                    leader = self._leader_from_answer(response=future.result())
                except grpc.RpcError as err:
                    leader = self._leader_from_answer(error=err)
                # A cancelled future or a channel closed under it fails in types grpc does not document:
                # no answer from that endpoint.
                except Exception:  # noqa: BLE001 - see above
                    continue
                if leader is not None:
                    break
        finally:
            for future in futures:
                future.cancel()
        log.debug("leader discovery: %s", leader or "no leader among the endpoints")
        return leader

    # -- the lease helpers ---------------------------------------------------------------

    def lock(
        self,
        resource: str,
        *,
        ttl_ms: int,
        timeout_s: float | None = None,
        holder: str | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
    ) -> Lease:
        """Block until ``resource``'s lease is granted to this caller, in arrival order among
        everyone waiting (a FIFO queue in the replicated state), and return it as a ``Lease``
        that renews itself like ``lease()``'s. Raises LockTimeout once ``timeout_s`` passes
        (None: no deadline), also when the cluster cannot be reached meanwhile: the call ends
        within timeout_s plus one attempt timeout (``LockWait``), RuntimeError if the client
        is closed meanwhile; either way the waiter leaves the queue. While it waits, one Lock
        call (one Raft entry) per limits.LOCK_WAIT_MS_MAX keeps its place; the grant itself is
        the entry that ended the previous lease.
        """
        acquired, sent_at = self._lock_granted(resource, ttl_ms=ttl_ms, timeout_s=timeout_s, holder=holder)
        lease = Lease(self, acquired, ttl_ms=ttl_ms, on_lost=on_lost, sent_at=sent_at)
        self._leases.add(lease)
        lease._start_keepalive()
        return lease

    def _lock_granted(
        self, resource: str, *, ttl_ms: int, timeout_s: float | None, holder: str | None
    ) -> tuple[AcquireResult, float]:
        """``lock()``'s wait: the granted lease and the monotonic time its TTL counts from
        (``Session.lock`` keeps it in a session instead of a Lease of its own)."""
        wait = LockWait(self, resource, ttl_ms=ttl_ms, holder=holder, timeout_s=timeout_s)
        try:
            while True:
                call = wait.next_call()
                if call is None:
                    raise wait.timed_out()
                try:
                    step = self._execute(call)
                except FencingError as error:
                    pause_s = wait.after_failure(error)  # raises when the wait is over
                    if pause_s > 0:
                        time.sleep(pause_s)
                    continue
                if step.acquired is not None:
                    return step.acquired, wait.granted_after
                pause_s = wait.pause_s(step)
                if pause_s > 0:
                    time.sleep(pause_s)
        except BaseException as exc:  # any exit, interrupts too, leaves the queue; re-raised
            closed = self._closed
            cancel_s = wait.cancel_timeout_s()
            if not closed and cancel_s is not None:
                try:
                    self.cancel_lock(resource, wait.waiter_id, timeout_s=cancel_s)
                except (FencingError, RuntimeError) as cancel_error:  # its slot expires by itself
                    log.info("leaving the lock queue of %s failed: %s", resource, cancel_error)
            if closed and not isinstance(exc, RuntimeError):
                raise RuntimeError("the FencingClient was closed while lock() waited") from exc
            raise

    def session(
        self,
        ttl_ms: int | None = None,
        *,
        ttl: str | float | None = None,
        holder: str | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
    ) -> Session:
        """A ``Session``: leases with one TTL, taken with ``session.acquire()`` or
        ``session.lock()``, all renewed by one thread (KeepAliveMany calls, whatever their
        number), lost together when the session is (``session.done``). Give the TTL as
        ``ttl_ms`` or as ``ttl``: seconds, or a duration such as ``"10s"``. Leaving its block
        releases every lease still in it. See ``coordinator.client.session``."""
        from coordinator.client.session import Session  # session.py builds on Lease, defined here

        ttl_ms = session_ttl_ms(ttl_ms, ttl)
        check_field(requests.REQUESTS["Acquire"]["ttl_ms"].check, ttl_ms, {"rpc": "session", "ttl_ms": ttl_ms})
        if self._closed:
            raise RuntimeError("the FencingClient is closed")
        session = Session(self, ttl_ms=ttl_ms, holder=holder, on_lost=on_lost)
        self._leases.add(session)  # close() stops its thread, as a Lease's
        return session
    def watch(self, prefix: str = "", *, start_revision: int = 0) -> Watcher:
        """The changes to resources under ``prefix`` ("": all), in log order, from
        ``start_revision`` (0: from now): iterate the ``Watcher`` for ``WatchEvent``s. A lost
        stream is resumed on the next endpoint from the last revision + 1, nothing missed or
        repeated; ``Compacted`` when that revision is gone from the member's history."""
        if self._closed:
            raise RuntimeError("the FencingClient is closed")
        return Watcher(self, prefix, start_revision)

    def lease(
        self,
        resource: str,
        *,
        ttl_ms: int,
        holder: str | None = None,
        wait_ms: int = 0,
        on_lost: Callable[[LeaseLost], None] | None = None,
        auto_renew: bool = True,
        timeout_s: float | None = None,
    ) -> Lease:
        """Acquire ``resource`` now and return a ``Lease`` that renews itself every ttl/3
        on a daemon thread (``auto_renew=False``: call ``lease.keep_alive()`` yourself).

        Use it as a context manager: leaving the block stops the keep-alive and releases
        the lease (best effort; failures are logged, never raised). Raises what
        ``acquire`` raises (LeaseHeld, ...).
        """
        sent_at = time.monotonic()
        acquired = self.acquire(
            resource, ttl_ms=ttl_ms, holder=holder, wait_ms=wait_ms, timeout_s=timeout_s
        )
        lease = Lease(self, acquired, ttl_ms=ttl_ms, on_lost=on_lost, sent_at=sent_at)
        self._leases.add(lease)
        if auto_renew:
            lease._start_keepalive()
        return lease


class Lease(LeaseBase):
    """A held lease: its ``token``, and ``write``/``delete``/``read`` bound to that token.

    ``lost`` is a ``threading.Event`` set, and right after it ``on_lost(LeaseLost)`` called
    once from the keep-alive thread, when a renewal is refused (StaleToken, LeaseExpired,
    UnknownToken, or another refusal) or when renewals keep failing until the lease must
    have expired (send time of the last good renewal + ttl, on this machine's monotonic
    clock: never later than the server's expiry).

    **It is advisory.** Between the moment the lease is lost and the moment this process
    notices, writes can still be sent, and writes after ``lost`` are not blocked here: the
    server is the judge, and refuses every write whose token is below the resource's hwm
    (StaleToken). ``raise_if_lost()`` helps stop early; it guarantees nothing.
    """

    def __init__(
        self,
        client: FencingClient,
        acquired: AcquireResult,
        *,
        ttl_ms: int,
        on_lost: Callable[[LeaseLost], None] | None = None,
        sent_at: float | None = None,
    ) -> None:
        super().__init__(
            client, acquired, ttl_ms=ttl_ms,
            sent_at=time.monotonic() if sent_at is None else sent_at,
        )
        self.lost = threading.Event()
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_lock = threading.Lock()

    def _is_lost(self) -> bool:
        return self.lost.is_set()

    @property
    def expires_at_ms(self) -> int:
        with self._state_lock:
            return self._expires_at_ms

    def keep_alive(self, *, timeout_s: float | None = None) -> KeepAliveResult:
        """Renew once now (the background thread does this by itself)."""
        sent_at = time.monotonic()
        result: KeepAliveResult = self._client.keep_alive(self.resource, self.token, timeout_s=timeout_s)
        with self._state_lock:
            self._renewed(result, sent_at)
        return result

    def _mark_lost(self, cause: BaseException | None, message: str = "") -> None:
        with self._state_lock:
            if self.lost.is_set():
                return
            self.lost_error = LeaseLost(message, cause=cause, request=self._context())
            self.lost.set()
        # A caller with on_lost reports the loss itself: a warning too would say it twice.
        log.log(logging.INFO if self._on_lost is not None else logging.WARNING, "%s", self.lost_error)
        if self._on_lost is not None:
            try:
                self._on_lost(self.lost_error)
            except Exception:  # the caller's callback, failing in any way, must not kill the thread
                log.exception("on_lost callback for %s raised", self.resource)

    def _start_keepalive(self) -> None:
        self._thread = threading.Thread(
            target=self._keepalive_loop,
            name=f"fencing-keepalive-{self.resource}-{self.token}",
            daemon=True,
        )
        self._thread.start()

    def _stop_keepalive(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # The loop wakes at once; a renewal in flight ends by its own deadline.
            thread.join(timeout=self._client._attempt_timeout_s + 1.0)

    def _keepalive_loop(self) -> None:
        last: Renewal | BaseException = Renewal.RENEWED  # the acquire
        while True:
            with self._state_lock:
                renewed_at = self._renewed_at
            step = keepalive_step(now=time.monotonic(), renewed_at=renewed_at, ttl_ms=self.ttl_ms, last=last)
            if step.action is KeepAliveAction.SLEEP:
                if step.cause is not None:
                    log.info("renewal of %s token %s failed: %s", self.resource, self.token, step.cause)
                if self._stop.wait(step.seconds):
                    return
                last = Renewal.DUE
            elif step.action is KeepAliveAction.RENEW:
                try:
                    self.keep_alive(timeout_s=step.seconds)
                    last = Renewal.RENEWED
                except RENEWAL_ERRORS as exc:
                    last = exc
            elif step.action is KeepAliveAction.LOST:
                self._mark_lost(step.cause, "" if step.cause is not None else self._expired_message())
                return
            else:  # STOP: the client (or its channel) was closed
                return

    def release(self, *, timeout_s: float | None = None) -> ReleaseResult | None:
        """Stop renewing and release the lease (raises what ``client.release`` raises);
        None if it was already released through this object."""
        self._stop_keepalive()
        with self._state_lock:
            if self._released:
                return None
            self._released = True
        released: ReleaseResult = self._client.release(self.resource, self.token, timeout_s=timeout_s)
        return released

    def close(self) -> None:
        """Stop renewing and release, best effort: failures are logged, never raised."""
        try:
            self.release()
        except Refused as exc:  # already fenced or ended: nothing left to release
            log.debug("release of %s token %s: %s", self.resource, self.token, exc)
        except FencingError as exc:
            log.warning("release of %s token %s failed: %s", self.resource, self.token, exc)
        except RuntimeError as exc:  # the client was closed first
            log.debug("release of %s skipped: %s", self.resource, exc)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
