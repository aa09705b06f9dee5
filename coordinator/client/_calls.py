"""One logical call and its attempts: what is sent, how it may be retried, what is raised.

Owns: ``Stubs`` (the four service stubs on one channel), ``Call`` (one logical call: its
request, retry ``Kind``, converter, deadlines and message shape), ``send`` (start one attempt)
and ``Attempts`` (the bookkeeping of one call: its deadline, attempt count, whether an attempt
may have applied, and the exception the caller gets in the end). The sync and asyncio loops
that drive them are ``sync``'s and ``aio``'s; the retry verdicts are ``retry``'s.
Must never: block, sleep or do I/O itself, or report a call that may have applied as failed:
that is OutcomeUnknown.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc

from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client.exceptions import FencingError, NotApplied, OutcomeUnknown, Unavailable, from_rpc_error
from coordinator.client.retry import Kind, classify
from coordinator.core.names import ErrorMeta, ErrorReason

if TYPE_CHECKING:
    from coordinator.client._base import _ClientBase


class Stubs:
    """The five service stubs on one channel (sync or asyncio: the generated stubs take both)."""

    __slots__ = ("channel", "lease", "store", "cluster", "admin", "watch")

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.lease = pb_grpc.LeaseStub(channel)
        self.store = pb_grpc.FencedStoreStub(channel)
        self.cluster = pb_grpc.ClusterStub(channel)
        self.admin = pb_grpc.AdminStub(channel)
        self.watch = pb_grpc.WatchStub(channel)


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
