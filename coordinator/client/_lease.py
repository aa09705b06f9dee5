"""A held lease and its keep-alive policy, shared by ``Lease`` and ``AsyncLease``.

Owns: ``LeaseBase`` (a lease's token and the fenced operations bound to it) and
``keepalive_step``, the keep-alive policy as one pure decision: when a lease is renewed, how
long a failing renewal is retried, and when the lease counts as lost.
Must never: block, sleep, read a clock of its own or do I/O (the thread or task that runs the
keep-alive does, and passes in its readings), or keep a lease it cannot prove live past
``renewed_at + ttl``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from coordinator.client.exceptions import AuthError, FencingError, InvalidArgument, Refused
from coordinator.client.results import AcquireResult, KeepAliveResult


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
