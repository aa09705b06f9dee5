"""What the sync and the asyncio fencing clients share: configuration, endpoint choice, the
request of every RPC, the bookkeeping of one call's attempts, and the keep-alive policy.

Owns: ``_ClientBase`` (the constructor and its checks, written once; every public RPC
method: check and build the request by its row of ``validation.REQUESTS``, describe how
it may be retried, and hand a ``Call`` to ``_execute``), ``Attempts`` (deadline, attempt count, maybe-applied, the final exception),
``LeaseBase`` and ``keepalive_step`` (when a lease is renewed, how long a failing renewal
is retried, when the lease counts as lost), and the defaults. Must never: block, sleep or
do I/O: ``FencingClient`` (threads) and ``AsyncFencingClient`` (asyncio) only add their
channel flavour, the loop that runs a ``Call`` and the loop that runs a lease's
keep-alive, so both follow exactly the same rules.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import random
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import grpc

from coordinator.client import results
from coordinator.core import limits
from coordinator.core import validation
from coordinator.core.names import ErrorMeta, ErrorReason
from coordinator.client.results import (
    AcquireResult,
    ClusterStatus,
    MemberList,
    DeleteResult,
    Description,
    EpochResult,
    ForceReleaseResult,
    KeepAliveItem,
    KeepAliveResult,
    ReadResult,
    ReleaseResult,
    Snapshot,
    WriteResult,
)
from coordinator.client.retry import Backoff, Kind, classify
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client.exceptions import (
    AuthError,
    FencingError,
    InvalidArgument,
    LockTimeout,
    NotApplied,
    OutcomeUnknown,
    Refused,
    Unavailable,
    from_rpc_error,
)

# The local three-node dev cluster (`fencingd dev`, API ports 7100-7102): fencingctl uses
# this when neither --endpoints nor FENCING_ENDPOINTS is given.
DEFAULT_ENDPOINTS: tuple[str, ...] = ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")

# -- defaults (each one is a keyword of the clients) ----------------------------------------
# Whole-call budget, retries included: a leader election takes 1-2 s (raft_node's timeout
# window) and a SIGKILLed leader is noticed at once, so 10 s rides out an election plus a
# few slow attempts, yet a caller still hears back quickly when the cluster is really down.
TIMEOUT_S_DEFAULT = 10.0
# One RPC attempt: a commit is milliseconds when healthy; a paused or partitioned node is
# abandoned after 3 s so the retry can go elsewhere well inside the whole-call budget.
ATTEMPT_TIMEOUT_S_DEFAULT = 3.0
# Attempts per call: with the backoff below, 10 attempts span about 4 s of sleeping, more
# than one election, and cap the load a client adds to a struggling cluster.
RETRY_MAX_ATTEMPTS_DEFAULT = 10
# First backoff 50 ms, doubling, capped at 1 s: quick after a failover, gentle while down.
RETRY_BACKOFF_S_DEFAULT = 0.05
RETRY_BACKOFF_MAX_S_DEFAULT = 1.0
# Leader discovery: one parallel Cluster.Status round waits at most this long; a live node
# answers in milliseconds, a paused one is not worth waiting for.
DISCOVERY_TIMEOUT_S = 1.0
# Discovery rounds are at least this far apart, so a cluster in an election is not flooded.
DISCOVERY_INTERVAL_S = 0.5
# An endpoint whose attempt just failed (connection, deadline) is not taken back as the
# leader for this long, even if the others still name it: a killed or paused leader is
# named by its followers until they elect another one (1-2 s).
SUSPECT_S = 2.0
# A backup (snapshot or restore, up to limits.BACKUP_BYTES_MAX, ~740 MB) in one attempt: the
# transfer, the check of the whole backup and ~707 chunk entries through the log take a minute
# or two at the largest; five minutes leaves room on a slow disk yet ends a stuck transfer.
BACKUP_TIMEOUT_S_DEFAULT = 300.0
# Channel options. Message size: a unary snapshot or restore is the largest message. Reconnect
# backoff: a restarted node is used again within 1 s (gRPC's default backoff grows to 120 s).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def new_op_id() -> bytes:
    """A fresh op_id: 16 random bytes (limits.OP_ID_BYTES_MIN), one per logical mutation."""
    return os.urandom(limits.OP_ID_BYTES_MIN)


def _invalid(exc: validation.InvalidField, request: dict[str, Any]) -> InvalidArgument:
    return InvalidArgument(
        str(exc), reason=ErrorReason.INVALID_FIELD, metadata={ErrorMeta.FIELD: exc.field},
        request=request,
    )


def _check(check: Callable[[Any], Any], value: Any, request: dict[str, Any]) -> Any:
    """Run one field check that is not a row of validation.REQUESTS (Acquire's wait_ms, a
    batch's shared ttl_ms); a bad field is InvalidArgument, raised before anything is sent."""
    try:
        return check(value)
    except validation.InvalidField as exc:
        raise _invalid(exc, request) from None


def _request(message: Any, request: dict[str, Any], **fields: Any) -> Any:
    """``message`` (a fencing.proto request type) holding ``fields``, checked by its RPC's row
    of validation.REQUESTS: the table and rules the server checks with, in the same order,
    so the first bad field is InvalidArgument naming it, raised before anything is sent.

    None leaves an optional field unset, except a bool: the wire cannot carry an unset one
    (the server reads it as False), so a None there is refused rather than sent as False.
    """
    rpc = message.DESCRIPTOR.name.removesuffix("Request")
    try:
        checked = validation.check_request(rpc, fields)
        wire = message.DESCRIPTOR.fields_by_name
        for name, value in checked.items():
            if value is None and wire[name].type == wire[name].TYPE_BOOL:
                validation.REQUESTS[rpc][name].check(value)
    except validation.InvalidField as exc:
        raise _invalid(exc, request) from None
    return message(**checked)


def _check_wait_ms(value: object) -> int:
    if not validation.is_int(value) or not 0 <= value <= limits.ACQUIRE_WAIT_MS_MAX:
        raise validation.InvalidField(
            "wait_ms", f"must be an integer in [0, {limits.ACQUIRE_WAIT_MS_MAX}], got {value!r}"
        )
    return int(value)


def _as_bytes(value: object) -> object:
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


def _default_holder() -> str:
    try:
        host = os.uname().nodename or "host"
    except AttributeError:  # pragma: no cover - not on Linux
        host = "host"
    return f"{host[:100]}/{os.getpid()}"


def normalize_endpoint(endpoint: str) -> str:
    """``host:port``, with ``localhost`` spelled 127.0.0.1; ValueError if malformed."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    if host == "localhost":
        host = "127.0.0.1"
    return f"{host}:{port}"


class Stubs:
    """The four service stubs on one channel (sync or asyncio: the generated stubs take both)."""

    __slots__ = ("channel", "lease", "store", "cluster", "admin")

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.lease = pb_grpc.LeaseStub(channel)
        self.store = pb_grpc.FencedStoreStub(channel)
        self.cluster = pb_grpc.ClusterStub(channel)
        self.admin = pb_grpc.AdminStub(channel)


class Shape(enum.Enum):
    """How a call's messages travel (Call.shape)."""

    UNARY = "unary"
    STREAM_OUT = "stream_out"
    STREAM_IN = "stream_in"


@dataclasses.dataclass(frozen=True)
class Call:
    """One logical call: what to send, how it may be retried, and how to read the answer."""

    service: str  # attribute of Stubs: lease, store, cluster, admin
    method: str
    request: Any
    kind: Kind
    context: dict[str, Any]  # what the caller asked; goes onto exceptions
    convert: Callable[[Any], Any]
    timeout_s: float | None = None  # whole-call override
    extra_attempt_s: float = 0.0  # e.g. an Acquire's server-side wait
    endpoint: str | None = None  # pin to one endpoint, one attempt
    # Monotonic time after which no new attempt starts (one already started runs to its own
    # timeout): a bounded lock() wait, whose attempts past its end would only wait longer.
    start_by: float | None = None
    # UNARY: ``request`` is one message. STREAM_OUT: the responses are read to the end (in the
    # attempt) and ``convert`` gets their list. STREAM_IN: ``request`` makes each attempt's
    # message iterator (an attempt may be resent, and an iterator is read once).
    shape: Shape = Shape.UNARY
    # The batch kind (coordinator/client/multiplex.py KINDS: "write", "acquire", "release") a
    # multiplexing client (FencingClient's ``multiplex``) may send this call in, as an item of
    # a WriteMany, AcquireMany or ReleaseMany; None: always a call of its own. Retried by the
    # same rules either way.
    batch: str | None = None


def send(call: Call, rpc: Callable[..., Any], timeout_s: float, metadata: Any) -> Any:
    """Start one attempt of ``call`` on ``rpc`` (a stub method): its response (a unary reply,
    a stream of replies, or an awaitable of either on an asyncio channel)."""
    request = call.request() if call.shape is Shape.STREAM_IN else call.request
    return rpc(request, timeout=timeout_s, metadata=metadata)


class Attempts:
    """The bookkeeping of one call: deadline, attempts, and what to raise in the end."""

    def __init__(self, client: _ClientBase, call: Call) -> None:
        self.client = client
        self.call = call
        self.budget_s = client._timeout_s if call.timeout_s is None else float(call.timeout_s)
        self.started = time.monotonic()
        self.deadline = self.started + self.budget_s + call.extra_attempt_s
        self.max_attempts = 1 if call.endpoint is not None else client._max_attempts
        self.count = 0
        self.maybe_applied = False
        self.last: FencingError | None = None

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def begin(self) -> float | None:
        """The next attempt's timeout, or None when the attempts or the deadline ran out."""
        remaining = self.remaining_s()
        if self.count >= self.max_attempts or remaining <= 0:
            return None
        if self.count > 0 and self.call.start_by is not None and time.monotonic() >= self.call.start_by:
            return None
        self.count += 1
        return min(self.client._attempt_timeout_s + self.call.extra_attempt_s, remaining)

    def failed(self, err: grpc.RpcError, endpoint: str) -> float:
        """Record a failed attempt. Returns the pause before the next one, or raises the
        exception the caller gets (a refusal, or OutcomeUnknown after a maybe-applied try)."""
        exc = from_rpc_error(err, endpoint=endpoint, request=self.call.context)
        exc.__cause__ = err
        return self.failed_with(exc, endpoint)

    def failed_with(self, exc: FencingError, endpoint: str) -> float:
        """``failed`` for an attempt whose exception is built already: one item of a
        multiplexed batch (its own error, or the batch RPC's, from the same table)."""
        call = self.call
        verdict = classify(exc, call.kind)
        self.maybe_applied = self.maybe_applied or verdict.maybe_applied
        self.client._log.debug(
            "%s attempt %d on %s: %s: %s%s",
            call.method, self.count, endpoint, type(exc).__name__, exc,
            " (retrying)" if verdict.retry else "",
        )
        if not verdict.retry:
            # Unknown when this attempt may have applied (a call sent once, Kind.ONCE, whose
            # connection dropped after the request went out: a plain UNAVAILABLE is a
            # NotApplied class, yet nothing says it did not apply), or when an earlier one may
            # have and this one cannot tell (a definite refusal now speaks for itself).
            this_maybe = verdict.maybe_applied and call.kind is not Kind.READ
            if this_maybe or (self.maybe_applied and call.kind is not Kind.READ and not isinstance(exc, NotApplied)):
                raise self._unknown(exc) from exc
            raise exc
        self.last = exc
        answered = exc.reason != "" and not isinstance(exc, OutcomeUnknown)
        self.client._after_failure(endpoint, verdict.leader_hint, answered=answered)
        pause = self.client._backoff.delay_s(self.count - 1, self.client._rng)
        return max(0.0, min(pause, self.remaining_s()))

    def _unknown(self, last: FencingError | None) -> OutcomeUnknown:
        detail = f"last attempt: {last.endpoint}: {type(last).__name__}: {last}" if last else ""
        return OutcomeUnknown(
            code=last.code if last else None,
            reason=ErrorReason.OUTCOME_UNKNOWN,
            metadata={ErrorMeta.DETAIL: detail},
            endpoint=last.endpoint if last else None,
            request=self.call.context,
        )

    def exhausted(self) -> FencingError:
        """The exception for a call whose attempts or deadline ran out."""
        last, context = self.last, self.call.context
        if self.maybe_applied and self.call.kind is not Kind.READ:
            exc: FencingError = self._unknown(last)
        elif last is None:
            exc = Unavailable(f"no attempt fit in the {self.budget_s:g} s deadline", request=context)
        else:
            # The time really spent, not the budget: attempts may run out well before it.
            elapsed_s = time.monotonic() - self.started
            summary = f"{self.count} attempt(s) in {elapsed_s:.1f} s; last on {last.endpoint}"
            if isinstance(last, NotApplied):  # Unavailable, NoLeader, Overloaded
                exc = type(last)(
                    f"{last} ({summary})",
                    code=last.code,
                    reason=last.reason,
                    metadata=last.metadata,
                    server_message=last.server_message,
                    endpoint=last.endpoint,
                    header=last.header,
                    request=context,
                )
            else:  # a read, or a call that surely did not apply, that never got an answer
                exc = Unavailable(
                    f"no answer ({summary}: {type(last).__name__}: {last})",
                    code=last.code,
                    endpoint=last.endpoint,
                    request=context,
                )
        exc.__cause__ = last
        return exc


class _ClientBase:
    """Configuration, endpoint choice and every RPC; subclasses provide channels and
    ``_execute`` (run a ``Call`` with retries and return its converted answer)."""

    _log: Any  # the subclass's logger

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S_DEFAULT,
        retry_max_attempts: int = RETRY_MAX_ATTEMPTS_DEFAULT,
        retry_backoff_s: float = RETRY_BACKOFF_S_DEFAULT,
        retry_backoff_max_s: float = RETRY_BACKOFF_MAX_S_DEFAULT,
        bearer_token: str | None = None,
        admin_token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        normalized: list[str] = []
        for endpoint in endpoints:
            e = normalize_endpoint(endpoint)
            if e not in normalized:
                normalized.append(e)
        if not normalized:
            raise ValueError("at least one endpoint is needed")
        if not timeout_s > 0 or not attempt_timeout_s > 0:
            raise ValueError("timeout_s and attempt_timeout_s must be positive")
        if retry_max_attempts < 1:
            raise ValueError("retry_max_attempts must be at least 1")
        if retry_backoff_s < 0 or retry_backoff_max_s < retry_backoff_s:
            raise ValueError("need 0 <= retry_backoff_s <= retry_backoff_max_s")
        if bearer_token and admin_token and bearer_token != admin_token:
            raise ValueError("give bearer_token or admin_token (its older name), not both")
        bearer_token = bearer_token or admin_token
        self._endpoints: tuple[str, ...] = tuple(normalized)
        self._timeout_s = float(timeout_s)
        self._attempt_timeout_s = float(attempt_timeout_s)
        self._max_attempts = int(retry_max_attempts)
        self._backoff = Backoff(base_s=float(retry_backoff_s), max_s=float(retry_backoff_max_s))
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {bearer_token}"),) if bearer_token else ()
        )
        self._credentials = credentials
        self._rng = random.Random()
        self._lock = threading.Lock()  # never held across I/O or an await
        self._preferred: str | None = None  # the endpoint believed to be the leader
        self._rr = 0  # round-robin cursor when no leader is known
        self._next_discovery_at = 0.0
        self._suspects: dict[str, float] = {}  # endpoint -> monotonic time it is trusted again
        self._closed = False
        self._stubs: dict[str, Stubs] = {
            endpoint: Stubs(self._open_channel(endpoint, credentials)) for endpoint in self._endpoints
        }
        self._leases = self._lease_registry()
        # lock() calls still waiting: close() takes their waiters out of line (asyncio client).
        self._lock_waits: set[LockWait] = set()

    # What a subclass adds: its channel flavour, how it tracks open leases, and the loop.
    _lease_registry: Callable[[], Any]  # a set-like factory (weak for threads, strong for tasks)

    def _open_channel(self, endpoint: str, credentials: grpc.ChannelCredentials | None) -> Any:
        raise NotImplementedError  # pragma: no cover - abstract

    def _execute(self, call: Call) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- endpoint choice ----------------------------------------------------------------

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    @property
    def leader_endpoint(self) -> str | None:
        """The endpoint this client currently believes is the leader (None: unknown)."""
        with self._lock:
            return self._preferred

    def _known_or_discover(self) -> tuple[str | None, bool]:
        """(the believed leader, None if unknown; whether a discovery round is due now)."""
        with self._lock:
            if self._preferred is not None:
                return self._preferred, False
            now = time.monotonic()
            if now >= self._next_discovery_at:
                self._next_discovery_at = now + DISCOVERY_INTERVAL_S
                return None, True
            return None, False

    def _adopt(self, leader: str | None) -> str:
        """Remember a discovered leader, or take the next endpoint round-robin."""
        with self._lock:
            if leader is not None and not self._suspect(leader):
                self._preferred = leader
                return leader
            endpoint = self._endpoints[self._rr % len(self._endpoints)]
            self._rr += 1
            return endpoint

    def _suspect(self, endpoint: str) -> bool:
        """Did an attempt on ``endpoint`` fail at the transport level a moment ago?"""
        until = self._suspects.get(endpoint)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._suspects[endpoint]
            return False
        return True

    @staticmethod
    def _discovery_budget_s(deadline: float) -> float:
        return min(DISCOVERY_TIMEOUT_S, max(0.0, deadline - time.monotonic()) / 2)

    def _match_endpoint(self, address: str) -> str | None:
        """``address`` if it is one of the configured endpoints (hints naming anything else
        are ignored: the caller chose where this client may connect)."""
        if not address:
            return None
        try:
            normalized = normalize_endpoint(address)
        except ValueError:
            return None
        return normalized if normalized in self._endpoints else None

    def _leader_from_answer(self, response: Any = None, error: grpc.RpcError | None = None) -> str | None:
        if error is not None:
            return self._match_endpoint(from_rpc_error(error).metadata.get(ErrorMeta.LEADER_API, ""))
        return self._match_endpoint(response.leader_api_address)

    def _after_failure(self, endpoint: str, hint: str, *, answered: bool) -> None:
        """After a retryable failure on ``endpoint``: follow the leader hint if it names
        another endpoint, else move on round-robin. ``answered``: the node itself replied
        (NO_LEADER, OVERLOADED); otherwise it is suspect for SUSPECT_S."""
        leader = self._match_endpoint(hint)
        with self._lock:
            if not answered:
                self._suspects[endpoint] = time.monotonic() + SUSPECT_S
            if leader is not None and leader != endpoint and not self._suspect(leader):
                self._preferred = leader
                return
            if self._preferred == endpoint:
                self._preferred = None
            # Next round-robin pick is the endpoint after the one that failed.
            self._rr = self._endpoints.index(endpoint) + 1

    # -- Lease ----------------------------------------------------------------------------

    def acquire(
        self,
        resource: str,
        *,
        ttl_ms: int,
        holder: str | None = None,
        wait_ms: int = 0,
        op_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Take the lease on ``resource`` and get a new fencing token (DESIGN I2).

        Raises LeaseHeld while another live lease holds it; with ``wait_ms`` the server
        waits up to that long (limits.ACQUIRE_WAIT_MS_MAX) for it to go. ``holder``
        defaults to ``<hostname>/<pid>``.
        """
        holder = _default_holder() if holder is None else holder
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "acquire", "resource": resource, "holder": holder, "op_id": op_id}
        req = _request(
            pb.AcquireRequest, ctx, resource=resource, holder=holder, ttl_ms=ttl_ms, op_id=op_id
        )
        wait_ms = _check(_check_wait_ms, wait_ms, ctx)  # not in the table: the server clamps it
        req.wait_ms = wait_ms
        return self._execute(Call(
            "lease", "Acquire", req, Kind.DEDUP, ctx,
            lambda r: results.acquire_result(r, resource=resource, holder=holder, op_id=op_id),
            timeout_s=timeout_s, extra_attempt_s=wait_ms / 1000,
            # An Acquire that waits in line goes on its own: AcquireMany refuses items with a
            # wait (one would hold every other item's answer for up to its wait).
            batch="acquire" if wait_ms == 0 else None,
        ))

    def keep_alive(
        self,
        resource: str,
        token: int,
        *,
        ttl_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> KeepAliveResult:
        """Extend the live lease holding ``token`` (same token, DESIGN I6).

        Raises LeaseExpired if it has ended (a new acquire is needed), StaleToken if a
        newer token exists. Repeating a keep-alive is harmless, so it is retried after an
        unknown outcome.
        """
        ctx = {"rpc": "keep-alive", "resource": resource, "token": token}
        req = _request(pb.KeepAliveRequest, ctx, resource=resource, token=token, ttl_ms=ttl_ms)
        return self._execute(Call(
            "lease", "KeepAlive", req, Kind.REPEATABLE, ctx,
            lambda r: results.keep_alive_result(r, resource=resource, token=token),
            timeout_s=timeout_s,
        ))

    def keep_alive_many(
        self,
        leases: Iterable[tuple[str, int]],
        *,
        ttl_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> list[KeepAliveItem]:
        """Renew many ``(resource, token)`` leases in one call; each item succeeds or fails
        on its own (``item.ok``, ``item.error``). At most limits.KEEP_ALIVE_BATCH_ITEMS_MAX
        items (InvalidArgument beyond)."""
        ctx: dict[str, Any] = {"rpc": "keep-alive-many"}
        if ttl_ms is not None:  # checked once, before the items: it is the batch's
            _check(validation.REQUESTS["KeepAlive"]["ttl_ms"].check, ttl_ms, ctx)
        requests = [
            _request(
                pb.KeepAliveRequest, {**ctx, "resource": resource, "token": token},
                resource=resource, token=token, ttl_ms=ttl_ms,
            )
            for resource, token in leases
        ]
        if len(requests) > limits.KEEP_ALIVE_BATCH_ITEMS_MAX:
            raise InvalidArgument(
                f"{len(requests)} leases, more than {limits.KEEP_ALIVE_BATCH_ITEMS_MAX} in one call",
                reason=ErrorReason.INVALID_FIELD, metadata={ErrorMeta.FIELD: "leases"}, request=ctx,
            )
        return self._execute(Call(
            "lease", "KeepAliveMany", pb.KeepAliveManyRequest(leases=requests), Kind.REPEATABLE,
            ctx, results.keep_alive_items, timeout_s=timeout_s,
        ))

    def release(
        self,
        resource: str,
        token: int,
        *,
        op_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> ReleaseResult:
        """End the lease holding ``token``; the hwm stays (``released`` is False if the
        lease had already ended)."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "release", "resource": resource, "token": token, "op_id": op_id}
        req = _request(pb.ReleaseRequest, ctx, resource=resource, token=token, op_id=op_id)
        return self._execute(Call(
            "lease", "Release", req, Kind.DEDUP, ctx, results.release_result, timeout_s=timeout_s,
            batch="release",
        ))

    def _lock_call(
        self, resource: str, *, ttl_ms: int, holder: str, waiter_id: bytes, wait_ms: int,
        timeout_s: float | None = None, start_by: float | None = None,
    ) -> Call:
        """One Lock call: queue (or renew) ``waiter_id`` and wait up to ``wait_ms`` for the
        grant. Repeating it is harmless (the waiter_id makes it one waiter), so it is retried
        like a keep-alive; ``timeout_s`` is its budget on top of the wait (None: the client's
        whole-call timeout)."""
        ctx = {"rpc": "lock", "resource": resource, "holder": holder}
        req = _request(
            pb.LockRequest, ctx, resource=resource, holder=holder, ttl_ms=ttl_ms, waiter_id=waiter_id
        )
        req.wait_ms = wait_ms  # not in the table: the server clamps it
        return Call(
            "lease", "Lock", req, Kind.REPEATABLE, ctx,
            lambda r: LockStep.of(r, resource=resource, holder=holder, waiter_id=waiter_id),
            timeout_s=timeout_s, extra_attempt_s=wait_ms / 1000, start_by=start_by,
        )

    def cancel_lock(self, resource: str, waiter_id: bytes, *, timeout_s: float | None = None) -> Any:
        """Take ``waiter_id`` out of ``resource``'s lock queue; if it was granted meanwhile,
        that lease is released. Returns the CancelLockResponse (``cancelled``, ``released``)."""
        ctx = {"rpc": "cancel-lock", "resource": resource}
        req = _request(pb.CancelLockRequest, ctx, resource=resource, waiter_id=waiter_id)
        return self._execute(Call(
            "lease", "CancelLock", req, Kind.REPEATABLE, ctx, lambda r: r, timeout_s=timeout_s,
        ))

    def describe(self, resource: str, *, timeout_s: float | None = None) -> Description:
        """The resource's lease and hwm, linearizable (read through the log)."""
        ctx = {"rpc": "describe", "resource": resource}
        req = _request(pb.DescribeRequest, ctx, resource=resource)
        return self._execute(Call(
            "lease", "Describe", req, Kind.READ, ctx,
            lambda r: results.description(r, resource=resource), timeout_s=timeout_s,
        ))

    # -- FencedStore ---------------------------------------------------------------------

    def write(
        self,
        resource: str,
        key: str,
        value: bytes,
        *,
        token: int,
        op_id: bytes | None = None,
        expected_version: int | None = None,
        timeout_s: float | None = None,
    ) -> WriteResult:
        """Fenced write (DESIGN I3): applied iff ``token`` equals the resource's hwm.

        ``expected_version``: None writes unconditionally, 0 requires the key to be absent,
        N requires version N (VersionMismatch otherwise). Pass the ``op_id`` of an earlier
        call that raised OutcomeUnknown to learn its outcome without applying twice.
        """
        op_id = new_op_id() if op_id is None else op_id
        ctx = {
            "rpc": "write", "resource": resource, "key": key, "token": token, "op_id": op_id,
            "expected_version": expected_version,
        }
        req = _request(
            pb.WriteRequest, ctx, resource=resource, key=key, value=_as_bytes(value), token=token,
            op_id=op_id, expected_version=expected_version,
        )
        return self._execute(Call(
            "store", "Write", req, Kind.DEDUP, ctx,
            lambda r: results.write_result(r, op_id=op_id), timeout_s=timeout_s, batch="write",
        ))

    def delete(
        self,
        resource: str,
        key: str,
        *,
        token: int,
        op_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> DeleteResult:
        """Fenced delete of ``key`` (checked like a write, DESIGN I7)."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "delete", "resource": resource, "key": key, "token": token, "op_id": op_id}
        req = _request(pb.DeleteRequest, ctx, resource=resource, key=key, token=token, op_id=op_id)
        return self._execute(Call(
            "store", "Delete", req, Kind.DEDUP, ctx,
            lambda r: results.delete_result(r, op_id=op_id), timeout_s=timeout_s,
        ))

    def read(self, resource: str, key: str, *, timeout_s: float | None = None) -> ReadResult:
        """Linearizable read of ``key`` (DESIGN I9); ``found`` is False if absent."""
        ctx = {"rpc": "read", "resource": resource, "key": key}
        req = _request(pb.ReadRequest, ctx, resource=resource, key=key)
        return self._execute(Call(
            "store", "Read", req, Kind.READ, ctx,
            results.read_result, timeout_s=timeout_s,
        ))

    # -- Cluster and Admin --------------------------------------------------------------

    def status(self, *, endpoint: str | None = None, timeout_s: float | None = None) -> ClusterStatus:
        """Cluster.Status: members, leader, term, indexes, epoch (linearizable). With
        ``endpoint`` the question goes to that node only, in one attempt."""
        target = None
        if endpoint is not None:
            target = self._match_endpoint(endpoint)
            if target is None:
                raise ValueError(f"{endpoint!r} is not one of this client's endpoints")
        return self._execute(Call(
            "cluster", "Status", pb.StatusRequest(), Kind.READ, {"rpc": "status"},
            results.cluster_status, timeout_s=timeout_s, endpoint=target,
        ))

    def force_release(
        self, resource: str, *, op_id: bytes | None = None, timeout_s: float | None = None
    ) -> ForceReleaseResult:
        """Admin: clear the lease by issuing a new epoch; the old holder is fenced (I7)."""
        op_id = new_op_id() if op_id is None else op_id
        ctx = {"rpc": "force-release", "resource": resource, "op_id": op_id}
        req = _request(pb.ForceReleaseRequest, ctx, resource=resource, op_id=op_id)
        return self._execute(Call(
            "admin", "ForceRelease", req, Kind.DEDUP, ctx,
            lambda r: results.force_release_result(r, op_id=op_id), timeout_s=timeout_s,
        ))

    def set_epoch_floor(
        self, floor: int, *, fence_all: bool = True, timeout_s: float | None = None
    ) -> EpochResult:
        """Admin: raise the epoch counter to at least ``floor``; with ``fence_all`` (the
        default) every resource is fenced at a new epoch (I11). Repeating it only raises
        the epoch further, so it is retried after an unknown outcome."""
        ctx = {"rpc": "set-epoch-floor", "floor": floor}
        req = _request(pb.SetEpochFloorRequest, ctx, floor=floor, fence_all=fence_all)
        return self._execute(Call(
            "admin", "SetEpochFloor", req, Kind.REPEATABLE, ctx, results.epoch_result,
            timeout_s=timeout_s,
        ))

    def member_list(self, *, timeout_s: float | None = None) -> MemberList:
        """Admin: the cluster configuration as the answering member knows it."""
        return self._execute(Call(
            "admin", "MemberList", pb.MemberListRequest(), Kind.READ, {"rpc": "member-list"},
            results.member_list, timeout_s=timeout_s,
        ))

    def member_add(self, member_id: str, raft_address: str, *, timeout_s: float | None = None) -> MemberList:
        """Admin: add ``member_id`` at ``raft_address`` as a learner; the leader promotes it to a
        voter once it has caught up. Sent once where it may have applied (a repeat is refused
        as MEMBER_EXISTS): check ``member_list()`` after an unknown outcome."""
        ctx = {"rpc": "member-add", "member_id": member_id, "raft_address": raft_address}
        req = pb.MemberAddRequest(member_id=member_id, raft_address=raft_address)
        return self._execute(Call("admin", "MemberAdd", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s))

    def member_remove(self, member_id: str, *, timeout_s: float | None = None) -> MemberList:
        """Admin: remove ``member_id`` from the configuration (one voter out per change)."""
        ctx = {"rpc": "member-remove", "member_id": member_id}
        req = pb.MemberRemoveRequest(member_id=member_id)
        return self._execute(Call("admin", "MemberRemove", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s))

    def member_replace(
        self, member_id: str, raft_address: str = "", *, timeout_s: float | None = None
    ) -> MemberList:
        """Admin: remove ``member_id``'s lost incarnation, then add a fresh learner under the same
        id at ``raft_address`` (default: the same address), promoted once caught up."""
        ctx = {"rpc": "member-replace", "member_id": member_id, "raft_address": raft_address}
        req = pb.MemberReplaceRequest(member_id=member_id, raft_address=raft_address)
        return self._execute(Call("admin", "MemberReplace", req, Kind.ONCE, ctx, results.member_list, timeout_s=timeout_s))

    def snapshot(self, *, local: bool = False, timeout_s: float | None = None) -> Snapshot:
        """Admin: a consistent backup of the whole state (read through the log; ``local``:
        the answering member's state as applied, without a barrier), of any size the limits
        allow: it arrives in chunks (Admin.SnapshotStream) and is checked against the size
        and sha256 the first chunk declares. ``timeout_s``: one attempt may take all of it
        (default BACKUP_TIMEOUT_S_DEFAULT)."""
        timeout_s = BACKUP_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        return self._execute(Call(
            "admin", "SnapshotStream", pb.SnapshotRequest(local=local), Kind.READ, {"rpc": "snapshot"},
            results.snapshot_from_chunks, timeout_s=timeout_s, extra_attempt_s=timeout_s,
            shape=Shape.STREAM_OUT,
        ))

    def restore(
        self, data: bytes, *, epoch_floor: int, timeout_s: float | None = None
    ) -> EpochResult:
        """Admin: replace the state by a backup, with an epoch floor above every token ever
        issued (I11). Any size the limits allow: it is sent in chunks (Admin.RestoreStream)
        and enters the log in chunks. Not resent after an attempt that may have applied: that
        raises OutcomeUnknown, and the operator checks ``status()`` before trying again.
        ``timeout_s``: one attempt may take all of it (default BACKUP_TIMEOUT_S_DEFAULT)."""
        ctx = {"rpc": "restore", "epoch_floor": epoch_floor}
        data = _as_bytes(data)
        _check(validation.check_backup_data, data, ctx)
        _request(pb.RestoreStreamRequest, ctx, epoch_floor=epoch_floor)  # checks the floor
        timeout_s = BACKUP_TIMEOUT_S_DEFAULT if timeout_s is None else timeout_s
        return self._execute(Call(
            "admin", "RestoreStream", lambda: _restore_messages(data, epoch_floor), Kind.ONCE, ctx,
            results.epoch_result, timeout_s=timeout_s, extra_attempt_s=timeout_s, shape=Shape.STREAM_IN,
        ))


def _restore_messages(data: bytes, epoch_floor: int) -> Iterable[pb.RestoreStreamRequest]:
    """A RestoreStream's messages: chunks of ``data``, the first carrying the floor."""
    view = memoryview(data)
    for offset in range(0, len(data), limits.BACKUP_CHUNK_BYTES):
        piece = bytes(view[offset : offset + limits.BACKUP_CHUNK_BYTES])
        yield pb.RestoreStreamRequest(epoch_floor=epoch_floor if offset == 0 else 0, data=piece)


@dataclasses.dataclass(frozen=True)
class LockStep:
    """What one Lock call answered: the grant, or whether the waiter is still queued."""

    acquired: AcquireResult | None
    queued: bool
    position: int

    @classmethod
    def of(cls, r: pb.LockResponse, *, resource: str, holder: str, waiter_id: bytes) -> LockStep:
        acquired = None
        if r.granted:
            acquired = AcquireResult(
                resource=resource, holder=holder, token=r.token, lease_id=r.lease_id or r.token,
                expires_at_ms=r.expires_at_ms, op_id=waiter_id, header=results.header_from_pb(r.header),
                token_proof=r.token_proof,
            )
        return cls(acquired=acquired, queued=r.queued, position=r.position)


# A Lock call the server answered without waiting (its waiter gate was full) is repeated after
# this pause, not at once: each call is a Raft entry, and the gate frees as grants come.
LOCK_BUSY_PAUSE_S = 0.5


class LockWait:
    """The bookkeeping of one ``lock()``, shared by the sync and asyncio loops: the waiter's
    id, the deadline, which call to make next, how long to pause after an answer, and whether
    a failed call ends the wait.

    A bounded wait (``timeout_s``) ends within timeout_s plus one attempt timeout, whatever
    the cluster does: each Lock call gets only what is left of the wait plus one attempt
    timeout (not the client's whole-call timeout) and starts no retry once the wait is over;
    a call that fails for want of a cluster (unavailable, no leader, overloaded, outcome
    unknown: repeating a Lock is harmless) is made again while the wait lasts and ends it
    with LockTimeout once it is over; leaving the queue afterwards gets only what is left of
    that same bound, and is skipped when no call can have reached the queue."""

    def __init__(self, client: _ClientBase, resource: str, *, ttl_ms: int, holder: str | None,
                 timeout_s: float | None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive (or None: no deadline), got {timeout_s!r}")
        self.client = client
        self.resource = resource
        self.ttl_ms = ttl_ms
        self.holder = _default_holder() if holder is None else holder
        self.timeout_s = timeout_s
        self.waiter_id = new_op_id()
        now = time.monotonic()
        self.started = now
        self.deadline = None if timeout_s is None else now + timeout_s
        # The whole lock() ends by here: the wait, then at most one attempt's time.
        self.end = None if self.deadline is None else self.deadline + client._attempt_timeout_s
        # Send time of the call before the last one: the grant applied after that call was
        # answered "queued", so this bounds the lease's start from below (LeaseBase._renewed_at).
        self.granted_after = now
        self._sent_at = now
        self._wait_s = 0.0
        self.calls = 0  # Lock calls made (each may have made several attempts)
        # Whether a Lock call may have put this waiter in the queue: only then is there
        # anything for CancelLock to take out. A call that failed NotApplied (every attempt
        # surely unapplied: no connection, no leader) did not.
        self.maybe_queued = False
        self._maybe_queued_before = False
        self.last_error: FencingError | None = None
        # Set by a client's close() that has taken (or tried to take) this waiter out of the
        # queue: the lock() loop makes no further call and ends with RuntimeError.
        self.abandoned = False

    def next_call(self) -> Call | None:
        """The next Lock call, or None once the deadline has passed."""
        now = time.monotonic()
        left_ms = limits.LOCK_WAIT_MS_MAX if self.deadline is None else int((self.deadline - now) * 1000)
        if left_ms <= 0:
            return None
        wait_ms = min(left_ms, limits.LOCK_WAIT_MS_MAX)
        budget_s = None
        if self.end is not None:
            # The call's own deadline (budget + its wait) falls at self.end, never later.
            budget_s = min(self.client._timeout_s, self.end - now - wait_ms / 1000)
        self.granted_after, self._sent_at, self._wait_s = self._sent_at, now, wait_ms / 1000
        self.calls += 1
        self._maybe_queued_before, self.maybe_queued = self.maybe_queued, True
        return self.client._lock_call(
            self.resource, ttl_ms=self.ttl_ms, holder=self.holder, waiter_id=self.waiter_id, wait_ms=wait_ms,
            timeout_s=budget_s, start_by=self.deadline,
        )

    def after_failure(self, error: BaseException) -> float:
        """A Lock call raised ``error``: the pause before the next call, or raises what ends
        lock() (``error`` itself, or LockTimeout once a bounded wait is over)."""
        if isinstance(error, NotApplied):
            self.maybe_queued = self._maybe_queued_before
        if not isinstance(error, (NotApplied, OutcomeUnknown)) or self.deadline is None:
            raise error  # a refusal, a bad argument, or an unbounded wait: as any call would
        self.last_error = error
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timed_out() from error
        # Each call already retried with backoff; a short pause keeps a dead cluster from
        # being asked in a tight loop for the rest of the wait.
        return min(LOCK_BUSY_PAUSE_S, left)

    def cancel_timeout_s(self) -> float | None:
        """The budget of the CancelLock that leaves the queue: an attempt timeout, cut to what
        is left of a bounded lock()'s end; None: no time is left (its slot expires by itself,
        within limits.LOCK_WAITER_TTL_MS), or no call ever reached the queue."""
        if not self.maybe_queued:
            return None
        if self.end is None:
            return self.client._attempt_timeout_s
        left = min(self.client._attempt_timeout_s, self.end - time.monotonic())
        return left if left > 0.05 else None

    def pause_s(self, step: LockStep) -> float:
        """After a call that was not granted: how long to pause before the next one."""
        if not step.queued:
            # Dropped (its slot expired while this client was away, or an admin fenced every
            # resource): queue again, at the tail, under a new id.
            self.client._log.info("lock waiter on %s left the queue; queueing again", self.resource)
            self.waiter_id = new_op_id()
            return 0.0
        if time.monotonic() - self._sent_at < self._wait_s / 2:
            left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            return LOCK_BUSY_PAUSE_S if left is None else min(LOCK_BUSY_PAUSE_S, left)
        return 0.0

    def timed_out(self) -> LockTimeout:
        elapsed_s = time.monotonic() - self.started
        message = (
            f"{self.resource} was not granted within {self.timeout_s:g} s "
            f"({self.calls} Lock call(s) in {elapsed_s:.1f} s"
        )
        if self.last_error is not None:
            message += f"; last: {type(self.last_error).__name__}: {self.last_error}"
        return LockTimeout(
            message + ")", request={"rpc": "lock", "resource": self.resource, "timeout_s": self.timeout_s}
        )


class LeaseBase:
    """What a held lease is, sync or asyncio: its token, and operations bound to it."""

    def __init__(self, client: Any, acquired: AcquireResult, *, ttl_ms: int, sent_at: float) -> None:
        self._client = client
        self.resource = acquired.resource
        self.holder = acquired.holder
        self.token = acquired.token
        self.lease_id = acquired.lease_id
        self.token_proof = acquired.token_proof  # b"" unless the cluster signs (DESIGN §6)
        self.ttl_ms = ttl_ms
        self.acquired = acquired
        self._expires_at_ms = acquired.expires_at_ms
        # Send time (local monotonic) of the latest renewal that succeeded, the acquire
        # included: the server stamps after it receives, so this + ttl is a lower bound of
        # the moment the server may consider the lease expired.
        self._renewed_at = sent_at
        self.lost_error: Any = None
        self._released = False

    def _is_lost(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "lost" if self._is_lost() else ("released" if self._released else "held")
        return f"<{type(self).__name__} {self.resource} token={self.token} {state}>"

    @property
    def expires_at_ms(self) -> int:
        """Expiry on the log clock, as of the last successful renewal."""
        return self._expires_at_ms

    def _renewed(self, result: KeepAliveResult, sent_at: float) -> None:
        self._expires_at_ms = result.expires_at_ms
        self._renewed_at = max(self._renewed_at, sent_at)

    def _context(self) -> dict[str, Any]:
        return {"rpc": "keep-alive", "resource": self.resource, "token": self.token}

    def _expired_message(self) -> str:
        return (
            f"the lease with token {self.token} on {self.resource} is lost: "
            "renewals failed until it expired"
        )

    # Fenced operations bound to this token (the async client returns awaitables).

    def write(self, key: str, value: bytes, **kwargs: Any) -> Any:
        """``client.write(resource, key, value, token=self.token, ...)``."""
        return self._client.write(self.resource, key, value, token=self.token, **kwargs)

    def delete(self, key: str, **kwargs: Any) -> Any:
        """``client.delete(resource, key, token=self.token, ...)``."""
        return self._client.delete(self.resource, key, token=self.token, **kwargs)

    def read(self, key: str, **kwargs: Any) -> Any:
        return self._client.read(self.resource, key, **kwargs)

    def describe(self, **kwargs: Any) -> Any:
        return self._client.describe(self.resource, **kwargs)

    def raise_if_lost(self) -> None:
        """Raise LeaseLost if the keep-alive has given this lease up (advisory)."""
        if self._is_lost():
            raise self.lost_error


# The keep-alive renews at ttl/3: two renewals can fail before the lease expires.
RENEW_FRACTION = 3
# After a failed renewal, try again this soon (the call itself already retried).
RENEW_RETRY_S = 0.2
# What one renewal may raise that the keep-alive handles: the client's own errors, and
# RuntimeError/ValueError once the client or its channel is closed. Anything else is a bug
# and ends the keep-alive loudly.
RENEWAL_ERRORS: tuple[type[BaseException], ...] = (FencingError, RuntimeError, ValueError)


class Renewal(enum.Enum):
    """What just happened to a lease, when it is not a renewal's exception."""

    RENEWED = "renewed"  # a renewal (or the acquire) succeeded
    DUE = "due"  # the pause ended: a renewal is due now


class KeepAliveAction(enum.Enum):
    SLEEP = "sleep"  # wait ``seconds``, then step again with Renewal.DUE
    RENEW = "renew"  # send one keep-alive with deadline ``seconds``, step again with its outcome
    LOST = "lost"  # give the lease up (``cause``: the refusal; None: it must have expired)
    STOP = "stop"  # the client was closed: end without a verdict


@dataclasses.dataclass(frozen=True)
class KeepAliveStep:
    action: KeepAliveAction
    seconds: float = 0.0
    cause: BaseException | None = None


def keepalive_step(
    *, now: float, renewed_at: float, ttl_ms: int, last: Renewal | BaseException
) -> KeepAliveStep:
    """The keep-alive policy of ``Lease`` and ``AsyncLease``, as one pure decision.

    ``now`` and ``renewed_at`` (send time of the latest successful renewal) are readings of
    one monotonic clock; ``last`` is what just happened: ``Renewal.RENEWED``,
    ``Renewal.DUE``, or the exception of the renewal just tried (one of RENEWAL_ERRORS).
    Renewals come every ttl/RENEW_FRACTION; after a failure that leaves the lease possibly
    live they come every RENEW_RETRY_S (never slower than the usual pace); a definite refusal
    loses the lease at once, and so does reaching ``renewed_at + ttl`` without a success:
    the server may have expired it by then. Each renewal's deadline is the time left.
    """
    interval_s = ttl_ms / 1000 / RENEW_FRACTION
    if last is Renewal.RENEWED:
        return KeepAliveStep(KeepAliveAction.SLEEP, interval_s)
    if last is Renewal.DUE:
        remaining_s = renewed_at + ttl_ms / 1000 - now
        if remaining_s <= 0:
            return KeepAliveStep(KeepAliveAction.LOST)
        return KeepAliveStep(KeepAliveAction.RENEW, remaining_s)
    if isinstance(last, (Refused, InvalidArgument, AuthError)):
        # A definite refusal: fenced (StaleToken), ended (LeaseExpired), never issued
        # (UnknownToken), or not allowed. Asking again changes nothing.
        return KeepAliveStep(KeepAliveAction.LOST, cause=last)
    if isinstance(last, FencingError):
        # Unavailable, OutcomeUnknown, Overloaded, ServerError: the lease may still be live;
        # try again soon, until renewed_at + ttl says it cannot be.
        return KeepAliveStep(KeepAliveAction.SLEEP, min(interval_s, RENEW_RETRY_S), cause=last)
    return KeepAliveStep(KeepAliveAction.STOP, cause=last)
